"""Hugging Face transformers.Trainer on a ShardDataset: a tiny model and the sample decoding
tests/test_frameworks.py uses in-process, and, run under torchrun, a DDP job whose Trainer
reads the ShardDataset through a DataLoader of its own (as the README says to), each rank
writing the sample ids of its batches to OUT_DIR/seen-<rank>.json.

Usage: torchrun --nproc-per-node=2 tests/hf_train.py DATASET OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from shardstream import ShardDataset


class TinyModel(torch.nn.Module):
    """A model transformers.Trainer can train: forward returns {"loss": ...}; it records the
    sample ids of each batch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[int]] = []

    def forward(self, y: torch.Tensor, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append(idx.tolist())
        x = y.float().unsqueeze(1)
        return {"loss": torch.nn.functional.mse_loss(self.layer(x), x)}


def hf_item(sample: dict) -> dict:
    """A sample as Trainer's default collator takes it: numbers only (the id from the key)."""
    base = 100_000 * int(sample.get("__source__") == "more")  # a mixture's second source: ids from 100000
    return {"y": float(sample["cls"]), "idx": base + int(sample["__key__"].rsplit("/", 1)[1])}


def main() -> None:
    from transformers import Trainer, TrainingArguments

    class ShardTrainer(Trainer):
        """Reads the ShardDataset through a plain DataLoader: accelerate would otherwise read it
        on rank 0 alone and hand its batches out (dispatch_batches), or keep every
        world_size-th batch of each rank (IterableDatasetShard), and a ShardDataset already
        splits itself over ranks."""

        def get_train_dataloader(self) -> DataLoader:
            return DataLoader(
                self.train_dataset,
                batch_size=self.args.per_device_train_batch_size,
                num_workers=self.args.dataloader_num_workers,
                collate_fn=self.data_collator,
                persistent_workers=self.args.dataloader_num_workers > 0,
            )

    dataset_dir, out = sys.argv[1], Path(sys.argv[2])
    dataset = ShardDataset(dataset_dir, decode=hf_item, shuffle_buffer=10, seed=5, batch_size=4)
    model = TinyModel()
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        dataloader_num_workers=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        ddp_backend="gloo",
    )
    ShardTrainer(model=model, args=args, train_dataset=dataset).train()
    (out / f"seen-{os.environ['RANK']}.json").write_text(json.dumps(model.seen))


if __name__ == "__main__":
    main()
