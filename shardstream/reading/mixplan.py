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
2. **Workers, then batches.** A rank's workers (their pieces, :func:`~.plan.split_workers`)
   are rounds shared out among the rank's counts the same way, and each worker's batches
   (the DataLoader's ``batch_size``; rounds of 64 without it) among the worker's counts,
   each batch in :func:`~.mixture.window_labels` order. So each batch the DataLoader yields
   holds the floor or ceil of each source's share of the worker's proportion (itself within
   one sample per piece of the rank's). A worker takes, of each source, a contiguous chunk
   of the rank's part, after those of the workers before it.
3. **Reading.** Each source's chunk is read as :mod:`.plan` reads a piece (runs, lanes,
   shuffle buffer sized by the source's share of ``shuffle_buffer``), and the worker emits
   the sources in its positions' order.

A resume of the same shape skips, in each source, the samples the worker's delivered
positions took. An elastic resume leaves, per source, a :class:`~.plan.Todo` of the old
workers' remainders (as :mod:`.plan` does): each old worker's count of each source comes
from the rounds of ranks and workers (O(ranks x workers)), and what it had delivered of each
from its first batches, replayed for every distinct kind of old worker at once
(:func:`~.mixture.apportion_prefix`); what is left is split anew, interleaved by what is
left of each source.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .mixture import Selection, apportion, apportion_prefix, window_labels
from .plan import (
    PlanRun,
    Segment,
    Todo,
    WorkerPlan,
    _wrapped,
    consumed_per_worker,
    interleaving,
    per_rank,
    runs_between,
    split_workers,
)

__all__ = ["MIX_MODES", "MixWorkerPlan", "MixturePlan"]

MIX_MODES = ("stratified", "random")
_ROUND = 64  # positions per round when the DataLoader's batch size is not known


@dataclass
class MixWorkerPlan:
    """What one worker reads in one segment of a mixture: per source a
    :class:`~.plan.WorkerPlan` over the source's selection (virtual ids: positions in the
    selection), and the source of each of the worker's positions (:meth:`labels`): round
    ``i`` holds ``rounds[i]`` of each source, in :func:`~.mixture.window_labels` order
    (``stratified``), or a seeded uniformly random interleaving of the same counts
    (``random``). ``skip`` leading positions
    were delivered before a resume."""

    sources: list[WorkerPlan]
    rounds: np.ndarray  # int64 (rounds, K): each of the worker's rounds (batches), per source
    mix: str = "stratified"
    stream: tuple[int, ...] = ()
    skip: int = 0
    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.count = sum(p.count for p in self.sources)

    def labels(self) -> Iterator[np.ndarray]:
        """The source of each position, in order: int16 arrays."""
        if self.mix == "random":
            yield from interleaving([p.count for p in self.sources], self.stream, np.int16)
            return
        known: dict[tuple[int, ...], np.ndarray] = {}  # rounds repeat a few patterns of counts
        for counts in map(tuple, self.rounds.tolist()):
            if counts not in known:
                known[counts] = window_labels(counts)
            yield known[counts]

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
        return per_rank(total, world_size, drop_last=self.drop_last)

    def _rank_layout(
        self, sizes: tuple[int, ...], world_size: int, rank: int, num_workers: int, batch_size: int | None
    ) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """The counts per source of ``rank`` and of its workers, and their pieces' sizes: ranks
        are rounds of ``per_rank`` shared out among the sources' ``sizes``, a rank's workers are
        rounds of their pieces shared out among the rank's counts (:func:`~.mixture.apportion`).
        Returns ``(start, workers, pieces)``: each source's first position of the rank, ``(NW,
        K)`` counts of each worker (a worker's chunk of a source follows the chunks of the
        workers before it), and each worker's piece size. O(ranks + workers), kept per shape."""
        key = (sizes, world_size, rank, num_workers, batch_size)
        if key not in self._layouts:
            per_rank = self.per_rank(sum(sizes), world_size)
            ranks = apportion([per_rank] * world_size, sizes)
            pieces = split_workers(per_rank, num_workers, batch_size)
            self._layouts[key] = (ranks[:rank].sum(axis=0), apportion(pieces, ranks[rank].tolist()), pieces)
        return self._layouts[key]

    def _rounds(self, counts: np.ndarray, piece: int, batch_size: int | None) -> np.ndarray:
        """A worker's rounds (its batches; rounds of 64 without a batch size) shared out among
        its counts: ``(rounds, K)``."""
        unit = batch_size or _ROUND
        lengths = [unit] * (piece // unit) + ([piece % unit] if piece % unit else [])
        return apportion(lengths, counts.tolist())

    def _source_runs(self, s: int, todo: Todo | None, start: int, count: int) -> list[PlanRun]:
        """Runs (virtual shards of source ``s``'s selection) of its positions
        ``start..start+count-1``, wrapping modulo what the source has (``todo``: what it still
        owes; None: the whole selection)."""
        sel = self.selections[s]
        total = sel.total if todo is None else todo.total
        if count <= 0 or total == 0:
            return []
        runs = []
        for a, b in _wrapped(start, start + count, total):
            runs += todo.runs(a, b) if todo is not None else runs_between(sel.starts, a, b)
        return runs

    def worker_plan(
        self, todo: list[Todo] | None, *, seg: int, world_size: int, rank: int, num_workers: int, worker_id: int,
        batch_size: int | None,
    ) -> MixWorkerPlan:  # fmt: skip
        """The plan of one worker of one segment (``todo``: what each source still owes)."""
        sizes = tuple(s.total for s in self.selections) if todo is None else tuple(t.total for t in todo)
        k = len(sizes)
        if sum(sizes) == 0:
            empty = [WorkerPlan([], s.starts) for s in self.selections]
            return MixWorkerPlan(empty, np.zeros((0, k), np.int64), self.mix)
        start, workers, pieces = self._rank_layout(sizes, world_size, rank, num_workers, batch_size)
        start = start + workers[:worker_id].sum(axis=0)
        plans = [
            self._source_plan(todo, sizes, s, int(start[s]), int(workers[worker_id, s]), seg, rank, worker_id)
            for s in range(k)
        ]
        rounds = self._rounds(workers[worker_id], pieces[worker_id], batch_size)
        return MixWorkerPlan(plans, rounds, self.mix, stream=(self.seed, self.epoch, seg, rank, worker_id, 9))

    def _source_plan(
        self, todo: list[Todo] | None, sizes: tuple[int, ...], s: int, start: int, count: int, seg: int, rank: int,
        worker_id: int,
    ) -> WorkerPlan:  # fmt: skip
        """A worker's plan of source ``s``: its chunk ``start .. start+count-1`` of the source."""
        sel = self.selections[s]
        runs = self._source_runs(s, None if todo is None else todo[s], start, count)
        if not self.shuffle:
            return WorkerPlan(runs, sel.starts)
        streams = (self.seed, self.epoch, seg, rank, worker_id, s)
        return WorkerPlan(
            runs,
            sel.starts,
            lanes=max(1, min(self.max_open_shards, len(runs))),
            capacity=max(1, round(self.shuffle_buffer * sizes[s] / sum(sizes))) if self.shuffle_buffer > 1 else 0,
            stream=(*streams, 2),
            interleave=(*streams, 1),
        )

    def current(self, *, world_size: int, num_workers: int) -> tuple[int, list[Todo] | None, Segment | None]:
        """As :meth:`.plan.EpochPlan.current`, per source: the segment to run now, what each
        source still owes (None: the whole epoch), and the segment it continues or None. A
        closed segment leaves, per source, a :class:`~.plan.Todo` of its old workers'
        remainders, their sizes from the counts alone: every old rank's and worker's counts per
        source (O(ranks x workers)), and what each had delivered of each source, the rounds of
        all old workers replayed together (:func:`~.mixture.apportion_prefix`, O(batches of a
        worker) numpy steps)."""
        todo: list[Todo] | None = None
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
            todo = self._remainders(todo, i, segment)
        return len(segments), todo, None

    def _remainders(self, todo: list[Todo] | None, seg: int, segment: Segment) -> list[Todo]:
        """What each source still owes after the closed segment ``seg``."""
        sizes = tuple(s.total for s in self.selections) if todo is None else tuple(t.total for t in todo)
        k, ranks, workers = len(sizes), segment.world_size, segment.num_workers
        unit = segment.split_batch_size or _ROUND
        if sum(sizes) == 0:
            return [Todo([]) for _ in range(k)]
        per_rank = self.per_rank(sum(sizes), ranks)
        pieces = split_workers(per_rank, workers, segment.split_batch_size)
        done = consumed_per_worker(pieces, segment.batch_size, segment.samples_consumed)
        counts = np.concatenate(  # (ranks * workers, K): each old worker's count of each source
            [apportion(pieces, row) for row in apportion([per_rank] * ranks, sizes).tolist()]
        )
        totals = np.tile(np.asarray(pieces, np.int64), ranks)
        full = np.tile(np.asarray(done, np.int64), ranks) // unit
        before, current = apportion_prefix(unit, totals, counts, full)
        partial = np.tile(np.asarray(done, np.int64), ranks) - full * unit
        delivered = before.copy()
        for row in np.flatnonzero(partial).tolist():  # a worker stopped inside a batch
            labels = window_labels(current[row].tolist())[: partial[row]]
            delivered[row] += np.bincount(labels, minlength=k)
        parts: list[list[tuple[int, Any]]] = [[] for _ in range(k)]
        for r in range(ranks):
            for w in range(workers):
                row = r * workers + w
                for s in range(k):
                    left = int(counts[row, s] - delivered[row, s])
                    if left > 0:
                        maker = functools.partial(
                            self._source_remainder, todo, sizes, segment, seg, r, w, s, int(delivered[row, s])
                        )
                        parts[s].append((left, maker))
        return [Todo(p) for p in parts]

    def _source_remainder(
        self, todo: list[Todo] | None, sizes: tuple[int, ...], segment: Segment, seg: int, rank: int, worker_id: int,
        s: int, delivered: int,
    ) -> list[PlanRun]:  # fmt: skip
        """What an old worker had not delivered of source ``s`` when segment ``seg`` closed."""
        start, workers, _ = self._rank_layout(
            sizes, segment.world_size, rank, segment.num_workers, segment.split_batch_size
        )
        first = int(start[s] + workers[:worker_id, s].sum())
        plan = self._source_plan(todo, sizes, s, first, int(workers[worker_id, s]), seg, rank, worker_id)
        return plan.remaining(delivered)

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
                sizes = tuple(s.total for s in self.selections) if todo is None else tuple(t.total for t in todo)
                lengths = self._rank_layout(sizes, world_size, rank, num_workers, self.batch_size)[2]
                skip = consumed_per_worker(lengths, continued.batch_size, continued.samples_consumed)[worker_id]
            if skip > plan.count:
                raise ValueError(f"checkpoint says worker {worker_id} yielded {skip} samples; it has {plan.count}")
            plan.resumed(skip)
        return plan, seg

    def rank_count(self, *, world_size: int, num_workers: int, rank: int = 0) -> int:
        """As :meth:`.plan.EpochPlan.rank_count`."""
        _, todo, continued = self.current(world_size=world_size, num_workers=num_workers)
        total = self.num_samples if todo is None else sum(t.total for t in todo)
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
