"""``ShardDataset``: shards from local disk or S3 as a stream of samples for a DataLoader."""

from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from .reading.assign import WorkerSlot, assign_shards, current_slot, distributed_rank
from .config import FetchConfig, S3Config
from .decode.cpu import ImageFormat, make_decoder
from .reading.epochs import EpochBoard, PassState, PassView
from .errors import CorruptShardError, DecodeError, ShardNotFoundError
from .storage.fetch import iter_shard_streams
from .index import resolve_source
from .reading.plan import (
    EpochPlan,
    PlanRun,
    Segment,
    ShardOrder,
    WorkerPlan,
    ramp_samples,
    without,
)
from .shuffle import shuffle_buffer
from .reading.stats import ReaderStats, StatsBoard, StatsSnapshot
from .reading.slicer import RunSlices, iter_sliced_batches
from .tarstream import Batch, Hashed, iter_sample_batches, stream_chunks

__all__ = ["STATE_FORMAT", "ShardDataset", "loader_state_dict"]

STATE_FORMAT = "shardstream-state"
STATE_VERSION = 1

log = logging.getLogger("shardstream")
_UNBATCHED = 2  # EpochBoard.once flag: warned that workers' pieces are not cut into whole batches
_OUT_BATCH = 64  # samples a shuffling reader hands on (and counts) together
_MIN_PART_BYTES = 1 << 20  # the smallest ranged GET a worker's share of the read-ahead budget makes

Source = str | os.PathLike[str] | Sequence[str]


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

    Args:
        source: a dataset written by ``shardstream pack`` (a local directory, an
            ``s3://bucket/prefix``, or its index file), a shard URL, a brace pattern of
            shard URLs (``"s3://b/data-{000000..000009}.tar"``), or a list of shard URLs.
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

    Yields:
        dicts ``{"__key__": str, "__shard__": shard URL, "<ext>": bytes, ...}``, one entry
        per member extension (decoded as ``decode`` says).

    Raises:
        ShardNotFoundError: no index at a dataset location, or (while iterating) a shard URL
            that does not exist.
        IndexFormatError: the index is malformed.
        CorruptShardError: a shard's tar stream is malformed or truncated (while iterating).
        StorageAccessError, StorageConnectionError, BucketNotFoundError: S3 problems.
    """

    def __init__(
        self,
        source: Source,
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
    ) -> None:
        super().__init__()
        if on_error not in ("raise", "skip"):
            raise ValueError(f"{on_error=} must be 'raise' or 'skip'")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"{batch_size=} must be an int >= 1 (the DataLoader's) or None")
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
        self.s3 = s3
        self.fetch = fetch or FetchConfig()
        self.shard_urls, self.index = resolve_source(source, s3=s3)
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.decode = make_decoder(decode)
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self.cache_limit_bytes = cache_limit_bytes
        self.log_every_s = log_every_s
        self.drop_last = drop_last
        self.max_open_shards = max_open_shards
        self.batch_size = batch_size
        self.resampled = resampled
        self.on_error = on_error
        self.verify_checksums = verify_checksums
        self._epochs = EpochBoard()  # the epoch of each pass, shared with DataLoader workers
        self._set = self._epochs.set(0, [])  # (generation, state) of the latest set_epoch / load here
        self._reader_pid = -1  # the process whose passes self._pass describes
        self._pass: PassState | None = None  # this reader's pass in progress
        self._loaded: PassState | None = None  # a state loaded in this worker for its next pass
        self._iter_seg: tuple[int, int] | None = None  # (segment index, samples skipped) of this iterator
        self._yielded = 0
        self._board = StatsBoard()

    def __repr__(self) -> str:
        return (
            f"ShardDataset({self.num_shards} shards, num_samples={self.num_samples}, "
            f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch})"
        )

    @property
    def num_shards(self) -> int:
        return len(self.shard_urls)

    @property
    def num_samples(self) -> int | None:
        """Samples in the whole dataset, from the index; None for bare shard URLs."""
        return self.index.num_samples if self.index is not None else None

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
        if self.index is not None and not self.resampled:
            self._shard_order(epoch)  # now, so DataLoader workers forked next inherit it

    def _view(self, num_workers: int | None = None) -> PassView:
        slot = current_slot(self.__dict__.get("_parent_rank"))
        return self._epochs.view(rank=slot.rank, num_workers=num_workers)

    def __len__(self) -> int:
        """Samples this rank yields in the pass in progress or, when none is, in the next
        pass: the same on every rank. After :meth:`load_state_dict` of a
        ``state_dict(samples_consumed)`` checkpoint: those still to come in its epoch; after a
        ``StatefulDataLoader`` checkpoint, the epoch's whole count, as that loader (and
        Lightning, which counts batches from the epoch's start) expects.

        Raises:
            TypeError: no index (bare shard URLs) or ``resampled``: the count is unknown.
        """
        if self.index is None or self.resampled:
            raise TypeError(
                "len() needs a dataset with an index (written by shardstream pack) and resampled=False"
            )
        slot = current_slot(self.__dict__.get("_parent_rank"))
        upcoming = self._epochs.view(rank=slot.rank).upcoming
        segments = _segments(upcoming)
        num_workers = 1
        if segments and segments[-1].world_size == slot.world_size:
            num_workers = segments[-1].num_workers
        plan = self._plan(PassState(upcoming.epoch, upcoming.segments or []))
        return plan.rank_count(world_size=slot.world_size, num_workers=num_workers, rank=slot.rank)

    def _shard_order(self, epoch: int) -> ShardOrder:
        """``epoch``'s order of shards, O(shards): kept for the two latest epochs, so workers
        forked after :meth:`set_epoch` or ``len()`` share the training process's copy (copy on
        write) instead of each computing it (0.08 s and 20 MB at 1,000,000 shards)."""
        assert self.index is not None  # internal invariant: callers check
        orders: dict[tuple[int, int, bool], ShardOrder] = self.__dict__.setdefault("_shard_orders", {})
        key = (epoch, self.seed, self.shuffle)
        if key not in orders:
            starts = next(iter(orders.values())).starts if orders else None
            orders[key] = ShardOrder.make(self.index.manifest.shard_samples, seed=self.seed, epoch=epoch,
                                          shuffle=self.shuffle, starts=starts)
            while len(orders) > 2:
                del orders[next(iter(orders))]
        return orders[key]

    def _plan(self, state: PassState) -> EpochPlan:
        assert self.index is not None  # internal invariant: callers check
        return EpochPlan(
            shard_order=self._shard_order(state.epoch),
            counts=self.index.manifest.shard_samples,
            seed=self.seed,
            epoch=state.epoch,
            shuffle=self.shuffle,
            shuffle_buffer=self.shuffle_buffer if self.shuffle else 0,
            max_open_shards=self.max_open_shards if self.shuffle else 1,
            drop_last=self.drop_last,
            segments=_segments(state),
            batch_size=self.batch_size,
        )

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
        if self.index is None or self.resampled:
            raise TypeError("state_dict() needs a dataset with an index (written by shardstream pack) and resampled=False")
        slot = current_slot(self.__dict__.get("_parent_rank"))
        if samples_consumed is None:  # a reader's own count (StatefulDataLoader)
            state = self._pass or self._loaded or self._view().upcoming
            segments = _segments(state)
            seg, skip = self._iter_seg if self._pass is not None and self._iter_seg else (len(segments), 0)
            workers = max(1, slot.num_workers)
            current = Segment(slot.world_size, workers, worker_yielded=((slot.worker_id, skip + self._yielded),),
                              split_batch_size=self.batch_size)
        else:
            if not isinstance(samples_consumed, int) or samples_consumed < 0:
                raise ValueError(f"{samples_consumed=} must be an int >= 0")
            workers = max(1, num_workers or 0)
            state = self._view(num_workers or 0).latest
            if state.segments is None:
                raise ValueError(
                    "the DataLoader workers resumed this epoch from a StatefulDataLoader checkpoint; keep saving "
                    "with StatefulDataLoader.state_dict() for this epoch"
                )
            segments = _segments(state)
            seg, base = len(segments), 0
            last = segments[-1] if segments else None
            if last is not None and (last.world_size, last.num_workers, last.split_batch_size) == (
                slot.world_size, workers, self.batch_size
            ):
                if last.samples_consumed is None:
                    raise ValueError(
                        "the loaded checkpoint came from StatefulDataLoader workers; keep saving with "
                        "StatefulDataLoader.state_dict() for this epoch"
                    )
                if last.batch_size != batch_size:
                    raise ValueError(
                        f"batch_size={batch_size} differs from the checkpoint's {last.batch_size}; resume "
                        "an epoch with the DataLoader batch size it started with"
                    )
                seg, base = len(segments) - 1, last.samples_consumed
            current = Segment(slot.world_size, workers, batch_size, base + samples_consumed,
                              split_batch_size=self.batch_size)
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": state.epoch,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "max_open_shards": self.max_open_shards,
            "drop_last": self.drop_last,
            "num_samples": self.num_samples,
            "num_shards": self.num_shards,
            "segments": [x.to_dict() for x in [*segments[:seg], current]],
        }

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
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a shardstream state (no \"format\": \"{STATE_FORMAT}\"): {str(state)[:200]}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state version {state.get('version')!r} is not supported (reads {STATE_VERSION})")
        mine = {
            "num_samples": self.num_samples,
            "num_shards": self.num_shards,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "max_open_shards": self.max_open_shards,
            "drop_last": self.drop_last,
        }
        differ = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if differ:
            detail = ", ".join(f"{k}: checkpoint {a!r}, dataset {b!r}" for k, (a, b) in differ.items())
            raise ValueError(f"the state was saved for another dataset or settings ({detail}); construct the same")
        segments = [Segment.from_dict(x).to_dict() for x in state["segments"]]  # validates them
        loaded = PassState(int(state["epoch"]), segments)
        if _in_worker():
            self._loaded = loaded
        else:
            self._set = self._epochs.set(loaded.epoch, segments)

    def shards_for(self, slot: WorkerSlot) -> list[str]:
        """The shard URLs ``slot`` reads in :attr:`epoch`, in reading order."""
        return [self.shard_urls[i] for i in self._shard_ids(slot, self.epoch)]

    def _shard_ids(self, slot: WorkerSlot, epoch: int) -> list[int]:
        return assign_shards(self.num_shards, slot, seed=self.seed, epoch=epoch, shuffle=self.shuffle)

    def __getstate__(self) -> dict[str, Any]:
        # Runs in the main process when a DataLoader hands the dataset to spawned workers,
        # which do not inherit torch.distributed: record the rank it knows here.
        state = self.__dict__.copy()
        state["_parent_rank"] = distributed_rank()
        state.pop("_shard_orders", None)  # O(shards) arrays a spawned worker remakes for its epoch
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
            slot = current_slot(self.__dict__.get("_parent_rank"))
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
                rank=slot.rank, worker_id=worker_id, num_workers=slot.num_workers, loaded=self._loaded,
                copied=self._set if first_here else None, loader=_loader_id() if in_worker else 0,
            )
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
            return _raise(exc)
        self._loaded = None
        self._pass, self._reader_pid = state, os.getpid()
        if first_advance:  # logged, not warnings.warn: a worker's warning filters may be the parent's
            log.warning(
                "ShardDataset: a new pass started without set_epoch(), so it reads epoch %d (each pass without "
                "set_epoch() reads the next epoch, not the same order again). Call dataset.set_epoch(epoch) "
                "before each epoch to choose the epoch yourself.", state.epoch,
            )
        stats = self._board.reader(slot.worker_id + 1 if in_worker else 0)
        fetch = _share_buffer(self.fetch, slot.num_workers if in_worker else 1)  # the rank's budget, shared
        self._yielded = 0
        self._iter_seg = None
        if self.index is not None and not self.resampled:
            plan = self._plan(state)
            try:
                mine, seg = plan.for_worker(
                    rank=slot.rank, world_size=slot.world_size, worker_id=slot.worker_id, num_workers=slot.num_workers
                )
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
                    slot.num_workers, slot.num_workers - 1,
                )
            samples = self._read_plan(mine, stats, fetch)
        else:
            if self.resampled:
                samples = self._read_resampled(slot, stats, state.epoch, fetch)
            else:
                samples = self._read(self._shard_ids(slot, state.epoch), stats, fetch)
            if self.shuffle and self.shuffle_buffer > 1:
                seed = int(np.random.SeedSequence([self.seed, state.epoch, slot.index]).generate_state(1)[0])
                samples = _in_batches(shuffle_buffer(
                    itertools.chain.from_iterable(samples), capacity_samples=self.shuffle_buffer,
                    rng=random.Random(seed), initial_samples=ramp_samples(self.shuffle_buffer),
                ))
        return self._deliver(samples, slot, stats, worker_id)

    def _deliver(
        self, batches: Iterator[Batch], slot: WorkerSlot, stats: ReaderStats, worker_id: int | None
    ) -> Iterator[Any]:
        """The pass's samples, decoded, counted (a batch at a time) and logged; marks the pass
        finished at its end."""
        decode = self.decode
        log_every_s = self.log_every_s if slot.worker_id == 0 else None
        next_log = time.monotonic() + log_every_s if log_every_s else float("inf")
        if self.on_error == "skip":
            batches = _repeat_over_skips(batches, decode, stats)
            decode = None
        for batch in batches:
            stats.samples(len(batch), batch.nbytes)
            if time.monotonic() >= next_log:
                log.info("%s", self.stats().log_line())
                next_log = time.monotonic() + log_every_s  # type: ignore[operator]
            if decode is None:
                for sample in batch:
                    self._yielded += 1
                    yield sample
            else:
                for sample in batch:
                    self._yielded += 1
                    yield decode(sample)
        self._epochs.finish_pass(rank=slot.rank, worker_id=worker_id)

    def _cache(self) -> Any:
        if self.cache_dir is None:
            return None
        from .storage.cache import ShardCache

        return ShardCache(self.cache_dir, cache_limit_bytes=self.cache_limit_bytes)  # type: ignore[arg-type]

    def _read_plan(self, plan: WorkerPlan, stats: ReaderStats, fetch: FetchConfig) -> Iterator[Batch]:
        """A worker's samples in its plan's emission order, in batches, skipping those
        delivered before a resume: each lane reads its runs (byte ranges of shards, from the
        index), arrivals follow the plan's interleaving, and a sample is held only until its
        turn comes, at most ``shuffle_buffer`` of them. Nothing is listed per sample up front:
        the interleaving and the emission order are drawn as samples come, so a piece of 10^8
        samples costs what one of 10^4 does before its first sample, but for its runs
        (O(shards)). One lane in arrival order (``shuffle=False``) hands its batches on as
        they are read."""
        if plan.skip >= plan.count:
            return
        emissions = plan.emissions()
        labels: Iterator[np.ndarray] = plan.labels()
        lane_runs = [plan.lane_runs(lane) for lane in range(plan.lanes)]
        fetch = _lane_fetch(fetch, plan.lanes)
        if plan.lanes == 1 and (plan.capacity <= 1 or plan.count <= 1):  # arrival order, one lane
            if plan.skip:
                lane_runs[0] = without(lane_runs[0], np.arange(plan.skip, dtype=np.int64))
            yield from self._read_runs(lane_runs[0], fetch, stats)
            return
        skipped = np.zeros(0, dtype=bool)  # by arrival index: delivered before the resume
        if plan.skip:
            delivered = np.fromiter(itertools.islice(emissions, plan.skip), dtype=np.int64, count=plan.skip)
            skipped = np.zeros(int(delivered.max()) + 1, dtype=bool)
            skipped[delivered] = True
            head: list[np.ndarray] = []
            while sum(map(len, head)) < len(skipped):
                head.append(next(labels))
            prefix = np.concatenate(head)[: len(skipped)]
            for lane in range(plan.lanes):  # each lane leaves out its delivered samples
                lane_runs[lane] = without(lane_runs[lane], np.flatnonzero(skipped[prefix == lane]))
            labels = itertools.chain(head, labels)
        pulled = [0]  # payload bytes of the batches the lanes have read
        readers = [self._read_runs(runs, fetch, stats) for runs in lane_runs]
        lanes_samples = [_flatten(reader, pulled) for reader in readers]
        held: dict[int, dict[str, Any] | None] = {}
        out, counted = Batch(), 0
        turn = next(emissions, None)
        t = 0
        for chunk in labels:
            lanes = chunk.tolist()
            if t < len(skipped):  # arrivals delivered before the resume come from no lane
                wanted = np.ones(len(lanes), dtype=bool)
                part = skipped[t : t + len(lanes)]
                wanted[: len(part)] = ~part
                lanes = [lane if w else -1 for lane, w in zip(lanes, wanted.tolist())]
            for lane in lanes:
                if lane >= 0:
                    held[t] = next(lanes_samples[lane])
                    while turn is not None and turn in held:
                        out.append(held.pop(turn))
                        turn = next(emissions, None)
                    if len(out) >= _OUT_BATCH or (out and not counted):  # the first sample goes at once
                        out.nbytes, counted = pulled[0] - counted, pulled[0]
                        yield out
                        out = Batch()
                t += 1
        if out:
            out.nbytes = pulled[0] - counted
            yield out
        for samples in lanes_samples:  # run each to its end: it checks counts, commits cache entries
            for _ in samples:
                raise AssertionError("internal error: a lane read beyond its plan")

    def _read_runs(self, runs: list[PlanRun], fetch: FetchConfig, stats: ReaderStats) -> Iterator[Batch]:
        """The wanted samples of each run in order, in batches, reading each run as one byte
        range of its shard (the whole shard when the run covers it; else the range from the
        shard's sample table); with ``on_error="skip"``, None for each sample of a run a
        corrupt shard lost."""
        index = self.index
        assert index is not None  # internal invariant: only planned reads come here
        urls, ranges, sizes = [], [], []
        for run in runs:
            urls.append(index.shard_url(run.shard))
            sizes.append(int(index.manifest.shard_bytes[run.shard]))
            if run.lo == 0 and run.hi == int(index.manifest.shard_samples[run.shard]) - 1:
                ranges.append(None)
            else:
                ends = index.table(run.shard).sample_ends()
                ranges.append((int(ends[run.lo - 1]) if run.lo else 0, int(ends[run.hi])))
        streams = iter_shard_streams(
            urls, sizes_bytes=sizes, byte_ranges=ranges, s3=self.s3, fetch=fetch, cache=self._cache(), stats=stats
        )
        # The streams come first in the zip, so the generator runs to its end after the last
        # run: that is where it finishes and commits the last shard's cache entry.
        for (url, stream), run, byte_range in zip(streams, runs, ranges):
            if self.on_error == "skip":
                yield from _skip_corrupt(self._read_run(url, stream, run, byte_range), run, url)
            else:
                yield from self._read_run(url, stream, run, byte_range)

    def _read_run(self, url: str, stream: Any, run: PlanRun, byte_range: tuple[int, int] | None) -> Iterator[Batch]:
        """The wanted samples of one run, in batches, checked against the index.

        Where the shard's table is at hand (a local dataset, or a byte range, which needed
        the table to find), members are sliced at the table's offsets and each header is
        checked against it (:mod:`shardstream.reading.slicer`); else the tar headers are parsed and
        the sample count is checked."""
        index = self.index
        assert index is not None  # internal invariant: runs come from the index
        checked = None
        if self.verify_checksums and byte_range is None:
            stream = checked = Hashed(stream)
        table = None
        if byte_range is not None:
            table = index.table(run.shard)
        elif index.tables_local or index.has_table(run.shard):
            try:
                table = index.table(run.shard)
            except ShardNotFoundError:  # a whole shard reads without its table, parsed
                table = None
        if table is not None:
            slices = RunSlices(table, run.indices(), url=url)
            yield from iter_sliced_batches(stream_chunks(stream), slices, base_offset=byte_range[0] if byte_range else 0)
        else:
            yield from _parsed_run(stream, run, url, int(index.manifest.shard_samples[run.shard]),
                                   foreign=index.manifest.foreign)
        if checked is not None:
            checked.drain()  # the tar's tail after its end blocks
            if f"{checked.crc32:08x}" != index.manifest.crc32_hex(run.shard):
                raise CorruptShardError(
                    f"{url}: CRC-32 {checked.crc32:08x} but the index says {index.manifest.crc32_hex(run.shard)}; "
                    "the shard's bytes changed after packing, re-pack or re-upload it"
                )

    def _read_resampled(self, slot: WorkerSlot, stats: ReaderStats, epoch: int, fetch: FetchConfig) -> Iterator[Batch]:
        """Endless: shards drawn with replacement, weighted by their sample counts (or
        uniformly without an index), 64 at a time so S3 reads run ahead."""
        rng = np.random.default_rng([self.seed, epoch, slot.index, 3])
        if self.index is not None:
            counts = self.index.manifest.shard_samples.astype(float)
        else:
            counts = np.ones(self.num_shards)
        if counts.sum() == 0:
            raise ValueError("resampled=True needs a dataset with at least one sample")
        p = counts / counts.sum()
        while True:
            yield from self._read(rng.choice(len(counts), size=64, p=p).tolist(), stats, fetch)

    def _read(self, shards: list[int], stats: ReaderStats, fetch: FetchConfig) -> Iterator[Batch]:
        """Every sample of these shards (ids), in batches, checked against the index's counts
        when there is one."""
        manifest = self.index.manifest if self.index is not None else None
        urls = [self.shard_urls[s] for s in shards]
        sizes = [int(manifest.shard_bytes[s]) if manifest is not None else None for s in shards]
        streams = iter_shard_streams(urls, sizes_bytes=sizes, s3=self.s3, fetch=fetch, cache=self._cache(),
                                     stats=stats)
        for s, (url, stream) in zip(shards, streams):
            count = 0
            for batch in iter_sample_batches(stream, url=url, foreign=manifest is None):
                count += len(batch)
                yield batch
            if manifest is not None and count != manifest.shard_samples[s]:
                raise CorruptShardError(
                    f"{url}: holds {count} samples but the index says {manifest.shard_samples[s]}; the shard "
                    "or its index is stale or damaged, re-pack or re-upload the dataset"
                )


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
        raise ValueError("DataLoader(drop_last=True) drops each worker's short last batch; use ShardDataset(drop_last=)")
    if getattr(loader, "in_order", True) is False:
        raise ValueError("DataLoader(in_order=False) delivers batches in no fixed order; a checkpoint needs in_order")
    if dataset.batch_size is not None and dataset.batch_size != loader.batch_size:
        raise ValueError(
            f"ShardDataset(batch_size={dataset.batch_size}) but the DataLoader's batch_size is {loader.batch_size}; "
            "give the dataset the DataLoader's batch size"
        )
    return dataset.state_dict(samples_consumed, batch_size=loader.batch_size, num_workers=loader.num_workers)


def _parsed_run(stream: Any, run: PlanRun, url: str, count: int, *, foreign: bool = False) -> Iterator[Batch]:
    """A run covering a whole shard, read by parsing its tar headers: its wanted samples, in
    batches; the shard must hold ``count`` samples (the index's). ``foreign``: an index built
    for another tool's shards (links skipped, as the index left them out)."""
    wanted = None
    if run.index is not None:
        wanted = np.zeros(count, bool)
        wanted[run.index] = True
    i = 0
    for batch in iter_sample_batches(stream, url=url, foreign=foreign):
        if i + len(batch) > count:
            raise CorruptShardError(
                f"{url}: holds more than the {count} samples the index says; the shard or its index is stale or "
                "damaged, re-pack or re-upload the dataset"
            )
        n = len(batch)
        if wanted is not None:
            kept = [sample for sample, w in zip(batch, wanted[i : i + n].tolist()) if w]
            batch = Batch(kept, sum(map(_payload_bytes, kept)))
        i += n
        if batch:
            yield batch
    if i != count:
        raise CorruptShardError(
            f"{url}: holds {i} samples but the index says {count}; the shard or its index is stale or damaged, "
            "re-pack or re-upload the dataset"
        )


def _skip_corrupt(batches: Iterator[Batch], run: PlanRun, url: str) -> Iterator[Batch]:
    """A run's batches; from a CorruptShardError on, a batch of ``None`` for each wanted
    sample left (logged once)."""
    done = 0
    try:
        for batch in batches:
            done += len(batch)
            yield batch
    except CorruptShardError as exc:
        log.warning("skipping %d samples of %s: %s", run.count - done, url, exc)
        if run.count > done:
            yield Batch([None] * (run.count - done))


def _repeat_over_skips(
    batches: Iterator[Batch], decode: Callable[[dict[str, Any]], Any] | None, stats: ReaderStats
) -> Iterator[Batch]:
    """Batches of decoded samples; a skipped (None) or undecodable one is counted and
    replaced by a repeat of the previous good one (or of the next, at the start), so the
    count is kept."""
    last: Any = None
    owed = 0
    warned: set[str] = set()
    for batch in batches:
        out = Batch(nbytes=batch.nbytes)
        for sample in batch:
            if sample is not None and decode is not None:
                try:
                    sample = decode(sample)
                except DecodeError as exc:
                    shard = str(sample.get("__shard__"))
                    if shard not in warned:
                        warned.add(shard)
                        log.warning("skipping undecodable samples of %s (first: %s)", shard, exc)
                    sample = None
            if sample is None:
                stats.add("skipped", 1)
                if last is None:
                    owed += 1
                    continue
                sample = last
            last = sample
            out.extend([sample] * (owed + 1))
            owed = 0
        if out:
            yield out
    if owed:
        raise CorruptShardError(f"on_error='skip': all {owed} samples of this reader were skipped; nothing to repeat")


def _flatten(batches: Iterator[Batch], pulled: list[int]) -> Iterator[Any]:
    """The samples of ``batches``, adding each batch's payload bytes to ``pulled[0]``."""
    for batch in batches:
        pulled[0] += batch.nbytes
        yield from batch


def _in_batches(samples: Iterator[dict[str, Any]], size: int = _OUT_BATCH) -> Iterator[Batch]:
    """``samples`` in batches of ``size`` (the last one shorter), their payload bytes counted."""
    batch = Batch()
    for sample in samples:
        batch.append(sample)
        if len(batch) >= size:
            batch.nbytes = sum(map(_payload_bytes, batch))
            yield batch
            batch = Batch()
    if batch:
        batch.nbytes = sum(map(_payload_bytes, batch))
        yield batch


def _lane_fetch(fetch: FetchConfig, lanes: int) -> FetchConfig:
    """Each of ``lanes`` concurrent readers gets a share of the reader's read-ahead bounds."""
    if lanes <= 1:
        return fetch
    return dataclasses.replace(
        _share_buffer(fetch, lanes),
        max_inflight_requests=max(1, fetch.max_inflight_requests // lanes),
        max_inflight_shards=max(1, fetch.max_inflight_shards // lanes),
    )


def _share_buffer(fetch: FetchConfig, readers: int) -> FetchConfig:
    """``fetch`` for one of ``readers`` that share its ``max_buffer_bytes``: each gets an equal
    part, holding at least two ranged GETs (smaller ones, down to 1 MiB, where the part is
    small), so a rank's DataLoader workers together keep to the rank's budget."""
    if readers <= 1:
        return fetch
    share = fetch.max_buffer_bytes // readers
    part = min(fetch.part_bytes, max(_MIN_PART_BYTES, share // 2))
    return dataclasses.replace(fetch, part_bytes=part, max_buffer_bytes=max(part, share))


def _segments(state: PassState) -> tuple[Segment, ...]:
    """The checkpoint segments a pass resumes (none when unknown here: a worker's own state)."""
    return tuple(Segment.from_dict(x) for x in state.segments or ())


def _raise(exc: BaseException) -> Iterator[Any]:
    """An iterator that raises ``exc`` at its first ``next``."""
    raise exc
    yield


def _payload_bytes(sample: dict[str, Any] | None) -> int:
    if sample is None:
        return 0
    return sum(len(v) for k, v in sample.items() if not k.startswith("__") and isinstance(v, (bytes, bytearray)))


def _loader_id() -> int:
    """The base seed this DataLoader worker process shares with its siblings (not 0)."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return ((info.seed - info.id) % (1 << 62)) or 1


def _in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None
