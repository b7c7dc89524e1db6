"""ShardDataset under the training loops users run: PyTorch Lightning's Trainer (1 and 2 CPU
devices with DDP over gloo, persistent workers on and off, a plain DataLoader and torchdata's
StatefulDataLoader, stopped mid-epoch by max_steps and resumed from its checkpoint) and Hugging
Face's transformers.Trainer (one process, and 2 DDP ranks under torchrun). Each epoch must
read every sample once, in that epoch's order, with nothing of ours in the loop."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hf_train import TinyModel, hf_item
from test_dataset import make_dataset
from test_torchrun import free_port
from torch.utils.data import DataLoader

from shardstream import ShardDataset

# Even over 2 ranks (no pads: every epoch is exactly the dataset), but 2 DataLoader workers
# splitting a rank's part evenly would each end with a short batch of 2, one batch more than
# len(loader) (196 = 49 x 4; 98 = 24 x 4 + 2): ShardDataset(batch_size=) must prevent that.
NUM_SAMPLES = 196


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("frameworks"), num_samples=NUM_SAMPLES, per_shard=8)


def lightning(dest: Path, out: Path, *args: str) -> list[dict]:
    """Run tests/lightning_epochs.py; each rank's record."""
    out.mkdir()
    script = Path(__file__).with_name("lightning_epochs.py")
    run = subprocess.run(
        [sys.executable, str(script), str(dest), str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(p.read_text()) for p in sorted(out.glob("keys-*.json"))]


def per_epoch(*runs: list[dict]) -> dict[int, list[list[str]]]:
    """``{trainer epoch: [keys of rank 0, keys of rank 1, ...]}`` over runs (a stop and its resume)."""
    epochs: dict[int, list[list[str]]] = collections.defaultdict(lambda: [[] for _ in runs[0]])
    for ranks in runs:
        for rank, record in enumerate(ranks):
            for epoch, keys in record["batches"]:
                epochs[epoch][rank] += keys
    return dict(epochs)


def reference_order(dest: Path, epoch: int, *, workers: int) -> list[str]:
    """Epoch ``epoch`` as one process with a DataLoader reads it (the scripts' settings)."""
    dataset = ShardDataset(dest, decode=lambda s: s["__key__"], shuffle_buffer=10, seed=5, batch_size=4)
    dataset.set_epoch(epoch)
    return [k for batch in DataLoader(dataset, batch_size=4, num_workers=workers) for k in batch]


@pytest.mark.parametrize(
    ("devices", "workers", "mode"),
    [(1, 2, "--persistent"), (1, 0, "--loader=stateful"), (2, 2, "--persistent"), (2, 2, "--loader=plain")],
)
def test_lightning_epochs_differ_and_are_exact(tmp_path, dataset_dir, devices, workers, mode):
    dest, keys = dataset_dir
    ranks = lightning(dest, tmp_path / "run", f"--devices={devices}", f"--workers={workers}", mode)
    assert len(ranks) == devices
    epochs = per_epoch(ranks)
    assert sorted(epochs) == [0, 1, 2]
    for by_rank in epochs.values():
        assert [len(k) for k in by_rank] == [NUM_SAMPLES // devices] * devices
        assert sorted(k for rank in by_rank for k in rank) == sorted(keys)  # every sample once
    assert len({tuple(by_rank[0]) for by_rank in epochs.values()}) == 3  # three different orders
    for record in ranks:
        assert record["epochs"] == [[0, 0], [1, 1], [2, 2]]  # the dataset read the trainer's epoch
    if devices == 1:
        assert [epochs[e][0] for e in (0, 1, 2)] == [reference_order(dest, e, workers=workers) for e in (0, 1, 2)]


@pytest.mark.parametrize(
    ("devices", "workers", "persistent"), [(1, 2, True), (1, 0, False), (2, 2, False), (2, 2, True)]
)
def test_lightning_resumes_mid_epoch_from_its_checkpoint(tmp_path, dataset_dir, devices, workers, persistent):
    """Stopped by max_steps in epoch 1, resumed from Lightning's own checkpoint (which holds the
    StatefulDataLoader's state): epoch 1 is completed with no repeat or loss, epoch 2 follows."""
    dest, keys = dataset_dir
    steps_per_epoch = -(-NUM_SAMPLES // devices // 4)
    stop = steps_per_epoch + 5
    mode = [f"--devices={devices}", f"--workers={workers}"] + (["--persistent"] if persistent else [])
    first = lightning(dest, tmp_path / "first", *mode, f"--max-steps={stop}")
    assert sum(len(k) for e, k in first[0]["batches"]) == NUM_SAMPLES // devices + 4 * 5  # stopped 5 steps in
    second = lightning(dest, tmp_path / "second", *mode, f"--resume={tmp_path / 'first' / 'last.ckpt'}")
    epochs = per_epoch(first, second)
    assert sorted(epochs) == [0, 1, 2]
    for epoch, by_rank in epochs.items():
        assert [len(k) for k in by_rank] == [NUM_SAMPLES // devices] * devices, epoch
        assert sorted(k for rank in by_rank for k in rank) == sorted(keys), epoch  # none repeated, none lost
    for record in second:
        assert record["epochs"] == [[1, 1], [2, 2]]
        assert record["len"] == NUM_SAMPLES // devices  # the whole epoch's count, as Lightning counts batches
    if devices == 1:
        assert epochs[1][0] == reference_order(dest, 1, workers=workers)  # the same order as unbroken


def trainer_args(tmp_path: Path, *, epochs: int, persistent: bool):
    """transformers.TrainingArguments of the in-process Trainer tests: CPU, batches of 4, 2
    DataLoader workers, no checkpoints, logs or reports."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(tmp_path / "out"),
        num_train_epochs=epochs,
        per_device_train_batch_size=4,
        dataloader_num_workers=2,
        dataloader_persistent_workers=persistent,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        learning_rate=0.01,
    )


class _SpyDataset(ShardDataset):
    """Records the set_epoch calls the framework makes."""

    calls: list[int]

    def set_epoch(self, epoch: int) -> None:
        self.calls.append(epoch)
        super().set_epoch(epoch)


@pytest.mark.parametrize("persistent", [True, False])
def test_hugging_face_trainer_epochs_differ_and_are_exact(tmp_path, dataset_dir, persistent):
    from transformers import Trainer

    dest, _ = dataset_dir
    dataset = _SpyDataset(dest, decode=hf_item, shuffle_buffer=10, seed=5, batch_size=4)
    dataset.calls = []
    model = TinyModel()
    Trainer(model=model, args=trainer_args(tmp_path, epochs=3, persistent=persistent), train_dataset=dataset).train()
    steps = -(-NUM_SAMPLES // 4)
    assert len(model.seen) == 3 * steps
    epochs = [[i for batch in model.seen[e * steps : (e + 1) * steps] for i in batch] for e in range(3)]
    assert all(sorted(e) == list(range(NUM_SAMPLES)) for e in epochs)  # every sample once per epoch
    assert len({tuple(e) for e in epochs}) == 3  # three different orders
    assert set(dataset.calls) == {0, 1, 2}  # accelerate's DataLoaderShard calls the dataset's set_epoch


def test_hugging_face_trainer_resumes_mid_epoch(tmp_path, dataset_dir):
    """Trainer(resume_from_checkpoint=...) skips the batches it trained on by reading them again
    (accelerate's skip_first_batches); the epoch's order is the same, so nothing repeats."""
    from transformers import Trainer, TrainingArguments

    dest, _ = dataset_dir
    steps = -(-NUM_SAMPLES // 4)

    def train(model: TinyModel, **kwargs) -> None:
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"),
            num_train_epochs=3,
            per_device_train_batch_size=4,
            dataloader_num_workers=2,
            dataloader_persistent_workers=True,
            use_cpu=True,
            report_to=[],
            save_strategy="steps",
            save_steps=steps + 5,
            logging_strategy="no",
            disable_tqdm=True,
            learning_rate=0.01,
            **{k: v for k, v in kwargs.items() if k == "max_steps"},
        )
        dataset = ShardDataset(dest, decode=hf_item, shuffle_buffer=10, seed=5, batch_size=4)
        Trainer(model=model, args=args, train_dataset=dataset).train(resume_from_checkpoint=kwargs.get("resume"))

    first, second = TinyModel(), TinyModel()
    train(first, max_steps=steps + 5)
    train(second, resume=str(tmp_path / "out" / f"checkpoint-{steps + 5}"))
    seen = first.seen + second.seen
    assert len(seen) == 3 * steps
    for e in range(3):
        assert sorted(i for batch in seen[e * steps : (e + 1) * steps] for i in batch) == list(range(NUM_SAMPLES))


def test_hugging_face_trainer_on_two_ranks_reads_each_epoch_once(tmp_path, dataset_dir):
    """Under torchrun with the Trainer reading through a DataLoader of its own (README): each
    rank trains on its half, each epoch is the dataset."""
    dest, _ = dataset_dir
    script = Path(__file__).with_name("hf_train.py")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            str(script),
            str(dest),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"seen-{r}.json").read_text()) for r in (0, 1)]
    steps = -(-NUM_SAMPLES // 2 // 4)
    assert [len(batches) for batches in ranks] == [2 * steps] * 2
    for e in range(2):
        ids = [i for batches in ranks for batch in batches[e * steps : (e + 1) * steps] for i in batch]
        assert sorted(ids) == list(range(NUM_SAMPLES))


@pytest.fixture(scope="module")
def mixture_json(tmp_path_factory, dataset_dir) -> Path:
    """The framework dataset read whole, and a second one of 40 samples read 1.5 times (60),
    keyed apart by source: 256 samples an epoch."""
    root = tmp_path_factory.mktemp("frameworks-mixture")
    more, _ = make_dataset(root, num_samples=40, per_shard=6)
    spec = {
        "sources": [
            {"location": str(dataset_dir[0]), "name": "base"},
            {"location": str(more), "repeat": 1.5, "name": "more"},
        ]
    }
    path = root / "mixture.json"
    path.write_text(json.dumps(spec))
    return path


def mixture_epoch(spec: Path, epoch: int) -> collections.Counter:
    from shardstream import Source

    data = json.loads(spec.read_text())
    dataset = ShardDataset(
        [Source(**x) for x in data["sources"]],
        decode=lambda s: f"{s['__source__']}|{s['__key__']}",
        shuffle_buffer=10,
        seed=5,
        batch_size=4,
    )
    dataset.set_epoch(epoch)
    return collections.Counter(dataset)


def test_lightning_resumes_a_mixture_mid_epoch_on_two_ranks(tmp_path, mixture_json):
    """A mixture under Lightning's DDP (2 ranks, 2 persistent workers, StatefulDataLoader),
    stopped mid-epoch 1 and resumed from Lightning's checkpoint: every epoch holds each
    source's count exactly, nothing of it lost or repeated beyond its own repeats."""
    per_rank = 256 // 2
    stop = per_rank // 4 + 5
    mode = ["--devices=2", "--workers=2", "--persistent"]
    first = lightning(mixture_json, tmp_path / "first", *mode, f"--max-steps={stop}")
    second = lightning(mixture_json, tmp_path / "second", *mode, f"--resume={tmp_path / 'first' / 'last.ckpt'}")
    epochs = per_epoch(first, second)
    assert sorted(epochs) == [0, 1, 2]
    for epoch, by_rank in epochs.items():
        assert [len(k) for k in by_rank] == [per_rank, per_rank], epoch
        assert collections.Counter(k for rank in by_rank for k in rank) == mixture_epoch(mixture_json, epoch), epoch
        for keys in by_rank:  # each rank its share of each source
            assert abs(sum(k.startswith("more|") for k in keys) - per_rank * 60 / 256) < 1


def test_hugging_face_trainer_reads_a_mixture_exactly(tmp_path, mixture_json):
    from transformers import Trainer

    from shardstream import Source

    data = json.loads(mixture_json.read_text())
    dataset = ShardDataset(
        [Source(**x) for x in data["sources"]], decode=hf_item, shuffle_buffer=10, seed=5, batch_size=4
    )
    model = TinyModel()
    Trainer(model=model, args=trainer_args(tmp_path, epochs=2, persistent=True), train_dataset=dataset).train()
    steps = 256 // 4
    assert len(model.seen) == 2 * steps
    for e in range(2):
        ids = [i for batch in model.seen[e * steps : (e + 1) * steps] for i in batch]
        assert sorted(i for i in ids if i < 100_000) == list(range(NUM_SAMPLES))
        more = [i for i in ids if i >= 100_000]
        assert len(more) == 60 and len(set(more)) == 40
        for batch in model.seen[e * steps : (e + 1) * steps]:  # 4 x 60/256 = 0.94: 0 or 1 a batch
            assert sum(i >= 100_000 for i in batch) <= 1
