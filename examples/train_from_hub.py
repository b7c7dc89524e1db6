"""Index a WebDataset on the Hugging Face Hub without copying it, then train from it.

    python examples/train_from_hub.py                                   # a local stand-in Hub, no network
    python examples/train_from_hub.py hf://datasets/ORG/NAME/train --index-dir ./name-index

Public WebDataset datasets on the Hub are folders of ``.tar`` shards. ``shardstream index
build`` (here :func:`shardstream.build_index`) reads each shard once, in ranged requests, and
writes the index and per-shard tables to a directory of yours (``--index-dir``, a local path or
an ``s3://`` / ``gs://`` / ``az://`` prefix); the shards stay on the Hub. The index records the
commit it was built from (a branch or tag is pinned to its commit sha), so every epoch and
every DataLoader worker reads the same bytes, with exact epochs, shuffling, resume and the node
cache as for a dataset of your own.

The dataset must hold ``.jpg`` (or ``.png``/``.webp``) images with ``.cls`` labels. Without an
argument the script makes such a dataset with webdataset's ``TarWriter``, serves it from a local
fake of the Hub's API (``shardstream.testing.webservers.FakeHub``, no network) and points
``HF_ENDPOINT`` at it. A private or gated dataset needs ``HF_TOKEN`` (sent to the Hub only).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from shardstream import CpuDecoder, RandomResizedCrop, ShardDataset, build_index


@contextlib.contextmanager
def stand_in_hub(folder: Path, num_images: int) -> Iterator[str]:
    """A WebDataset written by webdataset's TarWriter, served by a local fake Hub."""
    import webdataset as wds
    from PIL import Image

    from shardstream.testing.webservers import FakeHub

    shards = folder / "repo" / "train"
    shards.mkdir(parents=True)
    rng = torch.Generator().manual_seed(0)
    per_shard = 100
    for s in range(0, num_images, per_shard):
        with wds.TarWriter(str(shards / f"shard-{s // per_shard:05d}.tar")) as sink:
            for i in range(s, min(s + per_shard, num_images)):
                label = i % 4
                pixels = (torch.rand(64, 64, 3, generator=rng) * 80 + label * 50).to(torch.uint8).numpy()
                jpeg = io.BytesIO()
                Image.fromarray(pixels).save(jpeg, format="JPEG", quality=90)
                sink.write({"__key__": f"{i:06d}", "jpg": jpeg.getvalue(), "cls": label})
    with FakeHub() as hub:
        hub.add_repo("demo/webdataset-images", {hub.commit_sha("first commit"): folder / "repo"})
        os.environ["HF_ENDPOINT"] = hub.endpoint
        yield "hf://datasets/demo/webdataset-images/train"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", nargs="?", help="hf://datasets/ORG/NAME[@REVISION]/FOLDER of .tar shards")
    parser.add_argument("--index-dir", help="where the index goes (default: a temporary directory)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--num-images", type=int, default=600, help="images of the stand-in dataset")
    args = parser.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        shards = args.shards or stack.enter_context(stand_in_hub(Path(tmp), args.num_images))
        index_dir = args.index_dir or f"{tmp}/index"
        started = time.perf_counter()
        manifest = build_index([shards], output=index_dir, overwrite=True, workers=2)
        print(
            f"indexed {manifest.num_shards} shards, {manifest.num_samples} samples of {shards} into "
            f"{index_dir} in {time.perf_counter() - started:.1f} s (nothing copied)"
        )
        dataset = ShardDataset(
            index_dir,
            shuffle_buffer=500,
            batch_size=args.batch_size,
            decode=CpuDecoder("torch", crop=RandomResizedCrop(size_px=48, scale=(0.5, 1.0))),
        )
        loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers, persistent_workers=True)
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for epoch in range(args.epochs):
            dataset.set_epoch(epoch)
            seen, loss_sum, started = 0, 0.0, time.perf_counter()
            for batch in loader:
                images = batch["jpg"].float() / 255  # (B, 3, 48, 48) float32 on the CPU
                labels = torch.as_tensor([int(c) for c in batch["cls"]])
                loss = nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen += len(labels)
                loss_sum += loss.item() * len(labels)
            rate = seen / (time.perf_counter() - started)
            print(f"epoch {epoch}: {seen} samples, loss {loss_sum / seen:.3f}, {rate:.0f} samples/s")
            if seen != manifest.num_samples:
                raise SystemExit(f"epoch {epoch} read {seen} samples, the index holds {manifest.num_samples}")


if __name__ == "__main__":
    main()
