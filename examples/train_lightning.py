"""Train the small image classifier with PyTorch Lightning on packed shards: no callback or
epoch bookkeeping of ours, exact epochs, and mid-epoch resume from Lightning's own checkpoint.

One process on CPU, then 2 processes (DDP over gloo); makes and packs 600 demo images first
when no dataset is given:

    pip install lightning torchdata
    python examples/train_lightning.py --checkpoint-dir /tmp/ckpt-lightning
    python examples/train_lightning.py --devices 2 --checkpoint-dir /tmp/ckpt-lightning-ddp
    python examples/train_lightning.py s3://bucket/train --accelerator gpu --devices 8 --checkpoint-dir ckpt

What makes it work:

- Lightning calls ``set_epoch`` on samplers, never on an IterableDataset. A ShardDataset needs
  none: each new pass over it (Lightning makes one per epoch) reads the next epoch, also with
  ``persistent_workers=True`` (shardstream logs once that it advanced the epoch by itself).
- Lightning saves the state of a stateful DataLoader in its checkpoints, so the loader is
  torchdata's ``StatefulDataLoader``: its state holds each worker's place in the epoch
  (a few numbers per worker, from ``ShardDataset.state_dict()``). Run the same command again
  after a stop or a crash and training goes on at the next sample of the epoch, with the same
  number of devices and workers (resuming at another world size needs
  ``shardstream.loader_state_dict``, as in train_torchrun.py).
- Every rank reads exactly ``len(dataset)`` samples per epoch, so DDP never waits on a rank
  with fewer batches.
- With ``--devices`` > 1 the DataLoader workers start from a ``forkserver``, not by forking the
  rank: Lightning's rank 0 runs a thread that watches the other ranks, and a process forked
  while another of its threads holds a lock can wait on that lock forever (seen once in CI:
  a worker stuck right after its fork, and rank 0 waiting on it). ``--batch-timeout-s`` makes
  a worker that sends nothing an error rather than a hang.

The dataset must hold `.jpg` images with `.cls` labels (as `shardstream demo` makes).
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader
from train_torchrun import small_cnn  # the sibling example

from shardstream import CpuDecoder, Part, RandomResizedCrop, ShardDataset, pack
from shardstream.testing import CLASS_NAMES, make_image_dataset


class Classifier(L.LightningModule):
    def __init__(self, dataset: ShardDataset) -> None:
        super().__init__()
        self.model = small_cnn(len(CLASS_NAMES))
        self.dataset = dataset  # only to print its epoch
        self.seen = 0
        self.started = 0.0

    def on_train_epoch_start(self) -> None:
        self.seen, self.started = 0, time.perf_counter()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        images, labels = batch["jpg"].float().div_(255), batch["cls"]
        logits = self.model(images)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        self.seen += len(labels)
        self.log("accuracy", (logits.argmax(1) == labels).float().mean(), on_epoch=True, sync_dist=True)
        return loss

    def on_train_epoch_end(self) -> None:
        seen = int(self.trainer.strategy.reduce(torch.tensor(float(self.seen)), reduce_op="sum"))
        accuracy = float(self.trainer.callback_metrics.get("accuracy_epoch", float("nan")))
        if self.global_rank == 0:
            print(
                f"epoch {self.current_epoch}: {seen} samples on {self.trainer.world_size} ranks in this run "
                f"(dataset epoch {self.dataset.epoch}), accuracy {accuracy:.1%}, "
                f"{seen / (time.perf_counter() - self.started):.0f} samples/s",
                flush=True,
            )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def demo_dataset(workdir: Path) -> str:
    """Makes and packs demo images under ``workdir`` once. Lightning starts the other ranks
    (running this script again) only inside ``fit``, after this is done."""
    shards = workdir / "shards"
    if not (shards / "index.bin").exists():
        make_image_dataset(workdir / "images", num_images=600)
        report = pack(workdir / "images", shards, max_shard_bytes=4 << 20, part=Part(0, 1), progress=False)
        print(report.summary(), flush=True)
    return str(shards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", nargs="?", help="packed dataset (dir or s3://...); default: make one")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per device")
    parser.add_argument("--size-px", type=int, default=64, help="crop size fed to the network")
    parser.add_argument("--num-workers", type=int, default=2, help="DataLoader workers per device")
    parser.add_argument(
        "--batch-timeout-s", type=float, default=120.0, help="most seconds to wait for a worker's batch (0: no limit)"
    )
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--checkpoint-dir", type=Path, help="last.ckpt saved every --checkpoint-every steps; resumed")
    parser.add_argument("--checkpoint-every", type=int, default=5, help="steps")
    parser.add_argument("--stop-after-steps", type=int, default=-1, help="stop after this many steps (to try a resume)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/shardstream-train-lightning"))
    args = parser.parse_args()
    if args.accelerator == "cpu":
        torch.set_num_threads(1)

    crop = RandomResizedCrop(size_px=args.size_px, scale=(0.35, 1.0))
    dataset = ShardDataset(
        args.dataset or demo_dataset(args.workdir),
        shuffle_buffer=200,
        decode=CpuDecoder("torch", crop=crop),
        batch_size=args.batch_size,
    )
    # forked workers of a rank with other threads running can hang at their start; a
    # forkserver is a single-threaded process that forks them instead, with these imported once
    ddp_workers = args.num_workers > 0 and args.devices > 1
    if ddp_workers:
        multiprocessing.set_forkserver_preload(["torch", "lightning", "shardstream"])
    loader = StatefulDataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
        pin_memory=args.accelerator == "gpu",
        multiprocessing_context="forkserver" if ddp_workers else None,
        timeout=args.batch_timeout_s if args.num_workers > 0 else 0,
    )
    callbacks = []
    if args.checkpoint_dir is not None:
        callbacks.append(
            ModelCheckpoint(
                dirpath=args.checkpoint_dir, every_n_train_steps=args.checkpoint_every, save_last=True, save_top_k=0
            )
        )
    last = args.checkpoint_dir / "last.ckpt" if args.checkpoint_dir is not None else None
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs,
        max_steps=args.stop_after_steps,
        callbacks=callbacks,
        enable_checkpointing=bool(callbacks),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(dataset), loader, ckpt_path=last if last is not None and last.exists() else None)
    if trainer.global_rank == 0 and args.stop_after_steps > 0 and trainer.global_step >= args.stop_after_steps:
        print(f"stopped after {trainer.global_step} steps; run the same command again to resume", flush=True)


if __name__ == "__main__":
    main()
