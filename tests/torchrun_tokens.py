"""Run under torchrun by tests/test_token_torchrun.py: each rank reads TokenBlocks of DATASET
through a DataLoader (collate_blocks), once per task of --tasks, and all-gathers what it read;
rank 0 writes OUT_DIR/NAME.json for each task NAME: per rank its ``len(dataset)`` before
reading, its batches, its dataset's epoch, the blocks (number, input_ids, labels,
position_ids, doc_lens) and, for a task that stops, the job checkpoint the rank made
(``loader_state_dict``), so the test can check that every rank made the same one. Rank 0
also writes that checkpoint to OUT_DIR/NAME-state.json.

--tasks is a JSON list of ``{"name": str, "drop_last": bool, "epoch": int, "stop": int | null,
"resume": STATE path | null}``: a task reads epoch ``epoch`` (or, with ``resume``, loads the
checkpoint at whatever world size this job has and reads the rest of its epoch), stopping after
``stop`` batches when given. The tasks run one after another in the same processes.

Usage: torchrun ... tests/torchrun_tokens.py DATASET OUT_DIR --seq-len L --tasks JSON
       [--workers K] [--batch-size B]
"""

import argparse
import json
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader

from shardstream import TokenBlocks, collate_blocks, loader_state_dict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--tasks", type=json.loads, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    for task in args.tasks:
        run(args, task)
    dist.barrier()
    dist.destroy_process_group()


def run(args: argparse.Namespace, task: dict[str, Any]) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = TokenBlocks(
        args.dataset,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        drop_last=task["drop_last"],
        shuffle_buffer=16,
        max_open_shards=2,
        seed=1,
    )
    if task.get("resume"):
        dataset.load_state_dict(json.loads(Path(task["resume"]).read_text()))
    else:
        dataset.set_epoch(task["epoch"])
    length = len(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers, collate_fn=collate_blocks)
    blocks: list[dict[str, Any]] = []
    batches, state = 0, None
    iterator = iter(loader)
    for batch in iterator:
        mine = []
        for row, key in enumerate(batch["keys"]):
            mine.append(
                {
                    "key": key,
                    "input_ids": batch["input_ids"][row].tolist(),
                    "labels": batch["labels"][row].tolist(),
                    "position_ids": batch["position_ids"][row].tolist(),
                }
            )
        pieces, at = batch["doc_lens"].tolist(), 0  # the batch's pieces, block after block
        for block in mine:
            count = block["position_ids"].count(0)  # each piece starts at position 0
            block["doc_lens"] = pieces[at : at + count]
            at += count
        assert at == len(pieces), "the batch's doc_lens are not its blocks' pieces"
        assert batch["cu_seqlens"].tolist() == [sum(pieces[:i]) for i in range(len(pieces) + 1)]
        blocks += mine
        batches += 1
        if task.get("stop") is not None and batches == task["stop"]:
            state = loader_state_dict(loader, samples_consumed=len(blocks))
            break
    del iterator
    result = {"rank": rank, "len": length, "batches": batches, "blocks": blocks, "state": state, "epoch": dataset.epoch}
    gathered = [None] * world_size
    dist.all_gather_object(gathered, result)
    if rank == 0:
        (args.out_dir / f"{task['name']}.json").write_text(json.dumps(gathered))
        if state is not None:
            (args.out_dir / f"{task['name']}-state.json").write_text(json.dumps(state))


if __name__ == "__main__":
    main()
