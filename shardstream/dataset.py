"""``ShardDataset``: the torch glue around a :class:`~shardstream.reading.reader.Reader` (which
reads without torch): who is reading (rank, DataLoader worker), the epoch of each pass carried to
DataLoader workers (:mod:`shardstream.reading.epochs`), pickling into spawned workers, warnings.
"""

from __future__ import annotations

import gc
import logging
import operator
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import IterableDataset

from .config import FetchConfig, RequestConfig, S3Config
from .decode.cpu import ImageFormat
from .decode.stage import PickedSamples, make_decoder
from .reading.access import SampleAccess
from .reading.assign import NodeAffinity, WorkerSlot, current_slot, distributed_rank, in_worker, loader_id
from .reading.engine import share_buffer
from .reading.epochs import EpochBoard, PassState, PassView, warn_advanced
from .reading.loader import checked_by_loader
from .reading.mixture import Source
from .reading.reader import ReaderPass, failing, loader_batch_size, open_reader
from .reading.schedule import STATE_FORMAT
from .reading.stats import StatsBoard, StatsSnapshot

__all__ = ["STATE_FORMAT", "ShardDataset", "loader_state_dict"]

log = logging.getLogger("shardstream")

Location = str | os.PathLike[str] | Sequence[str]


def _setting(owner: str, name: str, doc: str) -> property:
    """A read-only attribute of the dataset that lives on its reader's schedule, engine or options."""
    return property(lambda self: getattr(operator.attrgetter(owner)(self), name), doc=doc)


class ShardDataset(IterableDataset):
    """Samples of tar shards from local disk or any store, shuffled and split over the job.

    With an index, epochs are exact (every sample once, each rank ``len(dataset)`` samples) and
    resume mid-epoch at any world size. docs/reading.md describes every argument.

    Args:
        source: a dataset written by ``shardstream pack`` (a directory, an ``s3://`` prefix,
            its index file), shard URLs or a brace pattern, or a list of ``Source(...)``: a mixture.
        shuffle, shuffle_buffer, seed, max_open_shards, drop_last, batch_size: the epoch's
            order (``shuffle_buffer`` in samples; ``batch_size``: the DataLoader's).
        decode: None (bytes), ``"pil"``, ``"numpy"``, ``"torch"``, a
            :class:`~shardstream.decode.CpuDecoder` (image steps, ``transform``), or a callable
            on a sample.
        fields: pick and name what each sample yields (:mod:`shardstream.fields`):
            ``{"image": "jpg;jpeg;png;webp", "label": "cls"}`` yields dicts with those keys
            (and ``__key__``, ``__shard__``, a mixture's ``__source__``), ``("jpg;png", "cls")``
            tuples in that order. Alternatives (``;``) match the last part of a member's
            extension, case-insensitively, the first present winning; only the picked members
            are decoded, each by the extension that matched (a ``.JPEG`` as a ``.jpg``). A
            custom ``decode`` gets the picked sample: ``__key__``, ``__shard__``
            (``__source__``) and each field's bytes under its name (a tuple's fields are named
            ``"0"``, ``"1"``, ...); what it returns is yielded (a dict, with a tuple spec, as the
            tuple of its fields). A sample without a field raises ``MissingFieldError`` (a
            ``DecodeError`` naming shard, key, fields and members), or is skipped under
            ``on_error="skip"``. With ``collate``, the collate gets these named samples
            (``ByteCollate`` takes dicts: use a dict spec with ``decode=None``, and
            ``ByteCollate(label_field=)`` the label's field name).
        s3, requests, fetch, cache_dir, cache_limit_bytes: the store's endpoint, request
            policy (RequestConfig) and read-ahead; a node-local cache and its bound (bytes).
        log_every_s, on_error, verify_checksums: stats log lines; ``"raise"`` or ``"skip"``
            (by repeats); CRC-32 checks of whole shards.
        resampled, epoch_samples, mix, replication: endless draws; a mixture's epoch size and
            interleaving; ranks per model-parallel group.
        shard_affinity: ``"node"``: each node keeps the same share of the shards in every epoch
            (shuffled within the node, across its ranks and workers, anew each epoch), so once
            its share is in its node cache (``cache_dir``) later epochs read nothing from the
            store; exact epochs and resume hold; an elastic resume re-partitions (logged).
            Nodes come from torchrun's ``LOCAL_WORLD_SIZE``, or
            ``NodeAffinity(ranks_per_node=...)``. Not with a mixture, bare shard URLs or
            ``resampled``. docs/planning.md says what it trades.
        collate: a :class:`~shardstream.reading.batching.Batcher` or ``collate_fn``: hand out
            batches of ``batch_size`` (read with ``DataLoader(batch_size=None)``: a DataLoader
            that batches them again raises a ValueError when iteration starts).

    Yields:
        dicts ``{"__key__": str, "__shard__": URL, "<ext>": bytes, ...}`` (decoded as ``decode``
        says; a mixture's with ``"__source__"``), what ``fields`` names, or with ``collate`` its
        batches.

    A DataLoader that batches by another size than ``batch_size`` is warned about when
    iteration starts (its ``len()`` and the batches it gives disagree), naming both sizes.

    Raises:
        ValueError: a bad argument or mixture (named), or a world size not a multiple of
            ``replication``. ShardNotFoundError, IndexFormatError: no or a bad index.
        CorruptShardError: a bad shard. StorageAccessError, StorageConnectionError: the store.
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
        requests: RequestConfig | None = None,
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
        fields: Mapping[str, str] | Sequence[str] | None = None,
        shard_affinity: str | NodeAffinity | None = None,
    ) -> None:
        super().__init__()
        arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__", "fetch")}  # all but fetch
        self.reader, self.shard_urls, self.index = open_reader(**arguments, make_decoder=make_decoder)
        self.fetch, self._collate = fetch or FetchConfig(), collate
        stage = self.reader.options.decode
        self._fields = stage.fields if isinstance(stage, PickedSamples) else None
        self._schedule, self._engine = self.reader.schedule, self.reader.engines[0]  # its settings are every engine's
        self._epochs = EpochBoard()  # the epoch of each pass, shared with DataLoader workers
        self._set = self._epochs.set(0, [])  # (generation, state) of the latest set_epoch / load here
        self._reader_pid = -1  # the process whose passes self._pass describes
        self._pass: PassState | None = None  # this reader's pass in progress
        self._loaded: PassState | None = None  # a state loaded in this worker for its next pass
        self._progress = ReaderPass()  # where this iterator's pass stands
        self._board = StatsBoard(sources=self._schedule.names)

    seed = _setting("_schedule", "seed", "Seed of shard order and sample shuffle.")
    shuffle = _setting("_schedule", "shuffle", "Whether shard order and samples are shuffled.")
    shuffle_buffer = _setting("_schedule", "shuffle_buffer", "Samples held by each reader's shuffle buffer.")
    max_open_shards = _setting("_schedule", "max_open_shards", "Shards each reader reads at once (lanes).")
    drop_last = _setting("_schedule", "drop_last", "Whether the fewest samples are dropped to even out ranks.")
    batch_size = _setting("_schedule", "batch_size", "The DataLoader's batch size workers' pieces are cut by.")
    num_samples = _setting("_schedule", "num_samples", "Samples of an epoch (all sources); None: bare shard URLs.")
    samples_per_source = _setting("_schedule", "per_source", "A mixture's samples per source and epoch, by name.")
    s3 = _setting("_engine", "s3", "S3 endpoint and credentials (None: the standard AWS environment).")
    requests = _setting("_engine", "requests", "Timeouts, attempts and connections of store requests, or None.")
    cache_dir = _setting("_engine", "cache_dir", "The node cache's directory, or None.")
    cache_limit_bytes = _setting("_engine", "cache_limit_bytes", "The node cache's size bound in bytes.")
    on_error = _setting("_engine", "on_error", "'raise' or 'skip' (corrupt shards, undecodable samples).")
    verify_checksums = _setting("_engine", "verify_checksums", "Whether whole shards are checked by CRC-32.")
    decode = _setting("reader.options", "decode", "The sample decoder, or None.")
    log_every_s = _setting("reader.options", "log_every_s", "Seconds between reader 0's log lines, or None.")
    resampled = _setting("reader.options", "resampled", "Whether shards are drawn with replacement, endlessly.")
    replication = _setting("reader.options", "replication", "Ranks per model-parallel group.")
    sources = _setting("_schedule", "sources", "A mixture's list of Source, or None (one dataset).")
    collate = property(lambda self: self._collate, doc="What makes the dataset's batches, or None (samples).")
    fields = property(lambda self: self._fields, doc="The parsed fields= (a shardstream.fields.Fields), or None.")

    @property
    def classes(self) -> list[str] | None:
        """The class names of the dataset's index (``pack --labels-from-dirs``), in class-index
        order, as torchvision's ``ImageFolder.classes``: a mixture's when every source has the
        same list, else None; None without an index or without class names in it."""
        return self.reader.classes

    @property
    def class_to_idx(self) -> dict[str, int] | None:
        """``{class name: class index}`` of :attr:`classes`, as torchvision's ``ImageFolder.class_to_idx``; or None."""
        classes = self.classes
        return None if classes is None else {name: i for i, name in enumerate(classes)}

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

    def random_access(self) -> SampleAccess:
        """The :class:`~shardstream.reading.access.SampleAccess` behind ``ds[i]``, :meth:`get`
        and :meth:`get_many` (made on first use, with this dataset's store settings).

        Raises:
            TypeError: a mixture (random access reads one dataset: open each source's location
                with its own ``ShardDataset`` or ``ShardMapDataset``), or shard URLs without an
                index (pass the dataset's directory or prefix; ``shardstream index build``
                indexes other tools' shards).
        """
        access = self.__dict__.get("_access")
        if access is None:
            if self.sources is not None:
                raise TypeError(
                    f"{self!r}: random access reads one dataset, not a mixture of {len(self.sources)} sources; "
                    "open each source's location with ShardDataset(location) or ShardMapDataset(location)"
                )
            if self.index is None:
                raise TypeError(
                    f"{self!r}: random access needs the dataset's index; pass the directory or prefix shardstream "
                    "pack wrote (for other tools' shards, run shardstream index build first)"
                )
            access = SampleAccess(
                self.index,
                s3=self.s3,
                requests=self.requests,
                fetch=self.fetch,
                cache_dir=self.cache_dir,
                cache_limit_bytes=self.cache_limit_bytes,
            )
            self._access = access
        return access

    def __getitem__(self, i: int | slice) -> Any:
        """The sample at global index ``i`` (shards in index order, samples in shard order;
        negative ``i`` from the end), or a list for a slice: one ranged read of the sample's
        bytes (docs/random-access.md), decoded as when streaming (``decode``, ``fields``).

        Raises:
            IndexError: ``i`` out of range (names it and the dataset's size). TypeError: as
                :meth:`random_access`. CorruptShardError, DecodeError, storage errors: always
                raised for a sample asked for by name, whatever ``on_error`` says.
        """
        access = self.random_access()
        if isinstance(i, slice):
            return self.get_many(range(*i.indices(access.num_samples)))
        return self.get_many([i])[0]

    def get(self, key: str) -> Any:
        """The sample with ``key``, decoded as when streaming.

        Raises:
            KeyError: no sample has ``key`` (names it and the dataset). Others as :meth:`get_many`.
        """
        return self.get_many([key])[0]

    def get_many(self, indices_or_keys: Sequence[int | str] | range) -> list[Any]:
        """The samples asked for, in the order asked: global indices (ints) and keys (strs),
        which may be mixed. Samples of one shard are read together, neighbouring ranges merged.

        Raises:
            IndexError, KeyError: an index out of range, a key absent (named with the dataset).
            IndexFormatError: a key asked of a dataset with no key index and unsorted keys
                (says to run ``shardstream index keys DEST``).
            CorruptShardError, DecodeError, storage errors: ``on_error="skip"`` does not apply
                to samples asked for explicitly; they are always raised.
        """
        return self.random_access().samples(indices_or_keys, self.reader.options.decode)

    def worker_slot(self) -> WorkerSlot:
        """Who is reading: this rank (with ``replication``: its group) and DataLoader worker.

        Raises:
            ValueError: world_size is not a multiple of ``replication``.
        """
        return self.reader.group(current_slot(self.__dict__.get("_parent_rank")))

    _slot = worker_slot  # its former name

    def stats(self) -> StatsSnapshot:
        """Reading metrics of this process and its DataLoader workers since their latest pass began."""
        return self._board.snapshot()

    @property
    def epoch(self) -> int:
        """The epoch of the pass in progress (here or in a DataLoader worker), else of the next."""
        if self._pass is not None and in_worker():
            return self._pass.epoch
        return self._view().latest.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` in the next pass, here and in every DataLoader worker (persistent too);
        without it each pass reads the next epoch; a loaded checkpoint's epoch keeps its place.

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
            self._schedule.prepare(epoch, self.worker_slot())  # now, so DataLoader workers forked next inherit it

    def _view(self, num_workers: int | None = None) -> PassView:
        return self._epochs.view(rank=self.worker_slot().rank, num_workers=num_workers)

    def __len__(self) -> int:
        """Samples (with ``collate``: batches) this rank yields in the pass in progress or the
        next, the same on every rank; after a ``state_dict(samples_consumed)`` resume, those left.

        Raises:
            TypeError: no index (bare shard URLs) or ``resampled``: the count is unknown.
        """
        self.reader.check_exact("len()")
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
        self.reader.check_exact("state_dict()")
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
        """Resume from :meth:`state_dict`: the next pass yields exactly the samples of that epoch
        not yet consumed (in the training process: in every DataLoader worker).

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

    def __getstate__(self) -> dict[str, Any]:  # to spawned workers, which lack torch.distributed: its rank
        return {**self.__dict__, "_parent_rank": distributed_rank()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if not os.path.exists(self._epochs.path):  # unpickled after its creator exited: new shared files
            self._board = StatsBoard()
            self._epochs = EpochBoard()
            self._set = self._epochs.set(self._set[1].epoch, self._set[1].segments or [])

    def __iter__(self) -> Iterator[Any]:
        """One pass, its epoch fixed now (``state_dict()`` describes it before the first sample);
        errors of that set-up are raised by the first ``next``."""
        try:
            slot, in_loader = self.worker_slot(), in_worker()
            worker_id = slot.worker_id if in_loader else None
            first_here = in_loader and self._reader_pid != os.getpid()  # a worker process's first pass
            if first_here:  # a forked worker's first full collection would walk the inherited heap
                gc.freeze()  # (~0.15 s) while the first sample waits: CPython's advice after a fork
            state, first_advance = self._epochs.start_pass(
                rank=slot.rank,
                worker_id=worker_id,
                num_workers=slot.num_workers,
                loaded=self._loaded,
                copied=self._set if first_here else None,
                loader=loader_id() if in_loader else 0,
            )
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
            return failing(exc)
        self._loaded = None
        self._pass, self._reader_pid = state, os.getpid()
        if first_advance and (self._schedule.epoch_varies or self.resampled):  # else every pass reads alike
            warn_advanced(state.epoch)
        self._progress, out = self.reader.open(
            state,
            slot,
            fetch=share_buffer(self.fetch, slot.num_workers if in_loader else 1),  # the rank's budget, shared
            stats=self._board.reader(slot.worker_id + 1 if in_loader else 0),
            log_line=(lambda: log.info("%s", self.stats().log_line())) if slot.worker_id == 0 else None,
            on_end=lambda: self._epochs.finish_pass(rank=slot.rank, worker_id=worker_id),
            once=self._epochs.once,
        )
        return checked_by_loader(
            out, self, batch_size=self.batch_size, batches=self.collate is not None, once=self._epochs.once
        )


def loader_state_dict(loader: Any, samples_consumed: int) -> dict[str, Any]:
    """The data state of a plain ``torch.utils.data.DataLoader`` over a :class:`ShardDataset`,
    for a checkpoint: ``loader.dataset.state_dict(samples_consumed, batch_size=loader.batch_size,
    num_workers=loader.num_workers)``. Resume with ``dataset.load_state_dict(state)``.

    ``samples_consumed``: samples this rank took from the loader's current iterator (all ranks
    the same; e.g. ``steps * batch_size``).

    Raises:
        TypeError: the loader's dataset is not a ShardDataset.
        ValueError: as :func:`~shardstream.reading.reader.loader_batch_size`.
    """
    dataset = loader.dataset
    if not isinstance(dataset, ShardDataset):
        raise TypeError(f"loader.dataset is a {type(dataset).__name__}, not a ShardDataset")
    batch_size = loader_batch_size(loader, batch_size=dataset.batch_size, batches=dataset.collate is not None)
    return dataset.state_dict(samples_consumed, batch_size=batch_size, num_workers=loader.num_workers)
