"""The decoder seam as a user meets it: a decoder registered by name is what
``ShardDataset(decode=name)`` uses; an unknown or taken name is refused by name; and the
decode package runs where torch is not loaded, refusing only what needs tensors, clearly."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image

from shardstream import ShardDataset, ShardMapDataset, pack
from shardstream.decode import Decoder, register_decoder
from shardstream.decode.protocol import decoder_names

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    """6 JPEGs of 8 x 6 px and a label each."""
    root = tmp_path_factory.mktemp("decoders")
    src = root / "src"
    src.mkdir()
    for i in range(6):
        Image.new("RGB", (8, 6), (40 * i, 0, 0)).save(src / f"{i:02d}.jpg", quality=95)
        (src / f"{i:02d}.cls").write_text(str(i))
    pack(src, root / "ds", progress=False)
    return root / "ds"


class Sizes:
    """A decoder: each sample's members as their sizes in bytes."""

    def __call__(self, sample):
        return {k: len(v) for k, v in sample.items() if not k.startswith("__")} | {"__key__": sample["__key__"]}


def test_a_registered_decoder_is_used_by_name_in_both_datasets(dataset_dir):
    if "sizes" not in decoder_names():
        register_decoder("sizes", Sizes)
    assert isinstance(Sizes(), Decoder)
    got = list(ShardDataset(dataset_dir, shuffle=False, decode="sizes"))
    assert [s["__key__"] for s in got] == [f"{i:02d}" for i in range(6)] and got[0]["cls"] == 1
    assert ShardMapDataset(dataset_dir, decode="sizes")[3] == got[3]
    with pytest.raises(ValueError, match="'sizes' is already registered"):
        register_decoder("sizes", Sizes)


def test_an_unknown_name_is_refused_with_the_names_there_are(dataset_dir):
    with pytest.raises(ValueError, match=r"decode='jpeg2000'.*'pil', 'numpy', 'torch'"):
        ShardDataset(dataset_dir, decode="jpeg2000")


def test_decode_works_without_torch_and_refuses_tensors_clearly(dataset_dir):
    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 10, 10)).save(buf, format="JPEG", quality=95)
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # importing torch raises ImportError from here on
        from shardstream.decode import CpuDecoder
        from shardstream.errors import MissingDependencyError
        data = {buf.getvalue()!r}
        array = CpuDecoder("numpy")({{"__key__": "k", "jpg": data}})["jpg"]
        print(array.shape, array.dtype)
        try:
            CpuDecoder("torch")({{"__key__": "k", "jpg": data}})
        except MissingDependencyError as exc:
            print("refused:", exc)
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "(6, 8, 3) uint8" in run.stdout
    assert "refused:" in run.stdout and "import torch" in run.stdout
