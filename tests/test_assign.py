import pytest

from shardstream.reading.assign import WorkerSlot, assign_shards, current_slot, shard_order


def all_slots(world_size, num_workers):
    return [
        WorkerSlot(rank=r, world_size=world_size, worker_id=w, num_workers=num_workers)
        for r in range(world_size)
        for w in range(num_workers)
    ]


@pytest.mark.parametrize(("num_shards", "world_size", "num_workers"), [(8, 2, 2), (13, 2, 2), (5, 3, 1), (2, 2, 2)])
def test_every_shard_goes_to_exactly_one_slot(num_shards, world_size, num_workers):
    for epoch in range(3):
        got = [
            assign_shards(num_shards, s, seed=3, epoch=epoch, shuffle=True) for s in all_slots(world_size, num_workers)
        ]
        flat = sorted(sum(got, []))
        assert flat == list(range(num_shards))
        sizes = [len(g) for g in got]
        assert max(sizes) - min(sizes) <= 1


def test_order_is_seeded_and_changes_per_epoch():
    a = shard_order(50, seed=1, epoch=0, shuffle=True)
    assert a == shard_order(50, seed=1, epoch=0, shuffle=True)
    assert a != shard_order(50, seed=1, epoch=1, shuffle=True)
    assert a != shard_order(50, seed=2, epoch=0, shuffle=True)
    assert shard_order(5, seed=1, epoch=3, shuffle=False) == [0, 1, 2, 3, 4]
    slot = WorkerSlot(rank=1, world_size=2)
    assert assign_shards(50, slot, seed=1, epoch=0, shuffle=True) != assign_shards(
        50, slot, seed=1, epoch=1, shuffle=True
    )


def test_slot_from_torchrun_variables(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert current_slot() == WorkerSlot(rank=2, world_size=4, worker_id=0, num_workers=1)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert current_slot() == WorkerSlot()


def test_bad_rank_variables_are_named(monkeypatch):
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(ValueError, match="RANK='two'"):
        current_slot()
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"rank=4 must be in \[0, world_size=4\)"):
        current_slot()
