"""Run by tests/test_frameworks.py: PyTorch Lightning's Trainer trains a tiny LightningModule
on a ShardDataset, with no callback of ours; each rank writes, for every training batch, the
trainer's epoch and the batch's keys to OUT/keys-<rank>.json (at the end of training, also when
max_steps stops it), and the dataset's epoch at each epoch's first batch.

Each RUN is one training run with a Trainer, dataset, DataLoader and model of its own, given as
one argument: "DATASET OUT [--workers K] [--persistent] [--loader plain|stateful] [--epochs E]
[--max-steps S] [--resume CKPT] [--no-dataset-batch-size]". The runs follow one another in the
same processes (one per device, the DDP process group made once), so that Lightning's import
and DDP start-up are paid once for several runs.

DATASET may be a JSON file {"sources": [Source keyword arguments], "epoch_samples": N}: a mixture,
whose keys are then "source|key".

Usage: python tests/lightning_epochs.py [--devices N] RUN [RUN ...]

With --max-steps, Lightning's ModelCheckpoint saves OUT/last.ckpt after step S, where the run
stops; --resume continues from such a checkpoint.

Lightning is imported in main(), not at the top: the DataLoader workers of several devices
start from a forkserver and import this script, and need only torch and shardstream.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import multiprocessing.forkserver
import shlex
import sys
from pathlib import Path

from shardstream import ShardDataset, Source


def to_item(sample: dict) -> dict:
    key = f"{sample['__source__']}|{sample['__key__']}" if "__source__" in sample else sample["__key__"]
    return {"key": key, "y": float(sample["cls"])}


def run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="RUN")
    parser.add_argument("dataset")
    parser.add_argument("out", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--loader", choices=["plain", "stateful"], default="stateful")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--no-dataset-batch-size", action="store_true", help="leave ShardDataset(batch_size=) unset")
    return parser


def tiny_model(dataset: ShardDataset, out: Path):
    """A LightningModule that records the keys of its batches (see the module's docstring)."""
    import lightning as L
    import torch

    class TinyModel(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.batches: list[list] = []
            self.epochs_seen: list[list[int]] = []

        def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
            if not self.batches or self.batches[-1][0] != self.current_epoch:  # the epoch's first batch here
                self.epochs_seen.append([self.current_epoch, dataset.epoch])
            self.batches.append([self.current_epoch, list(batch["key"])])
            x = batch["y"].float().unsqueeze(1)
            return torch.nn.functional.mse_loss(self.layer(x), x)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_end(self) -> None:
            record = {"batches": self.batches, "epochs": self.epochs_seen, "len": len(dataset)}
            (out / f"keys-{self.global_rank}.json").write_text(json.dumps(record))

    return TinyModel()


def train(args: argparse.Namespace, devices: int) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader

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
    ddp_workers = devices > 1 and args.workers > 0
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
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks,
        num_sanity_val_steps=0,
    )
    trainer.fit(tiny_model(dataset, args.out), loader, ckpt_path=args.resume)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("runs", nargs="+", metavar="RUN")
    args = parser.parse_args()
    runs = [run_parser().parse_args(shlex.split(run)) for run in args.runs]
    if args.devices > 1 and any(run.workers > 0 for run in runs):
        # As examples/train_lightning.py: workers from a forkserver, as a worker forked beside
        # Lightning's observer thread can hang. Started now, it loads what the workers import
        # (each worker would else import, even compile, them again) while this rank imports
        # Lightning (and rank 0 waits for the other ranks to start).
        preload = ["torch", "torchdata.stateful_dataloader", "numpy.random", "shardstream", "shardstream.dataset"]
        multiprocessing.set_forkserver_preload(preload)
        multiprocessing.forkserver.ensure_running()
    for text, run in zip(args.runs, runs):
        print(f"lightning_epochs.py: run {text}", file=sys.stderr, flush=True)  # whose errors follow
        train(run, args.devices)
        gc.collect()  # this run's DataLoader, its persistent workers stopped, before the next run's


if __name__ == "__main__":
    main()
