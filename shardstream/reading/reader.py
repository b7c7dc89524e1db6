"""The reader: one pass of one reader, from its epoch and slot to the items or batches it
hands out. No torch: :class:`shardstream.ShardDataset` is the torch glue around it.

A :class:`Reader` is a schedule, its engines and a list of stages (:mod:`.stages`), composed
as data by :meth:`Reader.open`: a mode (exact epochs, resampling, bare shard URLs), the item
unit's stages, delivery (decoding, skips, counts, log lines) and batching. A new kind of item
or step is a new stage in the list, not code here.

One dataset and a mixture are read alike: a dataset is a mixture of one source
(:func:`open_reader` resolves both through one path, :func:`~.mixschedule.schedule_for` picks
the plan), and ``replication`` makes each model-parallel group of ranks one reader of the
data (:meth:`Reader.group`).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import FetchConfig, OnError, OrderSettings, StoreSettings, on_error_of
from ..index import DatasetIndex, resolve_source
from .assign import NodeAffinity, WorkerSlot
from .batching import Batcher, as_batcher
from .engine import ReadingEngine
from .epochs import PassState
from .mixschedule import refused, schedule_for
from .mixture import Source, sources_of
from .schedule import Schedule
from .shards import ChainedUrls, IndexedShards, url_shards
from .stages import SAMPLES, ItemUnit, PassContext, PassProgress, Stage, default_stages, failing
from .stats import ReaderStats

__all__ = ["ReadOptions", "Reader", "ReaderPass", "failing", "loader_batch_size", "open_reader", "read_options"]

ReaderPass = PassProgress  # its former name


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How a reader delivers what it reads.

    Attributes:
        decode: the per-item stage: a callable taking a sample (a dict of the members) and
            returning what is handed on (``make_decoder`` composes it once from ``decode`` and
            ``fields``), or None (members as bytes).
        on_error: ``"raise"`` or ``"skip"`` (undecodable samples and corrupt runs replaced by
            repeats of the previous good sample).
        log_every_s: seconds between log lines of reader 0 (None: no logging).
        resampled: draw shards with replacement, endlessly, instead of epochs.
        replication: ranks per model-parallel group (they read the same samples).
        batcher: make batches of ``batch_size`` items; None: hand out items.
        batch_size: items a batch (with ``batcher``).
        unit: what an item is (:class:`~.stages.ItemUnit`; a sample by default).

    Made by :func:`read_options`, which checks every value first.
    """

    decode: Callable[[dict[str, Any]], Any] | None = None
    on_error: OnError = "raise"
    log_every_s: float | None = None
    resampled: bool = False
    replication: int = 1
    batcher: Batcher | None = None
    batch_size: int | None = None
    unit: ItemUnit = SAMPLES


class Reader:
    """Reads passes of a dataset or mixture (module doc). Picklable: DataLoader workers get a copy.

    Args:
        schedule: the epoch schedule (which items each rank and worker reads).
        engines: one :class:`~.engine.ReadingEngine` per source (one for a dataset).
        options: how items are delivered (:class:`ReadOptions`).
        stages: the pass's stages in order (:mod:`.stages`); None: the built-in list for
            ``options`` (:func:`~.stages.default_stages`).
    """

    def __init__(
        self,
        schedule: Schedule,
        engines: Sequence[ReadingEngine],
        options: ReadOptions,
        stages: Sequence[Stage] | None = None,
    ) -> None:
        self.schedule = schedule
        self.engines = list(engines)
        self.options = options
        if stages is None:
            stages = default_stages(
                exact=self.exact,
                resampled=options.resampled,
                unit=options.unit,
                decode=options.decode,
                on_error=options.on_error,
                log_every_s=options.log_every_s,
                batcher=options.batcher,
                batch_size=options.batch_size,
            )
        self.stages: tuple[Stage, ...] = tuple(stages)

    def __repr__(self) -> str:
        return f"Reader({self.schedule.num_shards} shards, {len(self.engines)} source(s), {self.options!r})"

    @property
    def engine(self) -> ReadingEngine:
        """The first source's engine: its store settings are every engine's."""
        return self.engines[0]

    @property
    def classes(self) -> list[str] | None:
        """The class names of the data's index (``Manifest.classes``): a mixture's when every
        source has the same list, else None; None without an index."""
        lists = [getattr(engine.shards, "classes", None) for engine in self.engines]
        first = lists[0] if lists else None
        return list(first) if first is not None and all(other == first for other in lists) else None

    @property
    def exact(self) -> bool:
        """Epochs planned from item counts (an index, or a mixture), not resampled."""
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
    ) -> tuple[PassProgress, Iterator[Any]]:
        """One pass of ``slot`` (a group, :meth:`group`) in the epoch of ``state``: its
        :class:`~.stages.PassProgress` (set now, before the first item) and what its last
        stage hands out, each stage opened on the one before (:class:`~.stages.PassContext`).

        Args:
            state: the pass's epoch and the checkpoint it resumes.
            slot: who reads.
            fetch: this reader's share of the read-ahead budget.
            stats: this reader's counters.
            log_line: called every ``log_every_s`` seconds while reading (None: never).
            on_end: called once every item was delivered (before a last short batch).
            once: whether a warning (a flag) is due: true once per dataset
                (:meth:`~.epochs.EpochBoard.once`), so workers do not each warn.

        What it hands out raises, at its first ``next``, a ValueError where the checkpoint
        cannot be split for this slot.
        """
        ctx = PassContext(
            state=state,
            slot=slot,
            engines=self.engines,
            schedule=self.schedule,
            fetch=fetch,
            stats=stats,
            log_line=log_line,
            on_end=on_end,
            once=once,
        )
        out: Iterator[Any] | None = None
        for stage in self.stages:
            out = stage.open(out, ctx)
        assert out is not None  # internal invariant: at least a mode
        return ctx.progress, out


def read_options(
    *,
    decode: Any,
    fields: Any,
    on_error: str,
    log_every_s: float | None,
    resampled: bool,
    replication: int,
    collate: Any,
    batch_size: int | None,
    unit: ItemUnit | None,
    make_decoder: Callable[..., Callable[[dict[str, Any]], Any] | None],
) -> ReadOptions:
    """:class:`ReadOptions` of :class:`shardstream.ShardDataset`'s arguments (their meaning is
    there), each checked; ``make_decoder(decode, fields=fields)`` makes the per-item stage.

    Raises:
        ValueError: a bad argument, named with its value.
    """
    on_error = on_error_of(on_error, where="ShardDataset", old=())
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"{batch_size=} must be an int >= 1 (the DataLoader's) or None")
    if collate is not None and batch_size is None:
        raise ValueError(
            "collate= makes the dataset hand out batches of batch_size samples: pass batch_size=... too (and "
            "read it with DataLoader(dataset, batch_size=None))"
        )
    if log_every_s is not None and not log_every_s > 0:
        raise ValueError(f"{log_every_s=} must be > 0 (seconds) or None")
    if not isinstance(replication, int) or isinstance(replication, bool) or replication < 1:
        raise ValueError(f"{replication=} must be an int >= 1 (ranks per model-parallel group)")
    if unit is not None and not isinstance(unit, ItemUnit):
        raise ValueError(f"unit={unit!r} is not an ItemUnit (a name, items_of(shards) and stages())")
    return ReadOptions(
        decode=make_decoder(decode, fields=fields),
        on_error=on_error,
        log_every_s=log_every_s,
        resampled=resampled,
        replication=replication,
        batcher=None if collate is None else as_batcher(collate),
        batch_size=batch_size,
        unit=unit or SAMPLES,
    )


def open_reader(
    source: Any,
    *,
    order: OrderSettings,
    store: StoreSettings,
    options: ReadOptions,
    verify_checksums: bool = False,
    epoch_samples: int | None = None,
    mix: str = "stratified",
    shard_affinity: Any = None,
) -> tuple[Reader, Sequence[str], DatasetIndex | None]:
    """The reader of a dataset or a mixture (:class:`shardstream.ShardDataset`'s arguments as
    values; docs/reading.md): ``source`` is a list of ``Source`` s, or one location, which is
    read as a mixture of one source. Returns the reader, its shard URLs (a mixture's laid end
    to end: O(sources), never listed) and the index of one dataset (None for a mixture or
    shard URLs). Shard URLs with their sample tables beside them read in exact epochs
    (:func:`~.shards.url_shards`: their tables' headers are read here, O(shards)).

    Raises:
        ValueError: a bad argument (named with its value), a combination the schedule refuses
            (:func:`~.mixschedule.schedule_for`), or a bad mixture (naming the source).
        TypeError: a list mixing ``Source`` s and shard URLs.
        ShardNotFoundError, IndexFormatError: as :func:`~shardstream.index.resolve_source`.
    """
    affinity = NodeAffinity.of(shard_affinity, replication=options.replication)
    given = sources_of(source)
    refused(given, epoch_samples=epoch_samples, resampled=options.resampled, shard_affinity=affinity)
    sources = given if given is not None else [Source(source)]
    s3, requests = store.s3, store.requests
    with concurrent.futures.ThreadPoolExecutor(min(16, len(sources))) as pool:  # their indexes' GETs at once
        resolved = list(pool.map(lambda src: resolve_source(src.location, s3=s3, requests=requests), sources))
    sets = [
        options.unit.items_of(IndexedShards(index) if index is not None else url_shards(urls, s3=s3, requests=requests))
        for urls, index in resolved
    ]
    schedule = schedule_for(
        sources if given is not None else None,
        sets,
        order,
        epoch_samples=epoch_samples,
        mix=mix,
        shard_affinity=affinity,
        resampled=options.resampled,
        unit=options.unit.name,
    )
    engines = [
        ReadingEngine(shards, store=store, on_error=options.on_error, verify_checksums=verify_checksums)
        for shards in sets
    ]
    if len(resolved) == 1 and schedule.sources is None:
        urls, index = resolved[0]
        return Reader(schedule, engines, options), urls, index
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
