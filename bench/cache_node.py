"""A node's processes sharing one node cache: per-epoch time, downloads per shard, peak cache size.

Starts a local SeaweedFS, packs a synthetic dataset into it, then runs ``--processes`` training
processes at once (``tests/cache_share.py``: a DataLoader of ``--workers`` workers each, 2
epochs) that share one ``cache_dir`` of ``--limit`` times the dataset's size. As ranks of one
job (``--mode ranks``: RANK / WORLD_SIZE set, each shard read by one rank an epoch) or as
independent jobs on the node (``--mode jobs``: each reads the whole dataset in its own order,
the most contention). It prints, per epoch: the slowest process's time, S3 reads per shard on
the node (cache misses, whole shards or ranges of shards cut at a rank or worker boundary, over
shards: 1.0 means each shard came from S3 about once), fills, waits for
another process's download, bypasses; and the peak bytes under the cache directory against
its limit. Nothing may hang: each run is bounded by ``--timeout-s``.

Usage:
    python bench/cache_node.py [--processes 8] [--workers 4] [--mode ranks|jobs] [--limit 2.0]
        [--num-samples 20000] [--sample-bytes 50000] [--shard-bytes 64MiB]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "cache_share.py"


def peak_watch(root: Path, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        total = 0
        if root.exists():
            for entry in os.scandir(root):
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    pass
        peak[0] = max(peak[0], total)
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--mode", choices=["ranks", "jobs"], default="ranks")
    parser.add_argument("--limit", type=float, default=2.0, help="cache limit as a multiple of the dataset's bytes")
    parser.add_argument("--num-samples", type=int, default=20000)
    parser.add_argument("--sample-bytes", type=int, default=50000)
    parser.add_argument("--shard-bytes", default="64MiB")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=900)
    args = parser.parse_args()

    from shardstream import open_index, pack
    from shardstream.cli import parse_size
    from shardstream.testing import SeaweedS3Server

    with tempfile.TemporaryDirectory() as tmp, SeaweedS3Server(data_dir=f"{tmp}/s3") as server:
        info = server.info
        s3 = info.s3_config()
        src = Path(tmp) / "src"
        rng = random.Random(0)
        for i in range(args.num_samples):
            folder = src / f"c{i % 10}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:07d}.bin").write_bytes(rng.randbytes(args.sample_bytes))
            (folder / f"{i:07d}.cls").write_text(str(i % 10))
        server.create_bucket("node")
        pack(src, "s3://node/data", max_shard_bytes=parse_size(args.shard_bytes), s3=s3, progress=False)
        index = open_index("s3://node/data", s3=s3).as_v1()
        num_shards, dataset_bytes = len(index.shards), sum(s.bytes for s in index.shards)
        limit_bytes = int(args.limit * dataset_bytes)
        cache_dir = Path(tmp) / "cache"
        print(
            f"{args.processes} processes x {args.workers} workers ({args.mode}), {args.num_samples} samples, "
            f"{num_shards} shards, {dataset_bytes / 1e6:.0f} MB, cache limit {limit_bytes / 1e6:.0f} MB "
            f"({args.limit}x), {os.cpu_count()} cores",
            flush=True,
        )

        stop, peak = threading.Event(), [0]
        watcher = threading.Thread(
            target=peak_watch, args=(cache_dir / "shardstream-cache-v1", stop, peak), daemon=True
        )
        watcher.start()
        processes, outs = [], []
        started = time.perf_counter()
        for p in range(args.processes):
            env = {**os.environ, **info.env(), "OMP_NUM_THREADS": "1"}
            if args.mode == "ranks":
                env.update(RANK=str(p), WORLD_SIZE=str(args.processes))
            out = Path(tmp) / f"out-{p}.json"
            outs.append(out)
            seed = 0 if args.mode == "ranks" else p
            processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(SCRIPT),
                        "s3://node/data",
                        str(cache_dir),
                        str(limit_bytes),
                        str(out),
                        f"--epochs={args.epochs}",
                        f"--workers={args.workers}",
                        f"--seed={seed}",
                    ],
                    env=env,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        hung = False
        for process in processes:
            try:
                _, err = process.communicate(timeout=max(1.0, args.timeout_s - (time.perf_counter() - started)))
            except subprocess.TimeoutExpired:
                hung = True
                break
            if process.returncode != 0:
                raise SystemExit(f"a process failed: {err[-3000:]}")
        if hung:
            for process in processes:
                process.kill()
            raise SystemExit(f"HUNG: not done after {args.timeout_s} s")
        stop.set()
        watcher.join()
        runs = [json.loads(out.read_text()) for out in outs]
        expected = sorted(x.key for s in index.shards for x in s.samples)
        for epoch in range(args.epochs):
            rows = [run[epoch] for run in runs]
            keys = sorted(k for row in rows for k in row["keys"])
            exact = keys == expected if args.mode == "ranks" else all(row["keys"] == expected for row in rows)
            total = {
                k: sum(row["stats"][k] for row in rows)
                for k in ("cache_misses", "cache_hits", "cache_fills", "cache_waits", "cache_bypasses")
            }
            print(
                f"epoch {epoch}: {max(row['seconds'] for row in rows):6.1f} s (slowest process), "
                f"S3 reads per shard on the node {total['cache_misses'] / num_shards:.2f} (whole or a range), "
                f"fills {total['cache_fills']}, waits {total['cache_waits']}, bypasses {total['cache_bypasses']}, "
                f"hits {total['cache_hits']}, every sample {'exactly once' if exact else 'NOT exact'}",
                flush=True,
            )
        print(
            f"peak cache size {peak[0] / 1e6:.1f} MB, limit {limit_bytes / 1e6:.1f} MB "
            f"(+ one shard allowed: {max(s.bytes for s in index.shards) / 1e6:.1f} MB)"
        )


if __name__ == "__main__":
    main()
