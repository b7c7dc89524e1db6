"""Run under torchrun by tests/test_torchrun.py: each rank reads epochs through a DataLoader
with workers and all-gathers what it saw; rank 0 writes the result as JSON.

Usage: torchrun --nproc-per-node=N tests/torchrun_read.py SOURCE OUT.json NUM_WORKERS NUM_EPOCHS
"""

import json
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader, get_worker_info

from shardstream import ShardDataset


def tag(sample):
    info = get_worker_info()
    return {"key": sample["__key__"], "shard": sample["__shard__"], "worker": info.id if info else 0}


def main() -> None:
    source, out, num_workers, num_epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    dataset = ShardDataset(source, decode=tag, shuffle_buffer=16, seed=1)
    result = []
    for epoch in range(num_epochs):
        dataset.set_epoch(epoch)
        seen = [
            (s["key"], s["shard"], s["worker"]) for s in DataLoader(dataset, num_workers=num_workers, batch_size=None)
        ]
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, seen)
        result.append(gathered)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
