"""Run by tests/test_cache_share.py (and bench/cache_node.py): one training process of several
on a node that share one node cache. It reads EPOCHS epochs of an S3 dataset through a
DataLoader and writes, per epoch, the keys it read (sorted), the seconds it took and its
stats() to OUT (JSON). S3 credentials come from the AWS_* environment variables.

Usage: python tests/cache_share.py DATASET CACHE_DIR LIMIT_BYTES OUT [--epochs E] [--workers K]
       [--batch-size B] [--seed S]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from torch.utils.data import DataLoader

from shardstream import ShardDataset


def key_of(sample: dict) -> str:
    return sample["__key__"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("cache_dir")
    parser.add_argument("limit_bytes", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dataset = ShardDataset(
        args.dataset,
        decode=key_of,
        seed=args.seed,
        shuffle_buffer=100,
        batch_size=args.batch_size,
        cache_dir=args.cache_dir,
        cache_limit_bytes=args.limit_bytes,
    )
    loader = DataLoader(
        dataset, batch_size=args.batch_size, num_workers=args.workers, persistent_workers=args.workers > 0
    )
    epochs = []
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)
        started = time.perf_counter()
        keys = [k for batch in loader for k in batch]
        seconds = time.perf_counter() - started
        epochs.append(
            {"epoch": epoch, "keys": sorted(keys), "seconds": seconds, "stats": dataclasses.asdict(dataset.stats())}
        )
    args.out.write_text(json.dumps(epochs))


if __name__ == "__main__":
    main()
