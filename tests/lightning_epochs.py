"""Run by tests/test_frameworks.py: PyTorch Lightning's Trainer trains a tiny LightningModule
on a ShardDataset, with no callback of ours; each rank writes, for every training batch, the
trainer's epoch and the batch's keys to OUT/keys-<rank>.json (at the end of training, also when
max_steps stops it), and the dataset's epoch at each epoch's first batch.

DATASET may be a JSON file {"sources": [Source keyword arguments], "epoch_samples": N}: a mixture,
whose keys are then "source|key".

Usage: python tests/lightning_epochs.py DATASET OUT [--devices N] [--workers K] [--persistent]
       [--loader plain|stateful] [--epochs E] [--max-steps S] [--resume CKPT] [--no-dataset-batch-size]

With --max-steps, Lightning's ModelCheckpoint saves OUT/last.ckpt after step S, where the run
stops; --resume continues from such a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from shardstream import ShardDataset, Source


def to_item(sample: dict) -> dict:
    key = f"{sample['__source__']}|{sample['__key__']}" if "__source__" in sample else sample["__key__"]
    return {"key": key, "y": float(sample["cls"])}


class TinyModel(L.LightningModule):
    def __init__(self, dataset: ShardDataset, out: Path) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.dataset, self.out = dataset, out
        self.batches: list[list] = []
        self.epochs_seen: list[list[int]] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if not self.batches or self.batches[-1][0] != self.current_epoch:  # the epoch's first batch here
            self.epochs_seen.append([self.current_epoch, self.dataset.epoch])
        self.batches.append([self.current_epoch, list(batch["key"])])
        x = batch["y"].float().unsqueeze(1)
        return torch.nn.functional.mse_loss(self.layer(x), x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self) -> None:
        record = {"batches": self.batches, "epochs": self.epochs_seen, "len": len(self.dataset)}
        (self.out / f"keys-{self.global_rank}.json").write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--loader", choices=["plain", "stateful"], default="stateful")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--no-dataset-batch-size", action="store_true", help="leave ShardDataset(batch_size=) unset")
    args = parser.parse_args()
    source, mixture = args.dataset, {}
    if source.endswith(".json"):  # a mixture: a list of Source keyword arguments, and epoch_samples
        spec = json.loads(Path(source).read_text())
        source, mixture = [Source(**x) for x in spec["sources"]], {"epoch_samples": spec.get("epoch_samples")}
    dataset = ShardDataset(
        source,
        **mixture,
        decode=to_item,
        shuffle_buffer=10,
        seed=5,
        batch_size=None if args.no_dataset_batch_size else args.batch_size,
    )
    if args.loader == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader as Loader
    else:
        Loader = DataLoader  # noqa: N806
    ddp_workers = args.devices > 1 and args.workers > 0
    if ddp_workers:  # as examples/train_lightning.py: a worker forked beside Lightning's observer thread can hang
        multiprocessing.set_forkserver_preload(["torch", "lightning", "shardstream"])
    loader = Loader(
        dataset,
        batch_size=args.batch_size,
        num_workers=args.workers,
        persistent_workers=args.persistent,
        multiprocessing_context="forkserver" if ddp_workers else None,
        timeout=120 if args.workers else 0,
    )
    callbacks = []
    if args.max_steps > 0:
        callbacks.append(ModelCheckpoint(dirpath=args.out, every_n_train_steps=args.max_steps, save_last=True))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks,
        num_sanity_val_steps=0,
    )
    trainer.fit(TinyModel(dataset, args.out), loader, ckpt_path=args.resume)


if __name__ == "__main__":
    main()
