"""The epoch plan: exact splits, the DataLoader's batch order, and what a resume owes."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from shardstream.reading.plan import EpochPlan, Segment, buffer_order, consumed_per_worker, ramp_samples, split_workers

COUNTS = [7, 13, 5, 9, 11, 3, 8, 1, 0, 20]  # 77 samples, unequal shards, one empty


def rank_streams(plan: EpochPlan, world_size: int, num_workers: int) -> list[list[list[int]]]:
    """[rank][worker] -> the sample ids that worker yields, in order."""
    out = []
    for r in range(world_size):
        workers = []
        for w in range(num_workers):
            p, _ = plan.for_worker(rank=r, world_size=world_size, worker_id=w, num_workers=num_workers)
            workers.append(p.ids[p.order[p.skip :]].tolist())
        out.append(workers)
    return out


def dataloader_order(workers: list[list[int]], batch_size: int) -> list[int]:
    """What a DataLoader delivers from these worker streams, by the round-robin rule."""
    streams = [list(w) for w in workers]
    out = []
    while any(streams):
        for s in streams:
            if s:
                out += s[:batch_size]
                del s[:batch_size]
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_and_equal_counts(world_size, num_workers, drop_last):
    plan = EpochPlan(COUNTS, seed=3, epoch=1, shuffle_buffer=6, max_open_shards=3, drop_last=drop_last)
    streams = rank_streams(plan, world_size, num_workers)
    per_rank = [sum(len(w) for w in r) for r in streams]
    n = sum(COUNTS)
    expected = n // world_size if drop_last else -(-n // world_size)
    assert per_rank == [expected] * world_size
    assert plan.rank_count(world_size=world_size, num_workers=num_workers) == expected
    assert len({len(w) for r in streams for w in r} | {0}) <= 3  # worker lengths differ by at most one
    ids = [i for r in streams for w in r for i in w]
    if drop_last:
        assert len(set(ids)) == len(ids) == expected * world_size  # drops n mod world_size, repeats none
    else:
        assert sorted(set(ids)) == list(range(n))
        assert len(ids) - len(set(ids)) == expected * world_size - n  # the pad: fewest repeats


def test_orders_change_with_the_epoch_and_shuffle_mixes_shards():
    a = rank_streams(EpochPlan(COUNTS, seed=0, epoch=0), 2, 1)
    b = rank_streams(EpochPlan(COUNTS, seed=0, epoch=1), 2, 1)
    assert set(a[0][0]) != set(b[0][0])  # samples move between ranks across epochs
    assert a == rank_streams(EpochPlan(COUNTS, seed=0, epoch=0), 2, 1)  # and are reproducible
    flat = a[0][0]
    starts = np.concatenate([[0], np.cumsum(COUNTS)])
    shard = np.searchsorted(starts, flat, side="right") - 1
    assert np.mean(shard[1:] != shard[:-1]) > 0.3  # consecutive samples mostly from other shards
    plain = rank_streams(EpochPlan(COUNTS, seed=0, epoch=0, shuffle=False), 1, 1)[0][0]
    assert plain == list(range(sum(COUNTS)))


def test_buffer_order_is_a_permutation_that_holds_at_most_capacity():
    rng = np.random.default_rng(0)
    order = buffer_order(1000, 50, rng)
    assert sorted(order.tolist()) == list(range(1000))
    # the t-th emitted sample (t < 950) arrived at most t + 50 samples in
    assert all(order[t] <= t + 50 for t in range(950))
    assert abs(np.corrcoef(order, np.arange(1000))[0, 1]) < 0.999
    assert order[0] < ramp_samples(50) == 5  # emitting starts at a tenth full, not when full
    # while the buffer grows it takes two arrivals per emission, then one
    assert max(order[:45]) < 5 + 2 * 45 and max(order[:100]) >= 60


class _Tagged(IterableDataset):
    def __init__(self, lengths):
        self.lengths = lengths

    def __iter__(self):
        w = get_worker_info().id
        return iter((w, i) for i in range(self.lengths[w]))


@pytest.mark.parametrize(("lengths", "batch_size"), [([10, 10], 3), ([7, 5, 6], 4), ([9, 8], 1)])
def test_consumed_per_worker_matches_a_real_dataloader(lengths, batch_size):
    loader = DataLoader(_Tagged(lengths), batch_size=batch_size, num_workers=len(lengths))
    seen = [tuple(x) for batch in loader for x in zip(batch[0].tolist(), batch[1].tolist())]
    assert len(seen) == sum(lengths)
    for consumed in range(sum(lengths) + 1):
        done = [sum(1 for w, _ in seen[:consumed] if w == k) for k in range(len(lengths))]
        assert consumed_per_worker(lengths, batch_size, consumed) == done
    with pytest.raises(ValueError, match="samples_consumed=99"):
        consumed_per_worker(lengths, batch_size, 99)


@pytest.mark.parametrize(
    ("first", "second"), [((2, 2, 3), (2, 2)), ((4, 2, 3), (2, 1)), ((2, 1, 5), (3, 2)), ((3, 3, 2), (1, 1))]
)
@pytest.mark.parametrize("consumed", [0, 5, 11])
@pytest.mark.parametrize("split", [False, True])
def test_resume_delivers_exactly_what_is_left(first, second, consumed, split):
    """A checkpoint after ``consumed`` samples per rank, resumed with the same or another shape:
    together the two runs deliver the epoch (pads aside). ``split``: workers' pieces cut into
    whole batches (ShardDataset(batch_size=)), by the checkpoint's batch size before, by 2 after
    a change of shape."""
    world_size, num_workers, batch_size = first
    split_before = batch_size if split else None
    split_after = split_before if (world_size, num_workers) == second or not split else 2
    plan = EpochPlan(COUNTS, seed=5, epoch=2, shuffle_buffer=4, max_open_shards=2, batch_size=split_before)
    before = [
        i for r in rank_streams(plan, world_size, num_workers) for i in dataloader_order(r, batch_size)[:consumed]
    ]
    resumed = EpochPlan(
        COUNTS,
        seed=5,
        epoch=2,
        shuffle_buffer=4,
        max_open_shards=2,
        batch_size=split_after,
        segments=[Segment(world_size, num_workers, batch_size, consumed, split_batch_size=split_before)],
    )
    after_streams = rank_streams(resumed, *second)
    counts = [sum(len(w) for w in r) for r in after_streams]
    assert len(set(counts)) == 1
    assert counts[0] == resumed.rank_count(world_size=second[0], num_workers=second[1])
    after = [i for r in after_streams for w in r for i in w]
    both = before + after
    assert sorted(set(both)) == list(range(sum(COUNTS)))
    assert len(both) - len(set(both)) < world_size + second[0]
    if (world_size, num_workers) == second:  # same shape: each worker continues its own order
        full = [i for r in rank_streams(plan, world_size, num_workers) for w in r for i in w]
        assert sorted(both) == sorted(full)


@pytest.mark.parametrize("num_workers", [1, 2, 3, 5])
@pytest.mark.parametrize("batch_size", [1, 3, 4, 16])
def test_pieces_of_whole_batches_make_the_dataloader_yield_len_loader_batches(num_workers, batch_size):
    for total in range(0, 60):
        sizes = split_workers(total, num_workers, batch_size)
        assert sum(sizes) == total and len(sizes) == num_workers
        tagged = [[(w, i) for i in range(n)] for w, n in enumerate(sizes)]
        batches = []
        streams = [list(t) for t in tagged]
        while any(streams):  # the DataLoader's round-robin over workers that still have data
            for stream in streams:
                if stream:
                    batches.append(stream[:batch_size])
                    del stream[:batch_size]
        assert len(batches) == -(-total // batch_size)  # what len(DataLoader) says
        assert all(len(b) == batch_size for b in batches[:-1])
    assert split_workers(10, 3, None) == [4, 3, 3]


def test_state_from_workers_alone_cannot_change_shape():
    plan = EpochPlan(COUNTS, seed=0, epoch=0, segments=[Segment(2, 2, worker_yielded=((0, 3),))])
    with pytest.raises(ValueError, match="same world_size and num_workers"):
        plan.for_worker(rank=0, world_size=3, worker_id=0, num_workers=1)
    p, _ = plan.for_worker(rank=0, world_size=2, worker_id=0, num_workers=2)
    assert p.skip == 3


def test_an_empty_dataset_plans_nothing():
    plan = EpochPlan([0, 0], seed=0, epoch=0)
    assert rank_streams(plan, 2, 2) == [[[], []], [[], []]]
    assert plan.rank_count(world_size=2, num_workers=2) == 0


def test_a_worker_plan_is_o_runs_not_o_samples():
    """10^10 samples in 100,000 shards, one reader (the largest piece a worker can get): the
    plan, its first arrivals and first emissions take no per-sample memory."""
    import tracemalloc

    counts = np.full(100_000, 100_000, dtype=np.int64)
    tracemalloc.start()
    try:
        plan = EpochPlan(counts, seed=1, epoch=0, shuffle_buffer=1000)
        mine, _ = plan.for_worker(rank=0, world_size=1, worker_id=0, num_workers=1)
        first = next(mine.labels())
        emitted = [t for _, t in zip(range(2000), mine.emissions())]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert mine.count == 10**10 and len(mine.runs) == 100_000
    assert len(first) == 65536 and set(np.unique(first).tolist()) == {0, 1, 2, 3}
    assert sorted(emitted) != emitted and max(emitted) < 3000
    assert peak < 200 * 2**20, f"planning took {peak / 2**20:.0f} MB"


@pytest.mark.parametrize("total", [10_000, 3 * 10**9])
def test_lane_interleaving_draws_take_each_lane_exactly_its_samples(total):
    """Chunked draws of the interleaving (exact hypergeometric below 10^9 samples, clipped
    multinomial above) give each lane exactly its count, in order, reproducibly."""
    from shardstream.reading.emission import _draw_counts

    remaining = np.array([total // 2, total // 3, total - total // 2 - total // 3, 5], dtype=np.int64)
    rng = np.random.default_rng(0)
    left, taken = int(remaining.sum()), np.zeros(4, np.int64)
    for _ in range(50):
        n = min(65536, left)
        counts = _draw_counts(rng, remaining - taken, n)
        assert counts.sum() == n and np.all(counts <= remaining - taken)
        taken += counts
        left -= n
    assert np.all(taken <= remaining)
    if total == 10_000:
        assert np.array_equal(taken, remaining)


def test_more_lanes_than_int8_holds():
    counts = [3] * 300
    plan = EpochPlan(counts, seed=2, epoch=0, shuffle_buffer=50, max_open_shards=200)
    mine, _ = plan.for_worker(rank=0, world_size=1, worker_id=0, num_workers=1)
    assert mine.lanes == 200 and next(mine.labels()).dtype == np.int32
    assert sorted(mine.ids[mine.order].tolist()) == list(range(900))


def test_buffer_state_says_what_the_buffer_emitted_and_holds():
    """The vectorised replay of the shuffle buffer (an elastic resume's) against the buffer
    itself, over sizes around the ramp, the growth and the final drain."""
    import random

    from shardstream.reading.plan import buffer_state, iter_buffer_order

    rng = random.Random(0)
    for _ in range(2000):
        count, capacity = rng.randint(0, 300), rng.choice([0, 1, 2, 3, 7, 10, 64, 1000])
        emitted, seed = rng.randint(0, count), rng.randint(0, 10**6)
        order = list(iter_buffer_order(count, capacity, np.random.default_rng(seed)))
        arrived, held = buffer_state(count, capacity, np.random.default_rng(seed), emitted)
        assert set(order[:emitted]) == set(range(arrived)) - set(held.tolist())
        assert len(set(held.tolist())) == len(held) and (held < arrived).all()


def test_a_worker_remainder_is_what_it_did_not_deliver():
    rng = np.random.default_rng(1)
    for trial in range(300):
        counts = rng.integers(0, 30, size=int(rng.integers(1, 12))).tolist()
        plan = EpochPlan(counts, seed=trial, epoch=1, shuffle_buffer=int(rng.choice([0, 5, 40])), max_open_shards=3)
        runs = plan.piece_runs(None, world_size=1, rank=0, num_workers=1, worker_id=0, batch_size=None)
        worker = plan.worker_plan(runs, seg=0, rank=0, worker_id=0)
        delivered = int(rng.integers(0, worker.count + 1))
        left = worker.remaining(delivered)
        ids = sorted(int(plan.shard_order.starts[r.shard]) + i for r in left for i in r.indices().tolist())
        assert ids == sorted(set(worker.ids.tolist()) - set(worker.ids[worker.order[:delivered]].tolist()))


def test_an_elastic_resume_works_out_only_the_old_workers_a_reader_needs():
    """64 old readers closed a segment; a reader of the new shape materialises the remainders
    its piece overlaps (two here), not the 64."""
    counts = [100] * 64
    plan = EpochPlan(counts, seed=1, epoch=0, shuffle_buffer=10, segments=[Segment(16, 4, 5, 40, split_batch_size=5)])
    seg, todo, continued = plan.current(world_size=32, num_workers=4)
    assert seg == 1 and continued is None and todo.total == 6400 - 16 * 40 and len(todo.sizes) == 64
    runs = plan.piece_runs(todo, world_size=32, rank=0, num_workers=4, worker_id=0, batch_size=None)
    assert sum(run.count for run in runs) == -(-todo.total // 32) // 4
    assert 1 <= len(todo._runs) <= 2
