"""Opening a dataset at scale: the index costs O(shards), never O(samples).

1. **Synthetic, 10^10 samples**: a manifest of 1,000,000 shards x 10,000 samples whose rows
   name a few real shards (each of 10,000 tiny samples, with its table), so reads work. For
   rank 0 of 1,024 with 8 DataLoader workers it measures: time and RSS to open
   (``ShardDataset(dest)``, over ``import shardstream, torch``), time to plan one worker's
   epoch, time to the first sample through ``DataLoader(num_workers=8)``, and
   ``shardstream info``.
2. **Real packs**: 1,000,000 tiny files packed into 16 shards and into 10,000 shards, and
   100,000 files into 16 shards (the reference): the same figures for one rank, and the RSS
   of the ``DataLoader(num_workers=2)`` process tree while it reads.

3. **Elastic resume at 10^10 samples** (``--elastic``, on the synthetic manifest): a job of
   1,024 ranks x 8 workers (DataLoader batch size 256) checkpointed half-way through epoch 0
   resumes at 512 ranks x 8; for rank 0 it measures the time and RSS to plan worker 0's piece
   of the rest, and to draw its first 10 emissions. Once for the dataset, once for a mixture of
   three sources over the same manifest (weights 0.6 / 0.3 / 0.1 of 10^10 samples).

4. **Key index** (``--key-index N``, default 10^7 keys): build ``keys/`` for N synthetic keys
   (``"%07d/%05d" % (shard, row)``, 13 bytes, in shards of 10,000) straight from synthetic
   tables; measure build time, peak RSS, the files' size in bytes per key, and 1,000 random
   lookups (time and bytes read each). ``--key-pack N`` also packs N tiny files and times
   ``shardstream index keys`` on the result: what the key index adds to ``pack``.

Each figure is taken in a fresh process. Targets (issues 15 and 24) are checked and printed.

Usage:
    python bench/scale.py [--files 1000000] [--workdir DIR] [--skip-synthetic] [--skip-real] [--elastic]
    python bench/scale.py --skip-synthetic --skip-real --key-index 10000000 [--key-pack 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARDS_SYNTHETIC = 1_000_000
SAMPLES_PER_SHARD = 10_000


def rss_mb(pid: int | str = "self", field: str = "VmRSS:", source: str = "status") -> float:
    try:
        for line in Path(f"/proc/{pid}/{source}").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_rss_mb(pid: int, *, proportional: bool = False) -> float:
    """RSS summed over a process and its descendants; ``proportional``: PSS, which counts a
    page shared by n processes (the forked workers' copy-on-write torch) as 1/n in each."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += rss_mb(current, "Pss:", "smaps_rollup") if proportional else rss_mb(current)
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == current:
                        todo.append(int(entry))
                except (OSError, IndexError):
                    pass
    return total


def measure(dest: str, world_size: int, num_workers: int) -> dict[str, float]:
    """In this (fresh) process: rank 0 of ``world_size`` opens ``dest``, plans, reads."""
    import threading

    import torch
    from torch.utils.data import DataLoader

    import shardstream  # noqa: F401
    from shardstream import ShardDataset
    from shardstream.reading.plan import EpochPlan

    base = rss_mb()
    started = time.perf_counter()
    dataset = ShardDataset(dest, shuffle_buffer=1000, seed=0)
    open_s = time.perf_counter() - started
    open_rss = rss_mb() - base

    started = time.perf_counter()  # the epoch's shard order (O(shards)), then one worker's piece
    plan = EpochPlan(counts=dataset.index.manifest.shard_samples, seed=0, epoch=0, shuffle_buffer=1000)
    mine, _ = plan.for_worker(rank=0, world_size=world_size, worker_id=0, num_workers=num_workers)
    first_emissions = list(zip(range(10), mine.emissions()))
    plan_s = time.perf_counter() - started
    del mine, first_emissions

    torch.set_num_threads(1)
    # The first sample as one reader sees it: worker 0 of rank 0 reads the same piece as the
    # only reader of rank 0 of world_size * num_workers ranks: in this process, then in one
    # DataLoader worker (a fork of this process first).
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", str(world_size * num_workers)
    started = time.perf_counter()
    next(iter(dataset))
    inline_first_s = time.perf_counter() - started
    dataset.set_epoch(0)
    started = time.perf_counter()
    next(iter(DataLoader(dataset, batch_size=None, num_workers=1)))
    reader_first_s = time.perf_counter() - started

    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", str(world_size)
    dataset.set_epoch(0)  # another DataLoader shape reads the dataset now
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers)
    peak, peak_pss = [0.0], [0.0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss_mb(os.getpid()))
            peak_pss[0] = max(peak_pss[0], tree_rss_mb(os.getpid(), proportional=True))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    it = iter(loader)
    next(it)
    first_s = time.perf_counter() - started
    for _ in range(2000):  # read on a while, so every worker is at work when the tree is measured
        next(it)
    time.sleep(0.3)
    stop.set()
    watcher.join()
    del it
    return {
        "open_s": open_s,
        "open_rss_mb": open_rss,
        "plan_s": plan_s,
        "inline_first_s": inline_first_s,
        "reader_first_s": reader_first_s,
        "first_sample_s": first_s,
        "tree_rss_mb": peak[0],
        "tree_pss_mb": peak_pss[0],
        "num_samples": dataset.num_samples,
        "num_shards": dataset.num_shards,
    }


def elastic(dest: str, kind: str) -> dict[str, float]:
    """In this (fresh) process: rank 0 of 512 x 8 resumes epoch 0 of ``dest`` (``kind``:
    "dataset" or "mixture") after 1,024 x 8 ranks consumed half of it in batches of 256."""
    from shardstream import ShardDataset, Source
    from shardstream.reading.epochs import PassState
    from shardstream.reading.plan import Segment

    if kind == "dataset":
        dataset = ShardDataset(dest, shuffle_buffer=1000, seed=0, batch_size=256)
    else:
        dataset = ShardDataset(
            [
                Source(dest, weight=0.6, name="a"),
                Source(dest, weight=0.3, name="b"),
                Source(dest, weight=0.1, name="c"),
            ],
            epoch_samples=10**10,
            shuffle_buffer=1000,
            seed=0,
            batch_size=256,
        )
    schedule = dataset._schedule
    per_rank = -(-dataset.num_samples // 1024)
    consumed = per_rank // 2 // 256 * 256
    closed = Segment(1024, 8, batch_size=256, samples_consumed=consumed, split_batch_size=256).to_dict()
    base = rss_mb()
    started = time.perf_counter()
    plan = schedule.plan(PassState(0, [closed]))
    mine, seg = plan.for_worker(rank=0, world_size=512, worker_id=0, num_workers=8)
    if kind == "dataset":
        first = list(zip(range(10), mine.emissions()))
    else:
        first = [list(zip(range(10), p.emissions())) for p in mine.sources] + [next(mine.labels())[:10]]
    took = time.perf_counter() - started
    remaining = plan.rank_count(world_size=512, num_workers=8)
    assert seg == 1 and first and remaining == -(-(dataset.num_samples - 1024 * consumed) // 512)
    return {"resume_s": took, "resume_rss_mb": rss_mb() - base, "rank_count": remaining, "worker_count": mine.count}


def run_child(dest: str, world_size: int, num_workers: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", dest, str(world_size), str(num_workers)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if out.returncode != 0:
        raise SystemExit(f"measuring {dest} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def info_s(dest: str) -> float:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "shardstream.cli", "info", dest], capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return time.perf_counter() - started


def tiny_files(root: Path, count: int) -> Path:
    """``count`` files of ~70 bytes in 1,000-file directories (made once)."""
    marker = root.with_name(root.name + ".done")
    if not marker.exists():
        for i in range(count):
            folder = root / f"d{i // 1000:05d}"
            if i % 1000 == 0:
                folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:08d}.txt").write_bytes(b"sample %08d of the scale benchmark, a tiny file\n" % i)
        marker.touch()
    return root


def synthetic(work: Path) -> str:
    """The 10^10-sample manifest over 4 real shards of 10,000 samples."""
    import numpy as np

    from shardstream import Manifest, open_index, pack

    dest = work / "synthetic"
    if (dest / "index.bin").exists():
        return str(dest)
    src = tiny_files(work / "files-40k", 4 * SAMPLES_PER_SHARD)
    pack(src, dest, max_samples_per_shard=SAMPLES_PER_SHARD, workers=1, progress=False)
    real = open_index(dest).manifest
    k = np.arange(SHARDS_SYNTHETIC) % real.num_shards
    manifest = Manifest.from_columns(
        names=(real.name(int(i)) for i in k),
        shard_bytes=real.shard_bytes[k],
        shard_samples=real.shard_samples[k],
        shard_members=real.shard_members[k],
        crc32=real.crc32[k],
    )
    with open(dest / "index.bin", "wb") as f:
        for piece in manifest.pieces():
            f.write(piece)
    return str(dest)


def key_index(work: Path, num_keys: int) -> dict[str, float]:
    """Build a key index of ``num_keys`` synthetic keys and time lookups (module doc, 4)."""
    import random
    import resource

    import numpy as np

    from shardstream import open_index
    from shardstream.index import KeyIndex, Manifest, ShardTable, write_key_index
    from shardstream.storage import LocalStore, write_pieces

    per_shard = 10_000
    num_shards = -(-num_keys // per_shard)
    counts = [min(per_shard, num_keys - s * per_shard) for s in range(num_shards)]
    manifest = Manifest.from_columns(
        names=(f"data-{s:07d}.tar" for s in range(num_shards)),
        shard_bytes=np.zeros(num_shards, np.int64),
        shard_samples=counts,
        shard_members=counts,
        crc32=np.zeros(num_shards, np.uint32),
    )

    def tables():
        for s, n in enumerate(counts):
            blob = "".join([f"{s:07d}/{r:05d}" for r in range(n)]).encode()
            columns = {
                "member_start": np.arange(n + 1, dtype=np.int64),
                "offsets": np.zeros(n, np.int64),
                "sizes": np.zeros(n, np.int64),
                "key_offsets": np.arange(n + 1, dtype=np.int64) * 13,
                "keys": np.frombuffer(blob, np.uint8),
                "name_offsets": np.zeros(n + 1, np.int64),
                "names": np.zeros(0, np.uint8),
            }
            yield ShardTable(shard=manifest.name(s), url="synthetic", columns=columns)

    dest = work / f"keys-{num_keys}"
    store = LocalStore(dest)
    store.check_writable()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = write_key_index(store, manifest, tables=tables(), spill_dir=str(work))
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    write_pieces(store, "index.bin", manifest.pieces())
    header_bytes = (dest / "keys" / "header.bin").stat().st_size
    opened = time.perf_counter()
    index = KeyIndex.open(open_index(dest))
    open_s = time.perf_counter() - opened
    assert index is not None
    rng = random.Random(0)
    probes = [rng.randrange(num_keys) for _ in range(1000)]
    started = time.perf_counter()
    for i in probes:
        s, r = divmod(i, per_shard)
        assert (s, r) in index.lookup(f"{s:07d}/{r:05d}")
    lookup_s = (time.perf_counter() - started) / len(probes)
    return {
        "num_keys": num_keys,
        "build_s": report.seconds,
        "bytes": report.bytes,
        "bytes_per_key": report.bytes / num_keys,
        "partitions": report.num_partitions,
        "header_bytes": header_bytes,
        "bucket_read_bytes": int(16 * index._capacity.max()),
        "peak_rss_mb": rss_peak,
        "rss_growth_mb": rss_peak - rss_before,
        "open_s": open_s,
        "lookup_ms": lookup_s * 1e3,
    }


def key_pack(work: Path, count: int) -> dict[str, float]:
    """Pack ``count`` tiny files into 16 shards, then time ``index keys`` on the result."""
    import shutil

    from shardstream import pack
    from shardstream.index import build_key_index

    src = tiny_files(work / f"files-{count}", count)
    dest = work / f"keypack-{count}"
    started = time.perf_counter()
    pack(src, dest, max_samples_per_shard=-(-count // 16), progress=False, overwrite=True)
    pack_s = time.perf_counter() - started
    shutil.rmtree(dest / "keys")
    report = build_key_index(dest)
    return {"files": count, "pack_s": pack_s, "keys_s": report.seconds, "bytes": report.bytes}


def row(label: str, r: dict[str, float], info: float) -> str:
    return (
        f"{label:34s} {r['num_samples']:>14,d} {r['num_shards']:>9,d} {r['open_s']:7.2f} s {r['open_rss_mb']:6.0f} MB "
        f"{r['plan_s']:6.2f} s {r['inline_first_s']:5.2f} / {r['reader_first_s']:4.2f} / {r['first_sample_s']:4.2f} s "
        f"{r['tree_rss_mb']:6.0f} / {r['tree_pss_mb']:4.0f} MB {info:6.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--elastic", action="store_true", help="also time an elastic resume at 10^10 samples")
    parser.add_argument("--key-index", type=int, metavar="N", help="build a key index of N synthetic keys")
    parser.add_argument("--key-pack", type=int, metavar="N", help="time the key index of a pack of N tiny files")
    parser.add_argument("--child", nargs=3, metavar=("DEST", "WORLD_SIZE", "WORKERS"), help=argparse.SUPPRESS)
    parser.add_argument("--child-elastic", nargs=2, metavar=("DEST", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), int(args.child[2]))))
        return
    if args.child_elastic:
        print(json.dumps(elastic(*args.child_elastic)))
        return
    work = args.workdir or Path(tempfile.mkdtemp(prefix="shardstream-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work directory {work}; {os.cpu_count()} cores")
    header = (
        f"{'dataset':34s} {'samples':>14s} {'shards':>9s} {'open':>9s} {'+RSS':>9s} {'plan':>8s} "
        f"{'1st sample: inline / 1 / N workers':>21s} {'tree RSS / PSS':>16s} {'info':>8s}"
    )
    checks = []
    if not args.skip_synthetic:
        dest = synthetic(work)
        r = run_child(dest, 1024, 8)
        info = info_s(dest)
        print(header)
        print(row("synthetic, rank 0 of 1,024 x 8", r, info))
        checks += [
            ("synthetic open <= 2 s", r["open_s"] <= 2),
            ("synthetic +RSS <= 300 MB", r["open_rss_mb"] <= 300),
            ("synthetic plan <= 1 s", r["plan_s"] <= 1),
            ("synthetic first sample <= 0.5 s (one reader, in process)", r["inline_first_s"] <= 0.5),
            ("synthetic first sample <= 0.5 s (one DataLoader worker)", r["reader_first_s"] <= 0.5),
            ("synthetic first sample <= 0.5 s (DataLoader, 8 workers)", r["first_sample_s"] <= 0.5),
            ("synthetic info < 2 s", info < 2),
        ]
    if args.elastic:
        dest = synthetic(work)
        for kind in ("dataset", "mixture"):
            out = subprocess.run(
                [sys.executable, __file__, "--child-elastic", dest, kind], capture_output=True, text=True, timeout=1200
            )
            if out.returncode != 0:
                raise SystemExit(f"elastic resume of the {kind} failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"elastic resume, 10^10-sample {kind}, 1,024 x 8 -> 512 x 8, rank 0 worker 0: "
                f"{r['resume_s']:.2f} s, +{r['resume_rss_mb']:.0f} MB ({r['rank_count']:,d} samples for the rank, "
                f"{r['worker_count']:,d} for the worker)",
                flush=True,
            )
            checks += [
                (f"elastic resume of the {kind} <= 2 s", r["resume_s"] <= 2),
                (f"elastic resume of the {kind} +RSS <= 300 MB", r["resume_rss_mb"] <= 300),
            ]
    if not args.skip_real:
        from shardstream import pack

        results = {}
        for count, shards in ((args.files // 10, 16), (args.files, 16), (args.files, 10_000)):
            src = tiny_files(work / f"files-{count}", count)
            dest = work / f"packed-{count}-{shards}"
            if not (dest / "index.bin").exists():
                started = time.perf_counter()
                pack(src, dest, max_samples_per_shard=-(-count // shards), progress=False)
                print(
                    f"packed {count:,d} files into {shards:,d} shards in {time.perf_counter() - started:.0f} s",
                    flush=True,
                )
            results[(count, shards)] = run_child(str(dest), 1, 2), info_s(str(dest))
        print(header)
        for (count, shards), (r, info) in results.items():
            print(row(f"{count:,d} files in {shards:,d} shards, 1 rank x 2", r, info))
        small, big16, big10k = (results[k][0] for k in results)
        checks += [
            ("1 M in 16 shards: open <= 0.5 s", big16["open_s"] <= 0.5),
            ("1 M in 10,000 shards: open <= 1.0 s", big10k["open_s"] <= 1.0),
            ("1 M open <= 2x the 100 k open", max(big16["open_s"], big10k["open_s"]) <= 2 * max(small["open_s"], 0.01)),
            ("1 M +RSS <= 150 MB", max(big16["open_rss_mb"], big10k["open_rss_mb"]) <= 150),
            (
                "1 M first sample <= 0.5 s (DataLoader, 2 workers)",
                max(big16["first_sample_s"], big10k["first_sample_s"]) <= 0.5,
            ),
            (
                "1 M DataLoader(num_workers=2) tree RSS <= 1.2 GB",
                max(big16["tree_rss_mb"], big10k["tree_rss_mb"]) <= 1200,
            ),
        ]
    if args.key_index:
        k = key_index(work, args.key_index)
        print(
            f"key index, {k['num_keys']:,d} keys: built in {k['build_s']:.1f} s (peak RSS {k['peak_rss_mb']:.0f} MB), "
            f"{k['bytes']:,d} bytes = {k['bytes_per_key']:.1f} bytes/key in {k['partitions']:,d} partitions, "
            f"header {k['header_bytes']:,d} bytes opened in {k['open_s'] * 1e3:.1f} ms; "
            f"a lookup reads {k['bucket_read_bytes']:,d} bytes, {k['lookup_ms']:.3f} ms locally",
            flush=True,
        )
        checks += [
            ("key index: a lookup reads <= 8 KB", k["bucket_read_bytes"] <= 8192),
            ("key index: <= 32 bytes per key", k["bytes_per_key"] <= 32),
        ]
    if args.key_pack:
        k = key_pack(work, args.key_pack)
        print(
            f"pack of {k['files']:,d} tiny files: {k['pack_s']:.1f} s in all, of which the key index "
            f"{k['keys_s']:.2f} s ({100 * k['keys_s'] / k['pack_s']:.1f} %), {k['bytes']:,d} bytes",
            flush=True,
        )
    for name, ok in checks:
        print(f"{'MET' if ok else 'NOT MET':8s} {name}")


if __name__ == "__main__":
    main()
