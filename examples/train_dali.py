"""train_torchrun.py with NVIDIA DALI decoding: shardstream streams the JPEG bytes, DALI decodes,
crops, flips and normalises them on the GPU (on the CPU when there is none, saying so).

    pip install 'shardstream[dali]'
    torchrun --nproc-per-node=2 examples/train_dali.py --checkpoint /tmp/ckpt-dali.pt           # CPU
    torchrun --nproc-per-node=8 examples/train_dali.py s3://bucket/train --device cuda --checkpoint ckpt.pt

Checkpoints hold the model, the optimizer and the data state; run the same command again to
resume mid-epoch (at any number of processes).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from train_torchrun import demo_dataset, save, small_cnn  # the sibling example

from shardstream import ShardDataset
from shardstream.dali import DaliLoader, gpu_available
from shardstream.synth import CLASS_NAMES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", nargs="?", help="packed dataset (dir or s3://...); default: make one")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--size-px", type=int, default=64, help="crop size fed to the network")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (each rank takes cuda:LOCAL_RANK)")
    parser.add_argument("--checkpoint", type=Path, help="saved every --checkpoint-every steps; resumed if present")
    parser.add_argument("--checkpoint-every", type=int, default=5, help="steps")
    parser.add_argument("--stop-after-steps", type=int, help="exit after this many steps (to try a resume)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/shardstream-train-dali"))
    args = parser.parse_args()

    cuda = args.device.startswith("cuda")
    if cuda and not gpu_available():
        raise SystemExit("--device cuda: no GPU that both torch and DALI can use; run with --device cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if rank == 0 and not cuda:
        print("DALI decodes on the CPU (device_id=None): no --device cuda given"
              + ("" if gpu_available() else ", and no GPU here"), flush=True)
    if not cuda:
        torch.set_num_threads(1)
    dataset = ShardDataset(args.dataset or demo_dataset(args.workdir), shuffle_buffer=200)
    loader = DaliLoader(dataset, batch_size=args.batch_size, crop_px=args.size_px, scale=(0.35, 1.0),
                        device_id=local_rank if cuda else None, num_workers=1)
    model = DistributedDataParallel(small_cnn(len(CLASS_NAMES)).to(device), device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    start_epoch = 0
    if args.checkpoint is not None and args.checkpoint.exists():
        checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch = checkpoint["epoch"]
        if checkpoint["data"] is not None:
            dataset.load_state_dict(checkpoint["data"])
        if rank == 0:
            print(f"resumed from {args.checkpoint}: epoch {start_epoch}, {len(loader)} batches per rank left", flush=True)

    def checkpoint(epoch: int, data: dict | None) -> None:
        if args.checkpoint is not None and rank == 0:
            save(args.checkpoint, {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                   "epoch": epoch, "data": data})

    steps = 0
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)
        started, consumed, correct, loss_sum = time.perf_counter(), 0, 0, 0.0
        for images, labels in loader:  # float32 (B, 3, size, size), normalised, on `device`
            logits = model(images)
            loss = loss_fn(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            consumed += len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            loss_sum += loss.item() * len(labels)
            steps += 1
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
            print(f"epoch {epoch}: {int(totals[0])} samples on {world_size} ranks, loss {totals[2] / totals[0]:.3f}, "
                  f"accuracy {totals[1] / totals[0]:.1%}, {totals[0] / seconds:.0f} samples/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
