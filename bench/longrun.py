"""Long runs: many epochs from S3 through a DataLoader with workers keep memory flat and leave
nothing behind.

Packs a small image dataset into a local SeaweedFS, then reads ``--epochs`` epochs through
``DataLoader(ShardDataset(..., cache_dir=...), num_workers=2)``. After each epoch it prints
the RSS of this process and (mid-epoch) of its whole process tree, the number of threads, child
processes, open file descriptors and shardstream files in /dev/shm and the temp directory.
At the end it checks: RSS of the last epoch within 10% (+20 MB) of the second's, and, once
the loader and dataset are gone, no child process, no extra thread, no shardstream file left.

Usage:
    python bench/longrun.py [--epochs 20] [--num-images 2000] [--workers 2] [--persistent-workers]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def tree(pid: int) -> list[int]:
    found = [pid]
    for child in children(pid):
        found += tree(child)
    return found


def leftovers() -> list[str]:
    places = ["/dev/shm", tempfile.gettempdir()]
    return sorted(str(p) for place in places if os.path.isdir(place) for p in Path(place).glob("shardstream-*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--persistent-workers", action="store_true")
    args = parser.parse_args()

    from torch.utils.data import DataLoader

    from shardstream import CpuDecoder, RandomResizedCrop, ShardDataset, pack
    from shardstream.testing import SeaweedS3Server
    from shardstream.testing.synth import make_image_dataset

    me = os.getpid()
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-longrun-") as tmp, SeaweedS3Server() as server:
        make_image_dataset(f"{tmp}/images", num_images=args.num_images, min_side_px=96, max_side_px=192)
        server.create_bucket("longrun")
        info = server.info
        s3 = info.s3_config()
        pack(f"{tmp}/images", "s3://longrun/data", max_shard_bytes=4 << 20, s3=s3, progress=False)
        before = leftovers()
        threads_before = threading.active_count()
        dataset = ShardDataset(
            "s3://longrun/data",
            s3=s3,
            cache_dir=f"{tmp}/cache",
            cache_limit_bytes=8 << 20,
            batch_size=32,
            decode=CpuDecoder("torch", crop=RandomResizedCrop(size_px=64)),
        )
        loader = DataLoader(
            dataset,
            batch_size=32,
            num_workers=args.workers,
            persistent_workers=args.persistent_workers and args.workers > 0,
        )
        print(
            f"{'epoch':>5s} {'samples':>8s} {'RSS main':>9s} {'RSS tree':>9s} {'threads':>8s} {'children':>9s} "
            f"{'fds':>5s} {'hit rate':>9s}"
        )
        rss = []
        server_pids = set(tree(server.pid))
        for epoch in range(args.epochs):
            dataset.set_epoch(epoch)
            count, tree_rss = 0, 0
            for i, batch in enumerate(loader):
                count += len(batch["cls"])
                if i == 20:  # mid-epoch, workers alive: the whole tree (this process and its workers)
                    mine = [p for p in tree(me) if p not in server_pids]
                    tree_rss = sum(rss_bytes(p) for p in mine if Path(f"/proc/{p}").exists())
            rss.append((rss_bytes(me), tree_rss))
            hit = dataset.stats().cache_hit_rate
            print(
                f"{epoch:5d} {count:8d} {rss[-1][0] / 1e6:8.0f}M {rss[-1][1] / 1e6:8.0f}M "
                f"{threading.active_count():8d} {len([p for p in children(me) if p not in server_pids]):9d} "
                f"{len(os.listdir('/proc/self/fd')):5d} {'-' if hit is None else f'{hit:.0%}':>9s}"
            )
        del loader, dataset
        gc.collect()
        left_children = [p for p in children(me) if p not in server_pids]
        left_files = [f for f in leftovers() if f not in before]
        grown = rss[-1][0] - rss[1][0]
        flat = all(late <= early * 1.10 + 20e6 for late, early in zip(rss[-1], rss[1]))
        print(
            f"\nRSS epoch 1 -> {args.epochs - 1}: main {rss[1][0] / 1e6:.0f} -> {rss[-1][0] / 1e6:.0f} MB "
            f"({grown / 1e6:+.0f} MB), tree {rss[1][1] / 1e6:.0f} -> {rss[-1][1] / 1e6:.0f} MB: "
            f"{'flat' if flat else 'GROWING'}"
        )
        print(
            f"after the loader is gone: {len(left_children)} child processes, "
            f"{threading.active_count() - threads_before:+d} threads (the I/O loop thread may stay), "
            f"{len(left_files)} shardstream files left in /dev/shm or tmp"
        )
        print("command: python bench/longrun.py " + " ".join(sys.argv[1:]))
        if not flat or left_children or left_files:
            sys.exit(1)


if __name__ == "__main__":
    main()
