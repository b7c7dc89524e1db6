"""Run under torchrun by tests/test_map_dataset.py: each rank reads epochs of a ShardMapDataset
through DistributedSampler and a DataLoader with workers, and all-gathers the keys it saw;
rank 0 writes them as JSON (one list per epoch and rank).

Usage: torchrun --nproc-per-node=N tests/torchrun_map.py LOCATION OUT.json NUM_WORKERS NUM_EPOCHS
"""

import json
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from shardstream.mapdataset import ShardMapDataset


def key_of(sample):
    return sample["__key__"]


def main() -> None:
    location, out, num_workers, num_epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    dataset = ShardMapDataset(location, decode=key_of)
    sampler = DistributedSampler(dataset, shuffle=True, seed=3, drop_last=False)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=num_workers, collate_fn=list)
    result = []
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        mine = [key for batch in loader for key in batch]
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        result.append(gathered)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
