"""Where the reader's CPU goes against the keep floor's, by on-CPU sampling (Linux ``perf``).

bench/http_read.py gives each reader's CPU per GB; this says what that CPU is made of. Two
readers of bench/http_read.py, over its nginx and its dataset, each in its own process, in
alternating rounds: ``keep-8x16-2m`` (the keep floor: 8 x 16 MiB ranged GETs through aiohttp,
every payload copied out as ``bytes``, in one thread) and ``shardstream``
(``ShardDataset(url, shuffle=False)``, the same touch of each payload). Each process is
sampled by ``perf record -e cpu-clock -F 2000 -g`` from its first sample to its last (the
process waits for the sampler to attach; start-up and exit are not sampled), and the samples
are sorted, per thread, into:

- ``user copies``: libc's memmove/memcpy (aiohttp's parser copying each body piece out of the
  socket's read, the payloads copied out of the pieces);
- ``socket receive``: the kernel's receive path (``recv`` and everything under it: the copy
  from the socket's buffers into the process, the TCP work it does on the way);
- ``page faults``: the kernel's page-fault handling (fresh memory being touched);
- ``interpreter``: libpython (bytecode, objects, the GIL's hand-overs);
- ``numpy``: numpy's extension (the slicer's batch arithmetic);
- ``other kernel`` and ``other``: the rest (wake-ups, epoll, the scheduler; aiohttp's and
  asyncio's C parts).

Printed: for each round and reader, the CPU seconds per GB of each part (samples / 2000 Hz /
the GB read), per thread and in all; then the medians, and shardstream's minus the keep
floor's. A difference in ``user copies`` and ``socket receive`` is the same bytes copied at a
higher cost (the two readers copy the same bytes the same number of times); a difference in
``interpreter`` and ``numpy`` is work the reader does that the floor does not.

Needs ``perf`` (linux-tools) allowed to sample this user's processes
(``/proc/sys/kernel/perf_event_paranoid`` <= 2 samples user and, as root, kernel code).

Usage:
    python bench/oncpu.py [--corpus photos|small] [--num-images 24000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # servers.nginx


READERS = ("keep-8x16-2m", "shardstream")
FREQUENCY_HZ = 2000
PARTS = ("user copies", "socket receive", "page faults", "interpreter", "numpy", "other kernel", "other")


def part_of(frames: list[str]) -> str:
    """The part a sample's call chain (leaf first, ``symbol (dso)`` each) belongs to."""
    leaf = frames[0] if frames else "?"
    if "memmove" in leaf or "memcpy" in leaf:
        return "user copies"
    names = [frame.split(" (", 1)[0] for frame in frames]
    if "exc_page_fault" in names:
        return "page faults"
    if any(name in ("__sys_recvfrom", "sock_recvmsg", "__sys_recvmsg") for name in names):
        return "socket receive"
    if "[kernel.kallsyms]" in leaf:
        return "other kernel"
    if "libpython" in leaf:
        return "interpreter"
    if "_multiarray_umath" in leaf:
        return "numpy"
    return "other"


def read_samples(path: Path) -> collections.Counter[tuple[str, str]]:
    """Samples of a ``perf record -g`` file by (thread, part); the thread is ``main`` when its
    id is the process's, else ``others`` (shardstream's event loop; the floor's index reads)."""
    out = subprocess.run(
        ["perf", "script", "-i", str(path), "-F", "pid,tid,ip,sym,dso"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    head: list[str] | None = None
    frames: list[str] = []
    for line in [*out.splitlines(), ""]:
        if not line.strip():
            if head is not None:
                pid, tid = head[0].split("/") if "/" in head[0] else (head[0], head[1])
                thread = "main" if pid == tid else "others"
                counts[(thread, part_of(frames))] += 1
            head, frames = None, []
        elif head is None and not line.startswith("\t"):
            head = line.split()
        else:
            frames.append(line.strip().split(None, 1)[-1])
    return counts


def by_part(figures: dict[tuple[str, str], float]) -> dict[str, float]:
    """``figures`` by (thread, part), summed over the threads."""
    return {part: sum(v for (_, p), v in figures.items() if p == part) for part in PARTS}


def reader_main(name: str, url: str, shards_json: str) -> None:
    """Run ``name`` as bench/http_read.py does; at its first sample, say so on stdout and wait
    for a line on stdin (the sampler attaches meanwhile); at its end, print its figures and
    wait again (the sampler stops before the process's exit)."""
    import http_read

    first = http_read.mark_first

    def mark_and_wait(*args: object, **kwargs: object) -> None:
        first(*args, **kwargs)  # type: ignore[arg-type]
        print("first", flush=True)
        sys.stdin.readline()

    http_read.mark_first = mark_and_wait
    http_read.reader_main(name, url, shards_json)  # prints its JSON line
    sys.stdout.flush()
    sys.stdin.readline()


def sample_reader(name: str, url: str, shards: list[tuple[str, int]], out: Path) -> dict[str, float]:
    """One reader's process, sampled from its first sample to its end; its JSON figures."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--_reader", name, "--_url", url, "--_shards", json.dumps(shards)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    perf = None
    try:
        assert child.stdin is not None and child.stdout is not None
        if child.stdout.readline().strip() != "first":
            raise RuntimeError(f"{name}: the reader ended before its first sample")
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQUENCY_HZ), "-g", "-p", str(child.pid),
             "-o", str(out)],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)  # perf attaches; the reader waits
        child.stdin.write("go\n")
        child.stdin.flush()
        run = json.loads(child.stdout.readline())
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=60)
        child.stdin.write("end\n")
        child.stdin.flush()
        child.wait(timeout=60)
        return run
    finally:
        for proc in (perf, child):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("photos", "small"), default="photos")
    parser.add_argument("--num-images", type=int, default=24000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--_reader", help=argparse.SUPPRESS)
    parser.add_argument("--_url", help=argparse.SUPPRESS)
    parser.add_argument("--_shards", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._reader:
        reader_main(args._reader, args._url, args._shards)
        return
    if shutil.which("perf") is None:
        parser.error("needs Linux perf on PATH (linux-tools)")

    from http_read import served_dataset
    from servers.nginx import NginxServer

    root, shards = served_dataset(args.corpus, args.num_images, args.shard_mib)
    print(f"{len(shards)} shards, {sum(s for _, s in shards) / 1e6:.0f} MB, corpus {args.corpus}")
    per_gb: dict[str, list[dict[tuple[str, str], float]]] = {name: [] for name in READERS}
    with NginxServer(root) as server, tempfile.TemporaryDirectory(prefix="oncpu-") as tmp:
        url = f"{server.url}/ds"
        for round_ in range(args.rounds):
            for name in READERS if round_ % 2 == 0 else READERS[::-1]:
                out = Path(tmp) / f"{name}-{round_}.perf"
                run = sample_reader(name, url, shards, out)
                gb = run["steady_bytes"] / 1e9
                counts = read_samples(out)
                figures = {key: n / FREQUENCY_HZ / gb for key, n in counts.items()}
                per_gb[name].append(figures)
                parts = by_part(figures)
                print(
                    f"round {round_ + 1}: {name:<13} {run['cpu_s'] / gb:.2f} CPU s/GB by rusage, "
                    f"{sum(parts.values()):.2f} sampled: " + ", ".join(f"{p} {v:.3f}" for p, v in parts.items())
                )
    print("medians, CPU s/GB (main: the consumer, or the keep floor's one thread; others: shardstream's event loop)")
    medians = {}
    for name in READERS:
        threads = sorted({t for figures in per_gb[name] for t, _ in figures}, key=lambda t: (t != "main", t))
        medians[name] = {part: statistics.median(by_part(f)[part] for f in per_gb[name]) for part in PARTS}
        for thread in threads:
            row = {part: statistics.median(f.get((thread, part), 0.0) for f in per_gb[name]) for part in PARTS}
            if sum(row.values()) >= 0.01:
                print(f"  {name:<13} {thread:<13} " + "  ".join(f"{p} {v:.3f}" for p, v in row.items()))
        print(f"  {name:<13} {'all':<13} " + "  ".join(f"{p} {v:.3f}" for p, v in medians[name].items())
              + f"  total {sum(medians[name].values()):.3f}")  # fmt: skip
    keep, ours = medians["keep-8x16-2m"], medians["shardstream"]
    print("shardstream minus the keep floor, CPU s/GB (share of the floor's total):")
    floor = sum(keep.values())
    for part in PARTS:
        print(f"  {part:<15} {ours[part] - keep[part]:+.3f} ({(ours[part] - keep[part]) / floor:+.1%})")
    print(f"  {'total':<15} {sum(ours.values()) - floor:+.3f} ({sum(ours.values()) / floor:.2f}x the floor)")


if __name__ == "__main__":
    main()
