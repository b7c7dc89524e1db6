"""Train a small image classifier with DDP on packed shards, with checkpoint and exact resume.

One node, 2 processes on CPU (makes and packs 600 demo images first when no dataset is given):

    torchrun --nproc-per-node=2 examples/train_torchrun.py --checkpoint /tmp/ckpt.pt

A dataset on S3 (AWS_* environment variables), GPUs, several nodes (run on each node, with
its --node-rank; HOST is node 0):

    torchrun --nnodes=2 --node-rank=0 --rdzv-endpoint=HOST:29500 --nproc-per-node=8 \\
        examples/train_torchrun.py s3://bucket/train --device cuda --checkpoint /shared/ckpt.pt

Every rank reads exactly len(dataset) samples per epoch (so DDP never waits on a rank with
fewer batches). The checkpoint holds the model, the optimizer and the data state
(shardstream.loader_state_dict: a few numbers); kill the job at any point and run the same
command again, even with another number of processes: training resumes at the next sample
of the epoch, none repeated, none skipped.

The dataset must hold `.jpg` images with `.cls` labels (as `shardstream demo` makes).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from shardstream import CpuDecoder, Part, RandomResizedCrop, ShardDataset, pack
from shardstream.dataset import loader_state_dict
from shardstream.testing import CLASS_NAMES, make_image_dataset


def small_cnn(num_classes: int) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(
        block(3, 16),
        block(16, 32),
        block(32, 64),
        block(64, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


def demo_dataset(workdir: Path) -> str:
    """Rank 0 makes and packs demo images under ``workdir`` (one node only); the others wait."""
    shards = workdir / "shards"
    if dist.get_rank() == 0 and not (shards / "index.bin").exists():
        make_image_dataset(workdir / "images", num_images=600)
        # part=Part(0, 1): all of it here (under torchrun, pack would take RANK/WORLD_SIZE as its part)
        report = pack(workdir / "images", shards, max_shard_bytes=4 << 20, part=Part(0, 1), progress=False)
        print(report.summary(), flush=True)
    dist.barrier()  # set-up, before any iteration
    return str(shards)


def save(path: Path, state: dict) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def common_arguments(doc: str, workdir: str) -> argparse.ArgumentParser:
    """The command line both training examples take."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", nargs="?", help="packed dataset (dir or s3://...); default: make one")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--size-px", type=int, default=64, help="crop size fed to the network")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (each rank takes cuda:LOCAL_RANK)")
    parser.add_argument("--checkpoint", type=Path, help="saved every --checkpoint-every steps; resumed if present")
    parser.add_argument("--checkpoint-every", type=int, default=5, help="steps")
    parser.add_argument("--stop-after-steps", type=int, help="exit after this many steps (to try a resume)")
    parser.add_argument("--workdir", type=Path, default=Path(workdir))
    return parser


def resume(
    args: argparse.Namespace, model: DistributedDataParallel, optimizer: torch.optim.Optimizer, dataset: ShardDataset
) -> int:
    """Load ``args.checkpoint`` if it exists; the epoch to start at (the dataset resumes inside it)."""
    if args.checkpoint is None or not args.checkpoint.exists():
        return 0
    checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if checkpoint["data"] is not None:
        dataset.load_state_dict(checkpoint["data"])
    return checkpoint["epoch"]


def checkpointer(
    args: argparse.Namespace, model: DistributedDataParallel, optimizer: torch.optim.Optimizer
) -> Callable[[int, dict | None], None]:
    """``save(epoch, data_state)``: rank 0 writes model, optimizer and data state atomically."""

    def checkpoint(epoch: int, data: dict | None) -> None:
        if args.checkpoint is not None and dist.get_rank() == 0:
            save(
                args.checkpoint,
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "data": data},
            )

    return checkpoint


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor
) -> tuple[int, float]:
    """One optimiser step on a batch; (correct predictions, summed loss)."""
    logits = model(images)
    loss = nn.functional.cross_entropy(logits, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return int((logits.argmax(1) == labels).sum()), loss.item() * len(labels)


def main() -> None:
    parser = common_arguments(__doc__, "/tmp/shardstream-train-torchrun")
    parser.add_argument("--num-workers", type=int, default=2, help="DataLoader workers per rank")
    args = parser.parse_args()

    cuda = args.device.startswith("cuda")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(1)
    source = args.dataset or demo_dataset(args.workdir)
    crop = RandomResizedCrop(size_px=args.size_px, scale=(0.35, 1.0))
    dataset = ShardDataset(
        source, shuffle_buffer=200, decode=CpuDecoder("torch", crop=crop), batch_size=args.batch_size
    )
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers, pin_memory=cuda)
    model = DistributedDataParallel(small_cnn(len(CLASS_NAMES)).to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    start_epoch = resume(args, model, optimizer, dataset)
    if rank == 0 and args.checkpoint is not None and args.checkpoint.exists():
        print(
            f"resumed from {args.checkpoint}: epoch {start_epoch}, {len(dataset)} samples per rank left "
            f"at world size {world_size}",
            flush=True,
        )
    checkpoint = checkpointer(args, model, optimizer)

    steps = 0
    for epoch in range(start_epoch, args.epochs):
        dataset.set_epoch(epoch)  # keeps a loaded checkpoint's place in its own epoch
        started, consumed, correct, loss_sum = time.perf_counter(), 0, 0, 0.0
        for batch in loader:
            images = batch["jpg"].to(device, non_blocking=True).float().div_(255)
            labels = batch["cls"].to(device, non_blocking=True)
            right, loss = train_step(model, optimizer, images, labels)
            consumed, correct, loss_sum, steps = consumed + len(labels), correct + right, loss_sum + loss, steps + 1
            if steps % args.checkpoint_every == 0:
                checkpoint(epoch, loader_state_dict(loader, samples_consumed=consumed))
            if args.stop_after_steps is not None and steps >= args.stop_after_steps:
                if rank == 0:
                    print(f"stopping after {steps} steps, {consumed} samples into epoch {epoch}", flush=True)
                checkpoint(epoch, loader_state_dict(loader, samples_consumed=consumed))
                dist.destroy_process_group()
                return
        totals = torch.tensor([consumed, correct, loss_sum], dtype=torch.float64)
        dist.all_reduce(totals)  # after the epoch, not in the iteration path
        checkpoint(epoch + 1, None)
        if rank == 0:
            seconds = time.perf_counter() - started
            print(
                f"epoch {epoch}: {int(totals[0])} samples on {world_size} ranks "
                f"({consumed} on rank 0), loss {totals[2] / totals[0]:.3f}, "
                f"accuracy {totals[1] / totals[0]:.1%}, {totals[0] / seconds:.0f} samples/s",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
