"""Reading shards over http(s): shardstream against plain concurrent ranged GETs, in one run.

The shards are packed once (``shardstream pack``, 64 MiB shards) from a benchmark corpus
(bench/corpus.py: photos of 60-150 KB by default, ``--corpus small`` for ~18 KB JPEGs) and
served by nginx on 127.0.0.1 (:class:`servers.nginx.NginxServer` from tests/servers, https
with a self-signed certificate when ``--https``). Two readers, each in its own subprocess,
alternating for ``--rounds`` rounds so both see the same noise:

- ``limit``: aiohttp concurrent ranged GETs of every shard, bytes discarded, swept over 8 x
  16 MiB, 16 x 8 MiB and 32 x 4 MiB in flight (``limit-8x16``, ...) with asyncio's socket reads
  of 256 KiB, and 8 x 16 MiB with shardstream's, growing to 2 MiB (``limit-8x16-2m``): what the
  machine and nginx give, timed from session creation;
- ``shardstream``: ``ShardDataset(URL, shuffle=False)`` over the dataset's index, one byte of
  every 4 KiB of each sample's payload touched (as bench/stream.py's raw readers), timed from
  the constructor to the last sample (its first sample reported on its own);
- ``shardstream-256k``: the same with asyncio's socket reads of 256 KiB, as shardstream's
  were before they grew to 2 MiB where they fill
  (:data:`~shardstream.storage.requests.RECEIVE_BYTES`): what that gains, in the same run (no
  target).

Printed: MB/s of shard bytes and the reader process's CPU seconds (user + system) per GB and
per 1,000 samples, for each round and reader; the median of each; shardstream's rate against
the best of the sweep (target >= 0.85x) and its CPU per GB against that reader's (target <=
1.3x). On 2 cores nginx shares the CPU with the reader, as SeaweedFS does in bench/stream.py:
the CPU ratio does not move with that, the rate ratio does. The default corpus is ~2.4 GB of
photos, so start-up is a small part of a run.

Usage:
    python bench/http_read.py [--corpus photos|small] [--num-images 24000] [--rounds 3] [--https]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # servers.nginx

import corpus


def read_limit(
    url: str, shards: list[tuple[str, int]], inflight: int, range_bytes: int = 16 << 20, wide_reads: bool = False
) -> int:
    """Ranged GETs of every shard, ``inflight`` at a time; returns the bytes received.
    ``wide_reads``: each body read as the pieces received, socket reads growing to 2 MiB where
    they fill, as shardstream's stores read (:func:`~shardstream.storage.requests.aiohttp_pieces`);
    else by ``iter_any`` with asyncio's reads of 256 KiB."""
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
                    size = 0
                    async for piece in pieces:
                        size += len(piece)
                    return size

            return sum(await asyncio.gather(*(get(*r) for r in ranges)))

    return asyncio.run(get_all())


def read_shardstream(url: str, started: float) -> tuple[int, float | None]:
    """Samples read, and seconds from ``started`` to the first."""
    from shardstream import ShardDataset

    samples, first = 0, None
    for sample in ShardDataset(url, shuffle=False):
        if first is None:
            first = time.perf_counter() - started
        samples += 1
        for key, value in sample.items():
            if not key.startswith("__"):
                view = memoryview(value)
                for i in range(0, len(view), 4096):
                    view[i]
    return samples, first


SWEEP = {  # in flight, bytes a GET, socket reads of up to 2 MiB
    "limit-8x16": (8, 16 << 20, False),
    "limit-16x8": (16, 8 << 20, False),
    "limit-32x4": (32, 4 << 20, False),
    "limit-8x16-2m": (8, 16 << 20, True),
}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def reader_main(name: str, url: str, shards_json: str) -> None:
    shards = [tuple(s) for s in json.loads(shards_json)]
    import aiohttp  # noqa: F401 - imports are not timed (torch takes a second)

    import shardstream.dataset  # noqa: F401
    from shardstream.storage import requests

    if name == "shardstream-256k":  # asyncio's own socket reads, as before shardstream widened them
        requests.RECEIVE_BYTES = 256 << 10
    started, cpu = time.perf_counter(), _cpu_s()
    first = None
    if name in SWEEP:
        inflight, part, wide = SWEEP[name]
        read_limit(url, shards, inflight, part, wide)  # type: ignore[arg-type]
        samples = 0
    else:
        samples, first = read_shardstream(url, started)
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu_s": _cpu_s() - cpu, "samples": samples,
                      "first_s": first}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("photos", "small"), default="photos")
    parser.add_argument("--num-images", type=int, default=24000, help="samples (photos: ~2.4 GB at the default)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--https", action="store_true", help="serve over TLS (self-signed certificate)")
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--_reader", help=argparse.SUPPRESS)
    parser.add_argument("--_url", help=argparse.SUPPRESS)
    parser.add_argument("--_shards", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._reader:
        reader_main(args._reader, args._url, args._shards)
        return

    from servers.nginx import NginxServer

    from shardstream import pack

    source = (corpus.photo_corpus if args.corpus == "photos" else corpus.small_corpus)(args.num_images)
    root = corpus.CACHE / f"http-{args.corpus}-{args.num_images}-{args.shard_mib}"
    if not (root / "ds" / "index.bin").exists():
        pack(source, root / "ds", max_shard_bytes=args.shard_mib << 20, progress=False)
    shards = sorted((p.name, p.stat().st_size) for p in (root / "ds").glob("*.tar"))
    total_bytes = sum(size for _, size in shards)
    print(f"{len(shards)} shards, {total_bytes / 1e6:.0f} MB, corpus {args.corpus} ({args.num_images} samples)")
    with NginxServer(root, https=args.https) as server:
        env = dict(os.environ)
        if args.https:
            env["SSL_CERT_FILE"] = str(server.ca_file)
        url = f"{server.url}/ds"
        names = [*SWEEP, "shardstream-256k", "shardstream"]
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            order = names if round_ % 2 == 0 else names[::-1]
            for name in order:
                out = subprocess.run(
                    [sys.executable, __file__, "--_reader", name, "--_url", url, "--_shards", json.dumps(shards)],
                    env=env, check=True, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                run = json.loads(out.stdout.strip().splitlines()[-1])
                runs[name].append(run)
                per_k = f", {run['cpu_s'] / run['samples'] * 1000:.3f} CPU s/1k samples" if run["samples"] else ""
                first = f", first sample {run['first_s']:.3f} s" if run.get("first_s") is not None else ""
                print(
                    f"round {round_ + 1}: {name:<16} {total_bytes / run['seconds'] / 1e6:8.0f} MB/s "
                    f"({run['seconds']:.2f} s), {run['cpu_s'] / (total_bytes / 1e9):.2f} CPU s/GB{per_k}{first}"
                )
    rate = {n: statistics.median(total_bytes / r["seconds"] / 1e6 for r in rs) for n, rs in runs.items()}
    cpu = {n: statistics.median(r["cpu_s"] / (total_bytes / 1e9) for r in rs) for n, rs in runs.items()}
    best = max(SWEEP, key=rate.__getitem__)
    ratio, cpu_ratio = rate["shardstream"] / rate[best], cpu["shardstream"] / cpu[best]
    for name in names:
        print(f"median: {name:<16} {rate[name]:8.0f} MB/s, {cpu[name]:.2f} CPU s/GB")
    wide = cpu["shardstream"] / cpu["shardstream-256k"]
    print(f"shardstream with reads growing to 2 MiB / with 256 KiB reads: {wide:.2f}x the CPU per GB, "
          f"{rate['shardstream'] / rate['shardstream-256k']:.2f}x the rate (no target)")  # fmt: skip
    print(f"shardstream / {best} (the fastest plain GETs): {ratio:.2f}x the rate (target >= 0.85x: "
          f"{'met' if ratio >= 0.85 else 'NOT met'}), {cpu_ratio:.2f}x the CPU per GB (target <= 1.3x: "
          f"{'met' if cpu_ratio <= 1.3 else 'NOT met'})")  # fmt: skip


if __name__ == "__main__":
    main()
