"""The slicer alone: CPU per sample of cutting samples out of remote parts by their tables.

Writes ``--shards`` shards of 64 MiB with ``ShardWriter`` (samples of a 12-24 KB random
``.jpg`` and a 1-byte ``.cls``, the small corpus's shape), holds each in memory cut as the S3
reader hands it on (parts of 16 MiB, each in pieces of ``--piece-kib``, as aiohttp receives them), then times
``iter_sliced_batches`` over every part of every shard, every sample iterated, ``--repeat``
times: CPU microseconds a sample (median and best). No network, no threads: what
shardstream's consumer thread does per sample, the payload copies included.

For a count that does not move with the machine's noise, run it under callgrind with
``--repeat 1`` and with ``--repeat 0`` (the set-up alone) and take the difference, memcpy
apart (callgrind counts ``rep movsb`` per byte), over the samples:

    valgrind --tool=callgrind --callgrind-out-file=cg.1 python bench/slicer.py --shards 2 --repeat 1
    valgrind --tool=callgrind --callgrind-out-file=cg.0 python bench/slicer.py --shards 2 --repeat 0
    callgrind_annotate cg.1 | grep -E "PROGRAM TOTALS|memcpy|memmove"   # and the same for cg.0

Usage:
    python bench/slicer.py [--shards 6] [--repeat 7] [--piece-kib 1024]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from shardstream import ShardWriter, open_index
from shardstream.reading.slicer import RunSlices, iter_sliced_batches
from shardstream.tarstream import Pieces

# Pieces as received: socket reads start at 256 KiB and grow to 2 MiB where they fill
# (shardstream.storage.requests.RECEIVE_BYTES); the median piece the slicer got in a read of the
# small corpus over http (nginx, 120,000 samples, 1,920 pieces) was 1 MiB (mean 1.13 MiB, 10th
# percentile 93 KiB). The per-piece costs (the header gather) weigh more at 256 KiB.
PIECE_KIB = 1024
PART_BYTES = 16 << 20  # FetchConfig().part_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=7, help="timed passes (0: the set-up alone)")
    parser.add_argument("--piece-kib", type=int, default=PIECE_KIB, help="bytes a received piece, KiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-slicer-") as tmp:
        rng = random.Random(0)
        with ShardWriter(tmp, max_shard_bytes=64 << 20) as writer:
            total, i = 0, 0
            while total < args.shards * (64 << 20) - (1 << 20):
                payload = rng.randbytes(rng.randrange(12000, 24000))
                writer.write({"__key__": f"{i:08d}", "jpg": payload, "cls": b"3"})
                total, i = total + len(payload) + 1536, i + 1
        index = open_index(tmp)
        shards = []
        piece_bytes = args.piece_kib << 10
        for i in range(min(args.shards, index.num_shards)):
            data = Path(index.shard_url(i)).read_bytes()
            parts = [
                Pieces(
                    [
                        data[b : min(b + piece_bytes, a + PART_BYTES)]
                        for b in range(a, min(a + PART_BYTES, len(data)), piece_bytes)
                    ]
                )
                for a in range(0, len(data), PART_BYTES)
            ]
            shards.append((index.table(i), parts, index.shard_url(i)))

    def one_pass() -> int:
        n = 0
        for table, parts, url in shards:
            run = RunSlices(table, np.arange(table.num_samples), url=url)
            for batch in iter_sliced_batches(parts, run):
                for _ in batch:
                    n += 1
        return n

    if args.repeat == 0:
        print(f"{sum(table.num_samples for table, _, _ in shards)} samples in {len(shards)} shards: set up, not read")
        return
    per_sample = []
    for _ in range(args.repeat):
        started = time.process_time()
        samples = one_pass()
        per_sample.append((time.process_time() - started) / samples * 1e6)
    print(
        f"{samples} samples in {len(shards)} shards: {statistics.median(per_sample):.2f} CPU us a sample "
        f"(median of {args.repeat}; best {min(per_sample):.2f})"
    )
    print("command: python bench/slicer.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
