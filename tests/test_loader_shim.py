"""The shim around torch's private DataLoader fetcher (shardstream.reading.loader): on the torch
versions it knows, the DataLoader's batch size is found among the calling frames, in the
training process and in DataLoader workers; on another torch the check is off and says so
once, naming the version, instead of silently answering None."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from shardstream import ShardDataset, pack
from shardstream.reading import loader
from shardstream.reading.loader import KNOWN_TORCH, fetcher_batch_size, known_torch

pytestmark = pytest.mark.timeout(120)


class Probe(IterableDataset):
    """Yields, for each of its 12 items, what fetcher_batch_size answered at the first."""

    def __iter__(self):
        found = fetcher_batch_size(self, once=lambda flag: True)
        for _ in range(12):
            yield found


def answers(loader_or_dataset) -> set:
    return {x for batch in loader_or_dataset for x in (batch if isinstance(batch, list) else [batch])}


def test_the_torch_of_this_environment_is_known():
    assert known_torch(torch.__version__), f"torch {torch.__version__} is outside KNOWN_TORCH={KNOWN_TORCH}"


@pytest.mark.parametrize(
    ("version", "known"),
    [
        ("2.13.0", True),
        ("2.13.1+cu128", True),
        ("2.3.0", True),
        ("2.8.0a0+git1234", True),
        ("2.2.2", False),
        ("2.14.0", False),
        ("2.14.0.dev20270101+cpu", False),
        ("3.0.0", False),
        ("nightly", False),
    ],
)
def test_known_versions(version, known):
    assert known_torch(version) is known


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_batch_size_is_found_under_a_real_dataloader(num_workers):
    probe = Probe()
    batched = DataLoader(
        probe, batch_size=5, num_workers=num_workers, collate_fn=list, timeout=60 if num_workers else 0
    )
    assert answers(batched) == {5}
    unbatched = DataLoader(probe, batch_size=None, num_workers=num_workers, timeout=60 if num_workers else 0)
    assert answers(unbatched) == {None}  # no auto_collation: nothing to compare
    assert answers(probe) == {None}  # a plain loop: no DataLoader among the frames


def test_an_unknown_torch_is_warned_about_and_not_walked(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    calls = []
    with pytest.warns(UserWarning, match=r"cannot check the DataLoader reading ShardDataset on torch 2\.99\.0") as got:
        found = answers(DataLoader(Probe(), batch_size=5, collate_fn=list))
    assert found == {None}  # the check is off, said so: no frame walk on a layout it does not know
    assert "2.3 to 2.13" in str(got[0].message) and "DataLoader(batch_size=None)" in str(got[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: a `once` that says it was said already
        assert fetcher_batch_size(Probe(), once=lambda flag: calls.append(flag) or False) is None
    assert calls == [loader.UNCHECKED_TORCH]


def test_an_unknown_torch_is_said_once_per_dataset_and_reading_goes_on(tmp_path, monkeypatch, capfd, log_to_stderr):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"{i:03d}.txt").write_text(str(i))
    pack(src, tmp_path / "ds", max_samples_per_shard=8, progress=False)
    dataset = ShardDataset(tmp_path / "ds", batch_size=10, decode=lambda s: s["__key__"])
    with warnings.catch_warnings(record=True) as known:  # the known torch: the mismatch is warned about
        warnings.simplefilter("always")
        next(iter(DataLoader(dataset, batch_size=5)))
    assert any("but the DataLoader batches 5 samples" in str(w.message) for w in known)

    monkeypatch.setattr(torch, "__version__", "2.99.0")
    fresh = ShardDataset(tmp_path / "ds", batch_size=10, decode=lambda s: s["__key__"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = [k for batch in DataLoader(fresh, batch_size=5) for k in batch]
        second = [k for batch in DataLoader(fresh, batch_size=5) for k in batch]
    messages = [str(w.message) for w in seen]
    assert sorted(first) == sorted(second) == [f"{i:03d}" for i in range(30)]  # reading is not stopped
    assert sum("cannot check the DataLoader" in m for m in messages) == 1  # once per dataset
    assert not any("but the DataLoader batches" in m for m in messages)  # unchecked, not guessed at
    capfd.readouterr()
    workers = ShardDataset(tmp_path / "ds", batch_size=10, decode=lambda s: s["__key__"])
    loader = DataLoader(workers, batch_size=10, num_workers=2, timeout=60)  # in its workers: a log line
    for _ in range(2):
        assert sorted(k for batch in loader for k in batch) == [f"{i:03d}" for i in range(30)]
    logged = capfd.readouterr().err
    assert logged.count("cannot check the DataLoader reading ShardDataset on torch 2.99.0") == 1  # one of 2 x 2
