"""ShardDataset under the training loops users run: PyTorch Lightning's Trainer (1 and 2 CPU
devices with DDP over gloo, persistent workers on and off, a plain DataLoader and torchdata's
StatefulDataLoader, stopped mid-epoch by max_steps and resumed from its checkpoint) and Hugging
Face's transformers.Trainer (one process, and 2 DDP ranks under torchrun). Each epoch must
read every sample once, in that epoch's order, with nothing of ours in the loop."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hf_train import TinyModel, hf_item
from test_dataset import make_dataset
from test_torchrun import free_port
from torch.utils.data import DataLoader

from shardstream import ShardDataset

pytestmark = pytest.mark.slow

# Even over 2 ranks (no pads: every epoch is exactly the dataset), but 2 DataLoader workers
# splitting a rank's part evenly would each end with a short batch of 2, one batch more than
# len(loader) (196 = 49 x 4; 98 = 24 x 4 + 2): ShardDataset(batch_size=) must prevent that.
NUM_SAMPLES = 196


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("frameworks"), num_samples=NUM_SAMPLES, per_shard=8)


# The Lightning runs of the tests below: (devices, workers, mode) of the uninterrupted runs, and
# (devices, workers, persistent workers) of the runs stopped mid-epoch 1 by max_steps and resumed.
EPOCH_CASES = [(1, 2, "--persistent"), (1, 0, "--loader=stateful"), (2, 2, "--persistent"), (2, 2, "--loader=plain")]
RESUME_CASES = [(1, 2, True), (1, 0, False), (2, 2, False), (2, 2, True)]
MIXTURE_PER_RANK = 256 // 2  # the mixture's epoch (mixture_json) over 2 ranks
MIXTURE_MODE = ("--workers=2", "--persistent")


def stop_step(devices: int) -> int:
    """The step where the stopped runs stop: 5 steps into epoch 1."""
    return -(-NUM_SAMPLES // devices // 4) + 5


def resume_mode(workers: int, persistent: bool) -> tuple[str, ...]:
    return (f"--workers={workers}", "--persistent") if persistent else (f"--workers={workers}",)


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of tests/lightning_epochs.py: its options, on ``devices`` devices, of the
    framework dataset or the mixture; ``resumes`` names the run whose last.ckpt it resumes."""

    devices: int
    options: tuple[str, ...]
    mixture: bool = False
    resumes: str | None = None


RUNS: dict[str, Run] = {
    **{f"epochs-{d}-{w}{m}": Run(d, (f"--workers={w}", m)) for d, w, m in EPOCH_CASES},
    **{f"stop-{d}-{w}-{p}": Run(d, (*resume_mode(w, p), f"--max-steps={stop_step(d)}")) for d, w, p in RESUME_CASES},
    **{f"resume-{d}-{w}-{p}": Run(d, resume_mode(w, p), resumes=f"stop-{d}-{w}-{p}") for d, w, p in RESUME_CASES},
    "mixture-stop": Run(2, (*MIXTURE_MODE, f"--max-steps={MIXTURE_PER_RANK // 4 + 5}"), mixture=True),
    "mixture-resume": Run(2, MIXTURE_MODE, mixture=True, resumes="mixture-stop"),
}


class LightningRuns:
    """The records of RUNS, each rank's: the runs of one device count that resume none run one
    after another in one launch of tests/lightning_epochs.py, and those that resume one in a
    second launch (a resume is always in other processes than its stopped run). Each launch
    pays Lightning's import, the DDP start-up and the workers' forkserver once for several
    runs; it is made when a test first asks for one of its runs. A failed launch fails the
    tests of its runs with its stderr (which names the run it was in)."""

    def __init__(self, root: Path, datasets: dict[bool, Path]) -> None:
        self.root, self.datasets = root, datasets
        self.failures: dict[tuple[int, bool], str | None] = {}

    def __call__(self, name: str) -> list[dict]:
        run = RUNS[name]
        self.launch(run.devices, resumed=run.resumes is not None)
        out = self.root / name
        return [json.loads(p.read_text()) for p in sorted(out.glob("keys-*.json"))]

    def launch(self, devices: int, *, resumed: bool) -> None:
        if resumed:
            self.launch(devices, resumed=False)  # the runs they resume
        key = (devices, resumed)
        if key not in self.failures:
            names = [n for n, r in RUNS.items() if r.devices == devices and (r.resumes is not None) == resumed]
            runs = []
            for name in names:
                run, out = RUNS[name], self.root / name
                out.mkdir()
                resume = [f"--resume={self.root / run.resumes / 'last.ckpt'}"] if run.resumes else []
                runs.append(shlex.join([str(self.datasets[run.mixture]), str(out), *run.options, *resume]))
            script = Path(__file__).with_name("lightning_epochs.py")
            self.failures[key] = f"runs {names}: did not end in 300 s"  # unless they end, and once only
            done = subprocess.run(
                [sys.executable, str(script), f"--devices={devices}", *runs],
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            self.failures[key] = None if done.returncode == 0 else f"runs {names}: {done.stderr[-4000:]}"
        assert self.failures[key] is None, self.failures[key]


@pytest.fixture(scope="module")
def lightning(tmp_path_factory, dataset_dir, mixture_json) -> LightningRuns:
    return LightningRuns(tmp_path_factory.mktemp("lightning"), {False: dataset_dir[0], True: mixture_json})


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


@pytest.mark.parametrize(("devices", "workers", "mode"), EPOCH_CASES)
def test_lightning_epochs_differ_and_are_exact(lightning, dataset_dir, devices, workers, mode):
    dest, keys = dataset_dir
    ranks = lightning(f"epochs-{devices}-{workers}{mode}")
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


@pytest.mark.parametrize(("devices", "workers", "persistent"), RESUME_CASES)
def test_lightning_resumes_mid_epoch_from_its_checkpoint(lightning, dataset_dir, devices, workers, persistent):
    """Stopped by max_steps in epoch 1, resumed (in new processes) from Lightning's own checkpoint
    (which holds the StatefulDataLoader's state): epoch 1 is completed with no repeat or loss,
    epoch 2 follows."""
    dest, keys = dataset_dir
    first = lightning(f"stop-{devices}-{workers}-{persistent}")
    assert len(first) == devices
    assert sum(len(k) for e, k in first[0]["batches"]) == NUM_SAMPLES // devices + 4 * 5  # stopped 5 steps in
    second = lightning(f"resume-{devices}-{workers}-{persistent}")
    assert len(second) == devices
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


def test_lightning_resumes_a_mixture_mid_epoch_on_two_ranks(lightning, mixture_json):
    """A mixture under Lightning's DDP (2 ranks, 2 persistent workers, StatefulDataLoader),
    stopped mid-epoch 1 and resumed from Lightning's checkpoint: every epoch holds each
    source's count exactly, nothing of it lost or repeated beyond its own repeats."""
    per_rank = MIXTURE_PER_RANK
    first, second = lightning("mixture-stop"), lightning("mixture-resume")
    assert len(first) == len(second) == 2
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
