"""The slicer alone: CPU per sample of cutting samples out of remote parts by their tables.

Writes ``--shards`` shards of 64 MiB with ``ShardWriter`` (samples of a random ``.jpg`` of
``--payload-kb``, 12-24 KB by default, the small corpus's shape; 60-120 for photos, and a
1-byte ``.cls``), holds each in memory cut as the S3 reader hands it on (parts of 16 MiB, each
in pieces of ``--piece-kib``, as aiohttp receives them), then times ``iter_sliced_batches`` over
every part of every shard, every sample iterated, ``--repeat`` times: CPU microseconds a sample
(median and best). No network, no threads: what shardstream's consumer thread does per sample,
the payload copies included. Beside it, each pass, the keep floor's work on the same bytes
(bench/floors.py's ``keep_copier``: every payload copied out by the table's offsets, no header
checked, no dict), and where both touch each sample's payload as the streaming benchmarks do
(one byte of every 4 KiB).

``--beside alone,spin,copy`` times each pass with this process on CPU 0 and, on CPU 1, nothing,
a Python busy loop, or a process copying 64 MiB arrays over and over (memory traffic, as a
receiving thread and a server make), the three interleaved pass by pass: what work running at
once on the machine's other CPU costs this one. shardstream overlaps its receiving (the event
loop's thread) with its slicing (the consumer's); the keep floor does one after the other in
one thread. On the 2-vCPU machine here (60-120 KB payloads, 8 shards, medians of 15 passes,
``--shards 8 --repeat 15 --payload-kb 60-120 --beside alone,spin,copy``) the slicer took 22.0
us a sample alone, 22.5 beside the busy loop and 27.6 beside the copying; the floor 18.8, 19.6
and 22.3: memory traffic on the other CPU, not its being busy, makes each copy dearer.

For a count that does not move with the machine's noise, run it under callgrind with
``--repeat 1`` and with ``--repeat 0`` (the set-up alone) and take the difference, memcpy
apart (callgrind counts ``rep movsb`` per byte), over the samples:

    valgrind --tool=callgrind --callgrind-out-file=cg.1 python bench/slicer.py --shards 2 --repeat 1
    valgrind --tool=callgrind --callgrind-out-file=cg.0 python bench/slicer.py --shards 2 --repeat 0
    callgrind_annotate cg.1 | grep -E "PROGRAM TOTALS|memcpy|memmove"   # and the same for cg.0

Usage:
    python bench/slicer.py [--shards 6] [--repeat 7] [--piece-kib 1024] [--payload-kb 12-24]
                           [--beside alone,spin,copy]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from floors import keep_copier

from shardstream import ShardWriter, open_index
from shardstream.reading.slicer import RunSlices, iter_sliced_batches
from shardstream.tarstream import Pieces

# Pieces as received: socket reads start at 256 KiB and grow to 2 MiB where they fill
# (shardstream.storage.requests.RECEIVE_BYTES); the median piece the slicer got in a read of the
# small corpus over http (nginx, 120,000 samples, 1,920 pieces) was 1 MiB (mean 1.13 MiB, 10th
# percentile 93 KiB). The per-piece costs (the header gather) weigh more at 256 KiB.
PIECE_KIB = 1024
PART_BYTES = 16 << 20  # FetchConfig().part_bytes
BESIDE = {  # what runs on CPU 1 while a pass is timed on CPU 0
    "alone": None,
    "spin": "while True: pass",
    "copy": "import numpy as np\na = np.ones(64 << 20, np.uint8)\nb = np.empty_like(a)\nwhile True: np.copyto(b, a)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=7, help="timed passes (0: the set-up alone)")
    parser.add_argument("--piece-kib", type=int, default=PIECE_KIB, help="bytes a received piece, KiB")
    parser.add_argument("--payload-kb", default="12-24", help="each .jpg's size range, KB (photos: 60-120)")
    parser.add_argument(
        "--beside", help=f"a list of {','.join(BESIDE)}: the slicer and the keep floor timed with each on the other CPU"
    )
    args = parser.parse_args()
    low, high = (int(kb) * 1000 for kb in args.payload_kb.split("-"))
    touch = args.beside is not None  # samples consumed as the streaming benchmarks consume them
    besides = args.beside.split(",") if touch else ["alone"]
    if unknown := set(besides) - set(BESIDE):
        parser.error(f"--beside: {', '.join(sorted(unknown))} unknown; choose from {', '.join(BESIDE)}")
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-slicer-") as tmp:
        rng = random.Random(0)
        with ShardWriter(tmp, max_shard_bytes=64 << 20) as writer:
            total, i = 0, 0
            while total < args.shards * (64 << 20) - (1 << 20):
                payload = rng.randbytes(rng.randrange(low, high))
                writer.write({"__key__": f"{i:08d}", "jpg": payload, "cls": b"3"})
                total, i = total + len(payload) + 1536, i + 1
        index = open_index(tmp)
        shards = []
        piece_bytes = args.piece_kib << 10
        for i in range(min(args.shards, index.num_shards)):
            data = Path(index.shard_url(i)).read_bytes()
            parts = []  # (first byte, pieces) a part
            for a in range(0, len(data), PART_BYTES):
                end = min(a + PART_BYTES, len(data))
                parts.append((a, [data[b : min(b + piece_bytes, end)] for b in range(a, end, piece_bytes)]))
            shards.append((index.table(i), parts, index.shard_url(i)))
        copy_out, _ = keep_copier(index)

    def one_pass() -> int:
        n = 0
        for table, parts, url in shards:
            run = RunSlices(table, np.arange(table.num_samples), url=url)
            for batch in iter_sliced_batches((Pieces(pieces) for _, pieces in parts), run):
                for sample in batch:
                    if touch:
                        bytes(memoryview(sample["jpg"])[::4096])
                    n += 1
        return n

    def floor_pass() -> int:
        for _, parts, url in shards:
            for first, pieces in parts:
                copy_out(url.rsplit("/", 1)[1], first, pieces)
        return sum(table.num_samples for table, _, _ in shards)

    if args.repeat == 0:
        print(f"{sum(table.num_samples for table, _, _ in shards)} samples in {len(shards)} shards: set up, not read")
        return
    if touch:
        os.sched_setaffinity(0, {0})
    passes: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeat):
        for beside in besides:
            other = None
            if BESIDE[beside] is not None:  # on CPU 1, dying with this process; timed once it is ready
                code = (
                    "import os\nfrom shardstream.packing.workers import die_with_parent\ndie_with_parent()\n"
                    f"if os.getppid() != {os.getpid()}:\n    raise SystemExit\nos.sched_setaffinity(0, {{1}})\n"
                    f"print('ready', flush=True)\n{BESIDE[beside]}"
                )
                other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
                if other.stdout is None or not other.stdout.readline():  # b"" once it has exited
                    raise RuntimeError(f"--beside {beside}: its process exited before it was ready")
            try:
                for work, run_pass in (
                    (("slicer", one_pass), ("floor", floor_pass)) if touch else (("slicer", one_pass),)
                ):
                    started = time.process_time()
                    samples = run_pass()
                    passes.setdefault((work, beside), []).append((time.process_time() - started) / samples * 1e6)
            finally:
                if other is not None:
                    other.kill()
                    other.wait()
    for (work, beside), per_sample in passes.items():
        print(
            f"{samples} samples in {len(shards)} shards, {work}{f' ({beside})' if touch else ''}: "
            f"{statistics.median(per_sample):.2f} CPU us a sample (median of {args.repeat}; best {min(per_sample):.2f})"
        )
    print("command: python bench/slicer.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
