"""Mistakes a user makes with the reading half, named where they happen: a DataLoader batching
by another size than ShardDataset(batch_size=), dataset-made batches batched again, len() of
shard URLs with their tables beside them, the set_epoch warning of passes that all read alike,
and the class names of an index (ShardDataset.classes / class_to_idx)."""

from __future__ import annotations

import gc
import logging
import warnings

import pytest
from test_dataset import make_dataset
from torch.utils.data import DataLoader
from torch.utils.data._utils import fetch as torch_fetch
from webdataset import TarWriter

from shardstream import ByteCollate, ShardDataset, Source
from shardstream.index import container
from shardstream.index.manifest import MAGIC

MISBATCHED = "ShardDataset(batch_size=16) but the DataLoader batches 32 samples"


def key_of(sample):
    return sample["__key__"]


@pytest.fixture(scope="module")
def issue_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("issue"), num_samples=124, per_shard=10)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # 3 workers on a 2-core box
def test_the_issues_case_a_loader_batching_by_another_size_is_warned_from_its_workers(
    issue_dataset, capfd, log_to_stderr
):
    dest, keys = issue_dataset
    dataset = ShardDataset(dest, batch_size=16, decode=key_of)
    loader = DataLoader(dataset, batch_size=32, num_workers=3)
    batches = list(loader)
    assert len(loader) == 4 and [len(b) for b in batches] == [32, 32, 32, 16, 12]  # as the issue saw it
    assert sorted(k for b in batches for k in b) == sorted(keys)
    list(loader)  # a second pass: not warned again
    logged = [line for line in capfd.readouterr().err.splitlines() if MISBATCHED in line]
    assert len(logged) == 1
    assert "ShardDataset(batch_size=32) or DataLoader(batch_size=16)" in logged[0]
    matched = DataLoader(ShardDataset(dest, batch_size=32, decode=key_of), batch_size=32, num_workers=3)
    assert [len(b) for b in matched] == [32, 32, 32, 28] and len(matched) == 4
    assert "but the DataLoader batches" not in capfd.readouterr().err


def test_in_the_training_process_it_is_a_warning_once_a_dataset(issue_dataset):
    dest, _ = issue_dataset
    loader = DataLoader(ShardDataset(dest, batch_size=16, decode=key_of), batch_size=32)
    with pytest.warns(UserWarning, match=r"ShardDataset\(batch_size=16\) but the DataLoader batches 32 samples"):
        list(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(loader)  # the same dataset again
        list(DataLoader(ShardDataset(dest, batch_size=16, decode=key_of), batch_size=16))  # sizes agree
        list(DataLoader(ShardDataset(dest, batch_size=16, decode=key_of), batch_size=None))  # not batching
        samples = iter(ShardDataset(dest, batch_size=16, decode=key_of))  # no DataLoader at all
        assert next(samples)


def test_a_torch_whose_fetcher_differs_does_not_warn(issue_dataset, monkeypatch):
    dest, keys = issue_dataset

    def other_fetch(self, indices):  # not torch's fetch: no frame to find
        return self.collate_fn([next(self.dataset_iter) for _ in indices])

    monkeypatch.setattr(torch_fetch._IterableDatasetFetcher, "fetch", other_fetch)
    loader = DataLoader(ShardDataset(dest, batch_size=16, decode=key_of, shuffle=False), batch_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = next(iter(loader))
    assert first == keys[:32]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataset_batches_under_a_batching_loader_say_batch_size_none(issue_dataset, num_workers):
    dest, keys = issue_dataset
    dataset = ShardDataset(dest, batch_size=8, collate=ByteCollate(label_field="cls"))
    with pytest.raises(
        ValueError, match=r"batches them again \(batch_size=8\); read it with DataLoader\(dataset, batch_size=None\)"
    ):
        list(DataLoader(dataset, batch_size=8, num_workers=num_workers))
    # The error's traceback holds that DataLoader's iterator in a reference cycle, its workers
    # alive: one slow to start would begin its pass while the next DataLoader's run (and be
    # told apart from them: the epochs' check). Collecting it shuts them down first.
    gc.collect()
    batches = list(DataLoader(dataset, batch_size=None, num_workers=num_workers))
    assert sorted(k for b in batches for k in b["__key__"]) == sorted(keys)


def test_shard_urls_with_their_tables_have_a_len_and_exact_epochs(tmp_path, monkeypatch):
    dest, keys = make_dataset(tmp_path, num_samples=117, per_shard=8)
    urls = sorted(str(p) for p in dest.glob("*.tar"))
    pattern = str(dest / f"data-{{000000..{len(urls) - 1:06d}}}.tar")
    for source in (urls, pattern):
        dataset = ShardDataset(source, seed=3, decode=key_of)
        assert len(dataset) == dataset.num_samples == 117
        assert list(dataset) == list(ShardDataset(dest, seed=3, decode=key_of))  # the index's epoch, sample for sample
    per_rank = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        dataset = ShardDataset(urls, decode=key_of, drop_last=False)
        got = list(DataLoader(dataset, batch_size=None, num_workers=2))
        assert len(dataset) == 59 and len(got) == 59  # 117 over 2 ranks, the same on each (one repeat)
        per_rank.append(got)
    assert set(per_rank[0] + per_rank[1]) == set(keys)


def test_shard_urls_without_tables_keep_todays_behaviour(tmp_path, caplog):
    shard = tmp_path / "wds-000000.tar"
    with TarWriter(str(shard), encoder=False, mtime=0) as writer:
        for i in range(5):
            writer.write({"__key__": f"{i:03d}", "txt": b"x", "cls": b"1"})
    bare = ShardDataset([str(shard)], shuffle=False)
    with pytest.raises(TypeError, match="needs a dataset with an index"):
        len(bare)
    assert [s["__key__"] for s in bare] == [f"{i:03d}" for i in range(5)]
    dest, _ = make_dataset(tmp_path / "packed", num_samples=30, per_shard=10)
    (dest / "data-000001.tar.samples").unlink()
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        partial = ShardDataset(sorted(str(p) for p in dest.glob("*.tar")))
    assert "data-000001.tar.samples: no sample table beside this shard" in caplog.text
    with pytest.raises(TypeError, match="needs a dataset with an index"):
        len(partial)


@pytest.mark.parametrize("shuffle", [False, True])
def test_the_set_epoch_warning_only_where_passes_differ(issue_dataset, caplog, shuffle):
    dest, _ = issue_dataset
    dataset = ShardDataset(dest, shuffle=shuffle, decode=key_of)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        first, second = list(dataset), list(dataset)
    warned = "started without set_epoch()" in caplog.text
    assert warned == shuffle and (first == second) == (not shuffle)


def with_classes(dest, classes):
    """Rewrite the index of ``dest`` with ``classes`` in its header, as pack --labels-from-dirs writes it."""
    path = dest / "index.bin"
    fields, columns = container.read(path.read_bytes(), magic=MAGIC, url=str(path), kind="index")
    fields = {**fields, "classes": classes, "class_counts": None}
    path.write_bytes(b"".join(container.to_pieces(MAGIC, fields, [(k, v.copy()) for k, v in columns.items()])))
    return dest


def test_classes_and_class_to_idx_come_from_the_index(tmp_path):
    plain, _ = make_dataset(tmp_path / "plain", num_samples=12, per_shard=4)
    assert ShardDataset(plain).classes is None and ShardDataset(plain).class_to_idx is None
    assert ShardDataset(sorted(str(p) for p in plain.glob("*.tar"))).classes is None
    a = with_classes(make_dataset(tmp_path / "a", num_samples=12, per_shard=4)[0], ["class0", "class1", "class2"])
    b = with_classes(make_dataset(tmp_path / "b", num_samples=9, per_shard=4)[0], ["class0", "class1", "class2"])
    c = with_classes(make_dataset(tmp_path / "c", num_samples=9, per_shard=4)[0], ["cat", "dog"])
    dataset = ShardDataset(a)
    assert dataset.classes == ["class0", "class1", "class2"]
    assert dataset.class_to_idx == {"class0": 0, "class1": 1, "class2": 2}
    assert ShardDataset([Source(a, name="a"), Source(b, name="b")]).classes == ["class0", "class1", "class2"]
    assert ShardDataset([Source(a, name="a"), Source(c, name="c")]).classes is None  # lists differ
    assert ShardDataset([Source(a, name="a"), Source(plain, name="p")]).class_to_idx is None  # one has none
