"""Run by tests/test_torchrun.py: two ranks started by torch.multiprocessing.spawn with an
explicit rank (no RANK / WORLD_SIZE variables), each reading through a DataLoader whose
workers are *spawned* and so do not inherit the process group.

Usage: python tests/spawn_read.py SOURCE OUT.json PORT
"""

import json
import os
import sys

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from shardstream import ShardDataset


def key(sample):
    return sample["__key__"]


def run(rank: int, source: str, out: str, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    loader = DataLoader(
        ShardDataset(source, decode=key), num_workers=2, batch_size=None, multiprocessing_context="spawn"
    )
    seen = list(loader)
    gathered = [None, None]
    dist.all_gather_object(gathered, seen)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    mp.spawn(run, args=(sys.argv[1], sys.argv[2], int(sys.argv[3])), nprocs=2)
