"""Run under torchrun by tests/test_torchrun.py: each rank reads epochs of a ShardDataset
through a DataLoader and all-gathers the keys it saw; rank 0 writes them to OUT_DIR/epochs.json.

With --stop-at-batch N, every rank stops after N batches of its first epoch, writes the
keys it consumed (OUT_DIR/consumed-<rank>.json) and rank 0 the data state
(OUT_DIR/state.json, from shardstream.loader_state_dict), then waits to be killed. With
--resume STATE the run continues that epoch from the state, at whatever world size it has.

SOURCE may be a JSON file holding a mixture: a list of Source keyword arguments (with
--epoch-samples when some have a weight); keys are then "source|key". --replication K gives each
group of K consecutive ranks the same samples.

With --persistent one DataLoader with persistent workers serves every epoch (else a new one
per epoch); with --no-set-epoch the loop never calls set_epoch, so each pass reads the next epoch.

Usage: torchrun ... tests/torchrun_epochs.py SOURCE OUT_DIR [--workers K] [--batch-size B]
       [--epochs E] [--drop-last] [--stop-at-batch N] [--resume STATE] [--persistent]
       [--no-set-epoch]
"""

import argparse
import json
import time
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
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--stop-at-batch", type=int)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--slow-rank", type=int, help="this rank sleeps --slow-s before its first epoch")
    parser.add_argument("--slow-s", type=float, default=0.0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--no-set-epoch", action="store_true")
    parser.add_argument("--epoch-samples", type=int)
    parser.add_argument("--replication", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    source = args.source
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
        **mixture,
    )
    first_epoch = 0
    if args.resume is not None:
        state = json.loads(args.resume.read_text())
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
            time.sleep(args.slow_s)
        started = time.time()
        for batch in loader:
            keys.extend(batch)
            batches += 1
            if args.stop_at_batch is not None and epoch == first_epoch and batches == args.stop_at_batch:
                state = loader_state_dict(loader, samples_consumed=len(keys))
                (args.out_dir / f"consumed-{rank}.json").write_text(json.dumps(keys))
                if rank == 0:
                    (args.out_dir / "state.json").write_text(json.dumps(state))
                (args.out_dir / f"ready-{rank}").touch()
                while True:  # killed here by the test, as a node failure would
                    time.sleep(1)
        ended = time.time()
        gathered = [None] * world_size
        mine = {
            "keys": keys,
            "batches": batches,
            "len": expected,
            "started": started,
            "ended": ended,
            "epoch": dataset.epoch,
        }
        dist.all_gather_object(gathered, mine)
        epochs.append({"epoch": epoch, "ranks": gathered})
    if rank == 0:
        (args.out_dir / "epochs.json").write_text(json.dumps(epochs))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
