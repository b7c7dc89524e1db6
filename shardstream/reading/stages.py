"""The reader's stages, and the item unit they count. No torch.

A pass of a :class:`~.reader.Reader` is a list of stages, composed as data: the first (a
*mode*) makes what the engines read, each next one takes the iterator of the one before
(:meth:`Stage.open`). The built-in list is ``[mode, *unit stages, Deliver, Batching]``:

- a mode: :class:`ExactRead` (an index or a mixture: the schedule's plan, one worker's piece
  of it, read by the engines), :class:`ResampledRead` (shards drawn with replacement),
  :class:`UrlRead` (bare shard URLs: every ``readers``-th shard of the epoch's order, through
  a shuffle buffer);
- the item unit's stages (:class:`ItemUnit`): none for samples;
- :class:`Deliver`: items decoded, or skipped and replaced by repeats (``on_error="skip"``),
  counted into the reader's stats a batch at a time, with a periodic log line;
- :class:`Batching` (with a :class:`~.batching.Batcher`): whole batches of ``batch_size``
  items, read straight from the shard files where the batcher can.

**State.** A stage's state is what a checkpoint needs to resume it, O(1) (or O(workers)) in
size: it writes it into the pass's :class:`PassProgress` (``ctx.progress``): the mode its
place in the epoch (``position``: segment and items skipped as read before a resume), the
delivering stages the items handed out (``delivered``). A stage that holds items back (a
buffer) must count only what it handed on. The schedule turns a progress into a checkpoint
(:meth:`~.schedule.Schedule.reader_state`) and a checkpoint into the next pass's plan, so a
new stage resumes without code of its own there.

**Items.** What epochs, ``len``, checkpoints and per-rank counts count is an *item*, made by
an :class:`ItemUnit` from the shards: a sample by default (:data:`SAMPLES`). A unit presents
the shards to the schedule and the engines as shards of its items
(:meth:`ItemUnit.items_of`: a :class:`~.shards.ShardSet` whose ``sample_counts`` and tables
are the items'), and adds the stages that turn what the engines read into items. A new kind
of item (fixed-length token blocks is the next one) is a new unit and its stage: the
schedule, the engines and ``ShardDataset`` stay as they are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..config import FetchConfig
from ..tarstream import Batch
from .assign import WorkerSlot
from .batching import Batcher, RunPiece, batches, reads_runs
from .engine import ReadingEngine, repeat_over_skips, shuffled
from .epochs import PassState
from .filerun import FileRun
from .shards import ShardSet
from .stats import ReaderStats

__all__ = [
    "SAMPLES",
    "Batching",
    "Deliver",
    "ExactRead",
    "ItemUnit",
    "PassContext",
    "PassProgress",
    "ResampledRead",
    "Samples",
    "Stage",
    "UrlRead",
    "default_stages",
    "failing",
]

log = logging.getLogger("shardstream")
_UNBATCHED = 2  # EpochBoard.once flag: warned that workers' pieces are not cut into whole batches


class PassProgress:
    """Where one pass stands, for checkpoints (the stages' state, O(1)): ``delivered`` items
    handed out, and ``position``: ``(segment index, items skipped as read before a resume)``
    of its piece of an exact epoch (None otherwise)."""

    def __init__(self, position: tuple[int, int] | None = None) -> None:
        self.delivered = 0
        self.position = position


@dataclass
class PassContext:
    """What every stage of one pass may use (made by :meth:`~.reader.Reader.open`).

    Attributes:
        state: the pass's epoch and the checkpoint it resumes.
        slot: who reads (a group with ``replication``).
        engines: one :class:`~.engine.ReadingEngine` per source.
        schedule: the epoch schedule (:class:`~.schedule.Schedule`).
        fetch: this reader's share of the read-ahead budget.
        stats: this reader's counters.
        progress: the pass's state (module doc), written by the stages.
        log_line: called every ``log_every_s`` seconds while reading (None: never).
        on_end: called once every item was delivered (before a last short batch).
        once: whether a warning (a flag) is due: true once per dataset.
    """

    state: PassState
    slot: WorkerSlot
    engines: Sequence[ReadingEngine]
    schedule: Any
    fetch: FetchConfig
    stats: ReaderStats
    progress: PassProgress = field(default_factory=PassProgress)
    log_line: Callable[[], None] | None = None
    on_end: Callable[[], None] | None = None
    once: Callable[[int], bool] = lambda flag: True


@runtime_checkable
class Stage(Protocol):
    """One step of a pass: takes the iterator of the stage before it (None for a mode, the
    first) and gives its own, writing its state into ``ctx.progress`` (module doc)."""

    def open(self, upstream: Iterator[Any] | None, ctx: PassContext) -> Iterator[Any]: ...


@runtime_checkable
class ItemUnit(Protocol):
    """What one item is (module doc): what epochs, ``len``, checkpoints and per-rank counts count.

    Attributes:
        name: the unit's name, recorded in checkpoints (``"sample"`` is not recorded).
    """

    name: str

    def items_of(self, shards: ShardSet) -> ShardSet:
        """The shards as shards of items: ``sample_counts`` the items in each shard (int64
        ``(num_shards,)``), ``table(shard)`` a table whose rows are the items' byte ranges.

        Raises:
            ValueError: the shards cannot hold this unit's items (say why and what to do).
        """
        ...

    def stages(self) -> Sequence[Stage]:
        """The stages that turn what the engines read into items (after the mode)."""
        ...


@dataclass(frozen=True)
class Samples:
    """The default unit: an item is a sample (a key's members)."""

    name: str = "sample"

    def items_of(self, shards: ShardSet) -> ShardSet:
        return shards

    def stages(self) -> Sequence[Stage]:
        return ()


SAMPLES = Samples()


@dataclass(frozen=True)
class ExactRead:
    """The mode of exact epochs: the schedule's plan of the pass, this slot's piece of it, read
    by the engines (file runs handed on unread where ``file_runs``: :func:`~.batching.reads_runs`).
    Sets ``ctx.progress.position``. A piece that cannot be cut for the slot (a checkpoint of
    another shape) raises its ValueError at the first ``next``."""

    file_runs: bool = False
    batched: bool = False  # the dataset cuts workers' pieces into whole batches (batch_size)

    def open(self, upstream: Iterator[Any] | None, ctx: PassContext) -> Iterator[Batch | FileRun]:
        schedule, slot = ctx.schedule, ctx.slot
        plan = schedule.plan(ctx.state, slot)
        try:
            mine, seg = schedule.worker_plan(plan, slot)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
            return failing(exc)
        if not self.batched and slot.num_workers > 1 and ctx.once(_UNBATCHED):
            log.warning(
                "ShardDataset read by %d DataLoader workers without ShardDataset(batch_size=...): if the "
                "DataLoader batches, each worker ends with a short batch, so it may yield up to "
                "num_workers - 1 = %d batches more than len(loader), which loops that stop at len(loader) "
                "(Lightning, Hugging Face's Trainer) never train on. Pass the DataLoader's batch_size to "
                "ShardDataset.",
                slot.num_workers,
                slot.num_workers - 1,
            )
        ctx.progress.position = (seg, mine.skip)
        return schedule.read_worker(
            mine, ctx.state.epoch, ctx.engines, fetch=ctx.fetch, stats=ctx.stats, file_runs=self.file_runs
        )


@dataclass(frozen=True)
class ResampledRead:
    """The mode of endless draws: shards drawn with replacement by the first engine, seeded by
    ``(seed, epoch, reader)``, through a shuffle buffer."""

    def open(self, upstream: Iterator[Any] | None, ctx: PassContext) -> Iterator[Batch]:
        schedule = ctx.schedule
        read = ctx.engines[0].read_resampled(
            seed=schedule.seed, epoch=ctx.state.epoch, reader=ctx.slot.index, fetch=ctx.fetch, stats=ctx.stats
        )
        return _buffered(read, ctx)


@dataclass(frozen=True)
class UrlRead:
    """The mode of bare shard URLs (no counts): every ``readers``-th shard of the epoch's
    order, read whole by the first engine, through a shuffle buffer."""

    def open(self, upstream: Iterator[Any] | None, ctx: PassContext) -> Iterator[Batch]:
        ids = ctx.schedule.shard_ids(ctx.slot, ctx.state.epoch)
        return _buffered(ctx.engines[0].read_shards(ids, fetch=ctx.fetch, stats=ctx.stats), ctx)


def failing(exc: BaseException) -> Iterator[Any]:
    """An iterator that raises ``exc`` at its first ``next`` (errors of a pass's set-up reach
    the consumer there, as a DataLoader worker hands them on)."""
    raise exc
    yield


def _buffered(read: Iterator[Batch], ctx: PassContext) -> Iterator[Batch]:
    schedule = ctx.schedule
    if schedule.shuffle and schedule.shuffle_buffer > 1:
        seed = (schedule.seed, ctx.state.epoch, ctx.slot.index)
        return shuffled(read, capacity_samples=schedule.shuffle_buffer, seed=seed)
    return read


@dataclass(frozen=True)
class Deliver:
    """Items decoded (``decode``), or skipped and replaced by repeats (``on_error="skip"``:
    :func:`~.engine.repeat_over_skips`), counted into ``ctx.stats`` a batch at a time and into
    ``ctx.progress.delivered`` one at a time, with a log line every ``log_every_s`` seconds;
    file runs are handed on unread (:class:`Batching` reads and counts them). Calls
    ``ctx.on_end`` once the last item was handed out."""

    decode: Callable[[dict[str, Any]], Any] | None = None
    on_error: str = "raise"
    log_every_s: float | None = None

    def open(self, upstream: Iterator[Any] | None, ctx: PassContext) -> Iterator[Any]:
        assert upstream is not None  # internal invariant: a mode comes first
        return self._delivered(upstream, ctx)

    def _delivered(self, read: Iterator[Batch | FileRun], ctx: PassContext) -> Iterator[Any]:
        decode, stats, progress, log_line = self.decode, ctx.stats, ctx.progress, ctx.log_line
        every_s = self.log_every_s or 0.0
        next_log = time.monotonic() + every_s if every_s and log_line is not None else float("inf")
        if self.on_error == "skip":  # no file runs then (reads_runs)
            read = repeat_over_skips(read, decode, stats)
            decode = None
        for batch in read:
            if log_line is not None and time.monotonic() >= next_log:
                log_line()
                next_log = time.monotonic() + every_s
            if isinstance(batch, FileRun):
                yield batch
                continue
            stats.samples(len(batch), batch.nbytes)
            if decode is None:
                for sample in batch:
                    progress.delivered += 1
                    yield sample
            else:
                for sample in batch:
                    progress.delivered += 1
                    yield decode(sample)
        if ctx.on_end is not None:
            ctx.on_end()


@dataclass(frozen=True)
class Batching:
    """Whole batches of ``batch_size`` items made by ``batcher`` (the last short); a batch of
    file runs alone read straight into the batcher's buffers (:func:`~.batching.batches`),
    its items counted into ``ctx.stats`` and ``ctx.progress``."""

    batcher: Batcher
    batch_size: int

    def open(self, upstream: Iterator[Any] | None, ctx: PassContext) -> Iterator[Any]:
        assert upstream is not None  # internal invariant: a mode comes first

        def count(pieces: Sequence[RunPiece]) -> None:
            n = sum(j - i for _, i, j in pieces)
            ctx.stats.samples(n, sum(sum(run.kept_sizes(i, j)) for run, i, j in pieces))
            ctx.progress.delivered += n

        return batches(upstream, self.batcher, self.batch_size, count)


def default_stages(
    *,
    exact: bool,
    resampled: bool,
    unit: ItemUnit,
    decode: Callable[[dict[str, Any]], Any] | None,
    on_error: str,
    log_every_s: float | None,
    batcher: Batcher | None,
    batch_size: int | None,
) -> tuple[Stage, ...]:
    """The built-in stage list of a reader (module doc), as data."""
    mode: Stage
    if resampled:
        mode = ResampledRead()
    elif exact:
        file_runs = reads_runs(batcher, decode=decode, on_error=on_error) and not unit.stages()
        mode = ExactRead(file_runs=file_runs, batched=batch_size is not None)
    else:
        mode = UrlRead()
    out: list[Stage] = [mode, *unit.stages(), Deliver(decode, on_error, log_every_s)]
    if batcher is not None and batch_size is not None:
        out.append(Batching(batcher, batch_size))
    return tuple(out)
