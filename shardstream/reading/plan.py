"""Exact epochs: which samples each reader reads, in which order, and what a resume still owes.

Everything here is a pure function of the index's per-shard sample counts and a few numbers
(seed, epoch, world_size, num_workers, ...), so every rank computes the same split without
talking to the others, and a checkpoint is those numbers, never a list of samples.

An epoch, for a job of ``world_size`` ranks each with ``num_workers`` DataLoader workers:

1. **Order.** The shards in a permutation seeded by ``(seed, epoch)``; their samples in shard
   order make the epoch's sequence of the dataset's ``N`` samples. A sample is named by its
   *id*, its position in index order (shard by shard), the same in every epoch.
2. **Ranks.** The sequence is cut into ``world_size`` contiguous parts of exactly
   ``ceil(N / world_size)`` samples (``pad``, the default: the parts are filled up by
   repeating the first samples of the sequence) or ``floor(N / world_size)``
   (``drop_last``: the last ``N mod world_size`` samples are left out). So shard-to-rank
   assignment changes every epoch, and every rank gets the same count.
3. **Workers.** A rank's part is cut into ``num_workers`` contiguous pieces, the same on
   every rank (so ranks also get the same number of batches). With the DataLoader's
   ``batch_size`` known, the pieces hold the batches the DataLoader deals round-robin (batch
   ``j`` to worker ``j mod num_workers``, only the last one short), so the DataLoader yields
   exactly ``ceil(part / batch_size)`` batches, the ``len(loader)`` that Lightning and Hugging
   Face's Trainer stop at; without it, sizes differ by at most one, and each worker's last
   batch may be short.
4. **Reading order.** A worker's piece falls into *runs*, its samples of one shard. Runs are
   dealt round-robin to ``max_open_shards`` lanes, read concurrently; the order in which
   their samples arrive is a seeded uniformly random interleaving of the lanes. (Without
   shuffle: one lane, index order.)
5. **Shuffle buffer.** Arriving samples pass through a buffer of ``shuffle_buffer`` samples:
   it starts emitting at a tenth full and grows to full by taking two arrivals per emission;
   once full, each arrival evicts a seeded random slot. The emission order is computed on
   the samples' positions alone, before any byte is read.

Because (4) and (5) depend on nothing but these numbers, "``d`` samples delivered by worker
``w``" names exactly which samples those were. A resume with the same ``world_size`` and
``num_workers`` continues each worker's order where it stopped; a resume with another shape
(elastic) closes the segment, takes the samples not yet delivered, in epoch order, and
splits those anew as in (2)-(5). Samples in shuffle buffers and prefetch queues at the
checkpoint were not delivered, so they are read again: none is lost, none repeated. What a
closed segment leaves is a :class:`Todo`: each old worker's remainder (its lanes from where
their arrivals stopped, and what its shuffle buffer still held: :func:`buffer_state`), whose
size is known from the counts alone and whose runs are worked out only when a new reader's
piece reaches it. So an elastic resume costs a rank what it reads, not the epoch.

Which samples a rank delivered follows from how a ``torch.utils.data.DataLoader`` hands out
batches: in order, round-robin over the workers that still have data, each worker's last
batch possibly short (:func:`consumed_per_worker`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .emission import DRAW_CHUNK, buffer_order, buffer_state, interleaving, iter_buffer_order, ramp_samples
from .order import NodeLayout, ShardOrder
from .segments import Segment, consumed_per_worker

__all__ = [
    "EpochPlan",
    "NodeLayout",
    "Segment",
    "ShardOrder",
    "WorkerPlan",
    "buffer_order",
    "buffer_state",
    "consumed_per_worker",
    "interleaving",
    "iter_buffer_order",
    "ramp_samples",
    "split_evenly",
    "split_workers",
]


def split_evenly(total: int, parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous pieces of ``total`` items, differing by at most one,
    larger first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def split_workers(total: int, num_workers: int, batch_size: int | None) -> list[int]:
    """Samples of each of ``num_workers`` DataLoader workers, of a rank's ``total``.

    With ``batch_size``: the DataLoader's batches dealt round-robin (batch ``j`` to worker
    ``j mod num_workers``, the last one short), so a DataLoader of that batch size yields
    exactly ``ceil(total / batch_size)`` batches. Without: :func:`split_evenly`.
    """
    if not batch_size:
        return split_evenly(total, num_workers)
    full, rest = divmod(total, batch_size)
    sizes = [batch_size * n for n in split_evenly(full, num_workers)]
    if rest:
        sizes[full % num_workers] += rest
    return sizes


def _wrapped(start: int, stop: int, total: int, base: int = 0) -> list[tuple[int, int]]:
    """Ranges within ``[0, total)`` that cover positions ``start..stop-1``, positions from
    ``total`` on wrapping around to ``base`` (a padded piece wraps to the start of the epoch, or
    with node affinity to the start of the last node's share; more than once when the epoch
    has fewer samples than ranks), in order."""
    if not 0 <= base < total:
        base = 0
    out = []
    while start < stop:
        a = start if start < total else base + (start - total) % (total - base)
        b = min(total, a + stop - start)
        out.append((a, b))
        start += b - a
    return out


class PlanRun(NamedTuple):
    """Samples of one shard that one lane reads as one byte range, in shard order: indices
    ``lo..hi`` of the shard, every one (``index`` None) or those in ``index`` (int64, going
    up; after an elastic resume or a skip, some are left out)."""

    shard: int
    lo: int
    hi: int
    index: np.ndarray | None = None

    @property
    def count(self) -> int:
        return self.hi - self.lo + 1 if self.index is None else len(self.index)

    def indices(self) -> np.ndarray:
        """int64 ``(count,)``: the run's indices in its shard."""
        return np.arange(self.lo, self.hi + 1, dtype=np.int64) if self.index is None else self.index


def runs_between(
    starts: np.ndarray,
    start: int,
    stop: int,
    order: np.ndarray | None = None,
    offsets: np.ndarray | None = None,
) -> list[PlanRun]:
    """Runs of positions ``start..stop-1`` of a sequence of pieces where piece ``k`` (shard
    ``order[k]``, or ``k`` without ``order``, from its sample ``offsets[k]`` on, or its first)
    begins at ``starts[k]``: one per piece met, in O(pieces met); pieces without samples take
    no place."""
    if stop <= start:
        return []
    first, last = (np.searchsorted(starts, [start, stop - 1], side="right") - 1).tolist()
    begins = starts[first : last + 2]
    lo = np.maximum(begins[:-1], start) - begins[:-1]
    hi = np.minimum(begins[1:], stop) - 1 - begins[:-1]
    if offsets is not None:
        lo, hi = lo + offsets[first : last + 1], hi + offsets[first : last + 1]
    pieces = range(first, last + 1) if order is None else order[first : last + 1].tolist()
    return [PlanRun(k, a, b) for k, a, b in zip(pieces, lo.tolist(), hi.tolist()) if b >= a]


def per_rank(total: int, world_size: int, *, drop_last: bool) -> int:
    """Samples each rank gets of ``total``: floor with ``drop_last``, else ceil (padded)."""
    return total // world_size if drop_last else -(-total // world_size)


def without(runs: Sequence[PlanRun], positions: np.ndarray) -> list[PlanRun]:
    """``runs`` less their samples at ``positions`` (sorted, 0-based over the runs' samples
    in order); emptied runs go."""
    out, base, k = [], 0, 0
    for run in runs:
        end = base + run.count
        stop = k + int(np.searchsorted(positions[k:], end))
        if stop == k:
            out.append(run)
        elif stop - k < run.count:
            keep = np.delete(run.indices(), positions[k:stop] - base)
            out.append(PlanRun(run.shard, int(keep[0]), int(keep[-1]), keep))
        base, k = end, stop
    return out


def _run_of(shard: int, index: np.ndarray) -> PlanRun:
    """A run of ``shard``'s samples at ``index`` (int64, going up)."""
    lo, hi = int(index[0]), int(index[-1])
    return PlanRun(shard, lo, hi, None if hi - lo + 1 == len(index) else index)


def slice_runs(runs: Sequence[PlanRun], start: int, stop: int) -> list[PlanRun]:
    """Samples ``start..stop-1`` of ``runs`` taken in order, as runs (O(runs))."""
    out, base = [], 0
    for run in runs:
        end = base + run.count
        if end > start and base < stop:
            a, b = max(start, base) - base, min(stop, end) - base
            if a == 0 and b == run.count:
                out.append(run)
            elif run.index is None:
                out.append(PlanRun(run.shard, run.lo + a, run.lo + b - 1))
            else:
                out.append(_run_of(run.shard, run.index[a:b]))
        base = end
        if base >= stop:
            break
    return out


class Todo:
    """What an elastic resume still owes of an epoch, in epoch order: parts of known size
    (one per worker of a closed segment: its samples not delivered), each worked out only when
    a reader of the new job needs samples from it. So a rank pays for the old workers whose
    remainders it reads, not for the epoch."""

    def __init__(self, parts: list[tuple[int, Callable[[], list[PlanRun]]]]) -> None:
        self.sizes = [n for n, _ in parts]
        self.makers = [make for _, make in parts]
        self.starts = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)])
        self._runs: dict[int, list[PlanRun]] = {}

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def runs(self, start: int, stop: int) -> list[PlanRun]:
        """Samples ``start..stop-1`` (within ``0..total-1``) as runs."""
        if stop <= start:
            return []
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        out: list[PlanRun] = []
        for part in range(first, len(self.sizes)):
            base = int(self.starts[part])
            if base >= stop:
                break
            if part not in self._runs:
                self._runs[part] = self.makers[part]()
                got = sum(run.count for run in self._runs[part])
                if got != self.sizes[part]:
                    raise AssertionError(f"internal error: part {part} holds {got} samples, not {self.sizes[part]}")
            out += slice_runs(self._runs[part], max(start, base) - base, min(stop, base + self.sizes[part]) - base)
        return out


@dataclass
class WorkerPlan:
    """What one worker reads and yields in one segment, in O(runs): samples are never listed.

    ``runs`` are the worker's piece in epoch order; run ``r`` is read by lane ``r mod lanes``.
    Samples arrive in a seeded uniformly random interleaving of the lanes (:meth:`labels`,
    the lane of each arrival, drawn a chunk at a time), a lane's samples in its runs' order;
    arrival indices leave the shuffle buffer in :meth:`emissions` order. ``skip`` leading
    emissions were delivered before a resume. ``ids`` and ``order`` list it all, for tests and
    for replaying a checkpoint.
    """

    runs: list[PlanRun]
    starts: np.ndarray  # int64: first sample id of each shard (ids = starts[shard] + index)
    lanes: int = 1
    capacity: int = 0  # the shuffle buffer's; <= 1: emitted in arrival order
    stream: tuple[int, ...] = ()  # seed of the buffer's draws
    interleave: tuple[int, ...] = ()  # seed of the lanes' interleaving
    skip: int = 0
    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.count = sum(run.count for run in self.runs)

    def lane_runs(self, lane: int) -> list[PlanRun]:
        return self.runs[lane :: self.lanes]

    def labels(self) -> Iterator[np.ndarray]:
        """The lane of each arrival, in arrival order: int8 (int32 past 127 lanes) arrays of
        up to 65,536, each drawn when asked for."""
        small = np.int8 if self.lanes <= 127 else np.int32
        left = self.count
        if self.lanes <= 1:
            while left:
                n = min(DRAW_CHUNK, left)
                yield np.zeros(n, small)
                left -= n
            return
        remaining = [sum(run.count for run in self.lane_runs(lane)) for lane in range(self.lanes)]
        yield from interleaving(remaining, self.interleave, small)

    def emissions(self) -> Iterator[int]:
        """Arrival indices in emission order, from the start."""
        return iter_buffer_order(self.count, self.capacity, np.random.default_rng(self.stream))

    def resumed_emissions(self) -> tuple[np.ndarray, Iterator[int]]:
        """For a resume ``skip`` emissions in: which arrivals were emitted before it (bool by
        arrival index, as long as the last one taken in by then) and the emission order from
        there, worked out by :func:`buffer_state` once (O(skip) numpy, no step per sample in
        Python)."""
        count, capacity, skip = self.count, self.capacity, self.skip
        if capacity <= 1 or count <= 1:
            return np.ones(skip, dtype=bool), iter(range(skip, count))
        state = buffer_state(count, capacity, np.random.default_rng(self.stream), skip)
        arrived, held = state
        emitted = np.ones(arrived, dtype=bool)
        emitted[held] = False
        rng = np.random.default_rng(self.stream)
        return emitted, iter_buffer_order(count, capacity, rng, start=skip, state=state)

    @functools.cached_property
    def ids(self) -> np.ndarray:
        """int64 ``(count,)``: the sample id of each arrival (O(count): tests and replays)."""
        labels = np.concatenate([np.empty(0, np.int8), *self.labels()])
        ids = np.empty(self.count, np.int64)
        for lane in range(self.lanes):
            runs = self.lane_runs(lane)
            if runs:
                ids[labels == lane] = np.concatenate([self.starts[run.shard] + run.indices() for run in runs])
        return ids

    @functools.cached_property
    def order(self) -> np.ndarray:
        """The whole emission order: int64 ``(count,)``."""
        return np.fromiter(self.emissions(), dtype=np.int64, count=self.count)

    @property
    def num_samples(self) -> int:
        """Samples this worker still yields."""
        return self.count - self.skip

    def remaining(self, delivered: int) -> list[PlanRun]:
        """The runs (epoch order) less the first ``delivered`` emissions: each lane's samples
        from where its arrivals stopped, and those that had arrived but were still in the
        shuffle buffer. O(delivered) vectorised work; O(runs + shuffle buffer) out."""
        if delivered <= 0:
            return list(self.runs)
        if delivered >= self.count:
            return []
        if self.capacity > 1:
            arrived, held = buffer_state(self.count, self.capacity, np.random.default_rng(self.stream), delivered)
        else:
            arrived, held = delivered, np.empty(0, np.int64)
        chunks, have = [], 0
        for chunk in self.labels():
            if have >= arrived:
                break
            chunks.append(chunk)
            have += len(chunk)
        labels = np.concatenate([np.empty(0, np.int8), *chunks])[:arrived]
        per_lane = np.bincount(labels, minlength=self.lanes)
        held_lane = labels[held]
        held_at = [np.empty(0, np.int64)] * self.lanes  # per lane: places in the lane of held arrivals
        for lane in np.unique(held_lane).tolist():
            mine = held[held_lane == lane]
            held_at[lane] = np.sort(np.searchsorted(np.flatnonzero(labels == lane), mine))
        out, offset = [], [0] * self.lanes
        for r, run in enumerate(self.runs):
            lane = r % self.lanes
            base = offset[lane]
            offset[lane] += run.count
            cut = int(per_lane[lane]) - base  # the run's samples before ``cut`` had arrived
            if cut <= 0:
                out.append(run)
                continue
            places = held_at[lane]
            a, b = np.searchsorted(places, [base, base + min(cut, run.count)]).tolist()
            keep = places[a:b] - base
            if cut < run.count:
                keep = np.concatenate([keep, np.arange(cut, run.count, dtype=np.int64)])
            if len(keep):
                out.append(_run_of(run.shard, run.indices()[keep]))
        return out


@dataclass
class EpochPlan:
    """The split of one epoch over a job (module doc).

    Args:
        counts: samples per shard, in index order.
        seed, epoch: the shuffle's seed and the epoch.
        shuffle: permute shards, interleave lanes and shuffle samples; False keeps index order.
        shuffle_buffer: samples in each worker's shuffle buffer.
        max_open_shards: lanes (shards read at once) per worker.
        drop_last: drop the fewest samples instead of padding with repeats.
        segments: earlier segments of this epoch (from a checkpoint), oldest first.
        batch_size: the DataLoader's batch size the workers' pieces are cut by
            (:func:`split_workers`); None: evenly.
    """

    counts: Sequence[int]
    seed: int
    epoch: int
    shuffle: bool = True
    shuffle_buffer: int = 1000
    max_open_shards: int = 4
    drop_last: bool = False
    segments: Sequence[Segment] = ()
    batch_size: int | None = None
    shard_order: ShardOrder | None = field(default=None, repr=False)
    orders: Callable[[int], ShardOrder] | None = field(default=None, repr=False)  # by world size (node affinity)

    def __post_init__(self) -> None:
        # The epoch's order of shards and where each begins in the epoch's sequence: O(shards),
        # so a worker maps its positions to sample ids without the sequence being built.
        if self.shard_order is None:
            self.shard_order = ShardOrder.make(self.counts, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
        self._starts = self.shard_order.starts

    @property
    def num_samples(self) -> int:
        return int(self._starts[-1])

    def order_for(self, world_size: int) -> ShardOrder:
        """The epoch's order of shards for a job of ``world_size`` readers: the same for every
        world size, but under node affinity, where the nodes' shares follow it (``orders``)."""
        if self.orders is None:
            assert self.shard_order is not None  # set in __post_init__
            return self.shard_order
        return self.orders(world_size)

    @staticmethod
    def _runs_in(order: ShardOrder, start: int, stop: int) -> list[PlanRun]:
        """Runs of positions ``start..stop-1`` of the epoch's sequence in ``order``: one per
        piece (shard, or with node affinity part of one) met, in O(pieces met)."""
        return runs_between(order.order_starts, start, stop, order.order, order.offsets)

    def per_rank(self, total: int, world_size: int) -> int:
        """Samples each rank gets of ``total`` (:func:`per_rank`)."""
        return per_rank(total, world_size, drop_last=self.drop_last)

    def piece_runs(
        self,
        todo: Todo | None,
        *,
        world_size: int,
        rank: int,
        num_workers: int,
        worker_id: int,
        batch_size: int | None,
    ) -> list[PlanRun]:
        """One worker's piece as runs: ``todo`` (what a resume still owes; None: the whole
        epoch) cut into ``world_size`` equal contiguous parts (the last padded by wrapping to
        the start), each cut into ``num_workers`` pieces (:func:`split_workers`)."""
        total = self.num_samples if todo is None else todo.total
        if total == 0:
            return []
        per_rank = self.per_rank(total, world_size)
        sizes = split_workers(per_rank, num_workers, batch_size)
        start = rank * per_rank + sum(sizes[:worker_id])
        stop = start + sizes[worker_id]
        if todo is not None:
            return [run for a, b in _wrapped(start, stop, total) for run in todo.runs(a, b)]
        order = self.order_for(world_size)
        return [run for a, b in _wrapped(start, stop, total, order.wrap_from) for run in self._runs_in(order, a, b)]

    def worker_plan(self, runs: list[PlanRun], *, seg: int, rank: int, worker_id: int) -> WorkerPlan:
        """The plan of worker ``worker_id`` of ``rank`` whose piece is ``runs`` (epoch order)."""
        streams = (self.seed, self.epoch, seg, rank, worker_id)
        if not self.shuffle:
            return WorkerPlan(runs, self._starts)
        return WorkerPlan(
            runs,
            self._starts,
            lanes=max(1, min(self.max_open_shards, len(runs))),
            capacity=self.shuffle_buffer,
            stream=(*streams, 2),
            interleave=(*streams, 1),
        )

    def current(self, *, world_size: int, num_workers: int) -> tuple[int, Todo | None, Segment | None]:
        """Replay the checkpoint's segments for a job of this shape: the index of the segment
        to run now, what it splits (None: the whole epoch), and the segment it continues (same
        shape, workers' pieces cut by the same batch size: skip what each worker delivered) or
        None (a new segment). A closed segment (an elastic resume) leaves a :class:`Todo`: each
        of its workers' remainders, of a size known from the counts alone (its piece less what
        it delivered), worked out only when a reader needs it. A pad's samples stay in the
        remainder where they were not delivered, so each padded sample is read once more at
        most, as the pad meant."""
        todo: Todo | None = None
        segments = list(self.segments)
        for i, segment in enumerate(segments):
            last = i == len(segments) - 1
            if last and (segment.world_size, segment.num_workers, segment.split_batch_size) == (
                world_size,
                num_workers,
                self.batch_size,
            ):
                return i, todo, segment
            if segment.samples_consumed is None:
                raise ValueError(
                    "this checkpoint was saved by DataLoader workers (StatefulDataLoader) and holds no "
                    "per-rank sample count; resume it with the same world_size and num_workers, or save "
                    "with shardstream.loader_state_dict(loader, samples_consumed) for an elastic resume"
                )
            total = self.num_samples if todo is None else todo.total
            sizes = split_workers(
                self.per_rank(total, segment.world_size), segment.num_workers, segment.split_batch_size
            )
            done = consumed_per_worker(sizes, segment.batch_size, segment.samples_consumed) if total else sizes
            parts = [
                (sizes[w] - done[w], functools.partial(self._remainder, todo, i, segment, r, w, done[w]))
                for r in range(segment.world_size)
                for w in range(segment.num_workers)
                if sizes[w] > done[w]
            ]
            todo = Todo(parts)
        return len(segments), todo, None

    def _remainder(
        self, todo: Todo | None, seg: int, segment: Segment, rank: int, worker_id: int, delivered: int
    ) -> list[PlanRun]:
        """What worker ``worker_id`` of ``rank`` had not delivered when segment ``seg`` closed."""
        runs = self.piece_runs(
            todo,
            world_size=segment.world_size,
            rank=rank,
            num_workers=segment.num_workers,
            worker_id=worker_id,
            batch_size=segment.split_batch_size,
        )
        return self.worker_plan(runs, seg=seg, rank=rank, worker_id=worker_id).remaining(delivered)

    def for_worker(self, *, rank: int, world_size: int, worker_id: int, num_workers: int) -> tuple[WorkerPlan, int]:
        """This worker's plan now (resumed where the checkpoint says) and the segment index."""
        seg, todo, continued = self.current(world_size=world_size, num_workers=num_workers)
        runs = self.piece_runs(
            todo,
            world_size=world_size,
            rank=rank,
            num_workers=num_workers,
            worker_id=worker_id,
            batch_size=self.batch_size,
        )
        plan = self.worker_plan(runs, seg=seg, rank=rank, worker_id=worker_id)
        if continued is not None:
            yielded = dict(continued.worker_yielded)
            if worker_id in yielded:
                plan.skip = yielded[worker_id]
            elif continued.samples_consumed is not None:
                total = self.num_samples if todo is None else todo.total
                lengths = split_workers(self.per_rank(total, world_size), num_workers, self.batch_size)
                plan.skip = consumed_per_worker(lengths, continued.batch_size, continued.samples_consumed)[worker_id]
            if plan.skip > plan.count:
                raise ValueError(f"checkpoint says worker {worker_id} yielded {plan.skip} samples; it has {plan.count}")
        return plan, seg

    def rank_count(self, *, world_size: int, num_workers: int, rank: int = 0) -> int:
        """Samples each rank yields now (the same on every rank): after a segment counted in
        ``samples_consumed``, those still to come; after one counted per worker (a
        StatefulDataLoader's checkpoint), the segment's whole count, since such loaders (and
        Lightning) count batches from the epoch's start."""
        _, todo, continued = self.current(world_size=world_size, num_workers=num_workers)
        part = self.per_rank(self.num_samples if todo is None else todo.total, world_size)
        if continued is None or continued.worker_yielded or continued.samples_consumed is None:
            return part
        return part - continued.samples_consumed
