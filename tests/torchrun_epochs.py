"""Run under torchrun by tests/test_torchrun.py: each rank reads epochs of a ShardDataset
through a DataLoader and all-gathers the keys it saw; rank 0 writes them to OUT_DIR/epochs.json.
Each --also SOURCE OUT_DIR is read the same way after it, in the same processes.

With --stop-at-batch N, every rank stops after N batches of its first epoch, writes the
keys it consumed (OUT_DIR/consumed-<rank>.json) and rank 0 the data state
(OUT_DIR/state.json, from shardstream.loader_state_dict); once every SOURCE is stopped so, it
writes OUT_DIR/ready-<rank> in each OUT_DIR and waits to be killed. With --resume STATE (one
for each SOURCE) the run continues that epoch from the state, at whatever world size it has.

SOURCE may be a JSON file holding a mixture: a list of Source keyword arguments (with
--epoch-samples when some have a weight); keys are then "source|key". --replication K gives each
group of K consecutive ranks the same samples.

With --slow-rank R, rank R starts its first epoch only when every other rank has read its own
(OUT_DIR/read-<rank>), or after --slow-s seconds if one has not (as when iteration waits for rank R).

With --affinity the dataset keeps each node's shards (shard_affinity="node"); --cache-dir
gives it a node cache. Each rank's epoch record holds its cache counters (stats()).

With --persistent one DataLoader with persistent workers serves every epoch (else a new one
per epoch); with --no-set-epoch the loop never calls set_epoch, so each pass reads the next epoch.

Usage: torchrun ... tests/torchrun_epochs.py SOURCE OUT_DIR [--also SOURCE OUT_DIR] [--workers K] [--batch-size B]
       [--epochs E] [--drop-last] [--stop-at-batch N] [--resume STATE] [--slow-rank R] [--slow-s S]
       [--persistent] [--no-set-epoch]
"""

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader

from shardstream import ShardDataset, Source
from shardstream.dataset import loader_state_dict


def key_of(sample):
    if "__source__" in sample:
        return f"{sample['__source__']}|{sample['__key__']}"
    return sample["__key__"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--also", nargs=2, action="append", default=[], metavar=("SOURCE", "OUT_DIR"), help="read it next, the same way"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--stop-at-batch", type=int)
    parser.add_argument("--resume", type=Path, action="append", help="one STATE for each SOURCE, in their order")
    parser.add_argument("--slow-rank", type=int, help="this rank waits for the others' first epochs before its own")
    parser.add_argument("--slow-s", type=float, default=60.0, help="the most --slow-rank waits")
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--no-set-epoch", action="store_true")
    parser.add_argument("--epoch-samples", type=int)
    parser.add_argument("--replication", type=int, default=1)
    parser.add_argument("--affinity", action="store_true", help="ShardDataset(shard_affinity='node')")
    parser.add_argument("--cache-dir", help="the node cache (one per node); its bound is --cache-limit-bytes")
    parser.add_argument("--cache-limit-bytes", type=int, default=1 << 30)
    args = parser.parse_args()
    jobs = [(args.source, args.out_dir), *((source, Path(out)) for source, out in args.also)]
    resumes = args.resume or [None] * len(jobs)
    if len(resumes) != len(jobs):
        parser.error(f"{len(resumes)} --resume for {len(jobs)} sources")
    dist.init_process_group("gloo")
    stopped = [read(args, source, out_dir, resume) for (source, out_dir), resume in zip(jobs, resumes)]
    if args.stop_at_batch is not None:
        for _, out_dir in jobs:
            (out_dir / f"ready-{dist.get_rank()}").touch()
        while stopped:  # killed here by the test, as a node failure would, the stopped iterators (and workers) alive
            time.sleep(1)
    dist.destroy_process_group()


def read(args: argparse.Namespace, source: str, out_dir: Path, resume: Path | None) -> Iterator | None:
    """Read SOURCE's epochs as the module's docstring says, into OUT_DIR; with --stop-at-batch,
    the iterator of the stopped epoch."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mixture = {}
    if source.endswith(".json"):
        source = [Source(**spec) for spec in json.loads(Path(source).read_text())]
        mixture = {"epoch_samples": args.epoch_samples, "batch_size": args.batch_size}
    dataset = ShardDataset(
        source,
        decode=key_of,
        shuffle_buffer=8,
        seed=1,
        max_open_shards=2,
        drop_last=args.drop_last,
        replication=args.replication,
        shard_affinity="node" if args.affinity else None,
        cache_dir=args.cache_dir,
        cache_limit_bytes=args.cache_limit_bytes if args.cache_dir else None,
        **mixture,
    )
    first_epoch = 0
    if resume is not None:
        state = json.loads(resume.read_text())
        dataset.load_state_dict(state)
        first_epoch = state["epoch"]
    epochs = []

    def make_loader() -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=args.batch_size,
            num_workers=args.workers,
            persistent_workers=args.persistent and args.workers > 0,
        )

    shared = make_loader() if args.persistent else None
    for epoch in range(first_epoch, args.epochs):
        if not args.no_set_epoch:
            dataset.set_epoch(epoch)  # the loaded epoch keeps its checkpoint; a new one starts afresh
        expected = len(dataset)
        loader = shared if shared is not None else make_loader()
        keys, batches = [], 0
        if rank == args.slow_rank and epoch == first_epoch:
            others = [out_dir / f"read-{r}" for r in range(world_size) if r != rank]
            deadline = time.monotonic() + args.slow_s
            while not all(p.exists() for p in others) and time.monotonic() < deadline:
                time.sleep(0.05)
        started = time.time()
        iterator = iter(loader)
        for batch in iterator:
            keys.extend(batch)
            batches += 1
            if args.stop_at_batch is not None and epoch == first_epoch and batches == args.stop_at_batch:
                state = loader_state_dict(loader, samples_consumed=len(keys))
                (out_dir / f"consumed-{rank}.json").write_text(json.dumps(keys))
                if rank == 0:
                    (out_dir / "state.json").write_text(json.dumps(state))
                return iterator
        ended = time.time()
        if args.slow_rank is not None and epoch == first_epoch:
            (out_dir / f"read-{rank}").touch()
        gathered = [None] * world_size
        mine = {
            "keys": keys,
            "batches": batches,
            "len": expected,
            "started": started,
            "ended": ended,
            "epoch": dataset.epoch,
            "stats": {k: getattr(dataset.stats(), k) for k in ("cache_hits", "cache_misses", "cache_fills")},
        }
        dist.all_gather_object(gathered, mine)
        epochs.append({"epoch": epoch, "ranks": gathered})
    if rank == 0:
        (out_dir / "epochs.json").write_text(json.dumps(epochs))
    return None


if __name__ == "__main__":
    main()
