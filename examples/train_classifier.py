"""Train a small image classifier from packed shards (local or S3), on CPU or GPU.

    python examples/train_classifier.py                 # makes and packs 1,000 demo images first
    python examples/train_classifier.py s3://bucket/train --epochs 3 --device cuda

The dataset must hold `.jpg` images with `.cls` labels (as `shardstream demo` makes).
S3 settings come from the standard AWS environment variables.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

from shardstream import CpuDecoder, RandomResizedCrop, ShardDataset, pack
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", nargs="?", help="packed dataset (dir or s3://...); default: make one")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--size-px", type=int, default=96, help="crop size fed to the network")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())

    with tempfile.TemporaryDirectory() as tmp:
        source = args.dataset
        if source is None:
            make_image_dataset(f"{tmp}/images", num_images=1000)
            source = f"{tmp}/shards"
            print(pack(f"{tmp}/images", source, max_shard_bytes=8 << 20, progress=False).summary())
        dataset = ShardDataset(
            source,
            shuffle_buffer=500,
            batch_size=args.batch_size,
            decode=CpuDecoder("torch", crop=RandomResizedCrop(size_px=args.size_px, scale=(0.35, 1.0))),
        )
        loader = DataLoader(
            dataset, batch_size=args.batch_size, num_workers=args.num_workers, pin_memory=args.device.startswith("cuda")
        )
        model = small_cnn(len(CLASS_NAMES)).to(args.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for epoch in range(args.epochs):
            dataset.set_epoch(epoch)
            started, seen, correct, loss_sum = time.perf_counter(), 0, 0, 0.0
            for batch in loader:
                images = batch["jpg"].to(args.device, non_blocking=True).float().div_(255)
                labels = batch["cls"].to(args.device, non_blocking=True)
                logits = model(images)
                loss = nn.functional.cross_entropy(logits, labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                seen += len(labels)
                correct += (logits.argmax(1) == labels).sum().item()
                loss_sum += loss.item() * len(labels)
            seconds = time.perf_counter() - started
            print(
                f"epoch {epoch}: {seen} samples, loss {loss_sum / seen:.3f}, train accuracy "
                f"{correct / seen:.1%}, {seen / seconds:.0f} samples/s"
            )


if __name__ == "__main__":
    main()
