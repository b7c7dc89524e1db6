"""``ShardDataset``: the torch glue around a :class:`~shardstream.reading.reader.Reader` (which
reads without torch): who is reading (rank, DataLoader worker), the epoch of each pass carried to
DataLoader workers (:mod:`shardstream.reading.epochs`), pickling into spawned workers, warnings.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import IterableDataset

from .config import Affinity, FetchConfig, MixMode, OnError, OrderSettings, RequestConfig, S3Config, StoreSettings
from .decode.cpu import ImageFormat
from .decode.stage import PickedSamples, make_decoder
from .reading.assign import NodeAffinity, WorkerSlot, current_slot, distributed_rank, in_worker, loader_id
from .reading.engine import share_buffer
from .reading.epochs import EpochBoard, PassState, warn_advanced
from .reading.front import EpochFront, ReaderSettings, SampleLookup
from .reading.loader import checked_by_loader
from .reading.mixture import Source
from .reading.reader import ReaderPass, failing, loader_batch_size, open_reader, read_options
from .reading.schedule import STATE_FORMAT
from .reading.stages import ItemUnit
from .reading.stats import StatsBoard

__all__ = ["STATE_FORMAT", "ShardDataset", "loader_state_dict"]

log = logging.getLogger("shardstream")

Location = str | os.PathLike[str] | Sequence[str]


class ShardDataset(EpochFront, SampleLookup, ReaderSettings, IterableDataset):
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
            tuples; only the picked members are decoded. A sample without a field raises
            ``MissingFieldError`` (or is skipped under ``on_error="skip"``). docs/reading.md
            says how a custom ``decode`` and a ``collate`` see the picked samples.
        s3, requests, fetch, cache_dir, cache_limit_bytes: the store's endpoint, request
            policy (RequestConfig) and read-ahead; a node-local cache and its bound (bytes).
        log_every_s, on_error, verify_checksums: stats log lines; ``"raise"`` or ``"skip"``
            (by repeats); CRC-32 checks of whole shards.
        resampled, epoch_samples, mix, replication: endless draws; a mixture's epoch size and
            interleaving; ranks per model-parallel group.
        shard_affinity: ``"node"``: each node keeps the same share of the shards in every epoch
            (shuffled within the node anew each epoch), so later epochs read from its node
            cache (``cache_dir``); exact epochs and resume hold. Nodes come from torchrun's
            ``LOCAL_WORLD_SIZE``, or ``NodeAffinity(ranks_per_node=...)``. Not with a mixture,
            bare shard URLs or ``resampled``; docs/planning.md says what it trades.
        collate: a :class:`~shardstream.reading.batching.Batcher` or ``collate_fn``: hand out
            batches of ``batch_size`` (read with ``DataLoader(batch_size=None)``: a DataLoader
            that batches them again raises a ValueError when iteration starts).
        unit: what an item is (:class:`~shardstream.reading.stages.ItemUnit`): what epochs,
            ``len``, checkpoints and per-rank counts count; None: a sample.

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
        on_error: OnError = "raise",
        verify_checksums: bool = False,
        epoch_samples: int | None = None,
        mix: MixMode = "stratified",
        replication: int = 1,
        collate: Callable[[list[Any]], Any] | None = None,
        fields: Mapping[str, str] | Sequence[str] | None = None,
        shard_affinity: Affinity | NodeAffinity | None = None,
        unit: ItemUnit | None = None,
    ) -> None:
        super().__init__()
        options = read_options(
            decode=decode,
            fields=fields,
            on_error=on_error,
            log_every_s=log_every_s,
            resampled=resampled,
            replication=replication,
            collate=collate,
            batch_size=batch_size,
            unit=unit,
            make_decoder=make_decoder,
        )
        order = OrderSettings(
            seed=seed,
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            max_open_shards=max_open_shards,
            drop_last=drop_last,
            batch_size=batch_size,
        )
        store = StoreSettings(
            s3=s3, requests=requests, fetch=fetch, cache_dir=cache_dir, cache_limit_bytes=cache_limit_bytes
        )
        self.reader, self.shard_urls, self.index = open_reader(
            source,
            order=order,
            store=store,
            options=options,
            verify_checksums=verify_checksums,
            epoch_samples=epoch_samples,
            mix=mix,
            shard_affinity=shard_affinity,
        )
        self.fetch, self._collate = store.fetch_or_default, collate
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

    collate = property(lambda self: self._collate, doc="What makes the dataset's batches, or None (samples).")
    fields = property(lambda self: self._fields, doc="The parsed fields= (a shardstream.fields.Fields), or None.")

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
        """Who is reading: this rank (with ``replication``: its group) and DataLoader worker.

        Raises:
            ValueError: world_size is not a multiple of ``replication``.
        """
        return self.reader.group(current_slot(self.__dict__.get("_parent_rank")))

    _slot = worker_slot  # its former name

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
