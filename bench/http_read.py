"""Reading shards over http(s): shardstream against plain concurrent ranged GETs, in one run.

The shards are packed once (``shardstream pack``, 64 MiB shards) from a benchmark corpus
(bench/corpus.py: photos of 60-150 KB by default, ``--corpus small`` for ~18 KB JPEGs) and
served by nginx on 127.0.0.1 (:class:`servers.nginx.NginxServer` from tests/servers, https
with a self-signed certificate when ``--https``). Two readers, each in its own subprocess,
alternating for ``--rounds`` rounds so both see the same noise:

- ``limit``: aiohttp, ``--inflight`` concurrent ranged GETs of 16 MiB of every shard, bytes
  discarded: what the machine and nginx give;
- ``shardstream``: ``ShardDataset(URL, shuffle=False)`` over the dataset's index, one byte of
  every 4 KiB of each sample's payload touched (as bench/stream.py's raw readers), timed from
  the constructor to the last sample.

Printed: MB/s of shard bytes for each round and reader, the median of each, and their ratio
(target >= 0.9x). On 2 cores nginx shares the CPU with the reader, as SeaweedFS does in
bench/stream.py.

Usage:
    python bench/http_read.py [--corpus photos|small] [--num-images 4000] [--rounds 3] [--https]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # servers.nginx

import corpus


def read_limit(url: str, shards: list[tuple[str, int]], inflight: int, range_bytes: int = 16 << 20) -> int:
    """Ranged GETs of every shard, ``inflight`` at a time; returns the bytes received."""
    import ssl

    import aiohttp

    ranges = [(name, a, min(a + range_bytes, size) - 1) for name, size in shards for a in range(0, size, range_bytes)]

    async def get_all() -> int:
        context = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight * 2, ssl=context)) as session:
            limit = asyncio.Semaphore(inflight)

            async def get(name: str, first: int, last: int) -> int:
                async with limit, session.get(f"{url}/{name}", headers={"Range": f"bytes={first}-{last}"}) as response:
                    if response.status != 206:
                        raise RuntimeError(f"{url}/{name}: HTTP {response.status} to a ranged GET")
                    size = 0
                    async for chunk in response.content.iter_any():
                        size += len(chunk)
                    return size

            return sum(await asyncio.gather(*(get(*r) for r in ranges)))

    return asyncio.run(get_all())


def read_shardstream(url: str) -> int:
    from shardstream import ShardDataset

    payload = 0
    for sample in ShardDataset(url, shuffle=False):
        for key, value in sample.items():
            if not key.startswith("__"):
                view = memoryview(value)
                payload += len(view)
                for i in range(0, len(view), 4096):
                    view[i]
    return payload


def reader_main(name: str, url: str, shards_json: str, inflight: int) -> None:
    shards = [tuple(s) for s in json.loads(shards_json)]
    import aiohttp  # noqa: F401 - imports are not timed (torch takes a second)

    import shardstream.dataset  # noqa: F401

    started = time.perf_counter()
    if name == "limit":
        read_limit(url, shards, inflight)  # type: ignore[arg-type]
    else:
        read_shardstream(url)
    print(json.dumps({"seconds": time.perf_counter() - started}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("photos", "small"), default="photos")
    parser.add_argument("--num-images", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inflight", type=int, default=8, help="concurrent GETs of the limit reader")
    parser.add_argument("--https", action="store_true", help="serve over TLS (self-signed certificate)")
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--_reader", help=argparse.SUPPRESS)
    parser.add_argument("--_url", help=argparse.SUPPRESS)
    parser.add_argument("--_shards", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._reader:
        reader_main(args._reader, args._url, args._shards, args.inflight)
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
        rates: dict[str, list[float]] = {"limit": [], "shardstream": []}
        for round_ in range(args.rounds):
            order = ("limit", "shardstream") if round_ % 2 == 0 else ("shardstream", "limit")
            for name in order:
                out = subprocess.run(
                    [sys.executable, __file__, "--_reader", name, "--_url", url, "--_shards", json.dumps(shards),
                     "--inflight", str(args.inflight)],
                    env=env, check=True, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                seconds = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
                rates[name].append(total_bytes / seconds / 1e6)
                print(f"round {round_ + 1}: {name:<12} {total_bytes / seconds / 1e6:8.0f} MB/s ({seconds:.2f} s)")
    limit, ours = statistics.median(rates["limit"]), statistics.median(rates["shardstream"])
    ratio = ours / limit
    print(f"median: limit {limit:.0f} MB/s, shardstream {ours:.0f} MB/s: ratio {ratio:.2f}x (target >= 0.9x: "
          f"{'met' if ratio >= 0.9 else 'NOT met'})")  # fmt: skip


if __name__ == "__main__":
    main()
