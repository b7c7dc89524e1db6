"""ShardDataset(collate=...): each reader hands out whole batches, the same batches a DataLoader
makes of the same samples; with ByteCollate and reads in shard order they are read straight
from the shard files (FileRun.read_into), GNU tar and PAX shards indexed in place included,
checked against the index as sliced reads are; resume; errors naming shard, member and byte."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import resume_check
import torch
from torch.utils.data import DataLoader, default_collate

from shardstream import ShardDataset, loader_state_dict, pack
from shardstream.collate import ByteBatch, ByteCollate
from shardstream.errors import CorruptShardError
from shardstream.packing.build import build_index
from shardstream.reading import filerun
from shardstream.reading.filerun import FileRun
from shardstream.reading.slicer import RunSlices

pytestmark = pytest.mark.timeout(180)

NUM_SAMPLES = 300
PER_SHARD = 20


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    """300 samples in shards of 20: a ``.jpg`` of random bytes (0 to ~80 KB, some empty), an
    ASCII integer ``.cls`` and a ``.txt`` (some empty)."""
    root = tmp_path_factory.mktemp("dataset-batches")
    src = root / "src"
    src.mkdir()
    rng = np.random.default_rng(7)
    for i in range(NUM_SAMPLES):
        size = 0 if i % 10 == 3 else int(rng.integers(70_000, 80_000)) if i % 10 == 7 else int(rng.integers(1, 20_000))
        (src / f"{i:05d}.jpg").write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        (src / f"{i:05d}.cls").write_bytes(str((i * 7) % 13 - 2).encode())
        (src / f"{i:05d}.txt").write_bytes(f"sample {i}".encode() * (i % 5))
    pack(src, root / "ds", max_samples_per_shard=PER_SHARD, progress=False)
    return root / "ds"


def as_plain(batch) -> dict:
    """A batch (ByteBatch or the default collate's dict) as plain lists of bytes and ints."""
    if isinstance(batch, ByteBatch):
        out = {field: [bytes(v) for v in batch[field]] for field in batch.fields}
        out["__key__"] = list(batch.keys)
        out.update({k: list(v) for k, v in batch.extras.items()})
        if batch.labels is not None:
            out["labels"] = batch.labels.tolist()
        return out
    return {k: (v.tolist() if isinstance(v, torch.Tensor) else list(v)) for k, v in batch.items()}


def reference_batches(source, batch_size, collate, num_workers=0, **settings) -> list[dict]:
    """What a DataLoader makes of the dataset's samples with ``collate`` as its collate_fn."""
    dataset = ShardDataset(source, batch_size=batch_size, **settings)
    loader = DataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate, **_timeout(num_workers)
    )
    return [as_plain(b) for b in loader]


def dataset_batches(source, batch_size, collate, num_workers=0, **settings) -> tuple[list[dict], int]:
    """The batches of ``ShardDataset(collate=collate)`` through ``DataLoader(batch_size=None)``
    (no collate_fn), and ``len(loader)``."""
    dataset = ShardDataset(source, batch_size=batch_size, collate=collate, **settings)
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers, **_timeout(num_workers))
    return [as_plain(b) for b in loader], len(loader)


def _timeout(num_workers: int) -> dict:
    """A worker that hangs is an error after 60 s (a DataLoader without workers takes none)."""
    return {"timeout": 60} if num_workers else {}


COLLATES = {
    "bytes-labels": ByteCollate(label_field="cls"),
    "bytes": ByteCollate(),
    "default": default_collate,
}
ORDERS = {  # in shard order (file runs), shard order shuffled (file runs), lanes and a buffer (samples)
    "in-order": {"shuffle": False},
    "shards-shuffled": {"shuffle": True, "shuffle_buffer": 0, "max_open_shards": 1, "seed": 5},
    "buffer": {"shuffle": True, "shuffle_buffer": 50, "seed": 5},
}
FAST = {"shuffle": True, "shuffle_buffer": 0, "max_open_shards": 1, "seed": 3}  # file runs, shuffled shards


def no_slicing(monkeypatch) -> None:
    """Make slicing a run into samples an error (in forked workers too): the read must be the
    file runs'."""
    monkeypatch.setattr(RunSlices, "batches", lambda *a, **k: pytest.fail("a run was sliced into samples"))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("collate", list(COLLATES))
def test_the_datasets_batches_are_the_dataloaders(dataset_dir, collate, order, num_workers, monkeypatch):
    """Batches of 16 cross shards of 20 (a batch read from two files); batches of 7 leave each
    reader a short last batch. ByteCollate in shard order reads file runs only."""
    for batch_size in (16, 7):
        settings = ORDERS[order]
        want = reference_batches(dataset_dir, batch_size, COLLATES[collate], num_workers, **settings)
        with monkeypatch.context() as patch:
            if collate.startswith("bytes") and order != "buffer":
                no_slicing(patch)
            got, length = dataset_batches(dataset_dir, batch_size, COLLATES[collate], num_workers, **settings)
        assert got == want
        assert length == len(want) == -(-NUM_SAMPLES // batch_size)
        assert sorted(k for b in got for k in b["__key__"]) == [f"{i:05d}" for i in range(NUM_SAMPLES)]


def test_in_shard_order_byte_batches_are_read_from_the_files_without_sample_dicts(dataset_dir, monkeypatch):
    calls = {"read_into": 0, "samples": 0}
    read_into, samples = FileRun.read_into, FileRun.samples

    def counted(name, method):
        def wrapper(self, *args, **kwargs):
            calls[name] += 1
            return method(self, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(FileRun, "read_into", counted("read_into", read_into))
    monkeypatch.setattr(FileRun, "samples", counted("samples", samples))
    monkeypatch.setattr(RunSlices, "batches", lambda *a, **k: pytest.fail("a sample was sliced"))
    dataset = ShardDataset(dataset_dir, shuffle=False, batch_size=16, collate=ByteCollate(label_field="cls"))
    batches = list(dataset)
    assert len(batches) == 19 and all(isinstance(b, ByteBatch) for b in batches)
    assert calls["samples"] == 0 and calls["read_into"] >= 19  # a batch across two shards reads twice
    assert dataset.stats().samples == NUM_SAMPLES
    members = sum(len(v) for b in batches for f in ("jpg", "txt") for v in b[f])
    labels = sum(len(str(label)) for b in batches for label in b.labels.tolist())
    assert dataset.stats().bytes == members + labels  # every member's bytes, as a sliced read counts them


def test_resume_mid_epoch_from_loader_state_dict(dataset_dir, monkeypatch):
    """The epoch's rest, split anew over the workers, read from file runs, in the batches the
    DataLoader makes of the same resumed dataset."""
    collate = ByteCollate(label_field="cls")
    settings = {**FAST, "batch_size": 16}
    dataset = ShardDataset(dataset_dir, collate=collate, **settings)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, timeout=60)
    made = [dataset]  # the checkpointed pass: this dataset again; the resumed one: a fresh dataset

    def make():
        return made.pop() if made else ShardDataset(dataset_dir, collate=collate, **settings)

    how = replace(  # a checkpoint after 5 batches counts their 5 * 16 samples
        resume_check.plain(batch_size=None, num_workers=2, timeout=60), keep=as_plain, ids=lambda b: b["__key__"]
    )
    with monkeypatch.context() as patch:
        no_slicing(patch)
        dataset.set_epoch(4)
        everything = [as_plain(b) for b in loader]
        every = [f"{i:05d}" for i in range(NUM_SAMPLES)]
        run = resume_check.check_resume(make, how, stop_after=5, epoch=4, expected=every)  # every sample once
    first, rest, state = run.batches_before[0][0], run.batches_after[0], run.states[0][0]
    assert first == everything[:5]
    plain = ShardDataset(dataset_dir, **settings)
    plain.load_state_dict(state)
    assert rest == [
        as_plain(b) for b in DataLoader(plain, batch_size=16, num_workers=2, collate_fn=collate, timeout=60)
    ]
    with pytest.raises(ValueError, match=r"batch_size=None"):
        loader_state_dict(DataLoader(dataset, batch_size=16), samples_consumed=16)


def test_persistent_workers_read_three_epochs(dataset_dir, monkeypatch):
    no_slicing(monkeypatch)
    dataset = ShardDataset(dataset_dir, **FAST, batch_size=16, collate=ByteCollate())
    loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True, timeout=60)
    orders = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        keys = [k for b in loader for k in b.keys]
        assert sorted(keys) == [f"{i:05d}" for i in range(NUM_SAMPLES)]
        orders.append(keys)
    assert orders[0] != orders[1] != orders[2]


@pytest.fixture(scope="module")
def three_members(tmp_path_factory) -> Path:
    """120 samples of three members (``.a``, ``.cls``, ``.b``; the label sorts in the middle)
    in shards of 20."""
    root = tmp_path_factory.mktemp("three-members")
    src = root / "src"
    src.mkdir()
    rng = np.random.default_rng(11)
    for i in range(120):
        (src / f"{i:04d}.a").write_bytes(rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8).tobytes())
        (src / f"{i:04d}.cls").write_bytes(str(i % 9).encode())
        (src / f"{i:04d}.b").write_bytes(rng.integers(0, 256, int(rng.integers(1, 900)), dtype=np.uint8).tobytes())
    pack(src, root / "ds", max_samples_per_shard=20, progress=False)
    return root / "ds"


@pytest.mark.parametrize("label_field", [None, "a", "cls", "b"])
@pytest.mark.parametrize("batch_size", [1, 7, 50])
def test_three_members_with_the_label_at_any_place_and_batches_past_a_shard(
    three_members, label_field, batch_size, monkeypatch
):
    """The label member set aside wherever it sorts; batches of 1, and of 50 (more than a
    shard of 20: a batch read from three files); preadv's buffers cut into calls of 3."""
    collate = ByteCollate(label_field=label_field)
    if label_field in ("a", "b"):  # not integers: named
        with pytest.raises(ValueError, match=rf"member '{label_field}' is not an integer label"):
            list(ShardDataset(three_members, shuffle=False, batch_size=batch_size, collate=collate))
        return
    want = reference_batches(three_members, batch_size, collate, shuffle=False)
    no_slicing(monkeypatch)
    monkeypatch.setattr(filerun, "_IOV_MAX", 3)
    got, length = dataset_batches(three_members, batch_size, collate, shuffle=False)
    assert got == want and length == -(-120 // batch_size)


@pytest.mark.parametrize("world_size", [2, 3])
def test_each_rank_reads_its_batches_from_file_runs(dataset_dir, world_size, monkeypatch):
    """Ranks cut shards at byte ranges: a rank's first run starts inside a shard."""
    keys = []
    for rank in range(world_size):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        want = reference_batches(dataset_dir, 16, ByteCollate(label_field="cls"), 2, **FAST)
        with monkeypatch.context() as patch:
            no_slicing(patch)
            got, length = dataset_batches(dataset_dir, 16, ByteCollate(label_field="cls"), 2, **FAST)
        assert got == want and length == len(got)
        keys += [k for b in got for k in b["__key__"]]
    assert set(keys) == {f"{i:05d}" for i in range(NUM_SAMPLES)}


def test_a_dataloader_that_batches_the_datasets_batches_again_is_told_so(dataset_dir):
    dataset = ShardDataset(dataset_dir, shuffle=False, batch_size=16, collate=ByteCollate())
    with pytest.raises(ValueError, match=r"read it with DataLoader\(dataset, batch_size=None\)"):
        next(iter(DataLoader(dataset, batch_size=4, collate_fn=ByteCollate())))


def foreign_shards(tmp_path: Path) -> Path:
    """Shards of GNU tar (names past 100 bytes: GNU long-name records) and of tarfile's PAX
    format (long names in PAX records), indexed in place: headers longer than a block."""
    out = tmp_path / "foreign"
    out.mkdir()
    src = tmp_path / "gnu-src" / ("d" * 60) / ("e" * 60)
    src.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for i in range(9):
        (src / f"k{i:02d}.jpg").write_bytes(rng.integers(0, 256, 300 + 997 * i, dtype=np.uint8).tobytes())
        (src / f"k{i:02d}.cls").write_text(str(i))
    subprocess.run(
        ["tar", "--format=gnu", "--sort=name", "-cf", str(out / "part-0.tar"), "-C", str(tmp_path / "gnu-src"), "."],
        check=True,
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(7):
            for ext, payload in (("jpg", os.urandom(800 + 313 * i)), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{'p' * 120}/é{i:02d}.{ext}")  # long and non-ASCII: PAX records
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    (out / "part-1.tar").write_bytes(buf.getvalue())
    build_index([str(out)], workers=1)
    return out


def test_gnu_and_pax_shards_indexed_in_place(tmp_path):
    out = foreign_shards(tmp_path)
    for batch_size in (4, 5):
        want = reference_batches(out, batch_size, ByteCollate(label_field="cls"), shuffle=False)
        got, _ = dataset_batches(out, batch_size, ByteCollate(label_field="cls"), shuffle=False)
        assert got == want and sum(len(b["__key__"]) for b in got) == 16


def test_a_shard_cut_short_after_it_was_opened_names_shard_and_sample(dataset_dir, tmp_path):
    shard = tmp_path / "data-000000.tar"
    shutil.copy(next(dataset_dir.glob("*000000.tar")), shard)
    dataset = ShardDataset(dataset_dir, shuffle=False)
    table = dataset._engine.shards.table(0)
    run = FileRun(str(shard), RunSlices(table, np.arange(table.num_samples), url=str(shard)))
    with open(shard, "r+b") as f:
        f.truncate(int(run.slices.ends[12]) - 100)
    out = bytearray(sum(run.kept_sizes(0, 20)))
    with pytest.raises(
        CorruptShardError, match=r"data-000000\.tar: ends at byte \d+, but the index says sample '00012'"
    ):
        run.read_into(0, 20, memoryview(out))
    run.read_into(0, 12, memoryview(bytearray(sum(run.kept_sizes(0, 12)))))  # what is there still reads


def copy_of(dataset_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ds"
    shutil.copytree(dataset_dir, copy)
    return copy


def test_a_damaged_header_names_shard_member_and_byte(dataset_dir, tmp_path):
    copy = copy_of(dataset_dir, tmp_path)
    shard = copy / "data-000003.tar"
    data = bytearray(shard.read_bytes())
    at = data.index(b"00065.jpg")  # the name field of a member's header
    data[at : at + 9] = b"00065.png"
    shard.write_bytes(data)
    dataset = ShardDataset(copy, shuffle=False, batch_size=16, collate=ByteCollate())
    with pytest.raises(CorruptShardError, match=rf"data-000003\.tar: tar header checksum mismatch at byte {at}"):
        list(dataset)


def test_a_swapped_shard_of_the_same_size_is_refused_by_its_headers(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):  # every shard the same size
        (src / f"{i:04d}.bin").write_bytes(bytes([i]) * 1000)
    pack(src, tmp_path / "ds", max_samples_per_shard=10, progress=False)
    a, b = tmp_path / "ds" / "data-000000.tar", tmp_path / "ds" / "data-000001.tar"
    assert a.stat().st_size == b.stat().st_size
    a_bytes = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(a_bytes)
    dataset = ShardDataset(tmp_path / "ds", shuffle=False, batch_size=8, collate=ByteCollate())
    with pytest.raises(CorruptShardError, match=r"data-000000\.tar: the tar header at byte 0 gives member '0010\.bin'"):
        list(dataset)


def test_a_label_that_is_not_an_integer_names_shard_and_key(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"{i:02d}.jpg").write_bytes(b"x" * (i + 1))
        (src / f"{i:02d}.cls").write_bytes(b"cat" if i == 4 else str(i).encode())
    pack(src, tmp_path / "ds", progress=False)
    dataset = ShardDataset(tmp_path / "ds", shuffle=False, batch_size=4, collate=ByteCollate(label_field="cls"))
    with pytest.raises(ValueError, match=r"data-000000\.tar: sample '04' member 'cls' is not an integer label"):
        list(dataset)


def test_collate_needs_batch_size(dataset_dir):
    with pytest.raises(ValueError, match=r"pass batch_size="):
        ShardDataset(dataset_dir, collate=ByteCollate())
    with pytest.raises(ValueError, match=r"must be callable"):
        ShardDataset(dataset_dir, batch_size=4, collate="bytes")
