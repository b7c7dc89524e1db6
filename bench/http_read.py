"""Reading shards over http(s): shardstream against plain concurrent ranged GETs, in one run.

The shards are packed once (``shardstream pack``, 64 MiB shards) from a benchmark corpus
(bench/corpus.py: photos of 60-150 KB by default, ``--corpus small`` for ~18 KB JPEGs) and
served by nginx on 127.0.0.1 (:class:`servers.nginx.NginxServer` from tests/servers, https
with a self-signed certificate when ``--https``). The readers, each in its own subprocess,
alternate for ``--rounds`` rounds so all see the same noise:

- ``limit``: aiohttp concurrent ranged GETs of every shard, bytes discarded, swept over 8 x
  16 MiB, 16 x 8 MiB and 32 x 4 MiB in flight (``limit-8x16``, ...) with asyncio's socket reads
  of 256 KiB, and 8 x 16 MiB with shardstream's, growing to 2 MiB (``limit-8x16-2m``): what the
  machine and nginx give, timed from session creation; the rate floor;
- ``keep-8x16-2m``, the keep floor: the GETs of ``limit-8x16-2m`` with each body kept until it
  is whole and every member inside it copied out as bytes by the dataset's index (read over
  http, as shardstream reads it) and touched as below: bench/stream.py's ``s3-keep`` over http,
  the least a reader does that hands out the samples' bytes; the CPU floor;
- ``shardstream``: ``ShardDataset(URL, shuffle=False)`` over the dataset's index, one byte of
  every 4 KiB of each sample's payload touched (as bench/stream.py's raw readers), timed from
  the constructor to the last sample;
- ``shardstream-256k``: the same with asyncio's socket reads of 256 KiB, as shardstream's
  were before they grew to 2 MiB where they fill
  (:data:`~shardstream.storage.requests.RECEIVE_BYTES`): what that gains, in the same run (no
  target).

Printed, for each round and reader, and the median of each: MB/s of shard bytes; the first
sample (the limits: first bytes) from construction; the reader process's CPU seconds (user +
system) split there (the keep floor: at its first bytes, as the limits): start-up, from the
process's start (interpreter, imports, session or dataset construction, the first sample),
reported on its own, and steady, from there to the end, per GB of shard bytes read after it and
per 1,000 samples after it. Targets: shardstream's rate >= 0.9x the best of the sweep (the rate
floor), its steady CPU per GB <= 1.15x the keep floor's (the CPU floor); its steady CPU per GB
against the best limit's is shown (no target). On 2 cores nginx shares the CPU with the reader,
as SeaweedFS does in bench/stream.py: the CPU ratio does not move with that, the rate ratio
does. The default corpus is ~2.4 GB of photos, so start-up is a small part of a run's rate.

``--pin`` (a diagnostic; the targets are read unpinned): each reader process on CPU 0 alone and
nginx on CPU 1, so shardstream's two threads (its event loop and the consumer) share one CPU as
the keep floor's one thread has it. Payloads copied while the other CPU moves memory (the
event loop receiving, nginx sending) cost more CPU per byte than copied with it idle
(bench/slicer.py ``--beside``: 60-120 KB payloads, 27.6 against 22.0 us a sample), a cost a
reader that overlaps receiving and slicing pays on its consumer's every payload and the
one-thread floor, whose receiving and copying take turns, pays on fewer; pinned, what is left
is the reader's own work.

Usage:
    python bench/http_read.py [--corpus photos|small] [--num-images 24000] [--rounds 3] [--https] [--pin]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # servers.nginx

import corpus
from procs import rusage_cpu_s

_FIRST: dict[str, float] = {}  # where the reader's start-up ended (its process runs one reader)


def mark_first(samples: int = 0, nbytes: int = 0) -> None:
    """Start-up ends here, the first time this is called: the reader has its first sample (a
    limit: its first bytes). Records the clock and the process's CPU seconds since it started;
    ``samples`` and ``nbytes``, what it has read by then, are left out of the steady figures."""
    if "cpu" not in _FIRST:
        mark_steady(samples, nbytes)
    _FIRST.setdefault("at", time.perf_counter())


def mark_steady(samples: int = 0, nbytes: int = 0) -> None:
    """The reader's CPU is split here (once), its first sample still timed by
    :func:`mark_first`: the keep floor calls it at its first bytes, as the limits' start-up
    ends, so that the receiving done before its first 16 MiB body is whole counts as steady
    work, as shardstream's does (bench/floors.py's ``mark_steady``)."""
    if "cpu" not in _FIRST:
        _FIRST.update(cpu=rusage_cpu_s(), samples=samples, bytes=nbytes)


def read_limit(
    url: str,
    shards: list[tuple[str, int]],
    inflight: int,
    range_bytes: int = 16 << 20,
    wide_reads: bool = False,
    on_body: Any = None,
) -> int:
    """Ranged GETs of every shard, ``inflight`` at a time; returns the bytes received.
    ``wide_reads``: each body read as the pieces received, socket reads growing to 2 MiB where
    they fill, as shardstream's stores read (:func:`~shardstream.storage.requests.aiohttp_pieces`);
    else by ``iter_any`` with asyncio's reads of 256 KiB. Without ``on_body`` the bytes are
    discarded as they arrive (start-up ends at the first); with it (the keep floor), each body
    is kept as those pieces (uncopied) until it is whole and handed to ``on_body(name,
    first_byte, pieces)``, which returns its byte count (bench/floors.py's ``keep_copier``)."""
    import ssl

    import aiohttp

    from shardstream.storage.requests import aiohttp_pieces

    ranges = [(name, a, min(a + range_bytes, size) - 1) for name, size in shards for a in range(0, size, range_bytes)]

    async def get_all() -> int:
        context = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight * 2, ssl=context)) as session:
            limit = asyncio.Semaphore(inflight)

            async def get(name: str, first: int, last: int) -> int:
                async with limit, session.get(f"{url}/{name}", headers={"Range": f"bytes={first}-{last}"}) as response:
                    if response.status != 206:
                        raise RuntimeError(f"{url}/{name}: HTTP {response.status} to a ranged GET")
                    pieces = aiohttp_pieces(response) if wide_reads else response.content.iter_any()
                    if on_body is None:
                        size = 0
                        async for piece in pieces:
                            if not size:
                                mark_first(0, len(piece))
                            size += len(piece)
                        return size
                    kept = []
                    async for piece in pieces:
                        if not kept:
                            mark_steady()
                        kept.append(piece)
                return on_body(name, first, kept)

            return sum(await asyncio.gather(*(get(*r) for r in ranges)))

    return asyncio.run(get_all())


def read_keep(url: str, shards: list[tuple[str, int]], inflight: int, range_bytes: int) -> int:
    """The keep floor: the GETs of ``limit-8x16-2m``, each body kept until it is whole, then
    every member lying wholly inside it copied out as ``bytes`` by the dataset's index (read
    over http, as shardstream reads it) and one byte of every 4 KiB touched: bench/stream.py's
    ``s3-keep`` over http, the least a reader does that hands out the samples' bytes. Returns
    the samples; its start-up's CPU ends at its first bytes (:func:`mark_steady`), its first
    sample is the first member copied."""
    from floors import keep_copier

    from shardstream import open_index

    copy_out, copied = keep_copier(open_index(url), mark_first)
    read_limit(url, shards, inflight, range_bytes, wide_reads=True, on_body=copy_out)
    return copied[0]


def read_shardstream(url: str) -> int:
    """Samples read (start-up ends at the first)."""
    from shardstream import ShardDataset

    samples = 0
    for sample in ShardDataset(url, shuffle=False):
        if not samples:
            mark_first(1)
        samples += 1
        for field in FIELDS:  # by name, as training code takes them (bench/floors.py's touched())
            bytes(memoryview(sample[field])[::4096])  # as the keep floor touches each member
    return samples


SWEEP = {  # in flight, bytes a GET, socket reads of up to 2 MiB
    "limit-8x16": (8, 16 << 20, False),
    "limit-16x8": (16, 8 << 20, False),
    "limit-32x4": (32, 4 << 20, False),
    "limit-8x16-2m": (8, 16 << 20, True),
}
FIELDS = ("jpg", "cls")  # the members of every sample of both corpora (bench/corpus.py)
KEEP = "keep-8x16-2m"  # the keep floor: limit-8x16-2m's GETs, bodies kept, members copied out


def reader_main(name: str, url: str, shards_json: str, cpu: int | None = None) -> None:
    """Run one reader; print its measurements as one JSON line. Its CPU (user + system of the
    process) is split at its first sample (a limit and the keep floor: its first bytes;
    :func:`mark_first`, :func:`mark_steady`):
    start-up, from the process's start (interpreter, imports, session or dataset
    construction, the first sample), and steady, from there to the end, with the bytes read
    after it (readers of samples: the shards' bytes times the share of samples after the
    first). ``cpu``: the process runs on that CPU alone (``--pin``)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    shards = [tuple(s) for s in json.loads(shards_json)]
    total_bytes = sum(size for _, size in shards)
    import aiohttp  # noqa: F401 - imports are not timed (torch takes a second); their CPU is start-up

    import shardstream.dataset  # noqa: F401
    from shardstream.storage import requests

    if name == "shardstream-256k":  # asyncio's own socket reads, as before shardstream widened them
        requests.RECEIVE_BYTES = 256 << 10
    if name == KEEP:  # the keep floor's imports, as the limits' and shardstream's above
        for module in ("numpy", "floors", "shardstream.index"):
            importlib.import_module(module)
    started = time.perf_counter()
    at_start = {"at": started, "cpu": rusage_cpu_s(), "samples": 0, "bytes": 0}
    if name in SWEEP:
        inflight, part, wide = SWEEP[name]
        nbytes = read_limit(url, shards, inflight, part, wide)  # type: ignore[arg-type]
        samples = 0
    else:
        samples = read_keep(url, shards, *SWEEP["limit-8x16-2m"][:2]) if name == KEEP else read_shardstream(url)
        nbytes = total_bytes
    seconds, cpu = time.perf_counter() - started, rusage_cpu_s()
    mark = _FIRST or at_start  # nothing read: steady from construction
    steady_samples = samples - int(mark["samples"])
    steady_bytes = nbytes - mark["bytes"] if not samples else total_bytes * steady_samples / samples
    print(json.dumps({"seconds": seconds, "first_s": mark["at"] - started if "at" in _FIRST else None,
                      "startup_cpu_s": mark["cpu"], "cpu_s": cpu - mark["cpu"], "samples": samples,
                      "steady_samples": steady_samples, "steady_bytes": steady_bytes}))  # fmt: skip


def served_dataset(name: str, num_images: int, shard_mib: int) -> tuple[Path, list[tuple[str, int]]]:
    """The folder nginx serves (its ``ds`` the dataset, packed once from the bench corpus
    ``name`` of ``num_images`` samples into shards of ``shard_mib`` MiB) and the shards'
    (name, bytes), sorted."""
    from shardstream import pack

    source = (corpus.photo_corpus if name == "photos" else corpus.small_corpus)(num_images)
    root = corpus.CACHE / f"http-{name}-{num_images}-{shard_mib}"
    if not (root / "ds" / "index.bin").exists():
        pack(source, root / "ds", max_shard_bytes=shard_mib << 20, progress=False)
    return root, sorted((p.name, p.stat().st_size) for p in (root / "ds").glob("*.tar"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("photos", "small"), default="photos")
    parser.add_argument("--num-images", type=int, default=24000, help="samples (photos: ~2.4 GB at the default)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--https", action="store_true", help="serve over TLS (self-signed certificate)")
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument(
        "--pin", action="store_true", help="a diagnostic: each reader on CPU 0 alone, nginx on CPU 1 (see above)"
    )
    parser.add_argument("--_cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--_reader", help=argparse.SUPPRESS)
    parser.add_argument("--_url", help=argparse.SUPPRESS)
    parser.add_argument("--_shards", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._reader:
        reader_main(args._reader, args._url, args._shards, args._cpu)
        return
    if args.pin and not {0, 1} <= os.sched_getaffinity(0):
        parser.error(
            f"--pin puts readers on CPU 0 and the server on CPU 1; this process may use {os.sched_getaffinity(0)}"
        )

    from servers.nginx import NginxServer

    root, shards = served_dataset(args.corpus, args.num_images, args.shard_mib)
    total_bytes = sum(size for _, size in shards)
    print(f"{len(shards)} shards, {total_bytes / 1e6:.0f} MB, corpus {args.corpus} ({args.num_images} samples)")
    pin = ["--_cpu", "0"] if args.pin else []
    if args.pin:  # nginx, started below, on CPU 1; each reader on CPU 0 (reader_main)
        os.sched_setaffinity(0, {1})
        print("pinned (a diagnostic): readers on CPU 0, nginx on CPU 1")
    with NginxServer(root, https=args.https) as server:
        env = dict(os.environ)
        if args.https:
            env["SSL_CERT_FILE"] = str(server.ca_file)
        url = f"{server.url}/ds"
        names = [*SWEEP, KEEP, "shardstream-256k", "shardstream"]
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            order = names if round_ % 2 == 0 else names[::-1]
            for name in order:
                out = subprocess.run(
                    [sys.executable, __file__, "--_reader", name, "--_url", url, "--_shards", json.dumps(shards), *pin],
                    env=env, check=True, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                run = json.loads(out.stdout.strip().splitlines()[-1])
                runs[name].append(run)
                first = "-" if run["first_s"] is None else f"{run['first_s']:.3f} s"
                print(
                    f"round {round_ + 1}: {name:<16} {total_bytes / run['seconds'] / 1e6:8.0f} MB/s "
                    f"({run['seconds']:.2f} s), first {'sample' if run['samples'] else 'bytes'} {first}, "
                    f"start-up {run['startup_cpu_s']:.2f} CPU s; steady {per_gb(run):.2f} CPU s/GB, "
                    f"{per_k(run)} CPU s/1k samples"
                )
    rate = {n: statistics.median(total_bytes / r["seconds"] / 1e6 for r in rs) for n, rs in runs.items()}
    cpu = {n: statistics.median(per_gb(r) for r in rs) for n, rs in runs.items()}
    startup = {n: statistics.median(r["startup_cpu_s"] for r in rs) for n, rs in runs.items()}
    best = max(SWEEP, key=rate.__getitem__)
    for name in names:
        per_1k = statistics.median(r["cpu_s"] / r["steady_samples"] * 1000 if r["steady_samples"] else math.nan
                                   for r in runs[name])  # fmt: skip
        print(
            f"median: {name:<16} {rate[name]:8.0f} MB/s, start-up {startup[name]:.2f} CPU s; steady "
            f"{cpu[name]:.2f} CPU s/GB, {'-' if math.isnan(per_1k) else f'{per_1k:.3f}'} CPU s/1k samples"
        )
    ratio, cpu_keep = rate["shardstream"] / rate[best], cpu["shardstream"] / cpu[KEEP]
    cpu_limit = cpu["shardstream"] / cpu[best]
    wide = cpu["shardstream"] / cpu["shardstream-256k"]
    print("targets (rate: against the fastest plain GETs; steady CPU per GB: against the keep floor):")
    print(f"  shardstream / {best} (the fastest plain GETs): {ratio:.2f}x the rate "
          f"(target >= 0.9x: {'met' if ratio >= 0.9 else 'NOT met'})")  # fmt: skip
    print(f"  shardstream / {KEEP} (the keep floor): {cpu_keep:.2f}x the steady CPU per GB "
          f"(target <= 1.15x: {'met' if cpu_keep <= 1.15 else 'NOT met'})")  # fmt: skip
    rounds = statistics.median(per_gb(s) / per_gb(k) for s, k in zip(runs["shardstream"], runs[KEEP]))
    print(f"  the same, the median of the rounds' ratios: {rounds:.2f}x (no target; the two run one after the "
          "other in each round, on the same state of the machine)")  # fmt: skip
    print(f"  shardstream / {best}: {cpu_limit:.2f}x the steady CPU per GB (no target)")
    print(f"  shardstream with reads growing to 2 MiB / with 256 KiB reads: {wide:.2f}x the steady CPU per GB, "
          f"{rate['shardstream'] / rate['shardstream-256k']:.2f}x the rate (no target)")  # fmt: skip


def per_gb(run: dict[str, float]) -> float:
    """A run's steady CPU seconds per GB of shard bytes read after its first sample (or bytes)."""
    return run["cpu_s"] / (run["steady_bytes"] / 1e9) if run["steady_bytes"] else math.nan


def per_k(run: dict[str, float]) -> str:
    """A run's steady CPU seconds per 1,000 samples after its first, or "-" (the limits)."""
    return f"{run['cpu_s'] / run['steady_samples'] * 1000:.3f}" if run["steady_samples"] else "-"


if __name__ == "__main__":
    main()
