"""Exact epochs of a mixture: which samples of which source each rank and worker reads, in
which order, and what a resume still owes. No torch.

It is :mod:`.plan` with one more level. An epoch of a mixture (:mod:`.mixture`) holds, per
source, a :class:`~.mixture.Selection` of ``n_s`` samples; all sources together ``n``.

1. **Ranks.** Every rank yields ``R = ceil(n / world_size)`` (floor with ``drop_last``).
   The ranks, as rounds of ``R`` positions, are shared out among sources by
   :func:`~.mixture.apportion`: rank ``r`` reads of each source the floor or ceil of its
   proportion of ``R``, and the ranks together read each source's ``n_s`` exactly (where
   ``R`` divides ``n``; a pad wraps to a source's first samples, a drop leaves its last).
   Rank ``r`` reads the source's positions after those of ranks ``0 .. r-1``.
2. **Workers.** A rank's positions fall into rounds: the DataLoader's batches when the
   dataset knows its ``batch_size`` (else rounds of 64), shared out among the rank's
   sources by :func:`~.mixture.apportion`, each in :func:`~.mixture.window_labels` order.
   Batches go to workers round-robin, as the DataLoader deals them, so each batch the
   DataLoader yields holds the floor or ceil of each source's share; without a batch size,
   workers take contiguous pieces. A worker takes, of each source, a contiguous chunk of
   the rank's part, as many samples as its positions want.
3. **Reading.** Each source's chunk is read as :mod:`.plan` reads a piece (runs, lanes,
   shuffle buffer sized by the source's share of ``shuffle_buffer``), and the worker emits
   the sources in its positions' order.

A resume of the same shape skips, in each source, the samples the worker's delivered
positions took; an elastic resume replays the closed segments per source (as :mod:`.plan`
does) and splits what is left, interleaved by what is left of each source.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from .mixture import Selection, apportion, window_labels
from .plan import (
    _DRAW_CHUNK,
    PlanRun,
    Segment,
    WorkerPlan,
    _draw_counts,
    _runs_of,
    _wrapped,
    consumed_per_worker,
    split_evenly,
)

__all__ = ["MIX_MODES", "MixWorkerPlan", "MixturePlan"]

MIX_MODES = ("stratified", "random")
_ROUND = 64  # positions per round when the DataLoader's batch size is not known


@dataclass
class MixWorkerPlan:
    """What one worker reads in one segment of a mixture: per source a
    :class:`~.plan.WorkerPlan` over the source's selection (virtual ids: positions in the
    selection), and the source of each of the worker's positions (:meth:`labels`): window
    ``i`` is positions ``slices[i, 0] .. slices[i, 1] - 1`` of a round holding ``rounds[i]``
    of each source, in :func:`~.mixture.window_labels` order (``stratified``), or a seeded
    uniformly random interleaving of the same counts (``random``). ``skip`` leading positions
    were delivered before a resume."""

    sources: list[WorkerPlan]
    rounds: np.ndarray  # int64 (windows, K)
    slices: np.ndarray  # int64 (windows, 2)
    mix: str = "stratified"
    stream: tuple[int, ...] = ()
    skip: int = 0
    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.count = sum(p.count for p in self.sources)

    def labels(self) -> Iterator[np.ndarray]:
        """The source of each position, in order: int16 arrays."""
        if self.mix == "stratified":
            known: dict[tuple[int, ...], np.ndarray] = {}  # rounds repeat a few patterns of counts
            for counts, (a, b) in zip(map(tuple, self.rounds.tolist()), self.slices.tolist()):
                if counts not in known:
                    known[counts] = window_labels(counts)
                yield known[counts][a:b]
            return
        remaining = np.array([p.count for p in self.sources], np.int64)
        rng = np.random.default_rng(self.stream)
        sources = np.arange(len(self.sources), dtype=np.int16)
        left = self.count
        while left:
            n = min(_DRAW_CHUNK, left)
            counts = _draw_counts(rng, remaining, n)
            chunk = np.repeat(sources, counts)
            rng.shuffle(chunk)
            remaining -= counts
            left -= n
            yield chunk

    def source_counts(self, positions: int) -> np.ndarray:
        """int64 ``(K,)``: how many of the first ``positions`` positions each source has."""
        out = np.zeros(len(self.sources), np.int64)
        left = positions
        for chunk in self.labels():
            if left <= 0:
                break
            out += np.bincount(chunk[:left], minlength=len(self.sources))
            left -= len(chunk)
        return out

    def resumed(self, skip: int) -> None:
        """Skip the first ``skip`` positions: each source skips the samples they took."""
        self.skip = skip
        for plan, n in zip(self.sources, self.source_counts(skip).tolist()):
            plan.skip = n

    @property
    def num_samples(self) -> int:
        return self.count - self.skip


@dataclass
class MixturePlan:
    """The split of one epoch of a mixture over a job (module doc).

    Args:
        selections: each source's samples this epoch.
        seed, epoch: the shuffle's seed and the epoch.
        shuffle: lanes and shuffle buffers; False: one lane, selection order.
        shuffle_buffer: samples in each worker's shuffle buffers, shared by the sources in
            proportion to their counts.
        max_open_shards: lanes per source and worker.
        drop_last: floor instead of ceil per rank.
        segments: earlier segments of the epoch (a checkpoint's), oldest first.
        batch_size: the DataLoader's batch size (positions are dealt to workers by it).
        mix: ``"stratified"`` or ``"random"`` interleaving.
    """

    selections: list[Selection]
    seed: int
    epoch: int
    shuffle: bool = True
    shuffle_buffer: int = 1000
    max_open_shards: int = 4
    drop_last: bool = False
    segments: Sequence[Segment] = ()
    batch_size: int | None = None
    mix: str = "stratified"
    _layouts: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_samples(self) -> int:
        return sum(s.total for s in self.selections)

    def per_rank(self, total: int, world_size: int) -> int:
        return total // world_size if self.drop_last else -(-total // world_size)

    def _rank_layout(
        self, sizes: tuple[int, ...], world_size: int, rank: int, num_workers: int, batch_size: int | None
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per worker of ``rank``: its windows (rounds' counts ``(m, K)`` and slices ``(m,
        2)``) and, per source, the start and length of its chunk among the source's positions
        (which wrap modulo the source's size). O(ranks + batches of the rank), kept per shape."""
        key = (sizes, world_size, rank, num_workers, batch_size)
        if key not in self._layouts:
            self._layouts[key] = self._make_layout(*key)
        return self._layouts[key]

    def _make_layout(
        self, sizes: tuple[int, ...], world_size: int, rank: int, num_workers: int, batch_size: int | None
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        k = len(sizes)
        per_rank = self.per_rank(sum(sizes), world_size)
        ranks = apportion([per_rank] * world_size, sizes)
        start = ranks[:rank].sum(axis=0)
        unit = batch_size or _ROUND
        lengths = [unit] * (per_rank // unit) + ([per_rank % unit] if per_rank % unit else [])
        rounds = apportion(lengths, ranks[rank].tolist())
        ends = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        out = []
        for w in range(num_workers):
            if batch_size:  # batch j to worker j mod num_workers, as the DataLoader deals them
                picked = np.arange(w, len(lengths), num_workers)
                slices = np.stack([np.zeros(len(picked), np.int64), ends[picked + 1] - ends[picked]], axis=1)
            else:  # contiguous pieces, cut out of the rounds
                bounds = np.cumsum([0, *split_evenly(per_rank, num_workers)])
                p0, p1 = int(bounds[w]), int(bounds[w + 1])
                picked = np.arange(p0 // unit, -(-p1 // unit)) if p1 > p0 else np.arange(0)
                slices = np.stack(
                    [np.maximum(p0, ends[picked]) - ends[picked], np.minimum(p1, ends[picked + 1]) - ends[picked]],
                    axis=1,
                )
            mine = rounds[picked].reshape(len(picked), k)
            taken = np.zeros(k, np.int64)
            for counts, (a, b) in zip(mine.tolist(), slices.tolist()):
                if a == 0 and b == sum(counts):
                    taken += counts
                else:
                    taken += np.bincount(window_labels(counts)[a:b], minlength=k)
            out.append((mine, slices.reshape(len(picked), 2), start.copy(), taken))
            start = start + taken
        return out

    def _source_runs(self, s: int, todo: np.ndarray | None, start: int, count: int) -> list[PlanRun]:
        """Runs (virtual shards of source ``s``'s selection) of its positions
        ``start..start+count-1``, wrapping modulo what the source has (``todo``: its virtual ids
        left, in order; None: the whole selection)."""
        sel = self.selections[s]
        total = sel.total if todo is None else len(todo)
        if count <= 0 or total == 0:
            return []
        if todo is None:
            runs = []
            for a, b in _wrapped(start, start + count, total):
                first, last = (np.searchsorted(sel.starts, [a, b - 1], side="right") - 1).tolist()
                begins = sel.starts[first : last + 2]
                lo = np.maximum(begins[:-1], a) - begins[:-1]
                hi = np.minimum(begins[1:], b) - 1 - begins[:-1]
                runs += [
                    PlanRun(v, x, y) for v, x, y in zip(range(first, last + 1), lo.tolist(), hi.tolist()) if y >= x
                ]
            return runs
        ids = todo[np.arange(start, start + count, dtype=np.int64) % total]
        shard = np.searchsorted(sel.starts, ids, side="right") - 1
        return _runs_of(shard, ids - sel.starts[shard])

    def worker_plan(
        self, todo: list[np.ndarray] | None, *, seg: int, world_size: int, rank: int, num_workers: int, worker_id: int,
        batch_size: int | None,
    ) -> MixWorkerPlan:  # fmt: skip
        """The plan of one worker of one segment (``todo``: each source's virtual ids left)."""
        sizes = tuple(s.total for s in self.selections) if todo is None else tuple(len(t) for t in todo)
        k = len(sizes)
        if sum(sizes) == 0:
            empty = [WorkerPlan([], s.starts) for s in self.selections]
            return MixWorkerPlan(empty, np.zeros((0, k), np.int64), np.zeros((0, 2), np.int64), self.mix)
        rounds, slices, start, taken = self._rank_layout(sizes, world_size, rank, num_workers, batch_size)[worker_id]
        plans = []
        total = sum(sizes)
        for s, sel in enumerate(self.selections):
            runs = self._source_runs(s, None if todo is None else todo[s], int(start[s]), int(taken[s]))
            streams = (self.seed, self.epoch, seg, rank, worker_id, s)
            if not self.shuffle:
                plans.append(WorkerPlan(runs, sel.starts))
                continue
            plans.append(
                WorkerPlan(
                    runs,
                    sel.starts,
                    lanes=max(1, min(self.max_open_shards, len(runs))),
                    capacity=max(1, round(self.shuffle_buffer * sizes[s] / total)) if self.shuffle_buffer > 1 else 0,
                    stream=(*streams, 2),
                    interleave=(*streams, 1),
                )
            )
        return MixWorkerPlan(plans, rounds, slices, self.mix, stream=(self.seed, self.epoch, seg, rank, worker_id, 9))

    def segment_plans(self, todo: list[np.ndarray], seg: int, segment: Segment) -> list[list[MixWorkerPlan]]:
        """Every worker's plan of a segment: ``[rank][worker_id]``."""
        return [
            [
                self.worker_plan(
                    todo,
                    seg=seg,
                    world_size=segment.world_size,
                    rank=r,
                    num_workers=segment.num_workers,
                    worker_id=w,
                    batch_size=segment.split_batch_size,
                )
                for w in range(segment.num_workers)
            ]
            for r in range(segment.world_size)
        ]

    def current(self, *, world_size: int, num_workers: int) -> tuple[int, list[np.ndarray] | None, Segment | None]:
        """As :meth:`.plan.EpochPlan.current`, per source: the segment to run now, each source's
        virtual ids left (None: the whole epoch), and the segment it continues or None."""
        todo: list[np.ndarray] | None = None
        segments = list(self.segments)
        for i, segment in enumerate(segments):
            if i == len(segments) - 1 and (segment.world_size, segment.num_workers, segment.split_batch_size) == (
                world_size,
                num_workers,
                self.batch_size,
            ):
                return i, todo, segment
            if segment.samples_consumed is None:
                raise ValueError(
                    "this checkpoint was saved by DataLoader workers (StatefulDataLoader) and holds no per-rank "
                    "sample count; resume it with the same world_size and num_workers, or save with "
                    "shardstream.loader_state_dict(loader, samples_consumed) for an elastic resume"
                )
            if todo is None:
                todo = [np.arange(s.total, dtype=np.int64) for s in self.selections]
            plans = self.segment_plans(todo, i, segment)
            assigned: list[list[np.ndarray]] = [[] for _ in self.selections]
            done: list[list[np.ndarray]] = [[] for _ in self.selections]
            for workers in plans:
                counts = consumed_per_worker([p.count for p in workers], segment.batch_size, segment.samples_consumed)
                for plan, d in zip(workers, counts):
                    took = plan.source_counts(d).tolist()
                    for s, sp in enumerate(plan.sources):
                        assigned[s].append(sp.ids)
                        done[s].append(sp.ids[sp.order[: took[s]]])
            todo = [
                t[np.isin(t, np.concatenate([t[:0], *a])) & ~np.isin(t, np.concatenate([t[:0], *d]))]
                for t, a, d in zip(todo, assigned, done)
            ]
        return len(segments), todo, None

    def for_worker(self, *, rank: int, world_size: int, worker_id: int, num_workers: int) -> tuple[MixWorkerPlan, int]:
        """This worker's plan now (resumed where the checkpoint says) and the segment index."""
        seg, todo, continued = self.current(world_size=world_size, num_workers=num_workers)
        plan = self.worker_plan(
            todo,
            seg=seg,
            world_size=world_size,
            rank=rank,
            num_workers=num_workers,
            worker_id=worker_id,
            batch_size=self.batch_size,
        )
        if continued is not None:
            yielded = dict(continued.worker_yielded)
            skip = 0
            if worker_id in yielded:
                skip = yielded[worker_id]
            elif continued.samples_consumed is not None:
                sizes = tuple(s.total for s in self.selections) if todo is None else tuple(len(t) for t in todo)
                layout = self._rank_layout(sizes, world_size, rank, num_workers, self.batch_size)
                lengths = [int(taken.sum()) for _, _, _, taken in layout]
                skip = consumed_per_worker(lengths, continued.batch_size, continued.samples_consumed)[worker_id]
            if skip > plan.count:
                raise ValueError(f"checkpoint says worker {worker_id} yielded {skip} samples; it has {plan.count}")
            plan.resumed(skip)
        return plan, seg

    def rank_count(self, *, world_size: int, num_workers: int, rank: int = 0) -> int:
        """As :meth:`.plan.EpochPlan.rank_count`."""
        _, todo, continued = self.current(world_size=world_size, num_workers=num_workers)
        total = self.num_samples if todo is None else sum(len(t) for t in todo)
        part = self.per_rank(total, world_size)
        if continued is None or continued.worker_yielded or continued.samples_consumed is None:
            return part
        return part - continued.samples_consumed


def real_plan(plan: WorkerPlan, sel: Selection, starts: np.ndarray) -> WorkerPlan:
    """``plan`` (over a selection's virtual shards) over the source's real shards, to read."""
    runs = []
    for run in plan.runs:
        off = int(sel.lo[run.shard])
        index = None if run.index is None else run.index + off
        runs.append(PlanRun(int(sel.shard[run.shard]), run.lo + off, run.hi + off, index))
    return WorkerPlan(
        runs,
        starts,
        lanes=plan.lanes,
        capacity=plan.capacity,
        stream=plan.stream,
        interleave=plan.interleave,
        skip=plan.skip,
    )
