"""shardstream.gpu.GpuLoader with a second graph: a GPU decoder is "a graph, not a copy".

``PillowGraph`` below is a tiny batched decoder written here, not in the package: it
implements :class:`~shardstream.decode.protocol.BatchDecoder` (batches from the feed, its CPU
fallback, finish, close) with Pillow on the CPU, and the generic loader that DaliLoader is
built on runs it: fields, the feed thread, DataLoader workers with shared-memory batches, the
CPU fallback for images the graph leaves out (a PNG here), a failed batch decoded on the CPU
and the graph built again, skipped samples, counters. No DALI is involved."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from shardstream import ShardDataset, pack
from shardstream.decode.protocol import BatchDecoder, BatchSource, CpuFallback
from shardstream.errors import DecodeError
from shardstream.gpu import GpuLoader

SIZE_PX = 12
NUM = 11  # 3 batches of 4, the last of 3
PNG = 6  # the sample stored as a PNG (under .jpg): the graph leaves it to its CPU fallback


def decoded(data: bytes | np.ndarray) -> torch.Tensor:
    """What both the graph and its fallback make of image bytes: RGB, resized to SIZE_PX
    square (bilinear), ``torch.uint8`` ``(3, SIZE_PX, SIZE_PX)``."""
    image = Image.open(io.BytesIO(bytes(data))).convert("RGB")
    array = np.array(image.resize((SIZE_PX, SIZE_PX), Image.Resampling.BILINEAR))
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


@dataclass(frozen=True)
class PillowFallback:
    """The graph's CPU twin: it leaves everything but JPEGs to the CPU."""

    def problem(self, data: bytes) -> str | None:
        return None if bytes(data[:2]) == b"\xff\xd8" else "not a JPEG"

    def decode(self, data: bytes, rng: Any) -> torch.Tensor:
        return decoded(data)


def _placeholder() -> np.ndarray:
    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, "JPEG")
    return np.frombuffer(out.getvalue(), dtype=np.uint8)


@dataclass
class PillowGraph:
    """A second batched decoder: each batch decoded with Pillow, on the CPU. ``fail_on``: the
    labels of batches it fails on once (as a GPU decoder fails on an image it cannot read)."""

    fail_on: set[int] = field(default_factory=set)
    built: int = 0
    closed: int = 0

    name = "Pillow"
    device = torch.device("cpu")
    fallback = PillowFallback()
    placeholder = _placeholder()

    def batches(self, source: BatchSource) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.built += 1
        return self._run(source)

    def _run(self, source: BatchSource) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            try:
                images, labels = source()
            except StopIteration:
                return
            numbers = [int(x[0]) for x in labels]
            if self.fail_on & set(numbers):
                self.fail_on -= set(numbers)
                raise RuntimeError(f"cannot decode the batch of samples {numbers}")
            yield torch.stack([decoded(x) for x in images]), torch.tensor(numbers, dtype=torch.int64)

    def finish(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(self.device)

    def close(self) -> None:
        self.closed += 1


def _image(i: int) -> Image.Image:
    rng = np.random.default_rng(i)
    height, width = 20 + 3 * i, 36 - i
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, dict[int, bytes]]:
    """NUM samples, the image of sample i (a JPEG, or a PNG for PNG) labelled i, in shards of 4."""
    root = tmp_path_factory.mktemp("gpu-loader")
    src = root / "src"
    src.mkdir()
    stored = {}
    for i in range(NUM):
        out = io.BytesIO()
        _image(i).save(out, "PNG" if i == PNG else "JPEG", quality=90)
        stored[i] = out.getvalue()
        (src / f"{i:03d}.jpg").write_bytes(stored[i])
        (src / f"{i:03d}.cls").write_text(str(i))
    pack(src, root / "ds", max_samples_per_shard=4, progress=False)
    return root / "ds", stored


def _check(batches: list[tuple[torch.Tensor, torch.Tensor]], stored: dict[int, bytes]) -> list[int]:
    """Every batch's images equal to the expected decode of the sample its label names; the labels."""
    labels = []
    for images, numbers in batches:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIZE_PX, SIZE_PX)
        assert numbers.dtype == torch.int64 and len(numbers) == len(images)
        for image, i in zip(images, numbers.tolist()):
            assert torch.equal(image, decoded(stored[i])), i
        labels += numbers.tolist()
    return labels


def test_the_second_graph_is_a_batch_decoder():
    graph = PillowGraph()
    assert isinstance(graph, BatchDecoder) and isinstance(graph.fallback, CpuFallback)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_second_graph_gives_the_decoded_images_and_labels(shards, num_workers):
    ds, stored = shards
    graph = PillowGraph()
    loader = GpuLoader(
        ShardDataset(ds, shuffle=False), graph, batch_size=4, fields=("jpg", "cls"), num_workers=num_workers
    )
    try:
        assert len(loader) == 3 and loader.device == torch.device("cpu")
        batches = list(loader)
        assert [len(y) for _, y in batches] == [4, 4, 3]
        labels = _check(batches, stored)
        assert sorted(labels) == list(range(NUM))
        if num_workers == 0:
            assert labels == list(range(NUM))  # the dataset's order
        assert _check(list(loader), stored) == labels  # a second epoch, the same (unshuffled)
    finally:
        loader.close()
    stats = loader.stats()
    assert stats["images"] == 2 * NUM and stats["skipped"] == stats["pipeline_rebuilds"] == 0
    assert stats["cpu_decoded"] == 2 and stats["cpu_reasons"] == {"not a JPEG": 2}  # the PNG, twice
    assert graph.built == 2  # one graph an epoch


def test_a_batch_the_graph_fails_on_is_decoded_on_the_cpu_and_the_graph_built_again(shards):
    ds, stored = shards
    graph = PillowGraph(fail_on={5})
    loader = GpuLoader(ShardDataset(ds, shuffle=False), graph, batch_size=4, prefetch_batches=1)
    batches = list(loader)
    labels = _check(batches, stored)
    assert sorted(labels) == list(range(NUM)) and [len(y) for _, y in batches] == [4, 4, 3]
    stats = loader.stats()
    assert stats["pipeline_rebuilds"] == 1 and graph.built == 2
    assert stats["cpu_reasons"]["Pillow failed on its batch"] == 3  # the failed batch's JPEGs (not its PNG)


def test_bad_samples_are_skipped_or_raised_as_with_dali(tmp_path, shards):
    _, stored = shards
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"{i:03d}.jpg").write_bytes(b"<html>404</html>" if i == 2 else stored[i])
        (src / f"{i:03d}.cls").write_text(str(i))
    pack(src, tmp_path / "ds", max_samples_per_shard=4, progress=False)
    loader = GpuLoader(ShardDataset(tmp_path / "ds", shuffle=False, on_error="skip"), PillowGraph(), batch_size=4)
    batches = list(loader)
    labels = _check(batches, {**stored, 2: stored[1]})  # a repeat of the previous good one in its place
    assert labels == [0, 1, 1, 3, 4, 5] and loader.stats()["skipped"] == 1
    with pytest.raises(DecodeError, match=r"sample '002', member 'jpg': no decoder can read this image: not a rec"):
        list(GpuLoader(ShardDataset(tmp_path / "ds", shuffle=False), PillowGraph(), batch_size=4))


def test_the_loader_refuses_what_is_not_a_graph_and_a_dataset_that_decodes(shards):
    ds, _ = shards
    not_a_graph: Any = object()
    with pytest.raises(TypeError, match="is not a BatchDecoder"):
        GpuLoader(ShardDataset(ds), not_a_graph, batch_size=4)
    with pytest.raises(ValueError, match="decode=None: Pillow decodes the raw bytes"):
        GpuLoader(ShardDataset(ds, decode="pil"), PillowGraph(), batch_size=4)


def test_importing_the_generic_loader_imports_neither_torch_nor_dali():
    code = "import sys, shardstream.gpu; assert not {'torch', 'nvidia.dali'} & set(sys.modules), sorted(sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
