"""A dataset is a mixture of one: one source read whole reads as the dataset, and random
access and shards_for answer for a mixture where their meaning is clear (sources read whole,
laid end to end), refused in one place where not."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstream import ShardDataset, Source, pack
from shardstream.reading.assign import WorkerSlot

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> tuple[Path, Path]:
    """Two datasets of 30 and 12 samples in shards of 5, keys a000.. and b000.."""
    root = tmp_path_factory.mktemp("one")
    out = []
    for name, n in (("a", 30), ("b", 12)):
        src = root / f"src_{name}"
        src.mkdir()
        for i in range(n):
            (src / f"{name}{i:03d}.txt").write_bytes(f"{name}{i}".encode())
        pack(src, root / name, max_samples_per_shard=5, progress=False)
        out.append(root / name)
    return out[0], out[1]


def test_one_whole_source_reads_and_checkpoints_as_the_dataset(two):
    a, _ = two
    plain, one = ShardDataset(a, seed=4), ShardDataset([Source(a)], seed=4)
    assert [s["__key__"] for s in one] == [s["__key__"] for s in plain]
    assert one.state_dict(7) == plain.state_dict(7) and "mixture" not in one.state_dict(7)
    assert one.sources is None and list(one.shard_urls) == list(plain.shard_urls)


def test_random_access_reads_a_mixture_of_whole_sources_laid_end_to_end(two):
    a, b = two
    mixed = ShardDataset([Source(a, name="a"), Source(b, name="b")], shuffle=False)
    assert mixed.random_access().num_samples == 42 == len(mixed)
    assert mixed[0]["__key__"] == "a000" and mixed[30]["__key__"] == "b000" and mixed[-1]["__key__"] == "b011"
    assert mixed[30]["__source__"] == "b" and mixed[29]["txt"] == b"a29"
    assert [s["__key__"] for s in mixed.get_many(["b003", 1, "a004"])] == ["b003", "a001", "a004"]
    with pytest.raises(KeyError, match="'zzz'"):
        mixed.get("zzz")
    with pytest.raises(IndexError, match="42"):
        mixed[42]


def test_a_mixture_read_in_parts_refuses_random_access_in_one_place(two):
    a, b = two
    parts = ShardDataset([Source(a, repeat=0.5), Source(b)])
    with pytest.raises(TypeError, match="read in parts"):
        parts[0]


def test_shards_for_a_mixture_names_the_shards_each_reader_reads(two):
    a, b = two
    mixed = ShardDataset([Source(a, name="a"), Source(b, name="b")], seed=2)
    every = mixed.shards_for(WorkerSlot())
    assert sorted(every) == sorted(mixed.shard_urls) and len(every) == 9
    halves = [mixed.shards_for(WorkerSlot(rank=r, world_size=2)) for r in range(2)]
    assert set(halves[0]) | set(halves[1]) == set(every) and all(halves)
    read = {s["__shard__"] for s in mixed}
    assert read == set(every)


def test_shards_for_a_rank_of_a_mixture_are_the_shards_its_pass_reads(two):
    a, b = two
    mixed = ShardDataset([Source(a, name="a"), Source(b, name="b")], seed=5)
    for rank in range(3):
        slot = WorkerSlot(rank=rank, world_size=3)
        _, out = mixed.reader.open(
            mixed._epochs.view(rank=rank).upcoming, slot, fetch=mixed.fetch, stats=mixed._board.reader(0)
        )
        assert {s["__shard__"] for s in out} == set(mixed.shards_for(slot))
