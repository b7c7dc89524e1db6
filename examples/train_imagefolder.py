"""Train and validate on an ImageNet-style tree of class folders: ``train/<class>/<file>.JPEG``.

    python examples/train_imagefolder.py                       # makes a small tree with odd names first
    python examples/train_imagefolder.py /data/imagenet/train /data/imagenet/val --epochs 1

The class of each image is its folder directly under the root, numbered in sorted order as
torchvision's ``ImageFolder`` numbers them. ``pack --labels-from-dirs`` stores that number as a
``cls`` member of each sample and the class names in the index; the reader picks the image by
``fields=`` whatever its extension's case (``.JPEG``, ``.jpg``, ``.png``, ``.webp``). Training
uses a random resized crop; validation resizes the shorter side and cuts the centre.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from shardstream import CenterCrop, CpuDecoder, RandomResizedCrop, Resize, ShardDataset, pack

FIELDS = {"image": "jpg;jpeg;png;webp", "label": "cls"}
WNIDS = ["n01440764", "n01443537", "n01484850", "n01491361"]  # class folders as ImageNet names them


def make_tree(root: str, images_per_class: int, seed: int) -> None:
    """A tree as users have it: upper- and mixed-case extensions, a multi-dot name, PNG and
    WebP beside JPEG, a nested folder inside a class. Each class has its own colour, so a small
    network learns it in an epoch or two."""
    rng = random.Random(seed)
    for c, wnid in enumerate(WNIDS):
        os.makedirs(f"{root}/{wnid}/extra", exist_ok=True)
        for i in range(images_per_class):
            hue = (c * 256 // len(WNIDS) + rng.randrange(-12, 13)) % 256
            size = (rng.randrange(56, 120), rng.randrange(56, 120))
            image = Image.new("HSV", size, (hue, 200, rng.randrange(120, 255))).convert("RGB")
            name, fmt = [
                (f"{wnid}_{i:05d}.JPEG", "JPEG"),
                (f"UPPER_{i:04d}.JPG", "JPEG"),
                (f"{wnid}_{i:05d}.crop.JPEG", "JPEG"),
                (f"extra/{wnid}_{i:05d}.png", "PNG"),
                (f"{wnid}_{i:05d}.webp", "WEBP"),
            ][i % 5]
            image.save(f"{root}/{wnid}/{name}", fmt)


def small_cnn(num_classes: int) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(
        block(3, 16), block(16, 32), block(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("train", nargs="?", help="a tree of class folders (default: make one)")
    parser.add_argument("val", nargs="?", help="the validation tree, with the same class folders")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--size-px", type=int, default=64, help="side of the square fed to the network")
    parser.add_argument("--images-per-class", type=int, default=60, help="with no tree given: images made per class")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    torch.manual_seed(0)  # the network's initial weights; the data order is ShardDataset's seed

    with tempfile.TemporaryDirectory() as tmp:
        train_dir, val_dir = args.train, args.val
        if train_dir is None:
            train_dir, val_dir = f"{tmp}/train", f"{tmp}/val"
            make_tree(train_dir, args.images_per_class, seed=0)
            make_tree(val_dir, max(5, args.images_per_class // 4), seed=1)
        # labels from the folders; shuffle spreads each class over every shard; an image that does
        # not decode stops the pack here (on_error="skip" leaves its sample out, reported)
        report = pack(
            train_dir, f"{tmp}/train-shards", labels_from_dirs=True, shuffle=True, check_images=True, progress=False
        )
        print(report.summary())
        train = ShardDataset(
            f"{tmp}/train-shards",
            batch_size=args.batch_size,
            fields=FIELDS,
            decode=CpuDecoder("torch", steps=RandomResizedCrop(size_px=args.size_px, scale=(0.35, 1.0))),
        )
        print(f"classes: {train.classes}")
        model = small_cnn(len(train.classes)).to(args.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        loader = DataLoader(train, batch_size=args.batch_size, num_workers=args.num_workers, persistent_workers=True)
        for epoch in range(args.epochs):
            train.set_epoch(epoch)
            model.train()
            started, seen, loss_sum = time.perf_counter(), 0, 0.0
            for batch in loader:  # batch["image"]: uint8 (B, 3, size_px, size_px); batch["label"]: int64 (B,)
                images = batch["image"].to(args.device).float().div_(255)
                labels = batch["label"].to(args.device)
                loss = nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                seen += len(labels)
                loss_sum += loss.item() * len(labels)
            print(
                f"epoch {epoch}: {seen} samples, loss {loss_sum / seen:.3f}, "
                f"{seen / (time.perf_counter() - started):.0f} samples/s"
            )

        if val_dir is None:
            return
        print(pack(val_dir, f"{tmp}/val-shards", labels_from_dirs=True, progress=False).summary())
        val = ShardDataset(
            f"{tmp}/val-shards",
            shuffle=False,
            batch_size=args.batch_size,
            fields=tuple(FIELDS.values()),  # tuples: (image, label)
            decode=CpuDecoder(
                "torch", steps=[Resize(shorter_side_px=args.size_px * 8 // 7), CenterCrop(size_px=args.size_px)]
            ),
        )
        if val.classes != train.classes:
            raise SystemExit(f"the validation classes {val.classes} are not the training classes {train.classes}")
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in DataLoader(val, batch_size=args.batch_size, num_workers=args.num_workers):
                predicted = model(images.to(args.device).float().div_(255)).argmax(1).cpu()
                correct += (predicted == labels).sum().item()
                total += len(labels)
        print(f"validation: {total} samples, accuracy {correct / total:.1%}")


if __name__ == "__main__":
    main()
