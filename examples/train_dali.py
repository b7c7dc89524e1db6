"""train_torchrun.py with NVIDIA DALI decoding: shardstream streams the JPEG bytes, DALI decodes,
crops, flips and normalises them on the GPU (on the CPU when there is none, saying so).

    pip install 'shardstream[dali]'
    torchrun --nproc-per-node=2 examples/train_dali.py --checkpoint /tmp/ckpt-dali.pt           # CPU
    torchrun --nproc-per-node=8 examples/train_dali.py s3://bucket/train --device cuda --checkpoint ckpt.pt

Checkpoints hold the model, the optimizer and the data state; run the same command again to
resume mid-epoch (at any number of processes).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from train_torchrun import (  # the sibling example
    checkpointer,
    common_arguments,
    demo_dataset,
    resume,
    small_cnn,
    train_step,
)

from shardstream import ShardDataset
from shardstream.dali import DaliLoader, gpu_available
from shardstream.testing import CLASS_NAMES


def main() -> None:
    args = common_arguments(__doc__, "/tmp/shardstream-train-dali").parse_args()

    cuda = args.device.startswith("cuda")
    if cuda and not gpu_available():
        raise SystemExit("--device cuda: no GPU that both torch and DALI can use; run with --device cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if rank == 0 and not cuda:
        print(
            "DALI decodes on the CPU (device_id=None): no --device cuda given"
            + ("" if gpu_available() else ", and no GPU here"),
            flush=True,
        )
    if not cuda:
        torch.set_num_threads(1)
    dataset = ShardDataset(args.dataset or demo_dataset(args.workdir), shuffle_buffer=200, batch_size=args.batch_size)
    loader = DaliLoader(
        dataset,
        batch_size=args.batch_size,
        crop_px=args.size_px,
        scale=(0.35, 1.0),
        device_id=local_rank if cuda else None,
    )
    model = DistributedDataParallel(small_cnn(len(CLASS_NAMES)).to(device), device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    start_epoch = resume(args, model, optimizer, dataset)
    if rank == 0 and args.checkpoint is not None and args.checkpoint.exists():
        print(f"resumed from {args.checkpoint}: epoch {start_epoch}, {len(loader)} batches per rank left", flush=True)
    checkpoint = checkpointer(args, model, optimizer)

    steps = 0
    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)
        started, consumed, correct, loss_sum = time.perf_counter(), 0, 0, 0.0
        for images, labels in loader:  # float32 (B, 3, size, size), normalised, on `device`
            right, loss = train_step(model, optimizer, images, labels)
            consumed, correct, loss_sum, steps = consumed + len(labels), correct + right, loss_sum + loss, steps + 1
            if steps % args.checkpoint_every == 0 or steps == args.stop_after_steps:
                checkpoint(epoch, loader.state_dict())
            if steps == args.stop_after_steps:
                if rank == 0:
                    print(f"stopping after {steps} steps, {consumed} samples into epoch {epoch}", flush=True)
                dist.destroy_process_group()
                return
        totals = torch.tensor([consumed, correct, loss_sum], dtype=torch.float64, device=device)
        dist.all_reduce(totals)  # after the epoch, not in the iteration path
        checkpoint(epoch + 1, None)
        if rank == 0:
            seconds = time.perf_counter() - started
            print(
                f"epoch {epoch}: {int(totals[0])} samples on {world_size} ranks, loss {totals[2] / totals[0]:.3f}, "
                f"accuracy {totals[1] / totals[0]:.1%}, {totals[0] / seconds:.0f} samples/s",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
