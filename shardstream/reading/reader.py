"""The reader: one pass of one reader, from its epoch and slot to the samples or batches it
hands out. No torch: :class:`shardstream.ShardDataset` is the torch glue around it.

A :class:`Reader` composes the stages every dataset goes through, whatever it reads:

1. **mode**: exact epochs (an index or a mixture: the schedule's plan, one worker's piece of
   it, read by the engines, :meth:`~.schedule.Schedule.read_worker`), resampling (shards drawn
   with replacement), or bare shard URLs (every ``readers``-th shard of the epoch's order,
   through a shuffle buffer);
2. **delivery**: samples decoded, or skipped and replaced by repeats (``on_error="skip"``,
   :func:`~.engine.repeat_over_skips`), counted into the reader's stats a batch at a time,
   with a periodic log line;
3. **batching** (with a :class:`~.batching.Batcher`): whole batches of ``batch_size``
   samples, read straight from the shard files where the batcher can
   (:func:`~.batching.reads_runs`).

One dataset and a mixture are read alike: what differs is the schedule's
(:class:`~.schedule.EpochSchedule`, :class:`~.schedule.MixtureSchedule`), and ``replication``
makes each model-parallel group of ranks one reader of the data (:meth:`Reader.group`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config
from ..index import DatasetIndex, resolve_source
from ..tarstream import Batch
from .assign import NodeAffinity, WorkerSlot
from .batching import Batcher, RunPiece, as_batcher, batches, reads_runs
from .engine import ReadingEngine, repeat_over_skips, shuffled
from .epochs import PassState
from .mixture import sources_of
from .schedule import EpochSchedule, MixtureSchedule, Schedule
from .shards import ChainedUrls, IndexedShards, url_shards
from .slicer import FileRun
from .stats import ReaderStats

log = logging.getLogger("shardstream")
_UNBATCHED = 2  # EpochBoard.once flag: warned that workers' pieces are not cut into whole batches

__all__ = ["ReadOptions", "Reader", "ReaderPass", "failing", "loader_batch_size", "open_reader"]


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How a reader delivers what it reads.

    Attributes:
        decode: the per-sample stage: a callable taking a sample (a dict of the members) and
            returning what is handed on (``make_decoder`` composes it once from ``decode`` and
            ``fields``), or None (members as bytes).
        on_error: ``"raise"`` or ``"skip"`` (undecodable samples and corrupt runs replaced by
            repeats of the previous good sample).
        log_every_s: seconds between log lines of reader 0 (None: no logging).
        resampled: draw shards with replacement, endlessly, instead of epochs.
        replication: ranks per model-parallel group (they read the same samples).
        batcher: make batches of ``batch_size`` samples; None: hand out samples.
        batch_size: samples a batch (with ``batcher``).

    Made by :func:`open_reader`, which checks every value first.
    """

    decode: Callable[[dict[str, Any]], Any] | None = None
    on_error: str = "raise"
    log_every_s: float | None = None
    resampled: bool = False
    replication: int = 1
    batcher: Batcher | None = None
    batch_size: int | None = None


class ReaderPass:
    """Where one pass stands, for checkpoints: samples delivered, and ``position``: ``(segment
    index, samples skipped as read before a resume)`` of its piece of an exact epoch (None
    otherwise)."""

    def __init__(self, position: tuple[int, int] | None = None) -> None:
        self.delivered = 0
        self.position = position


class Reader:
    """Reads passes of a dataset or mixture (module doc). Picklable: DataLoader workers get a copy.

    Args:
        schedule: the epoch schedule (which samples each rank and worker reads).
        engines: one :class:`~.engine.ReadingEngine` per source (one for a dataset).
        options: how samples are delivered (:class:`ReadOptions`).
    """

    def __init__(self, schedule: Schedule, engines: Sequence[ReadingEngine], options: ReadOptions) -> None:
        self.schedule = schedule
        self.engines = list(engines)
        self.options = options

    def __repr__(self) -> str:
        return f"Reader({self.schedule.num_shards} shards, {len(self.engines)} source(s), {self.options!r})"

    @property
    def classes(self) -> list[str] | None:
        """The class names of the data's index (``Manifest.classes``): a mixture's when every
        source has the same list, else None; None without an index."""
        lists = [getattr(engine.shards, "classes", None) for engine in self.engines]
        first = lists[0] if lists else None
        return list(first) if first is not None and all(other == first for other in lists) else None

    @property
    def exact(self) -> bool:
        """Epochs planned from sample counts (an index, or a mixture), not resampled."""
        return self.schedule.num_samples is not None and not self.options.resampled

    def check_exact(self, what: str) -> None:
        """Raise unless epochs are exact (:attr:`exact`), for ``what`` that needs it.

        Raises:
            TypeError: no index (bare shard URLs) or ``resampled``: counts are unknown.
        """
        if not self.exact:
            raise TypeError(f"{what} needs a dataset with an index (written by shardstream pack) and resampled=False")

    def group(self, slot: WorkerSlot) -> WorkerSlot:
        """The reader of the data ``slot`` is: with ``replication`` k, its rank's data-parallel
        group (``rank // k`` of ``world_size // k``), so a group's ranks read alike.

        Raises:
            ValueError: world_size is not a multiple of ``replication``.
        """
        k = self.options.replication
        if k == 1:
            return slot
        if slot.world_size % k:
            raise ValueError(
                f"world_size={slot.world_size} is not a multiple of replication={k}; each model-parallel group "
                "needs all its ranks"
            )
        return WorkerSlot(
            rank=slot.rank // k, world_size=slot.world_size // k, worker_id=slot.worker_id, num_workers=slot.num_workers
        )

    def open(
        self,
        state: PassState,
        slot: WorkerSlot,
        *,
        fetch: FetchConfig,
        stats: ReaderStats,
        log_line: Callable[[], None] | None = None,
        on_end: Callable[[], None] | None = None,
        once: Callable[[int], bool] = lambda flag: True,
    ) -> tuple[ReaderPass, Iterator[Any]]:
        """One pass of ``slot`` (a group, :meth:`group`) in the epoch of ``state``: its
        :class:`ReaderPass` (set now, before the first sample) and what it hands out.

        Args:
            state: the pass's epoch and the checkpoint it resumes.
            slot: who reads.
            fetch: this reader's share of the read-ahead budget.
            stats: this reader's counters.
            log_line: called every ``log_every_s`` seconds while reading (None: never).
            on_end: called once every sample was delivered (before a last short batch).
            once: whether a warning (a flag) is due: true once per dataset
                (:meth:`~.epochs.EpochBoard.once`), so workers do not each warn.

        What it hands out raises, at its first ``next``, a ValueError where the checkpoint
        cannot be split for this slot.
        """
        options, schedule = self.options, self.schedule
        if self.exact:
            plan = schedule.plan(state, slot)
            try:
                mine, seg = schedule.worker_plan(plan, slot)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
                return ReaderPass(), failing(exc)
            if options.batch_size is None and slot.num_workers > 1 and once(_UNBATCHED):
                log.warning(
                    "ShardDataset read by %d DataLoader workers without ShardDataset(batch_size=...): if the "
                    "DataLoader batches, each worker ends with a short batch, so it may yield up to "
                    "num_workers - 1 = %d batches more than len(loader), which loops that stop at len(loader) "
                    "(Lightning, Hugging Face's Trainer) never train on. Pass the DataLoader's batch_size to "
                    "ShardDataset.",
                    slot.num_workers,
                    slot.num_workers - 1,
                )
            progress = ReaderPass((seg, mine.skip))
            file_runs = reads_runs(options.batcher, decode=options.decode, on_error=options.on_error)
            read: Iterator[Batch | FileRun] = schedule.read_worker(
                mine, state.epoch, self.engines, fetch=fetch, stats=stats, file_runs=file_runs
            )
        else:
            progress = ReaderPass()
            engine = self.engines[0]
            if options.resampled:
                read = engine.read_resampled(
                    seed=schedule.seed, epoch=state.epoch, reader=slot.index, fetch=fetch, stats=stats
                )
            else:
                read = engine.read_shards(schedule.shard_ids(slot, state.epoch), fetch=fetch, stats=stats)
            if schedule.shuffle and schedule.shuffle_buffer > 1:
                read = shuffled(
                    read, capacity_samples=schedule.shuffle_buffer, seed=(schedule.seed, state.epoch, slot.index)
                )
        out = self._delivered(read, progress, stats, log_line, on_end)
        if options.batcher is not None and options.batch_size is not None:
            out = batches(out, options.batcher, options.batch_size, lambda pieces: _count(pieces, progress, stats))
        return progress, out

    def _delivered(
        self,
        read: Iterator[Batch | FileRun],
        progress: ReaderPass,
        stats: ReaderStats,
        log_line: Callable[[], None] | None,
        on_end: Callable[[], None] | None,
    ) -> Iterator[Any]:
        """The pass's samples, decoded, counted (a batch at a time) and logged; file runs are
        handed on unread (the batching stage reads and counts them)."""
        decode = self.options.decode
        every_s = self.options.log_every_s or 0.0
        next_log = time.monotonic() + every_s if every_s and log_line is not None else float("inf")
        if self.options.on_error == "skip":  # no file runs then (reads_runs)
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
        if on_end is not None:
            on_end()


def failing(exc: BaseException) -> Iterator[Any]:
    """An iterator that raises ``exc`` at its first ``next`` (errors of a pass's set-up reach
    the consumer there, as a DataLoader worker hands them on)."""
    raise exc
    yield


def _count(pieces: Sequence[RunPiece], progress: ReaderPass, stats: ReaderStats) -> None:
    """File-run ``pieces`` delivered: their samples and every member's bytes, as a sliced read counts."""
    count = sum(j - i for _, i, j in pieces)
    stats.samples(count, sum(sum(run.kept_sizes(i, j)) for run, i, j in pieces))
    progress.delivered += count


def open_reader(
    source: Any,
    *,
    shuffle: bool,
    shuffle_buffer: int,
    seed: int,
    decode: Any,
    s3: S3Config | None,
    requests: RequestConfig | None,
    cache_dir: str | os.PathLike[str] | None,
    cache_limit_bytes: int | None,
    log_every_s: float | None,
    drop_last: bool,
    max_open_shards: int,
    batch_size: int | None,
    resampled: bool,
    on_error: str,
    verify_checksums: bool,
    epoch_samples: int | None,
    mix: str,
    replication: int,
    collate: Any,
    fields: Any = None,
    shard_affinity: Any = None,
    make_decoder: Callable[..., Callable[[dict[str, Any]], Any] | None],
) -> tuple[Reader, Sequence[str], DatasetIndex | None]:
    """The reader of :class:`shardstream.ShardDataset`'s arguments (their meaning is there
    and in docs/reading.md; ``make_decoder(decode, fields=fields)`` makes the per-sample stage,
    :attr:`ReadOptions.decode`): one dataset, or a mixture of the ``Source`` s in ``source``;
    with its shard URLs (O(sources) for a mixture: never listed) and its index (None for a
    mixture or shard URLs). Shard URLs with their sample tables beside them read in exact
    epochs (:func:`~.shards.url_shards`: their tables' headers are read here, O(shards)).

    Raises:
        ValueError: a bad argument (named with its value), ``epoch_samples`` without a
            mixture, ``resampled`` with one, or a bad mixture (naming the source).
        TypeError: a list mixing ``Source`` s and shard URLs.
        ShardNotFoundError, IndexFormatError: as :func:`~shardstream.index.resolve_source`.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"{on_error=} must be 'raise' or 'skip'")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"{batch_size=} must be an int >= 1 (the DataLoader's) or None")
    if collate is not None and batch_size is None:
        raise ValueError(
            "collate= makes the dataset hand out batches of batch_size samples: pass batch_size=... too (and "
            "read it with DataLoader(dataset, batch_size=None))"
        )
    batcher = None if collate is None else as_batcher(collate)
    if not isinstance(max_open_shards, int) or max_open_shards < 1:
        raise ValueError(f"{max_open_shards=} must be an int >= 1")
    if cache_dir is not None and (not isinstance(cache_limit_bytes, int) or cache_limit_bytes < 1):
        raise ValueError(f"{cache_limit_bytes=} must be an int >= 1 (bytes) when cache_dir is set")
    if log_every_s is not None and not log_every_s > 0:
        raise ValueError(f"{log_every_s=} must be > 0 (seconds) or None")
    if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
        raise ValueError(f"{shuffle_buffer=} must be an int >= 0 (samples)")
    if not isinstance(seed, int):
        raise ValueError(f"{seed=} must be an int")
    if not isinstance(replication, int) or isinstance(replication, bool) or replication < 1:
        raise ValueError(f"{replication=} must be an int >= 1 (ranks per model-parallel group)")
    options = ReadOptions(
        decode=make_decoder(decode, fields=fields),
        on_error=on_error,
        log_every_s=log_every_s,
        resampled=resampled,
        replication=replication,
        batcher=batcher,
        batch_size=batch_size,
    )
    affinity = NodeAffinity.of(shard_affinity, replication=replication)
    order = dict(seed=seed, shuffle=shuffle, shuffle_buffer=shuffle_buffer, max_open_shards=max_open_shards)
    order.update(drop_last=drop_last, batch_size=batch_size)
    engine = dict(s3=s3, requests=requests, on_error=on_error, verify_checksums=verify_checksums)
    engine.update(
        cache_dir=os.fspath(cache_dir) if cache_dir is not None else None, cache_limit_bytes=cache_limit_bytes
    )
    sources = sources_of(source)
    if sources is not None and len(sources) == 1 and sources[0].rule() == {"repeat": 1.0} and epoch_samples is None:
        source, sources = sources[0].location, None  # one whole source: a plain dataset
    if sources is None:
        if epoch_samples is not None:
            raise ValueError(
                f"{epoch_samples=} sets the size of a mixture's epoch; pass a list of Source(...) to mix datasets"
            )
        urls, index = resolve_source(source, s3=s3, requests=requests)
        shards = IndexedShards(index) if index is not None else url_shards(urls, s3=s3, requests=requests)
        if affinity is not None and (resampled or shards.sample_counts is None):
            raise ValueError(
                "shard_affinity='node' splits exact epochs by node: it needs an index (not bare shard URLs) "
                "and resampled=False"
            )
        schedule: Schedule = EpochSchedule(shards, **order, shard_affinity=affinity)
        return Reader(schedule, [ReadingEngine(shards, **engine)], options), urls, index
    if resampled:
        raise ValueError("resampled=True reads one dataset endlessly; a mixture's epochs are exact, drop it")
    if affinity is not None:
        raise ValueError(
            "shard_affinity='node' is not supported for a mixture yet: each source would need its own node "
            "shares; read the mixture without it (its node cache then holds what each epoch brings)"
        )
    with concurrent.futures.ThreadPoolExecutor(min(16, len(sources))) as pool:  # their indexes' GETs at once
        resolved = list(pool.map(lambda src: resolve_source(src.location, s3=s3, requests=requests), sources))
    sets = [
        IndexedShards(index) if index is not None else url_shards(urls, s3=s3, requests=requests)
        for urls, index in resolved
    ]
    schedule = MixtureSchedule(sources, sets, epoch_samples=epoch_samples, mix=mix, **order)
    engines = [ReadingEngine(shards, **engine) for shards in sets]
    return Reader(schedule, engines, options), ChainedUrls([urls for urls, _ in resolved]), None


def loader_batch_size(loader: Any, *, batch_size: int | None, batches: bool) -> int | None:
    """The batch size a checkpoint of a dataset read by ``loader`` (a DataLoader) counts in:
    the DataLoader's, or the dataset's when it makes the batches itself (``batches``).

    Raises:
        ValueError: the loader drops last batches, delivers out of order, batches the
            dataset's batches again, or batches other than the dataset's ``batch_size``.
    """
    if getattr(loader, "drop_last", False):
        raise ValueError(
            "DataLoader(drop_last=True) drops each worker's short last batch; use ShardDataset(drop_last=)"
        )
    if getattr(loader, "in_order", True) is False:
        raise ValueError("DataLoader(in_order=False) delivers batches in no fixed order; a checkpoint needs in_order")
    if batches:
        if loader.batch_size is not None:
            raise ValueError(
                f"ShardDataset(collate=...) hands out batches of {batch_size}, but the DataLoader batches them "
                f"again (batch_size={loader.batch_size}); read it with DataLoader(dataset, batch_size=None)"
            )
        return batch_size
    if batch_size is not None and batch_size != loader.batch_size:
        raise ValueError(
            f"ShardDataset(batch_size={batch_size}) but the DataLoader's batch_size is {loader.batch_size}; "
            "give the dataset the DataLoader's batch size"
        )
    return loader.batch_size
