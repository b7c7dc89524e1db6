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
checkpoint were not delivered, so they are read again: none is lost, none repeated.

Which samples a rank delivered follows from how a ``torch.utils.data.DataLoader`` hands out
batches: in order, round-robin over the workers that still have data, each worker's last
batch possibly short (:func:`consumed_per_worker`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "EpochPlan",
    "Segment",
    "WorkerPlan",
    "buffer_order",
    "iter_buffer_order",
    "consumed_per_worker",
    "ramp_samples",
    "split_evenly",
    "split_workers",
]


@dataclass(frozen=True)
class Segment:
    """One stretch of an epoch run with one job shape, and how far each rank got.

    ``samples_consumed`` is per rank (all ranks of a DDP job consume the same count);
    ``worker_yielded`` instead gives each worker's count (as a StatefulDataLoader worker
    reports it), for a resume of the same shape only. ``batch_size`` is the DataLoader's
    (None: unbatched, one sample at a time); ``split_batch_size`` the one the workers' pieces
    were cut by (:func:`split_workers`; the dataset's ``batch_size``).
    """

    world_size: int
    num_workers: int
    batch_size: int | None = None
    samples_consumed: int | None = None
    worker_yielded: tuple[tuple[int, int], ...] = ()  # ((worker_id, samples yielded), ...)
    split_batch_size: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "batch_size": self.batch_size,
            "samples_consumed": self.samples_consumed,
            "worker_yielded": [list(x) for x in self.worker_yielded],
            "split_batch_size": self.split_batch_size,
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Segment:
        return cls(
            world_size=int(d["world_size"]),  # type: ignore[call-overload]
            num_workers=int(d["num_workers"]),  # type: ignore[call-overload]
            batch_size=None if d.get("batch_size") is None else int(d["batch_size"]),  # type: ignore[call-overload]
            samples_consumed=None if d.get("samples_consumed") is None else int(d["samples_consumed"]),  # type: ignore[call-overload]
            worker_yielded=tuple((int(w), int(n)) for w, n in d.get("worker_yielded") or ()),  # type: ignore[attr-defined]
            split_batch_size=None if d.get("split_batch_size") is None else int(d["split_batch_size"]),  # type: ignore[call-overload]
        )


_DRAW_CHUNK = 1 << 16


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


def ramp_samples(capacity: int) -> int:
    """Samples a shuffle buffer of ``capacity`` holds before it first emits: a tenth of it."""
    return max(1, capacity // 10)


def iter_buffer_order(count: int, capacity: int, rng: np.random.Generator) -> Iterator[int]:
    """The emission order of a shuffle buffer of ``capacity`` samples fed ``0..count-1``, one
    arrival index at a time (:func:`buffer_order`), so a reader needs no array of it up front."""
    if capacity <= 1 or count <= 1:
        yield from range(count)
        return
    buf = list(range(min(ramp_samples(capacity), count)))
    arrived = len(buf)
    drawn = 0  # the draws come from one stream of ``count`` doubles, taken a chunk at a time
    draws: list[float] = []
    emitted = 0
    while arrived < count:
        if emitted == drawn:
            take = min(_DRAW_CHUNK, count - drawn)
            draws, drawn = rng.random(take).tolist(), drawn + take
        j = int(draws[emitted - drawn + len(draws)] * len(buf))
        yield buf[j]
        emitted += 1
        buf[j] = arrived
        arrived += 1
        if len(buf) < capacity and arrived < count:
            buf.append(arrived)
            arrived += 1
    if drawn < count:
        rng.random(count - drawn)  # the rest of the stream, as one draw of ``count`` would use
    yield from rng.permutation(np.asarray(buf, dtype=np.int64)).tolist()


def buffer_order(count: int, capacity: int, rng: np.random.Generator) -> np.ndarray:
    """The emission order of a shuffle buffer of ``capacity`` samples fed ``0..count-1``.

    It emits its first sample once it holds :func:`ramp_samples` of them, and takes in two
    arrivals per emission until it holds ``capacity`` (as WebDataset's buffer does), so the
    first sample does not wait for a full buffer; from then on each arrival evicts a random
    slot; at the end the rest leave in random order.

    Returns:
        int64 array of shape ``(count,)``, a permutation of ``0..count-1``.
    """
    return np.fromiter(iter_buffer_order(count, capacity, rng), dtype=np.int64, count=count)


def consumed_per_worker(lengths: Sequence[int], batch_size: int | None, samples_consumed: int) -> list[int]:
    """How many samples each DataLoader worker had delivered when the rank had consumed
    ``samples_consumed``: batches come in order, round-robin over the workers that still have
    data, each worker's last batch possibly short.

    Raises:
        ValueError: ``samples_consumed`` is negative or more than the workers hold.
    """
    total = sum(lengths)
    if not 0 <= samples_consumed <= total:
        raise ValueError(
            f"samples_consumed={samples_consumed} must be in [0, {total}] (the samples this rank has this epoch)"
        )
    size = batch_size or 1
    done = [0] * len(lengths)
    left = samples_consumed
    rounds = max((math.ceil(n / size) for n in lengths), default=0)
    full_rounds = min(left // max(1, size * len(lengths)), min((n // size for n in lengths), default=0))
    for w in range(len(lengths)):  # whole rounds in which every worker gives a full batch
        done[w] = full_rounds * size
    left -= full_rounds * size * len(lengths)
    for _ in range(full_rounds, rounds):
        for w, n in enumerate(lengths):
            if left == 0:
                return done
            take = min(size, n - done[w], left)
            if take > 0:
                done[w] += take
                left -= take
    return done


@dataclass
class WorkerPlan:
    """What one worker reads and yields in one segment.

    ``ids[t]`` is the sample id of the ``t``-th sample to arrive (reading order), ``lane[t]``
    the lane it is read by; the emission order (a permutation of arrival indices ``t``) comes
    from :meth:`emissions` as the worker goes (``order`` makes it whole, for tests and
    replays). ``skip`` leading emissions were delivered before a resume.
    """

    ids: np.ndarray
    lane: np.ndarray
    shard: np.ndarray | None = None  # per arrival: its shard and index in the shard (None: derive from ids)
    index: np.ndarray | None = None
    capacity: int = 0  # the shuffle buffer's; <= 1: emitted in arrival order
    stream: tuple[int, ...] = ()  # seed of the buffer's draws
    skip: int = 0

    def emissions(self) -> Iterator[int]:
        """Arrival indices in emission order, from the start."""
        return iter_buffer_order(len(self.ids), self.capacity, np.random.default_rng(self.stream))

    @functools.cached_property
    def order(self) -> np.ndarray:
        """The whole emission order: int64 ``(len(ids),)``."""
        return np.fromiter(self.emissions(), dtype=np.int64, count=len(self.ids))

    @property
    def num_samples(self) -> int:
        """Samples this worker still yields."""
        return len(self.ids) - self.skip


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
    _starts: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts, dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        # The epoch's order of shards and where each begins in the epoch's sequence: O(shards),
        # so a worker maps its positions to sample ids without the sequence being built.
        self._order = (np.random.default_rng([self.seed, self.epoch]).permutation(np.arange(len(counts), dtype=np.int32))
                       if self.shuffle else np.arange(len(counts), dtype=np.int32))  # int32: a million shards shuffle faster
        self._order_starts = np.concatenate([[0], np.cumsum(counts[self._order])])

    @property
    def num_samples(self) -> int:
        return int(self._starts[-1])

    def shard_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, index within shard)`` of sample ids."""
        shard = np.searchsorted(self._starts, ids, side="right") - 1
        return shard, ids - self._starts[shard]

    def sequence(self) -> np.ndarray:
        """The epoch's sample ids in order: shards permuted by ``(seed, epoch)``. Built only to
        replay a checkpoint's closed segments (an elastic resume); a fresh or same-shape epoch
        maps positions with :meth:`ids_at`."""
        return self.ids_at(np.arange(self.num_samples, dtype=np.int64))

    def ids_at(self, positions: np.ndarray) -> np.ndarray:
        """Sample ids at these positions of the epoch's sequence (O(len + log shards) each)."""
        return self._located(positions)[0]

    def _located(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, shard, index within shard)`` at these positions of the epoch's sequence."""
        k = np.searchsorted(self._order_starts, positions, side="right") - 1
        shard, index = self._order[k], positions - self._order_starts[k]
        return self._starts[shard] + index, shard, index

    def per_rank(self, total: int, world_size: int) -> int:
        """Samples each rank gets of ``total``: floor with ``drop_last``, else ceil (padded)."""
        return total // world_size if self.drop_last else -(-total // world_size)

    def piece(self, todo: np.ndarray | None, *, world_size: int, rank: int, num_workers: int, worker_id: int,
              batch_size: int | None) -> np.ndarray:
        """The ids of one worker's piece: ``todo`` (ids in epoch order; None: the whole epoch)
        cut into ``world_size`` equal contiguous parts (the last padded by wrapping to the
        start), each cut into ``num_workers`` pieces (:func:`split_workers`)."""
        return self._piece(todo, world_size=world_size, rank=rank, num_workers=num_workers, worker_id=worker_id,
                           batch_size=batch_size)[0]

    def _piece(self, todo: np.ndarray | None, *, world_size: int, rank: int, num_workers: int, worker_id: int,
               batch_size: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`piece`, with each sample's shard and index in its shard."""
        total = self.num_samples if todo is None else len(todo)
        per_rank = self.per_rank(total, world_size)
        sizes = split_workers(per_rank, num_workers, batch_size)
        start = rank * per_rank + sum(sizes[:worker_id])
        if total == 0:
            empty = np.empty(0, np.int64)
            return empty, empty, empty
        positions = np.arange(start, start + sizes[worker_id], dtype=np.int64) % total  # a pad wraps
        if todo is None:
            return self._located(positions)
        ids = todo[positions]
        return (ids, *self.shard_of(ids))

    def worker_plan(self, ids: np.ndarray, *, seg: int, rank: int, worker_id: int,
                    located: tuple[np.ndarray, np.ndarray] | None = None) -> WorkerPlan:
        """The plan of worker ``worker_id`` of ``rank`` whose piece is ``ids`` (epoch order;
        ``located``: their shards and indices, when known)."""
        streams = (self.seed, self.epoch, seg, rank, worker_id)
        shard, index = located if located is not None else self.shard_of(ids)
        if not self.shuffle or len(ids) == 0:
            return WorkerPlan(ids=ids, lane=np.zeros(len(ids), np.int64), shard=shard, index=index)
        # A run ends where the shard changes or the index does not go up (a pad wraps).
        breaks = np.flatnonzero((np.diff(shard) != 0) | (np.diff(index) <= 0)) + 1
        run = np.zeros(len(ids), np.int64)
        run[breaks] = 1
        run = np.cumsum(run)
        lanes = min(self.max_open_shards, int(run[-1]) + 1)
        run_lane = run % lanes
        # A uniformly random interleaving of the lanes: shuffle the multiset of lane labels
        # (as small ints: numpy's shuffle moves fewer bytes, and draws the same).
        multiset = np.repeat(np.arange(lanes, dtype=np.int8), np.bincount(run_lane, minlength=lanes))
        labels = np.random.default_rng([*streams, 1]).permutation(multiset)
        # The k-th arrival from lane L is lane L's k-th sample (its samples keep their order).
        arrival = np.empty(len(ids), np.int64)
        for lane in range(lanes):
            arrival[labels == lane] = np.flatnonzero(run_lane == lane)
        return WorkerPlan(ids=ids[arrival], lane=labels, shard=shard[arrival], index=index[arrival],
                          capacity=self.shuffle_buffer, stream=(*streams, 2))

    def segment_plans(self, todo: np.ndarray, seg: int, segment: Segment) -> list[list[WorkerPlan]]:
        """Every worker's plan of a segment: ``[rank][worker_id]``."""
        return [
            [
                self.worker_plan(
                    self.piece(todo, world_size=segment.world_size, rank=r, num_workers=segment.num_workers,
                               worker_id=w, batch_size=segment.split_batch_size),
                    seg=seg, rank=r, worker_id=w,
                )
                for w in range(segment.num_workers)
            ]
            for r in range(segment.world_size)
        ]

    def delivered(self, plans: list[list[WorkerPlan]], segment: Segment) -> np.ndarray:
        """Ids delivered in a closed segment (every rank consumed ``samples_consumed``)."""
        if segment.samples_consumed is None:
            raise ValueError(
                "this checkpoint was saved by DataLoader workers (StatefulDataLoader) and holds no "
                "per-rank sample count; resume it with the same world_size and num_workers, or save "
                "with shardstream.loader_state_dict(loader, samples_consumed) for an elastic resume"
            )
        out = []
        for workers in plans:
            counts = consumed_per_worker([len(p.ids) for p in workers], segment.batch_size, segment.samples_consumed)
            out.extend(p.ids[p.order[:d]] for p, d in zip(workers, counts))
        return np.concatenate(out) if out else np.empty(0, np.int64)

    def current(self, *, world_size: int, num_workers: int) -> tuple[int, np.ndarray | None, Segment | None]:
        """Replay the checkpoint's segments for a job of this shape: the index of the segment
        to run now, the ids it splits (epoch order; None: the whole epoch, never built), and the
        segment it continues (same shape, workers' pieces cut by the same batch size: skip what
        each worker delivered) or None (a new segment). Closed segments (an elastic resume) are
        replayed over the whole sequence: a cost per sample of the epoch, once per resume."""
        todo: np.ndarray | None = None
        segments = list(self.segments)
        for i, segment in enumerate(segments):
            last = i == len(segments) - 1
            if last and (segment.world_size, segment.num_workers, segment.split_batch_size) == (
                world_size, num_workers, self.batch_size
            ):
                return i, todo, segment
            if todo is None:
                todo = self.sequence()
            plans = self.segment_plans(todo, i, segment)
            assigned = np.unique(np.concatenate([p.ids for workers in plans for p in workers] or [todo[:0]]))
            done = self.delivered(plans, segment)
            todo = todo[np.isin(todo, assigned) & ~np.isin(todo, done)]
        return len(segments), todo, None

    def for_worker(self, *, rank: int, world_size: int, worker_id: int, num_workers: int) -> tuple[WorkerPlan, int]:
        """This worker's plan now (resumed where the checkpoint says) and the segment index."""
        seg, todo, continued = self.current(world_size=world_size, num_workers=num_workers)
        ids, shard, index = self._piece(todo, world_size=world_size, rank=rank, num_workers=num_workers,
                                        worker_id=worker_id, batch_size=self.batch_size)
        plan = self.worker_plan(ids, seg=seg, rank=rank, worker_id=worker_id, located=(shard, index))
        if continued is not None:
            yielded = dict(continued.worker_yielded)
            if worker_id in yielded:
                plan.skip = yielded[worker_id]
            elif continued.samples_consumed is not None:
                total = self.num_samples if todo is None else len(todo)
                lengths = split_workers(self.per_rank(total, world_size), num_workers, self.batch_size)
                plan.skip = consumed_per_worker(lengths, continued.batch_size, continued.samples_consumed)[worker_id]
            if plan.skip > len(plan.ids):
                raise ValueError(f"checkpoint says worker {worker_id} yielded {plan.skip} samples; it has {len(plan.ids)}")
        return plan, seg

    def rank_count(self, *, world_size: int, num_workers: int, rank: int = 0) -> int:
        """Samples each rank yields now (the same on every rank): after a segment counted in
        ``samples_consumed``, those still to come; after one counted per worker (a
        StatefulDataLoader's checkpoint), the segment's whole count, since such loaders (and
        Lightning) count batches from the epoch's start."""
        _, todo, continued = self.current(world_size=world_size, num_workers=num_workers)
        part = self.per_rank(self.num_samples if todo is None else len(todo), world_size)
        if continued is None or continued.worker_yielded or continued.samples_consumed is None:
            return part
        return part - continued.samples_consumed
