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
from dataclasses import dataclass
from pathlib import Path

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

    from .config import S3Config
    from .dataset import ShardDataset
    from .decode.cpu import CpuDecoder, RandomResizedCrop
    from .packing.pack import pack
    from .testing.s3server import S3ServerError, SeaweedS3Server
    from .testing.synth import CLASS_NAMES, make_image_dataset

    torch.set_num_threads(1)
    with contextlib.ExitStack() as stack:
        root = (
            Path(workdir)
            if workdir
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shardstream-demo-")))
        )
        raw = root / "images"
        print(f"[1/4] making {num_images} photo-like JPEGs in {len(CLASS_NAMES)} classes under {raw}")
        raw_bytes = make_image_dataset(raw, num_images=num_images, num_classes=len(CLASS_NAMES), progress=True)
        print(f"      {raw_bytes / 1e6:.1f} MB, {2 * num_images} files (.jpg + .cls per sample)")

        s3: S3Config | None = None
        dest = str(root / "shards")
        if not local:
            server = SeaweedS3Server()
            try:
                info = server.start()
            except S3ServerError as exc:
                print(f"[2/4] could not start the local S3 server ({exc}); packing to {dest} instead")
            else:
                stack.callback(server.stop)
                server.create_bucket(DEMO_BUCKET)
                s3 = info.s3_config()
                dest = f"s3://{DEMO_BUCKET}/scenes"
                print(f"[2/4] started a local S3 server (SeaweedFS) at {info.endpoint_url}, bucket {DEMO_BUCKET}")
        else:
            print(f"[2/4] --local: packing to {dest}")

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
        seconds = time.perf_counter() - started
        result = DemoResult(
            dest=dest,
            num_samples=num_samples,
            num_unique_keys=len(keys),
            num_batches=num_batches,
            seconds=seconds,
            first_batch_s=first_batch_s,
            label_counts=dict(sorted(labels.items())),
        )
        once = "every sample exactly once" if num_samples == len(keys) == num_images else "MISMATCH"
        print(
            f"      read {num_samples} samples in {num_batches} batches in {seconds:.2f} s: "
            f"{num_samples / seconds:.0f} samples/s ({once})"
        )
        print("      labels: " + ", ".join(f"{CLASS_NAMES[k]}={v}" for k, v in result.label_counts.items()))
    print("done" + ("; the S3 server is stopped and its data removed" if s3 is not None else ""))
    return result
