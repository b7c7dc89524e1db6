"""``ShardDataset``: shards from local disk or S3 as a stream of samples for a DataLoader.

The torch glue around a :class:`~shardstream.reading.reader.Reader`, which does the reading
(mode, delivery, batching) without torch: this class checks its arguments, knows who is reading
(rank, DataLoader worker: :func:`~shardstream.reading.assign.current_slot`), carries the epoch
of each pass to DataLoader workers (:mod:`shardstream.reading.epochs`), survives pickling into
spawned workers, and warns. Every argument is described in docs/reading.md.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import IterableDataset

from .config import FetchConfig, S3Config
from .decode.cpu import ImageFormat, make_decoder
from .reading.assign import WorkerSlot, current_slot, distributed_rank, in_worker, loader_id
from .reading.engine import share_buffer
from .reading.epochs import EpochBoard, PassState, PassView, warn_advanced
from .reading.mixture import Source
from .reading.reader import ReaderPass, ReadOptions, loader_batch_size, open_reader
from .reading.schedule import STATE_FORMAT
from .reading.stats import StatsBoard, StatsSnapshot

__all__ = ["STATE_FORMAT", "ShardDataset", "loader_state_dict"]

log = logging.getLogger("shardstream")

Location = str | os.PathLike[str] | Sequence[str]


def _setting(owner: str, name: str, doc: str) -> property:
    """A read-only attribute of the dataset that lives on its reader's schedule, engine or options."""
    return property(lambda self: getattr(getattr(self, owner), name), doc=doc)


class ShardDataset(IterableDataset):
    """Samples of tar shards, streamed from local disk or S3, shuffled and split over the job.

    With an index, epochs are exact: every sample once per epoch, and every rank yields
    ``len(dataset)`` samples (``ceil(N / world_size)``, or ``floor`` with ``drop_last``);
    :meth:`state_dict` / :meth:`load_state_dict` resume mid-epoch, also at another world size.
    A list of :class:`~shardstream.Source` s is a mixture. docs/reading.md ("Every argument of
    ShardDataset") describes each argument; docs/mixtures.md the mixtures.

    Args:
        source: a dataset written by ``shardstream pack`` (a directory, an ``s3://``
            prefix, its index file), a shard URL, a brace pattern, a list of shard URLs, or a
            list of ``Source(...)`` (a mixture).
        shuffle, shuffle_buffer (samples), seed, max_open_shards, drop_last, batch_size: the
            epoch's order (``batch_size``: the DataLoader's).
        decode: None (bytes), ``"pil"``, ``"numpy"``, ``"torch"`` or a callable on a sample.
        s3, fetch: S3 endpoint and credentials; read-ahead (bytes per rank).
        cache_dir, cache_limit_bytes: a node-local cache of remote shards and its bound.
        log_every_s: seconds between log lines of :meth:`stats` (None: none).
        resampled: shards drawn with replacement, endlessly (no ``len``, no resume).
        on_error: ``"raise"`` or ``"skip"`` (replaced by repeats; counted in stats).
        verify_checksums: check whole shards against the index's CRC-32.
        epoch_samples, mix: a mixture's epoch size and interleaving.
        replication: ranks per model-parallel group (they read the same samples).
        collate: hand out ``collate(samples)`` of each ``batch_size`` samples (a
            :class:`~shardstream.reading.batching.Batcher` or a ``collate_fn``); read with
            ``DataLoader(batch_size=None)``.

    Yields:
        dicts ``{"__key__": str, "__shard__": shard URL, "<ext>": bytes, ...}`` (decoded as
        ``decode`` says; a mixture's also ``"__source__"``), or with ``collate`` its batches.

    Raises:
        ValueError: a bad argument or mixture (named); while iterating, a world size that is
            not a multiple of ``replication``.
        ShardNotFoundError: no index at a dataset location, or (iterating) a missing shard.
        IndexFormatError: a malformed index.
        CorruptShardError: a malformed or truncated shard (while iterating).
        StorageAccessError, StorageConnectionError, BucketNotFoundError: store problems.
    """

    def __init__(
        self,
        source: Location | Source | Sequence[Source],
        *,
        shuffle: bool = True,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        decode: ImageFormat | Callable[[dict[str, Any]], Any] | None = None,
        s3: S3Config | None = None,
        fetch: FetchConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        log_every_s: float | None = None,
        drop_last: bool = False,
        max_open_shards: int = 4,
        batch_size: int | None = None,
        resampled: bool = False,
        on_error: str = "raise",
        verify_checksums: bool = False,
        epoch_samples: int | None = None,
        mix: str = "stratified",
        replication: int = 1,
        collate: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        super().__init__()
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__", "fetch")}  # all but fetch
        self.reader, self.shard_urls, self.index = open_reader(**{**arguments, "decode": make_decoder(decode)})
        self.fetch = fetch or FetchConfig()
        self.collate = collate
        self._schedule, self._engine = self.reader.schedule, self.reader.engines[0]  # its settings are every engine's
        self._epochs = EpochBoard()  # the epoch of each pass, shared with DataLoader workers
        self._set = self._epochs.set(0, [])  # (generation, state) of the latest set_epoch / load here
        self._reader_pid = -1  # the process whose passes self._pass describes
        self._pass: PassState | None = None  # this reader's pass in progress
        self._loaded: PassState | None = None  # a state loaded in this worker for its next pass
        self._progress = ReaderPass()  # where this iterator's pass stands
        self._board = StatsBoard(sources=self._schedule.names)

    # The arguments that the schedule, the engine and the reader hold, read-only here: one copy of each.
    seed = _setting("_schedule", "seed", "Seed of shard order and sample shuffle.")
    shuffle = _setting("_schedule", "shuffle", "Whether shard order and samples are shuffled.")
    shuffle_buffer = _setting("_schedule", "shuffle_buffer", "Samples held by each reader's shuffle buffer.")
    max_open_shards = _setting("_schedule", "max_open_shards", "Shards each reader reads at once (lanes).")
    drop_last = _setting("_schedule", "drop_last", "Whether the fewest samples are dropped to even out ranks.")
    batch_size = _setting("_schedule", "batch_size", "The DataLoader's batch size workers' pieces are cut by.")
    num_samples = _setting("_schedule", "num_samples", "Samples of an epoch (all sources); None: bare shard URLs.")
    samples_per_source = _setting("_schedule", "per_source", "A mixture's samples per source and epoch, by name.")
    s3 = _setting("_engine", "s3", "S3 endpoint and credentials (None: the standard AWS environment).")
    cache_dir = _setting("_engine", "cache_dir", "The node cache's directory, or None.")
    cache_limit_bytes = _setting("_engine", "cache_limit_bytes", "The node cache's size bound in bytes.")
    on_error = _setting("_engine", "on_error", "'raise' or 'skip' (corrupt shards, undecodable samples).")
    verify_checksums = _setting("_engine", "verify_checksums", "Whether whole shards are checked by CRC-32.")
    decode = _setting("_options", "decode", "The sample decoder, or None.")
    log_every_s = _setting("_options", "log_every_s", "Seconds between reader 0's log lines, or None.")
    resampled = _setting("_options", "resampled", "Whether shards are drawn with replacement, endlessly.")
    replication = _setting("_options", "replication", "Ranks per model-parallel group.")

    @property
    def _options(self) -> ReadOptions:
        return self.reader.options

    def __repr__(self) -> str:
        names = self._schedule.names
        mixed = f"{len(names)} sources, " if names else ""
        return (
            f"ShardDataset({mixed}{self.num_shards} shards, num_samples={self.num_samples}, "
            f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch})"
        )

    @property
    def num_shards(self) -> int:
        return len(self.shard_urls)

    def worker_slot(self) -> WorkerSlot:
        """Who is reading, as the data sees it: this process's rank and DataLoader worker; with
        ``replication``, the rank's data-parallel group (:meth:`Reader.group`).

        Raises:
            ValueError: world_size is not a multiple of ``replication``.
        """
        return self.reader.group(current_slot(self.__dict__.get("_parent_rank")))

    _slot = worker_slot  # the name DaliLoader and older callers used

    def stats(self) -> StatsSnapshot:
        """Reading metrics summed over this process and its DataLoader workers, since each
        reader's latest iterator started (:class:`~shardstream.reading.stats.StatsSnapshot`)."""
        return self._board.snapshot()

    @property
    def epoch(self) -> int:
        """The epoch of the pass in progress (the latest one started by this process or its
        DataLoader workers), or, before any since the latest :meth:`set_epoch` /
        :meth:`load_state_dict`, the epoch the next pass reads."""
        if self._pass is not None and in_worker():
            return self._pass.epoch
        return self._view().latest.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch``'s order in the next pass, here and in every DataLoader worker,
        persistent ones included (through shared memory). Without it, each new pass reads the
        next epoch. Setting the epoch a loaded checkpoint is in keeps the checkpoint's place.

        Raises:
            ValueError: ``epoch`` is not an int >= 0.
        """
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"{epoch=} must be an int >= 0")
        view = self._view()
        pending = view.latest if not view.started else None
        segments = pending.segments if pending is not None and pending.epoch == epoch and pending.segments else []
        self._set = self._epochs.set(epoch, segments)
        if self.reader.exact:
            self._schedule.prepare(epoch)  # now, so DataLoader workers forked next inherit it

    def _view(self, num_workers: int | None = None) -> PassView:
        return self._epochs.view(rank=self.worker_slot().rank, num_workers=num_workers)

    def __len__(self) -> int:
        """Samples this rank yields in the pass in progress or the next (the same on every
        rank); with ``collate``, its batches. After ``load_state_dict`` of a
        ``state_dict(samples_consumed)`` checkpoint: those still to come in its epoch.

        Raises:
            TypeError: no index (bare shard URLs) or ``resampled``: the count is unknown.
        """
        if not self.reader.exact:
            raise TypeError("len() needs a dataset with an index (written by shardstream pack) and resampled=False")
        slot = self.worker_slot()
        count = self._schedule.rank_count(self._epochs.view(rank=slot.rank).upcoming, slot)
        return count if self.collate is None else -(-count // self.batch_size)

    def state_dict(
        self, samples_consumed: int | None = None, *, batch_size: int | None = None, num_workers: int | None = None
    ) -> dict[str, Any]:
        """Where this epoch stands, as a few numbers (docs/reading.md, "Shuffle and resume"):
        ``state_dict(samples_consumed, batch_size=, num_workers=)`` in the training process
        (samples this rank took from the DataLoader iterator; resumes at any world size), or
        ``state_dict()`` inside each worker, as ``StatefulDataLoader`` calls it.

        Raises:
            TypeError: no index, or ``resampled``.
            ValueError: a bad ``samples_consumed``, or a mix of the two kinds within an epoch.
        """
        if not self.reader.exact:
            raise TypeError(
                "state_dict() needs a dataset with an index (written by shardstream pack) and resampled=False"
            )
        slot = self.worker_slot()
        if samples_consumed is None:  # a reader's own count (StatefulDataLoader)
            state = self._pass or self._loaded or self._view().upcoming
            progress = self._progress if self._pass is not None else ReaderPass()
            return self._schedule.reader_state(state, slot, position=progress.position, yielded=progress.delivered)
        if not isinstance(samples_consumed, int) or samples_consumed < 0:
            raise ValueError(f"{samples_consumed=} must be an int >= 0")
        latest = self._view(num_workers or 0).latest
        return self._schedule.consumed_state(
            latest, slot, samples_consumed=samples_consumed, batch_size=batch_size, num_workers=num_workers
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next pass yields exactly the samples of that
        epoch not yet consumed (split over this job's ranks and workers). In the training
        process it reaches every DataLoader worker; in a worker, that worker.

        Raises:
            ValueError: not a shardstream state, or saved for another dataset or settings.
        """
        loaded = self._schedule.loaded_state(state)
        if in_worker():
            self._loaded = loaded
        else:
            self._set = self._epochs.set(loaded.epoch, loaded.segments or [])

    def shards_for(self, slot: WorkerSlot) -> list[str]:
        """The shard URLs ``slot`` reads in :attr:`epoch`, in reading order (not a mixture).

        Raises:
            TypeError: a mixture (its readers read parts of every source).
        """
        return [self.shard_urls[i] for i in self._schedule.shard_ids(slot, self.epoch)]

    def __getstate__(self) -> dict[str, Any]:
        # Runs in the main process when a DataLoader hands the dataset to spawned workers,
        # which do not inherit torch.distributed: record the rank it knows here.
        state = self.__dict__.copy()
        state["_parent_rank"] = distributed_rank()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if not os.path.exists(self._epochs.path):  # unpickled after its creator exited: new shared files
            self._board = StatsBoard()
            self._epochs = EpochBoard()
            self._set = self._epochs.set(self._set[1].epoch, self._set[1].segments or [])

    def __iter__(self) -> Iterator[Any]:
        """One pass: its epoch is fixed here, when the iterator is created (as a DataLoader
        worker does at the start of each DataLoader iterator), so ``state_dict()`` describes
        it before the first sample. Errors of that set-up are raised by the first ``next``."""
        try:
            slot, in_loader = self.worker_slot(), in_worker()
            worker_id = slot.worker_id if in_loader else None
            first_here = in_loader and self._reader_pid != os.getpid()  # a worker process's first pass
            if first_here:
                # A forked worker inherits the training process's heap and the collector's
                # counts; its first full collection would walk all of it (~0.15 s) while the
                # first sample waits: move inherited objects out of its way (CPython's advice).
                gc.freeze()
            state, first_advance = self._epochs.start_pass(
                rank=slot.rank,
                worker_id=worker_id,
                num_workers=slot.num_workers,
                loaded=self._loaded,
                copied=self._set if first_here else None,
                loader=loader_id() if in_loader else 0,
            )
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
            return _raise(exc)
        self._loaded = None
        self._pass, self._reader_pid = state, os.getpid()
        if first_advance:
            warn_advanced(state.epoch)
        self._progress = ReaderPass()
        try:
            self._progress, out = self.reader.open(
                state,
                slot,
                fetch=share_buffer(self.fetch, slot.num_workers if in_loader else 1),  # the rank's budget, shared
                stats=self._board.reader(slot.worker_id + 1 if in_loader else 0),
                log_line=(lambda: log.info("%s", self.stats().log_line())) if slot.worker_id == 0 else None,
                on_end=lambda: self._epochs.finish_pass(rank=slot.rank, worker_id=worker_id),
                once=self._epochs.once,
            )
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
            return _raise(exc)
        return out


def loader_state_dict(loader: Any, samples_consumed: int) -> dict[str, Any]:
    """The data state of a plain ``torch.utils.data.DataLoader`` over a :class:`ShardDataset`,
    for a checkpoint: ``loader.dataset.state_dict(samples_consumed, batch_size=loader.batch_size,
    num_workers=loader.num_workers)``. Resume with ``dataset.load_state_dict(state)``.

    Args:
        loader: the DataLoader (in order, as by default; ``drop_last=False``).
        samples_consumed: samples this rank took from the loader's current iterator (all ranks
            the same; e.g. ``steps * batch_size``).

    Raises:
        TypeError: the loader's dataset is not a ShardDataset.
        ValueError: the loader drops last batches, delivers out of order, or batches other than
            the dataset's ``batch_size``.
    """
    dataset = loader.dataset
    if not isinstance(dataset, ShardDataset):
        raise TypeError(f"loader.dataset is a {type(dataset).__name__}, not a ShardDataset")
    batch_size = loader_batch_size(loader, batch_size=dataset.batch_size, batches=dataset.collate is not None)
    return dataset.state_dict(samples_consumed, batch_size=batch_size, num_workers=loader.num_workers)


def _raise(exc: BaseException) -> Iterator[Any]:
    """An iterator that raises ``exc`` at its first ``next``."""
    raise exc
    yield
