"""Index a WebDataset on the Hugging Face Hub without copying it, then train from it.

    python examples/train_from_hub.py hf://datasets/ORG/NAME/FOLDER
    python examples/train_from_hub.py hf://datasets/ORG/NAME@REVISION/FOLDER --index-dir ./name-index --epochs 3

The argument (required) names a folder of ``.tar`` shards in a Hub dataset repo: public
WebDataset datasets on the Hub are such folders. ``shardstream index build`` (here
:func:`shardstream.build_index`) reads each shard once, in ranged requests, and writes the index
and per-shard tables to a directory of yours (``--index-dir``, a local path or an ``s3://`` /
``gs://`` / ``az://`` prefix; default: a temporary directory); the shards stay on the Hub. The
index records the commit it was built from (a branch or tag is pinned to its commit sha), so
every epoch and every DataLoader worker reads the same bytes, with exact epochs, shuffling,
resume and the node cache as for a dataset of your own.

The dataset must hold ``.jpg`` (or ``.png``/``.webp``) images with ``.cls`` labels in
``0..--num-classes - 1``. A private or gated dataset needs ``HF_TOKEN`` (sent to the Hub only);
``HF_ENDPOINT`` points the script at another Hub (a mirror, or the local fake Hub
``tests/test_examples.py`` runs it against).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

from shardstream import CpuDecoder, RandomResizedCrop, ShardDataset, build_index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", help="hf://datasets/ORG/NAME[@REVISION]/FOLDER of .tar shards")
    parser.add_argument("--index-dir", help="where the index goes (default: a temporary directory)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--num-classes", type=int, default=4, help="the labels run from 0 to this - 1")
    args = parser.parse_args()
    if not args.shards.startswith("hf://datasets/"):
        parser.error(f"expected an hf://datasets/ORG/NAME/FOLDER URL, got {args.shards!r}")
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        shards = args.shards
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
            nn.Conv2d(3, 16, 3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, args.num_classes),
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
