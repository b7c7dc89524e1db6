"""``ShardDataset``: shards from local disk or S3 as a stream of samples for a DataLoader.

The torch-facing class, thin on purpose: it checks its arguments, knows who is reading
(rank, DataLoader worker: :func:`~shardstream.reading.assign.current_slot`), carries the
epoch of each pass to DataLoader workers (:mod:`shardstream.reading.epochs`), survives
pickling into spawned workers, and warns. What to read each epoch, ``len`` and checkpoints
are the epoch schedule's (:mod:`shardstream.reading.schedule`); reading is the engine's
(:mod:`shardstream.reading.engine`), which sees the shards through a
:class:`~shardstream.reading.shards.ShardSet`.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import IterableDataset

from .config import FetchConfig, S3Config
from .decode.cpu import ImageFormat, make_decoder
from .index import resolve_source
from .reading.assign import WorkerSlot, current_slot, distributed_rank
from .reading.engine import ReadingEngine, read_mixed, repeat_over_skips, share_buffer, shuffled
from .reading.epochs import EpochBoard, PassState, PassView
from .reading.mixture import Source
from .reading.schedule import STATE_FORMAT, EpochSchedule, MixtureSchedule
from .reading.shards import BareShards, IndexedShards
from .reading.slicer import FileRun
from .reading.stats import ReaderStats, StatsBoard, StatsSnapshot
from .tarstream import Batch

__all__ = ["STATE_FORMAT", "ShardDataset", "loader_state_dict"]

log = logging.getLogger("shardstream")
_UNBATCHED = 2  # EpochBoard.once flag: warned that workers' pieces are not cut into whole batches

Location = str | os.PathLike[str] | Sequence[str]


def _setting(owner: str, name: str, doc: str) -> property:
    """A read-only attribute of the dataset that lives on its schedule or engine."""
    return property(lambda self: getattr(getattr(self, owner), name), doc=doc)


class ShardDataset(IterableDataset):
    """Samples of tar shards, streamed from local disk or S3, shuffled and split over the job.

    With an index (a dataset written by ``shardstream pack``) epochs are exact
    (:mod:`shardstream.reading.plan`): each epoch the shards are permuted by ``(seed, epoch)`` the
    same way on every rank, and the epoch's samples are cut into equal contiguous parts, one
    per rank (rank from ``torch.distributed`` when initialised, else ``RANK`` /
    ``WORLD_SIZE``), then per DataLoader worker. Every sample is read once per epoch and
    every rank yields exactly ``len(dataset)`` samples: ``ceil(N / world_size)`` (the fewest
    samples repeated) or, with ``drop_last``, ``floor(N / world_size)``. Ranks agree by
    computing the same function; nothing in iteration talks to other ranks. Each worker reads
    ``max_open_shards`` of its shards at once (S3 shards as parallel ranged GETs running
    ahead, local shards memory-mapped) and mixes them through a shuffle buffer of
    ``shuffle_buffer`` samples. :meth:`state_dict` / :meth:`load_state_dict` resume mid-epoch,
    also at another world size.

    Which epoch each pass reads (:mod:`shardstream.reading.epochs`): a pass is one iteration, by this
    process or by each DataLoader worker once per DataLoader iterator. :meth:`set_epoch` (or
    :meth:`load_state_dict`) in the training process sets the next pass's epoch in every
    worker, persistent ones included; a pass that starts without one since the previous pass
    reads the next epoch (logged once), so loops that never call :meth:`set_epoch` (PyTorch
    Lightning's) still get a new order each epoch. An explicit :meth:`set_epoch` always wins.

    With bare shard URLs (no index, so no sample counts), shard ``i`` of the epoch's order
    goes to reader ``i % (world_size * num_workers)``: every sample once per epoch, counts per
    rank equal only when the shards divide evenly; no ``len`` and no resume.

    With a list of :class:`~shardstream.Source` s, a mixture of datasets
    (:mod:`shardstream.reading.mixture`, docs page "Mixtures"): each epoch reads each source's
    count (``samples=``, ``repeat=``, ``weight=`` of ``epoch_samples``, by the largest
    remainder), sub-sampled sources cover all their samples over successive epochs before any
    repeats, every rank reads each source's proportion within one sample, each batch (with
    ``batch_size``) the floor or ceil of each source's share, and every sample carries
    ``"__source__"``: its source's name.

    Args:
        source: a dataset written by ``shardstream pack`` (a local directory, an
            ``s3://bucket/prefix``, or its index file), a shard URL, a brace pattern of
            shard URLs (``"s3://b/data-{000000..000009}.tar"``), or a list of shard URLs;
            or a list of ``Source(location, weight= | repeat= | samples=)``: a mixture (every
            source needs an index).
        shuffle: shuffle shard order and samples; ``False`` yields shards in index order and
            samples in shard order (split over readers as above).
        shuffle_buffer: samples held by each reader's shuffle buffer.
        seed: seed of shard order and sample shuffle; combine with :meth:`set_epoch`.
        decode: ``None`` (members as ``bytes``), ``"pil"``, ``"numpy"``, ``"torch"`` (see
            :mod:`shardstream.decode.cpu`), or a callable taking and returning a sample.
        s3: S3 endpoint and credentials; default the standard AWS environment.
        fetch: read-ahead of S3 shards: ranged GET size, requests in flight, memory bound
            ``max_buffer_bytes`` per rank, shared equally by its DataLoader workers
            (:class:`~shardstream.config.FetchConfig`).
        cache_dir: a node-local directory caching ``s3://`` shards, shared safely by every
            rank and worker of the node (one download per shard per node); the next epoch
            reads hits from local disk. None: no cache.
        cache_limit_bytes: the cache's size bound (required with ``cache_dir``); least
            recently used shards are evicted, never one being read, never a file the cache
            did not create.
        log_every_s: when set, reader 0 of this process logs :meth:`stats` (logger
            ``"shardstream"``, INFO) every ``log_every_s`` seconds while iterating.
        drop_last: when the samples do not divide by world_size, drop the fewest
            (``N mod world_size``) instead of repeating the fewest (the default, pad).
        max_open_shards: shards each reader reads at once and mixes (lanes).
        batch_size: the ``batch_size`` of the DataLoader that reads the dataset. Each
            DataLoader worker then gets whole batches (only the rank's last batch short), so
            the DataLoader yields exactly ``len(loader) = ceil(len(dataset) / batch_size)``
            batches: the count Lightning and Hugging Face's Trainer stop at. Without it, each
            of ``num_workers > 1`` workers ends with its own short batch, up to
            ``num_workers - 1`` batches more than ``len(loader)``, which such loops never
            read (logged once). None: the DataLoader does not batch, or has one worker.
        collate: make each reader (each DataLoader worker) hand out whole batches:
            ``collate(samples)`` of every ``batch_size`` consecutive samples it reads (its
            last batch short), as a DataLoader's ``collate_fn`` would; read such a dataset
            with ``DataLoader(dataset, batch_size=None)``, and ``len(dataset)`` counts
            batches. With :class:`shardstream.collate.ByteCollate` and reads in shard order
            from local shards, a batch is read straight from the shard files into its
            shared-memory block (one ``preadv`` a batch, no sample objects: 1.1-1.3x the
            rate of ``ByteCollate`` as a ``collate_fn`` with 2 workers on 2 cores). Shard
            order means ``shuffle=False``, or ``shuffle_buffer=0`` with
            ``max_open_shards=1`` (shards shuffled, each read through). Needs
            ``batch_size``. None: samples.
        verify_checksums: check each shard read whole against the CRC-32 in the index (one
            more pass over the bytes: about half the local read speed); a mismatch is a
            CorruptShardError (or skipped, see ``on_error``). Runs that are byte ranges of a
            shard (exact epochs split shards at part boundaries) are checked by their tar
            headers, sizes and keys only.
        on_error: ``"raise"`` (default): a corrupt shard or undecodable sample raises
            (CorruptShardError / DecodeError naming shard, key and byte offset). ``"skip"``:
            the undecodable sample, or the rest of a shard's run from the corrupt point on,
            is skipped, counted in ``stats().skipped`` and logged once per shard; each skipped
            sample is replaced by a repeat of the reader's previous good sample, so every rank
            still yields ``len(dataset)`` samples (S3 and connection errors always raise).
        resampled: an endless stream instead of epochs: each reader draws shards at random
            with replacement (weighted by sample count, seeded by ``(seed, epoch, reader)``)
            and passes their samples through the shuffle buffer. No ``len``, no resume.
        epoch_samples: a mixture's epoch size, shared out by the ``weight=`` sources (after
            ``samples=`` and ``repeat=`` ones); needed when a source has a weight.
        mix: a mixture's interleaving within the epoch: ``"stratified"`` (each batch holds
            each source's share) or ``"random"`` (a seeded random interleaving of the same
            per-worker counts).
        replication: ranks per model-parallel group: each group of ``replication``
            consecutive ranks reads the same samples in the same order, and epochs are exact
            over the ``world_size // replication`` groups.

    Yields:
        dicts ``{"__key__": str, "__shard__": shard URL, "<ext>": bytes, ...}``, one entry
        per member extension (decoded as ``decode`` says); of a mixture, also
        ``"__source__"``: the source's name. With ``collate``, what it makes of each batch
        of them.

    Raises:
        ValueError: a bad argument, or a bad mixture (each message names the source), or
            (while iterating) a world size that is not a multiple of ``replication``.
        ShardNotFoundError: no index at a dataset location, or (while iterating) a shard URL
            that does not exist.
        IndexFormatError: the index is malformed.
        CorruptShardError: a shard's tar stream is malformed or truncated (while iterating).
        StorageAccessError, StorageConnectionError, BucketNotFoundError: S3 problems.
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
        if on_error not in ("raise", "skip"):
            raise ValueError(f"{on_error=} must be 'raise' or 'skip'")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"{batch_size=} must be an int >= 1 (the DataLoader's) or None")
        if collate is not None and (batch_size is None or not callable(collate)):
            raise ValueError(
                "collate= makes the dataset hand out batches of batch_size samples: pass batch_size=... too (and "
                "read it with DataLoader(dataset, batch_size=None))"
                if batch_size is None
                else f"collate={collate!r} must be callable (a DataLoader collate_fn)"
            )
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
        self.fetch = fetch or FetchConfig()
        self.decode = make_decoder(decode)
        self.log_every_s = log_every_s
        self.resampled = resampled
        self.replication = replication
        self.collate = collate
        sources = _sources_of(source)
        if sources is not None and len(sources) == 1 and sources[0].rule() == {"repeat": 1.0} and epoch_samples is None:
            source, sources = sources[0].location, None  # one whole source: a plain dataset
        self.sources = sources
        settings = {
            "seed": seed,
            "shuffle": shuffle,
            "shuffle_buffer": shuffle_buffer,
            "max_open_shards": max_open_shards,
            "drop_last": drop_last,
            "batch_size": batch_size,
        }
        engine = {
            "s3": s3,
            "cache_dir": os.fspath(cache_dir) if cache_dir is not None else None,
            "cache_limit_bytes": cache_limit_bytes,
            "on_error": on_error,
            "verify_checksums": verify_checksums,
        }
        if sources is None:
            if epoch_samples is not None:
                raise ValueError(
                    f"{epoch_samples=} sets the size of a mixture's epoch; pass a list of Source(...) to mix datasets"
                )
            self.shard_urls, self.index = resolve_source(source, s3=s3)  # type: ignore[arg-type]
            shards = IndexedShards(self.index) if self.index is not None else BareShards(self.shard_urls)
            # which samples each reader reads, len, checkpoints
            self._schedule = EpochSchedule(shards, **settings)  # type: ignore[arg-type]
            self._engines = [ReadingEngine(shards, **engine)]  # type: ignore[arg-type]
        else:
            if resampled:
                raise ValueError("resampled=True reads one dataset endlessly; a mixture's epochs are exact, drop it")
            with concurrent.futures.ThreadPoolExecutor(min(16, len(sources))) as pool:  # their indexes' GETs at once
                resolved = list(pool.map(lambda src: resolve_source(src.location, s3=s3), sources))
            self.index = None
            self.shard_urls = _Chained([urls for urls, _ in resolved])  # O(sources): never listed
            shard_sets = [IndexedShards(index) if index is not None else BareShards(urls) for urls, index in resolved]
            self._schedule = MixtureSchedule(
                sources,
                shard_sets,
                epoch_samples=epoch_samples,
                mix=mix,
                **settings,  # type: ignore[arg-type]
            )
            self._engines = [ReadingEngine(shards, **engine) for shards in shard_sets]  # type: ignore[arg-type]
        self._engine = self._engines[0]  # its settings are every engine's
        self._epochs = EpochBoard()  # the epoch of each pass, shared with DataLoader workers
        self._set = self._epochs.set(0, [])  # (generation, state) of the latest set_epoch / load here
        self._reader_pid = -1  # the process whose passes self._pass describes
        self._pass: PassState | None = None  # this reader's pass in progress
        self._loaded: PassState | None = None  # a state loaded in this worker for its next pass
        self._iter_seg: tuple[int, int] | None = None  # (segment index, samples skipped) of this iterator
        self._yielded = 0
        self._board = StatsBoard(sources=tuple(self._schedule.names) if sources is not None else ())

    # The arguments that the schedule and the engine hold, read-only here: one copy of each.
    seed = _setting("_schedule", "seed", "Seed of shard order and sample shuffle.")
    shuffle = _setting("_schedule", "shuffle", "Whether shard order and samples are shuffled.")
    shuffle_buffer = _setting("_schedule", "shuffle_buffer", "Samples held by each reader's shuffle buffer.")
    max_open_shards = _setting("_schedule", "max_open_shards", "Shards each reader reads at once (lanes).")
    drop_last = _setting("_schedule", "drop_last", "Whether the fewest samples are dropped to even out ranks.")
    batch_size = _setting("_schedule", "batch_size", "The DataLoader's batch size workers' pieces are cut by.")
    s3 = _setting("_engine", "s3", "S3 endpoint and credentials (None: the standard AWS environment).")
    cache_dir = _setting("_engine", "cache_dir", "The node cache's directory, or None.")
    cache_limit_bytes = _setting("_engine", "cache_limit_bytes", "The node cache's size bound in bytes.")
    on_error = _setting("_engine", "on_error", "'raise' or 'skip' (corrupt shards, undecodable samples).")
    verify_checksums = _setting("_engine", "verify_checksums", "Whether whole shards are checked by CRC-32.")

    def __repr__(self) -> str:
        mixed = f"{len(self.sources)} sources, " if self.sources is not None else ""
        return (
            f"ShardDataset({mixed}{self.num_shards} shards, num_samples={self.num_samples}, "
            f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch})"
        )

    @property
    def num_shards(self) -> int:
        return len(self.shard_urls)

    @property
    def num_samples(self) -> int | None:
        """Samples in the whole dataset, from the index; of a mixture, in one epoch (all
        sources, by their rules); None for bare shard URLs."""
        if self.sources is not None:
            return self._schedule.num_samples
        return self.index.num_samples if self.index is not None else None

    @property
    def samples_per_source(self) -> dict[str, int]:
        """Of a mixture: samples each source gives one epoch, by name (empty otherwise)."""
        if self.sources is None:
            return {}
        return dict(zip(self._schedule.names, self._schedule.per_epoch))  # type: ignore[attr-defined]

    @property
    def _exact(self) -> bool:
        """Epochs planned from sample counts (an index, or a mixture), not resampled."""
        return (self.index is not None or self.sources is not None) and not self.resampled

    def _slot(self) -> WorkerSlot:
        """Who is reading: this process's rank and DataLoader worker; with ``replication``,
        the rank's data-parallel group (``rank // replication`` of ``world_size //
        replication``), so the ranks of a group read the same samples in the same order.

        Raises:
            ValueError: world_size is not a multiple of ``replication``.
        """
        slot = current_slot(self.__dict__.get("_parent_rank"))
        k = self.replication
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

    def stats(self) -> StatsSnapshot:
        """Reading metrics summed over this process and its DataLoader workers, since each
        reader's latest iterator started: samples/s, bytes/s, stall time, time to first
        sample, cache hit rate, retries, bytes in flight (:class:`~shardstream.reading.stats.StatsSnapshot`)."""
        return self._board.snapshot()

    @property
    def epoch(self) -> int:
        """The epoch of the pass in progress (the latest one started by this process or its
        DataLoader workers), or, before any since the latest :meth:`set_epoch` /
        :meth:`load_state_dict`, the epoch the next pass reads."""
        if self._pass is not None and _in_worker():
            return self._pass.epoch
        return self._view().latest.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch``'s shard order and shuffle in the next pass, in this process and in
        every DataLoader worker, persistent ones included (the value goes through shared
        memory; each worker reads it when its next iterator starts).

        Call it in the training process before creating each epoch's DataLoader iterator.
        Without it, each new pass reads the next epoch (:mod:`shardstream.reading.epochs`). Setting
        the epoch a loaded checkpoint is in, before iterating, keeps the checkpoint's place;
        any other call starts ``epoch`` from its start.

        Raises:
            ValueError: ``epoch`` is not an int >= 0.
        """
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"{epoch=} must be an int >= 0")
        view = self._view()
        pending = view.latest if not view.started else None
        keep = pending is not None and pending.epoch == epoch and pending.segments
        self._set = self._epochs.set(epoch, pending.segments if keep else [])  # type: ignore[union-attr,arg-type]
        if self._exact:
            self._schedule.shard_order(epoch)  # now, so DataLoader workers forked next inherit it

    def _view(self, num_workers: int | None = None) -> PassView:
        slot = self._slot()
        return self._epochs.view(rank=slot.rank, num_workers=num_workers)

    def __len__(self) -> int:
        """Samples this rank yields in the pass in progress or, when none is, in the next
        pass: the same on every rank; with ``collate``, its batches (the samples divided by
        ``batch_size``, rounded up). After :meth:`load_state_dict` of a
        ``state_dict(samples_consumed)`` checkpoint: those still to come in its epoch; after a
        ``StatefulDataLoader`` checkpoint, the epoch's whole count, as that loader (and
        Lightning, which counts batches from the epoch's start) expects.

        Raises:
            TypeError: no index (bare shard URLs) or ``resampled``: the count is unknown.
        """
        if not self._exact:
            raise TypeError("len() needs a dataset with an index (written by shardstream pack) and resampled=False")
        slot = self._slot()
        count = self._schedule.rank_count(self._epochs.view(rank=slot.rank).upcoming, slot)
        return count if self.collate is None else -(-count // self.batch_size)

    def state_dict(
        self, samples_consumed: int | None = None, *, batch_size: int | None = None, num_workers: int | None = None
    ) -> dict[str, Any]:
        """Where this epoch stands, as a few numbers: seed, epoch, the job's shape and how many
        samples were consumed (never the samples, never a shuffle buffer). Costs nothing per
        step; call it only when saving a checkpoint.

        Two ways to call it:

        - ``state_dict(samples_consumed, batch_size=, num_workers=)`` in the training
          process (or :func:`loader_state_dict`, which reads the DataLoader's settings):
          ``samples_consumed`` is how many samples this rank took from the DataLoader
          iterator of the pass in progress (all ranks take the same number). Resumes at the
          same or another world size.
        - ``state_dict()`` with no arguments, as ``torchdata``'s ``StatefulDataLoader`` calls
          it inside each worker: what this reader has yielded in its pass. Resumes with the
          same world_size and num_workers.

        Raises:
            TypeError: no index, or ``resampled``.
            ValueError: a bad ``samples_consumed``, or a mix of the two kinds within an epoch.
        """
        if not self._exact:
            raise TypeError(
                "state_dict() needs a dataset with an index (written by shardstream pack) and resampled=False"
            )
        slot = self._slot()
        if samples_consumed is None:  # a reader's own count (StatefulDataLoader)
            state = self._pass or self._loaded or self._view().upcoming
            position = self._iter_seg if self._pass is not None and self._iter_seg else None
            return self._schedule.reader_state(state, slot, position=position, yielded=self._yielded)
        if not isinstance(samples_consumed, int) or samples_consumed < 0:
            raise ValueError(f"{samples_consumed=} must be an int >= 0")
        return self._schedule.consumed_state(
            self._view(num_workers or 0).latest,
            slot,
            samples_consumed=samples_consumed,
            batch_size=batch_size,
            num_workers=num_workers,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next pass yields exactly the samples of that
        epoch not yet consumed (split over this job's ranks and workers; a job of another
        world size splits them anew); the passes after it read the next epochs. Called in the
        training process it reaches every DataLoader worker, persistent ones included; called
        inside a worker (as ``StatefulDataLoader`` does) it applies to that worker.

        Raises:
            ValueError: the state is not a shardstream state, or was saved for another
                dataset or with other shuffle settings (each named).
        """
        loaded = self._schedule.loaded_state(state)
        if _in_worker():
            self._loaded = loaded
        else:
            self._set = self._epochs.set(loaded.epoch, loaded.segments or [])

    def shards_for(self, slot: WorkerSlot) -> list[str]:
        """The shard URLs ``slot`` reads in :attr:`epoch`, in reading order (bare shard URLs
        and single datasets; not a mixture).

        Raises:
            TypeError: a mixture (its readers read parts of every source).
        """
        if self.sources is not None:
            raise TypeError("shards_for() answers for one dataset; a mixture's readers read parts of every source")
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
            slot = self._slot()
            in_worker = _in_worker()
            worker_id = slot.worker_id if in_worker else None
            first_here = in_worker and self._reader_pid != os.getpid()  # a worker process's first pass
            if first_here:
                # A forked worker inherits the training process's heap (torch: millions of
                # objects) and the collector's counts; its first full collection would walk all
                # of it (~0.15 s) while the first sample waits. Inherited objects are long-lived:
                # move them out of the collector's way, as CPython's docs advise after a fork.
                gc.freeze()
            state, first_advance = self._epochs.start_pass(
                rank=slot.rank,
                worker_id=worker_id,
                num_workers=slot.num_workers,
                loaded=self._loaded,
                copied=self._set if first_here else None,
                loader=_loader_id() if in_worker else 0,
            )
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
            return _raise(exc)
        self._loaded = None
        self._pass, self._reader_pid = state, os.getpid()
        if first_advance:  # logged, not warnings.warn: a worker's warning filters may be the parent's
            log.warning(
                "ShardDataset: a new pass started without set_epoch(), so it reads epoch %d (each pass without "
                "set_epoch() reads the next epoch, not the same order again). Call dataset.set_epoch(epoch) "
                "before each epoch to choose the epoch yourself.",
                state.epoch,
            )
        stats = self._board.reader(slot.worker_id + 1 if in_worker else 0)
        fetch = share_buffer(self.fetch, slot.num_workers if in_worker else 1)  # the rank's budget, shared
        self._yielded = 0
        self._iter_seg = None
        if self._exact:
            plan = self._schedule.plan(state)
            try:
                mine, seg = self._schedule.worker_plan(plan, slot)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
                return _raise(exc)
            self._iter_seg = (seg, mine.skip)
            if self.batch_size is None and slot.num_workers > 1 and self._epochs.once(_UNBATCHED):
                log.warning(
                    "ShardDataset read by %d DataLoader workers without ShardDataset(batch_size=...): if the "
                    "DataLoader batches, each worker ends with a short batch, so it may yield up to "
                    "num_workers - 1 = %d batches more than len(loader), which loops that stop at len(loader) "
                    "(Lightning, Hugging Face's Trainer) never train on. Pass the DataLoader's batch_size to "
                    "ShardDataset.",
                    slot.num_workers,
                    slot.num_workers - 1,
                )
            if self.sources is not None:
                samples = read_mixed(
                    self._engines,
                    self._schedule.real_plans(mine, state.epoch),  # type: ignore[attr-defined]
                    mine,  # type: ignore[arg-type]
                    names=self._schedule.names,  # type: ignore[attr-defined]
                    fetch=fetch,
                    stats=stats,
                )
            else:
                file_runs = hasattr(self.collate, "gather") and self.decode is None and self.on_error == "raise"
                samples = self._engine.read_plan(mine, fetch=fetch, stats=stats, file_runs=file_runs)  # type: ignore[arg-type]
        else:
            if self.resampled:
                samples = self._engine.read_resampled(
                    seed=self.seed, epoch=state.epoch, reader=slot.index, fetch=fetch, stats=stats
                )
            else:
                samples = self._engine.read_shards(
                    self._schedule.shard_ids(slot, state.epoch), fetch=fetch, stats=stats
                )
            if self.shuffle and self.shuffle_buffer > 1:
                samples = shuffled(
                    samples, capacity_samples=self.shuffle_buffer, seed=(self.seed, state.epoch, slot.index)
                )
        delivered = self._deliver(samples, slot, stats, worker_id)
        return delivered if self.collate is None else self._batched(delivered, stats)

    def _batched(self, items: Iterator[Any], stats: ReaderStats) -> Iterator[Any]:
        """``collate`` of each ``batch_size`` consecutive samples of ``items`` (the last batch
        short). A batch of :class:`~shardstream.reading.slicer.FileRun` pieces goes to the
        collate's ``gather`` (read straight from the files), counted here; one that mixes them
        with samples, or that ``gather`` declines, is collated from samples."""
        size, collate = self.batch_size, self.collate
        gather = getattr(collate, "gather", None)
        pieces: list[tuple[FileRun, int, int]] = []
        samples: list[Any] = []
        held = 0  # samples of the batch in the making, in pieces or samples
        for item in items:
            if type(item) is FileRun:
                i = 0
                while i < item.num_samples:
                    j = min(item.num_samples, i + size - held)
                    if samples:  # the batch began with samples: these come as samples too
                        samples += self._file_samples([(item, i, j)], stats)
                    else:
                        pieces.append((item, i, j))
                    held += j - i
                    i = j
                    if held == size:
                        yield self._collated(pieces, samples, gather, stats)
                        pieces, samples, held = [], [], 0
                continue
            if pieces:
                samples, pieces = self._file_samples(pieces, stats), []
            samples.append(item)
            held += 1
            if held == size:
                yield collate(samples)  # type: ignore[misc]
                samples, held = [], 0
        if held:
            yield self._collated(pieces, samples, gather, stats)

    def _collated(
        self, pieces: list[tuple[FileRun, int, int]], samples: list[Any], gather: Any, stats: ReaderStats
    ) -> Any:
        """One batch: ``pieces`` gathered (counted as delivered here) or ``samples`` collated."""
        if pieces:
            batch = gather(pieces)
            if batch is None:  # the collate takes samples for these: it names what differs
                return self.collate(self._file_samples(pieces, stats))  # type: ignore[misc]
            self._count(pieces, stats)
            return batch
        return self.collate(samples)  # type: ignore[misc]

    def _file_samples(self, pieces: list[tuple[FileRun, int, int]], stats: ReaderStats) -> list[dict[str, Any]]:
        """The samples of ``pieces`` (file runs' samples ``i`` to ``j - 1``) as dicts, counted."""
        self._count(pieces, stats)
        return [sample for run, i, j in pieces for sample in run.samples(i, j)]

    def _count(self, pieces: list[tuple[FileRun, int, int]], stats: ReaderStats) -> None:
        """``pieces`` delivered: their samples and every member's bytes, as a sliced read counts."""
        count = sum(j - i for _, i, j in pieces)
        stats.samples(count, sum(sum(run.kept_sizes(i, j)) for run, i, j in pieces))
        self._yielded += count

    def _deliver(
        self, batches: Iterator[Batch], slot: WorkerSlot, stats: ReaderStats, worker_id: int | None
    ) -> Iterator[Any]:
        """The pass's samples, decoded, counted (a batch at a time) and logged; marks the pass
        finished at its end."""
        decode = self.decode
        log_every_s = self.log_every_s if slot.worker_id == 0 else None
        next_log = time.monotonic() + log_every_s if log_every_s else float("inf")
        if self.on_error == "skip":
            batches = repeat_over_skips(batches, decode, stats)
            decode = None
        for batch in batches:
            if time.monotonic() >= next_log:
                log.info("%s", self.stats().log_line())
                next_log = time.monotonic() + log_every_s  # type: ignore[operator]
            if type(batch) is FileRun:  # read by the batcher (_batched), which counts it
                yield batch
                continue
            stats.samples(len(batch), batch.nbytes)
            if decode is None:
                for sample in batch:
                    self._yielded += 1
                    yield sample
            else:
                for sample in batch:
                    self._yielded += 1
                    yield decode(sample)
        self._epochs.finish_pass(rank=slot.rank, worker_id=worker_id)


def loader_state_dict(loader: Any, samples_consumed: int) -> dict[str, Any]:
    """The data state of a plain ``torch.utils.data.DataLoader`` over a :class:`ShardDataset`,
    for a checkpoint: ``loader.dataset.state_dict(samples_consumed, batch_size=loader.batch_size,
    num_workers=loader.num_workers)``.

    Args:
        loader: the DataLoader (in-order, as by default; its ``drop_last`` must be False so no
            worker's short last batch is dropped).
        samples_consumed: samples this rank took from the loader's current iterator (all ranks
            the same; e.g. ``steps * batch_size``).

    Raises:
        TypeError: the loader's dataset is not a ShardDataset.
        ValueError: the loader drops last batches, delivers out of order, or batches other than
            the dataset's ``batch_size``.

    Resume: ``dataset.load_state_dict(state)``, then create the DataLoader iterator as usual.
    """
    dataset = loader.dataset
    if not isinstance(dataset, ShardDataset):
        raise TypeError(f"loader.dataset is a {type(dataset).__name__}, not a ShardDataset")
    if getattr(loader, "drop_last", False):
        raise ValueError(
            "DataLoader(drop_last=True) drops each worker's short last batch; use ShardDataset(drop_last=)"
        )
    if getattr(loader, "in_order", True) is False:
        raise ValueError("DataLoader(in_order=False) delivers batches in no fixed order; a checkpoint needs in_order")
    if dataset.collate is not None:  # the dataset makes the batches
        if loader.batch_size is not None:
            raise ValueError(
                f"ShardDataset(collate=...) hands out batches of {dataset.batch_size}, but the DataLoader batches them "
                f"again (batch_size={loader.batch_size}); read it with DataLoader(dataset, batch_size=None)"
            )
        return dataset.state_dict(samples_consumed, batch_size=dataset.batch_size, num_workers=loader.num_workers)
    if dataset.batch_size is not None and dataset.batch_size != loader.batch_size:
        raise ValueError(
            f"ShardDataset(batch_size={dataset.batch_size}) but the DataLoader's batch_size is {loader.batch_size}; "
            "give the dataset the DataLoader's batch size"
        )
    return dataset.state_dict(samples_consumed, batch_size=loader.batch_size, num_workers=loader.num_workers)


class _Chained(Sequence[str]):
    """The shard URLs of a mixture's sources, one after another, without a list of them (a
    source's URLs are made from its index on demand)."""

    def __init__(self, parts: list[Sequence[str]]) -> None:
        self.parts = parts
        self.starts = [0]
        for part in parts:
            self.starts.append(self.starts[-1] + len(part))

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        part = bisect.bisect_right(self.starts, i) - 1
        return self.parts[part][i - self.starts[part]]


def _sources_of(source: Any) -> list[Source] | None:
    """The mixture ``source`` names (a Source, or a list of them), or None (one dataset).

    Raises:
        TypeError: a list mixing Source objects and shard URLs.
    """
    if isinstance(source, Source):
        return [source]
    if isinstance(source, (list, tuple)) and any(isinstance(x, Source) for x in source):
        if not all(isinstance(x, Source) for x in source):
            raise TypeError("a list of Source(...) mixes datasets; give every entry as Source(location, ...)")
        return list(source)
    return None


def _raise(exc: BaseException) -> Iterator[Any]:
    """An iterator that raises ``exc`` at its first ``next``."""
    raise exc
    yield


def _loader_id() -> int:
    """The base seed this DataLoader worker process shares with its siblings (not 0)."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return ((info.seed - info.id) % (1 << 62)) or 1


def _in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None
