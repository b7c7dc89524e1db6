"""``shardstream index build`` against reading the same shards without an index, in one run.

The shards are webdataset's own (``ShardWriter``, 64 MiB) of the photo corpus, as
bench/stream.py converts them (cached under ~/.cache/shardstream-bench); they are copied to a
scratch directory, where the index is written beside them. Each round times: a raw read of
every sample of the bare shards by one ``ShardDataset`` process (no decoding), then
``build_index`` with 1 worker and with ``--workers`` (default: the CPU count), each from
scratch (``overwrite``). Prints each round and the ratios to the raw read of the same round.

Usage:
    python bench/index_build.py [--shards DIR] [--rounds 3] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from corpus import CACHE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shards",
        default=str(CACHE / "stream-photos10000-64MiB" / "wds"),
        help="a directory of .tar shards (default: bench/stream.py's webdataset photo shards)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    from shardstream import ShardDataset
    from shardstream.packing.build import build_index

    source = Path(args.shards)
    tars = sorted(source.glob("*.tar"))
    if not tars:
        raise SystemExit(f"{source}: no .tar shards (run python bench/stream.py first, or pass --shards)")
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-index-") as scratch:
        for tar in tars:
            shutil.copy(tar, scratch)
        urls = sorted(str(p) for p in Path(scratch).glob("*.tar"))
        size = sum(os.path.getsize(u) for u in urls)
        print(f"{len(urls)} shards, {size / 1e6:.0f} MB from {source}; {os.cpu_count()} cores")
        for round_ in range(args.rounds):
            started = time.perf_counter()
            samples = sum(1 for _ in ShardDataset(urls, shuffle=False))
            raw = time.perf_counter() - started
            started = time.perf_counter()
            build_index([scratch], workers=1, overwrite=True)
            one = time.perf_counter() - started
            started = time.perf_counter()
            build_index([scratch], workers=args.workers, overwrite=True)
            many = time.perf_counter() - started
            print(
                f"round {round_ + 1}: raw read {samples} samples in {raw:.2f} s ({samples / raw:,.0f}/s); "
                f"index build, 1 worker: {one:.2f} s = {raw / one:.2f}x the raw read's speed; "
                f"{args.workers} workers: {many:.2f} s = {raw / many:.2f}x"
            )


if __name__ == "__main__":
    main()
