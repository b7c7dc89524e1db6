"""Raw read speed of packed shards: shardstream against its peers and the storage's limit.

Runs every reader on the same shards in one run (these machines are noisy, so compare the
ratios) and prints samples/s, MB/s and time to first sample:

- local disk: ``cat`` of the shard files (the limit), Python ``tarfile`` streaming,
  webdataset's ``WebDataset`` and shardstream's ``ShardDataset`` (raw bytes, no decoding);
- S3 (a local SeaweedFS started here): plain aiobotocore GETs of the shard objects, 8 at a
  time, bytes discarded (the limit), and ``ShardDataset`` from ``s3://``.

Usage: python bench/read.py [--num-images 3000] [--dir DIR_OF_FILES] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
import webdataset as wds
from corpus import aio_client

from shardstream import ShardDataset, pack
from shardstream.testing import SeaweedS3Server
from shardstream.testing.synth import make_image_dataset


def timed(read) -> tuple[int, int, float, float]:
    """Run ``read()`` (a generator of payload sizes); returns samples, bytes, seconds, first-sample s."""
    started = time.perf_counter()
    first = float("nan")
    samples = total = 0
    for size in read():
        if samples == 0:
            first = time.perf_counter() - started
        samples += 1
        total += size
    return samples, total, time.perf_counter() - started, first


def payload(sample: dict) -> int:
    return sum(len(v) for k, v in sample.items() if not k.startswith("__"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", type=int, default=3000)
    parser.add_argument("--dir", help="pack this directory instead of generated JPEGs")
    parser.add_argument("--repeat", type=int, default=3, help="runs per reader; the best is shown")
    parser.add_argument("--shard-size", type=int, default=16 << 20, help="bytes per shard")
    args = parser.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory(prefix="shardstream-bench-") as tmp, SeaweedS3Server() as server:
        src = Path(args.dir) if args.dir else Path(tmp) / "images"
        if not args.dir:
            make_image_dataset(src, num_images=args.num_images)
        local = Path(tmp) / "shards"
        pack(src, local, max_shard_bytes=args.shard_size, progress=False)
        shards = sorted(str(p) for p in local.glob("*.tar"))
        server.create_bucket("bench")
        info = server.info
        s3 = info.s3_config()
        pack(src, "s3://bench/shards", max_shard_bytes=args.shard_size, s3=s3, progress=False)
        names = [Path(p).name for p in shards]

        def cat():
            subprocess.run(["cat", *shards], stdout=subprocess.DEVNULL, check=True)
            yield from (0 for _ in range(0))

        def stdlib_tarfile():
            for url in shards:
                with tarfile.open(url, mode="r|") as tar:
                    for member in tar:
                        if member.isfile():
                            yield len(tar.extractfile(member).read())

        def webdataset():
            for sample in wds.WebDataset(shards, shardshuffle=False, empty_check=False):
                yield payload(sample)

        def shardstream_local():
            for sample in ShardDataset(local, shuffle=False):
                yield payload(sample)

        def s3_limit():

            async def get_all() -> list[int]:
                async with aio_client(info) as client:
                    limit = asyncio.Semaphore(8)

                    async def get(name: str) -> int:
                        async with limit:
                            response = await client.get_object(Bucket="bench", Key=f"shards/{name}")
                            size = 0
                            async with response["Body"] as body:
                                while chunk := await body.read(1 << 20):
                                    size += len(chunk)
                            return size

                    return await asyncio.gather(*(get(n) for n in names))

            yield from asyncio.run(get_all())

        def shardstream_s3():
            for sample in ShardDataset("s3://bench/shards", s3=s3, shuffle=False):
                yield payload(sample)

        total_bytes = sum(Path(p).stat().st_size for p in shards)
        readers = [
            ("local: cat (limit)", cat),
            ("local: tarfile", stdlib_tarfile),
            ("local: webdataset", webdataset),
            ("local: shardstream", shardstream_local),
            ("s3: aiobotocore 8 GETs (limit)", s3_limit),
            ("s3: shardstream", shardstream_s3),
        ]
        results = {}
        for name, read in readers:
            runs = [timed(read) for _ in range(args.repeat)]
            results[name] = min(runs, key=lambda r: r[2])
        num_samples = results["local: shardstream"][0]
        print(f"{len(shards)} shards, {num_samples} samples, {total_bytes / 1e6:.1f} MB; best of {args.repeat}")
        print(f"{'reader':34s} {'samples/s':>10s} {'MB/s':>8s} {'first sample':>13s}")
        for name, (samples, _, seconds, first) in results.items():
            rate = f"{num_samples / seconds:10.0f}" if samples else f"{'-':>10s}"
            first_ms = f"{first * 1e3:10.1f} ms" if samples else f"{'-':>13s}"
            print(f"{name:34s} {rate} {total_bytes / 1e6 / seconds:8.0f} {first_ms}")
        secs = {name: r[2] for name, r in results.items()}
        print(
            "ratios (speed): "
            f"local shardstream / webdataset = {secs['local: webdataset'] / secs['local: shardstream']:.2f}x, "
            f"/ cat = {secs['local: cat (limit)'] / secs['local: shardstream']:.2f}x; "
            "s3 shardstream / aiobotocore limit = "
            f"{secs['s3: aiobotocore 8 GETs (limit)'] / secs['s3: shardstream']:.2f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
