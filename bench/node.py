"""A whole node reading: ranks x DataLoader workers, against the node's own limits, in one run.

For each layout ``RxW`` (``--layouts``, default 1x1,1x8,2x4,4x4,8x2: R rank processes with
RANK / WORLD_SIZE set, each a ``DataLoader(num_workers=W, batch_size=64)`` over
``ShardDataset(shuffle=False, batch_size=64)``, raw bytes, no decoding), from S3 and from local
disk, it measures the aggregate samples/s and GB/s (from the first process's start, after
its imports, to the last one's end) and the node's peak memory: the proportional set size (PSS) of every
process of the run summed, sampled every 0.2 s, so pages shared between a rank and its
forked workers count once. The limits use the same number of processes (R x W):
  - S3: that many processes each issuing 8 concurrent 16 MiB ranged GETs (aiobotocore) of
    its share of the shard objects, bytes discarded;
  - local: that many ``cat`` processes, each over its share of the shard files, to /dev/null.
Targets (issue 17): >= 0.9x of both limits at 8 processes or more; peak PSS <= R x (one
reader's baseline + ``FetchConfig.max_buffer_bytes``), the baseline being the peak PSS of
one rank with one worker reading local shards (nothing in flight from S3), measured in the
same run.

The corpus is the photo corpus of bench/stream.py (JPEGs of ~90 KB, 64 MiB shards, packed
anew to local disk and to a local SeaweedFS server started here). The page cache is warmed
first, so local reads measure the loader, not the disk. This needs a machine with the cores
for it: run it on the 16-core machine (the ``device`` tool), where the README's table comes
from; on 2 cores, ``--layouts 1x1,1x2,2x1`` checks that it runs.

``--collate bytes`` collates with :class:`shardstream.collate.ByteCollate` (the batches' bytes
cross from the workers in shared memory) instead of torch's default collate (pickled).

Usage:
    python bench/node.py [--num-images 10000] [--layouts 1x1,1x8,2x4,4x4,8x2] [--repeat 1] [--collate bytes]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from corpus import photo_corpus

BUCKET = "bench"
BATCH = 64
GET_BYTES = 16 << 20
GET_INFLIGHT = 8


def rank_main(source: str, fetch: str) -> None:
    """One rank: its share of the dataset through a DataLoader; prints samples and bytes."""
    from torch.utils.data import DataLoader

    from shardstream import FetchConfig, S3Config, ShardDataset
    from shardstream.collate import ByteCollate

    workers = int(os.environ["NODE_WORKERS"])
    collate = {"collate_fn": ByteCollate()} if os.environ.get("NODE_COLLATE") == "bytes" else {}
    start = time.time()  # after the imports: the clock covers dataset construction to the last batch
    s3 = S3Config() if source.startswith("s3://") else None
    dataset = ShardDataset(source, shuffle=False, batch_size=BATCH, s3=s3, fetch=FetchConfig(**json.loads(fetch)))
    samples = nbytes = 0
    for batch in DataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=workers,
        timeout=300,
        persistent_workers=False,
        prefetch_factor=2 if workers else None,
        **collate,
    ):
        samples += len(batch["__key__"])
        nbytes += sum(len(v) for field, values in batch.items() if not field.startswith("__") for v in values)
    print(json.dumps({"samples": samples, "bytes": nbytes, "start": start, "end": time.time()}), flush=True)


def get_main(keys_json: str) -> None:
    """One limit process: 8 concurrent 16 MiB ranged GETs of its objects; prints bytes."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    objects = json.loads(keys_json)
    start = time.time()

    async def run() -> int:
        async with get_session().create_client(
            "s3",
            endpoint_url=os.environ["S3_ENDPOINT_URL"],
            config=AioConfig(s3={"addressing_style": "path"}, max_pool_connections=16),
        ) as client:
            limit = asyncio.Semaphore(GET_INFLIGHT)

            async def get(key: str, first: int, last: int) -> int:
                async with limit:
                    response = await client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={first}-{last}")
                    size = 0
                    async with response["Body"] as body:
                        while chunk := await body.read(1 << 20):
                            size += len(chunk)
                    return size

            ranges = [
                (key, a, min(a + GET_BYTES, size) - 1) for key, size in objects for a in range(0, size, GET_BYTES)
            ]
            return sum(await asyncio.gather(*(get(*r) for r in ranges)))

    nbytes = asyncio.run(run())
    print(json.dumps({"bytes": nbytes, "start": start, "end": time.time()}), flush=True)


def pss_bytes(pids: set[int]) -> int:
    """Summed proportional set size of these processes (Linux smaps_rollup)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def descendants(roots: list[int]) -> set[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = set(roots), list(roots)
    while todo:
        p = todo.pop()
        for child, up in parent.items():
            if up == p and child not in found:
                found.add(child)
                todo.append(child)
    return found


def run_group(commands: list[list[str]], envs: list[dict[str, str]], timeout_s: float) -> tuple[float, int, list[dict]]:
    """Start the processes together; (seconds from the first one's start to the last one's end,
    as each reports them after its imports; peak summed PSS; their JSON outputs)."""
    started = time.perf_counter()
    processes = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, text=True) for c, e in zip(commands, envs)]
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], pss_bytes(descendants([p.pid for p in processes])))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    outputs = []
    try:
        for p in processes:
            out, _ = p.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - started)))
            if p.returncode != 0:
                raise SystemExit(f"{commands[processes.index(p)]} exited {p.returncode}")
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
        stop.set()
        watcher.join()
    return max(o["end"] for o in outputs) - min(o["start"] for o in outputs), peak[0], outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", type=int, default=10_000)
    parser.add_argument("--layouts", default="1x1,1x8,2x4,4x4,8x2", help="ranks x workers, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the fastest is shown")
    parser.add_argument(
        "--collate",
        choices=("default", "bytes"),
        default="default",
        help="the DataLoader's collate: torch's default (batches pickled) or shardstream.collate.ByteCollate",
    )
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--_rank", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--_get", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._rank:
        rank_main(*args._rank)
        return
    if args._get:
        get_main(args._get)
        return

    from shardstream import FetchConfig, pack
    from shardstream.testing import SeaweedS3Server

    layouts = [tuple(int(x) for x in layout.split("x")) for layout in args.layouts.split(",")]
    root = photo_corpus(args.num_images)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    budget = FetchConfig().max_buffer_bytes
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-node-") as scratch, SeaweedS3Server() as server:
        tmp = Path(scratch)
        server.create_bucket(BUCKET)
        local = tmp / "shards"
        (tmp / "files.txt").write_text("".join(f"{f}\n" for f in files))
        pack(root, local, max_shard_bytes=64 << 20, files_from=tmp / "files.txt", progress=False)
        info = server.info
        s3_url = f"s3://{BUCKET}/node"
        s3 = info.s3_config()
        pack(root, s3_url, max_shard_bytes=64 << 20, files_from=tmp / "files.txt", s3=s3, progress=False)
        shards = sorted(p for p in local.iterdir() if p.suffix == ".tar")
        total_bytes = sum(p.stat().st_size for p in shards)
        subprocess.run(["cat", *map(str, shards)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        base_env = {
            **os.environ,
            **info.env(),
            "S3_ENDPOINT_URL": info.endpoint_url,
            "AWS_EC2_METADATA_DISABLED": "true",
            "OMP_NUM_THREADS": "1",
        }
        print(
            f"{args.num_images} samples, {total_bytes / 1e9:.2f} GB in {len(shards)} shards; {os.cpu_count()} cores; "
            f"read-ahead budget {budget >> 20} MiB a rank",
            flush=True,
        )
        rows = []
        for ranks, workers in layouts:
            procs = ranks * max(workers, 1)
            for source in ("s3", "local"):
                url = s3_url if source == "s3" else str(local)
                best = None
                for _ in range(args.repeat):
                    commands = [[sys.executable, __file__, "--_rank", url, json.dumps({})] for _ in range(ranks)]
                    envs = [
                        {
                            **base_env,
                            "RANK": str(r),
                            "WORLD_SIZE": str(ranks),
                            "LOCAL_RANK": str(r),
                            "NODE_WORKERS": str(workers),
                            "NODE_COLLATE": args.collate,
                        }
                        for r in range(ranks)
                    ]
                    seconds, peak, outs = run_group(commands, envs, args.timeout_s)
                    samples = sum(o["samples"] for o in outs)
                    if best is None or seconds < best[0]:
                        best = (seconds, peak, samples, sum(o["bytes"] for o in outs))
                seconds, peak, samples, nbytes = best  # type: ignore[misc]
                parts = [shards[i::procs] for i in range(procs)]
                if source == "s3":
                    commands = [
                        [
                            sys.executable,
                            __file__,
                            "--_get",
                            json.dumps([(f"node/{p.name}", p.stat().st_size) for p in part]),
                        ]
                        for part in parts
                    ]
                else:
                    commands = [
                        [
                            sys.executable,
                            "-c",
                            "import subprocess,sys,json,time; t=time.time(); "
                            "subprocess.run(['cat', *sys.argv[1:]], stdout=subprocess.DEVNULL, check=True); "
                            "print(json.dumps({'start': t, 'end': time.time()}))",
                            *map(str, part),
                        ]
                        for part in parts
                    ]
                limit_s, _, _ = run_group(commands, [base_env] * len(commands), args.timeout_s)
                rows.append((ranks, workers, source, samples, seconds, nbytes, peak, limit_s))
                print(
                    f"{ranks}x{workers} {source}: {samples / seconds:,.0f} samples/s, "
                    f"{total_bytes / seconds / 1e9:.2f} GB/s, limit {total_bytes / limit_s / 1e9:.2f} GB/s, "
                    f"peak PSS {peak / 1e6:.0f} MB",
                    flush=True,
                )
    baseline = next((peak for r, w, src, *_, peak, _ in rows if (r, w, src) == (1, 1, "local")), None)
    print(
        f"\n{'ranks x workers':16s} {'from':6s} {'samples/s':>10s} {'GB/s':>6s} {'limit GB/s':>10s} {'/ limit':>8s} "
        f"{'peak PSS':>9s} {'PSS bound':>10s}"
    )
    for ranks, workers, source, samples, seconds, _nbytes, peak, limit_s in rows:
        ratio = limit_s / seconds
        bound = f"{ranks * (baseline + budget) / 1e6:8.0f}MB" if baseline else "-"
        print(
            f"{ranks:>6d} x {workers:<7d} {source:6s} {samples / seconds:10.0f} {total_bytes / seconds / 1e9:6.2f} "
            f"{total_bytes / limit_s / 1e9:10.2f} {ratio:7.2f}x {peak / 1e6:7.0f}MB {bound:>10s}"
        )
    print(
        "\ntargets: at 8 processes or more, >= 0.90x of the limit of the same number of processes "
        "(S3 ranged GETs, cat); peak PSS <= ranks x (the 1x1 local run's PSS + max_buffer_bytes)"
    )
    for ranks, workers, source, _samples, seconds, _nbytes, peak, limit_s in rows:
        if ranks * workers >= 8:
            ok = limit_s / seconds >= 0.9 and (baseline is None or peak <= ranks * (baseline + budget))
            print(f"  {ranks}x{workers} {source}: {'met' if ok else 'NOT met'}")
    print(
        f"command: python bench/node.py --num-images {args.num_images} --layouts {args.layouts} "
        f"--collate {args.collate}"
    )


if __name__ == "__main__":
    main()
