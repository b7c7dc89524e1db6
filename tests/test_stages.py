"""The reader's stage list and item unit, as a new kind of item meets them: a unit defined
here (every other sample of each shard, tagged by a stage of its own) reads through
``ShardDataset`` with exact epochs, ``len``, workers and resume, with no change to the dataset,
the engine or the schedule; and a stage list is data a Reader is built from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from shardstream import ShardDataset, Source, pack
from shardstream.index import ShardTable
from shardstream.reading.assign import WorkerSlot
from shardstream.reading.reader import Reader
from shardstream.reading.stages import SAMPLES, Deliver, ExactRead, ItemUnit, PassContext, Stage

pytestmark = pytest.mark.timeout(180)


class EvenRows:
    """A shard set whose items are the even rows (samples 0, 2, 4, ...) of each shard's table."""

    def __init__(self, shards):
        self.shards = shards
        self.num_shards, self.foreign, self.classes = shards.num_shards, shards.foreign, shards.classes
        self.sample_counts = (np.asarray(shards.sample_counts) + 1) // 2

    def url(self, shard):
        return self.shards.url(shard)

    def size_bytes(self, shard):
        return self.shards.size_bytes(shard)

    def crc32_hex(self, shard):
        return self.shards.crc32_hex(shard)

    def table(self, shard):
        return even_rows(self.shards.table(shard))

    def request_table(self, shard, *, on_retry=None, cache=None):
        wait = self.shards.request_table(shard, on_retry=on_retry, cache=cache)
        return lambda: even_rows(wait())


def even_rows(table: ShardTable) -> ShardTable:
    """The table of ``table``'s even rows: their members, keys and names, nothing else."""
    rows = np.arange(0, table.num_samples, 2)
    firsts, lasts = table.member_start[rows], table.member_start[rows + 1]
    members = np.concatenate([np.arange(a, b) for a, b in zip(firsts, lasts)])
    keys = [table.key(int(i)).encode() for i in rows]
    names = [name.encode() for name in np.array(table.member_names(), dtype=object)[members]]
    return ShardTable(
        shard=table.shard,
        url=table.url,
        columns={
            "member_start": np.concatenate([[0], np.cumsum(lasts - firsts)]).astype(np.int64),
            "offsets": table.offsets[members],
            "sizes": table.sizes[members],
            "key_offsets": np.concatenate([[0], np.cumsum([len(k) for k in keys])]).astype(np.int64),
            "keys": np.frombuffer(b"".join(keys), np.uint8),
            "name_offsets": np.concatenate([[0], np.cumsum([len(n) for n in names])]).astype(np.int64),
            "names": np.frombuffer(b"".join(names), np.uint8),
        },
    )


class Tagged:
    """A stage: each item read gets ``"__unit__": "even"``."""

    def open(self, upstream, ctx):
        for batch in upstream:
            for sample in batch:
                if sample is not None:
                    sample["__unit__"] = "even"
            yield batch


class EvenSamples:
    name = "even-sample"

    def items_of(self, shards):
        return EvenRows(shards)

    def stages(self):
        return (Tagged(),)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    """45 samples in shards of 10 (the last of 5): a ``.bin`` and a ``.cls`` each."""
    root = tmp_path_factory.mktemp("stages")
    src = root / "src"
    src.mkdir()
    for i in range(45):
        (src / f"{i:03d}.bin").write_bytes(bytes([i]) * (i + 1))
        (src / f"{i:03d}.cls").write_bytes(str(i % 4).encode())
    pack(src, root / "ds", max_samples_per_shard=10, progress=False)
    return root / "ds"


EVEN = sorted(f"{i:03d}" for i in range(45) if i % 10 % 2 == 0)


def test_the_protocols_are_met_by_the_built_ins_and_by_a_new_unit():
    assert isinstance(SAMPLES, ItemUnit) and isinstance(EvenSamples(), ItemUnit)
    assert isinstance(Tagged(), Stage) and isinstance(ExactRead(), Stage) and isinstance(Deliver(), Stage)


def test_a_new_unit_reads_its_items_once_an_epoch_with_its_stage(dataset_dir):
    ds = ShardDataset(dataset_dir, unit=EvenSamples(), seed=3)
    items = list(ds)
    assert len(ds) == len(EVEN) == 23
    assert sorted(s["__key__"] for s in items) == EVEN
    assert {s["__unit__"] for s in items} == {"even"}
    assert all(s["bin"] == bytes([int(s["__key__"])]) * (int(s["__key__"]) + 1) for s in items)


def test_a_new_unit_splits_over_workers_and_ranks_and_counts_items(dataset_dir):
    loader = DataLoader(ShardDataset(dataset_dir, unit=EvenSamples(), batch_size=4), batch_size=4, num_workers=2)
    keys = [k for batch in loader for k in batch["__key__"]]
    assert sorted(keys) == EVEN and len(loader) == 6
    halves = [ShardDataset(dataset_dir, unit=EvenSamples(), drop_last=True) for _ in range(2)]
    got = []
    for rank, ds in enumerate(halves):
        progress, out = ds.reader.open(
            ds._epochs.view(rank=rank).upcoming,
            WorkerSlot(rank=rank, world_size=2),
            fetch=ds.fetch,
            stats=ds._board.reader(0),
        )
        got.append([s["__key__"] for s in out])
        assert progress.delivered == len(got[-1]) == 11  # 23 items over 2 ranks, the fewest dropped
    assert len(set(got[0]) | set(got[1])) == 22


def test_a_new_unit_resumes_mid_epoch_and_its_checkpoint_names_it(dataset_dir):
    ds = ShardDataset(dataset_dir, unit=EvenSamples(), seed=1)
    first = [s["__key__"] for s in ds]
    state = ds.state_dict(7)
    assert state["unit"] == "even-sample" and state["num_samples"] == 23
    again = ShardDataset(dataset_dir, unit=EvenSamples(), seed=1)
    again.load_state_dict(state)
    assert len(again) == 23 - 7
    assert [s["__key__"] for s in again] == first[7:]
    with pytest.raises(ValueError, match="unit"):
        ShardDataset(dataset_dir, seed=1).load_state_dict(state)  # samples are not its items


def test_a_samples_checkpoint_has_no_unit_key(dataset_dir):
    assert "unit" not in ShardDataset(dataset_dir).state_dict(3)


def test_a_unit_reads_a_mixture_of_its_items(dataset_dir):
    ds = ShardDataset([Source(dataset_dir, name="a"), Source(dataset_dir, name="b")], unit=EvenSamples())
    items = list(ds)
    assert len(ds) == 46 and sorted(s["__key__"] for s in items) == sorted(EVEN * 2)
    assert {s["__source__"] for s in items} == {"a", "b"}


def test_a_reader_is_its_stage_list(dataset_dir):
    """A stage list is data: a Reader built with one more stage runs it after the others."""
    ds = ShardDataset(dataset_dir, shuffle=False)

    class Keys:
        def open(self, upstream, ctx: PassContext):
            return (sample["__key__"] for sample in upstream)

    reader = Reader(ds.reader.schedule, ds.reader.engines, ds.reader.options, stages=[*ds.reader.stages, Keys()])
    state = ds._epochs.view(rank=0).upcoming
    _, out = reader.open(state, WorkerSlot(), fetch=ds.fetch, stats=ds._board.reader(0))
    assert list(out) == [f"{i:03d}" for i in range(45)]
    assert [type(stage).__name__ for stage in ds.reader.stages] == ["ExactRead", "Deliver"]
    batched = ShardDataset(dataset_dir, batch_size=8, collate=len, resampled=True)
    assert [type(stage).__name__ for stage in batched.reader.stages] == ["ResampledRead", "Deliver", "Batching"]
