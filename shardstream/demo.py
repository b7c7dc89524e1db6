"""``shardstream demo``: the whole path on an embedded default, with no set-up.

Makes a small image-classification dataset of photo-like JPEGs, starts a local S3 server
(SeaweedFS), packs the dataset into it, reads one epoch through a torch DataLoader with
2 workers, Pillow decoding and a random resized crop to 224 x 224, and prints the speed.
"""

from __future__ import annotations

import collections
import contextlib
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import S3Config

__all__ = ["DemoResult", "run_demo"]

DEMO_BUCKET = "shardstream-demo"


@dataclass(frozen=True, kw_only=True)
class DemoResult:
    """What the demo read: counts, and times in seconds."""

    dest: str
    num_samples: int
    num_unique_keys: int
    num_batches: int
    seconds: float
    first_batch_s: float
    label_counts: dict[int, int]


def run_demo(
    *,
    num_images: int = 3000,
    num_workers: int = 2,
    batch_size: int = 64,
    workdir: str | None = None,
    local: bool = False,
) -> DemoResult:
    """Run the demo and print what happens; returns the figures.

    Args:
        num_images: JPEGs to generate.
        num_workers: DataLoader worker processes.
        batch_size: samples per batch.
        workdir: directory for the generated files (kept); default a temporary one.
        local: pack to a local directory instead of the embedded S3 server.
    """
    import torch
    from torch.utils.data import DataLoader

    from .dataset import ShardDataset
    from .decode.cpu import CpuDecoder, RandomResizedCrop
    from .packing.pack import pack
    from .testing.synth import CLASS_NAMES

    torch.set_num_threads(1)
    with contextlib.ExitStack() as stack:
        root = (
            Path(workdir)
            if workdir
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shardstream-demo-")))
        )
        raw = root / "images"
        _make_images(raw, num_images)
        dest, s3 = _destination(stack, root, local=local)

        report = pack(raw, dest, max_shard_bytes=16 << 20, s3=s3, overwrite=True)
        print(f"[3/4] {report.summary()}")

        dataset = ShardDataset(
            dest,
            s3=s3,
            shuffle_buffer=512,
            seed=0,
            batch_size=batch_size,
            decode=CpuDecoder("torch", crop=RandomResizedCrop(size_px=224)),
        )
        loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
        print(
            f"[4/4] one epoch: {dataset.num_shards} shards, {num_workers} workers, batches of {batch_size}, "
            "Pillow decode + random resized crop 224"
        )
        result = _read_epoch(loader, dest)
        num_samples, seconds = result.num_samples, result.seconds
        once = "every sample exactly once" if num_samples == result.num_unique_keys == num_images else "MISMATCH"
        print(
            f"      read {num_samples} samples in {result.num_batches} batches in {seconds:.2f} s: "
            f"{num_samples / seconds:.0f} samples/s ({once})"
        )
        print("      labels: " + ", ".join(f"{CLASS_NAMES[k]}={v}" for k, v in result.label_counts.items()))
    print("done" + ("; the S3 server is stopped and its data removed" if s3 is not None else ""))
    return result


def _make_images(raw: Path, num_images: int) -> None:
    """Step 1: ``num_images`` photo-like JPEGs (and their ``.cls`` labels) under ``raw``."""
    from .testing.synth import CLASS_NAMES, make_image_dataset

    print(f"[1/4] making {num_images} photo-like JPEGs in {len(CLASS_NAMES)} classes under {raw}")
    raw_bytes = make_image_dataset(raw, num_images=num_images, num_classes=len(CLASS_NAMES), progress=True)
    print(f"      {raw_bytes / 1e6:.1f} MB, {2 * num_images} files (.jpg + .cls per sample)")


def _destination(stack: contextlib.ExitStack, root: Path, *, local: bool) -> tuple[str, S3Config | None]:
    """Step 2: where the dataset is packed, and the S3 settings that reach it: a bucket of a
    local S3 server started here (stopped as ``stack`` closes), or ``root / "shards"`` with
    ``local`` or where the server does not start."""
    from .testing.s3server import S3ServerError, SeaweedS3Server

    dest = str(root / "shards")
    if local:
        print(f"[2/4] --local: packing to {dest}")
        return dest, None
    server = SeaweedS3Server()
    try:
        info = server.start()
    except S3ServerError as exc:
        print(f"[2/4] could not start the local S3 server ({exc}); packing to {dest} instead")
        return dest, None
    stack.callback(server.stop)
    server.create_bucket(DEMO_BUCKET)
    s3 = info.s3_config()
    dest = f"s3://{DEMO_BUCKET}/scenes"
    print(f"[2/4] started a local S3 server (SeaweedFS) at {info.endpoint_url}, bucket {DEMO_BUCKET}")
    return dest, s3


def _read_epoch(loader: Iterable[dict[str, Any]], dest: str) -> DemoResult:
    """Step 4: one epoch of ``loader`` read and counted, its first batch described as it comes."""
    labels: collections.Counter[int] = collections.Counter()
    keys: set[str] = set()
    num_samples = num_batches = 0
    started = time.perf_counter()
    first_batch_s = float("nan")
    for batch in loader:
        if num_batches == 0:
            first_batch_s = time.perf_counter() - started
            image = batch["jpg"]
            print(
                f"      first batch after {first_batch_s:.2f} s: jpg {tuple(image.shape)} {image.dtype}, "
                f"cls {tuple(batch['cls'].shape)} {batch['cls'].dtype}"
            )
        num_batches += 1
        num_samples += len(batch["__key__"])
        keys.update(batch["__key__"])
        labels.update(batch["cls"].tolist())
    return DemoResult(
        dest=dest,
        num_samples=num_samples,
        num_unique_keys=len(keys),
        num_batches=num_batches,
        seconds=time.perf_counter() - started,
        first_batch_s=first_batch_s,
        label_counts=dict(sorted(labels.items())),
    )
