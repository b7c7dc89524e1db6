"""`shardstream index --dali`: DALI .idx files from our index, byte for byte what DALI's own
wds2idx writes by scanning the tars, and DALI's fn.readers.webdataset reads our shards with
them: the same samples, the same bytes."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardstream import pack
from shardstream.format import split_key
from shardstream.packing.dali_index import write_dali_index

pytestmark = pytest.mark.slow  # DALI's reader and wds2idx (tests/lanes.py)

if os.environ.get("SHARDSTREAM_NO_DALI") == "1":
    pytest.skip("SHARDSTREAM_NO_DALI=1: DALI tests skipped on request", allow_module_level=True)

WDS2IDX = shutil.which("wds2idx") or str(Path(sys.executable).with_name("wds2idx"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, dict[str, dict[str, bytes]]]:
    """21 samples in 3 folders (one with a 120-byte name): .jpg, .cls and .seg.png members."""
    root = tmp_path_factory.mktemp("dali-index")
    files: dict[str, dict[str, bytes]] = {}
    for i in range(21):
        folder = root / "src" / (f"class{i % 3}" if i % 7 else "long-" + "x" * 110)
        folder.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.new("RGB", (8 + i, 8), (i * 10, 0, 0)).save(buf, "JPEG")
        members = {"jpg": buf.getvalue(), "cls": str(i % 3).encode(), "seg.png": bytes([i]) * (100 + i * 37)}
        for ext, data in members.items():
            (folder / f"{i:04d}.{ext}").write_bytes(data)
        files[f"{folder.relative_to(root / 'src')}/{i:04d}"] = members
    pack(root / "src", root / "ds", max_samples_per_shard=8, progress=False)
    return root / "ds", files


def test_the_idx_files_match_wds2idx_byte_for_byte(dataset, tmp_path):
    ds, _ = dataset
    run = subprocess.run(
        [sys.executable, "-m", "shardstream.cli", "index", "--dali", str(ds), "--out-dir", str(tmp_path / "ours")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and "wrote 3 DALI index files" in run.stdout, run.stderr
    assert os.access(WDS2IDX, os.X_OK), "wds2idx missing: pip install 'shardstream[dali]'"
    long_names = 0
    for shard in sorted(ds.glob("*.tar")):
        theirs = tmp_path / f"{shard.stem}.wds2idx"
        subprocess.run([WDS2IDX, str(shard), str(theirs)], check=True, capture_output=True, timeout=60)
        data = shard.read_bytes()
        ours_lines = (tmp_path / "ours" / f"{shard.stem}.idx").read_text().splitlines()
        for mine, other in zip(ours_lines, theirs.read_text().splitlines(), strict=True):
            if "long-" not in mine:
                assert mine == other
                continue
            # A name over 100 bytes: wds2idx gives the offset of the GNU long-name record's
            # header plus 512, two blocks before the payload; ours is the payload itself.
            long_names += 1
            a, b = mine.split(), other.split()
            for i in range(0, len(a), 4):
                assert a[i] == b[i] and a[i + 2] == b[i + 2] and a[i + 3] == b[i + 3]
                assert int(b[i + 1]) == int(a[i + 1]) - 1024
                key, ext = split_key(a[i + 3])
                assert data[int(a[i + 1]) : int(a[i + 1]) + int(a[i + 2])] == dataset[1][key][ext]  # ours is right
    assert long_names == 3


def test_dali_reads_our_shards_with_them(dataset):
    from nvidia.dali import fn, pipeline_def

    ds, files = dataset
    written = write_dali_index(ds)
    shards = sorted(str(p) for p in ds.glob("*.tar"))
    assert [str(p) for p in written] == [s.removesuffix(".tar") + ".idx" for s in shards]

    @pipeline_def(batch_size=7, num_threads=1, device_id=None)
    def read():
        jpg, cls, seg = fn.readers.webdataset(
            paths=shards,
            index_paths=[str(p) for p in written],
            ext=["jpg", "cls", "seg.png"],
            missing_component_behavior="error",
            random_shuffle=False,
            name="reader",
        )
        return jpg, cls, seg

    pipe = read()
    pipe.build()
    got = []
    for _ in range(3):
        outputs = pipe.run()
        for i in range(len(outputs[0])):
            got.append({ext: np.array(out[i]).tobytes() for ext, out in zip(("jpg", "cls", "seg.png"), outputs)})
    expected = sorted(files.values(), key=lambda m: (m["cls"], m["seg.png"]))
    assert sorted(got, key=lambda m: (m["cls"], m["seg.png"])) == expected  # 21 samples, every byte


def test_an_s3_dataset_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="reads local files only; copy the dataset"):
        write_dali_index("s3://bucket/ds")
    run = subprocess.run(
        [sys.executable, "-m", "shardstream.cli", "index", "--dali", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1 and "no index here" in run.stderr
