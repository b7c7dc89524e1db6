"""What a dataset object shows of its :class:`~.reader.Reader`, without torch: its settings as
read-only attributes (:class:`ReaderSettings`) and random access to its samples
(:class:`SampleLookup`, of one dataset or of a mixture's sources laid end to end).
:class:`shardstream.ShardDataset` is made of these and the torch glue.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

from ..config import StoreSettings
from ..index import DatasetIndex
from .access import SampleAccess
from .assign import WorkerSlot, in_worker
from .epochs import EpochBoard, PassState, PassView
from .stages import PassProgress
from .stats import StatsBoard, StatsSnapshot

__all__ = ["EpochFront", "MixtureAccess", "ReaderSettings", "SampleLookup"]


def _setting(owner: str, name: str, doc: str) -> property:
    """A read-only attribute of the dataset that lives on its reader's schedule, engine or options."""
    return property(lambda self: getattr(operator.attrgetter(owner)(self), name), doc=doc)


class ReaderSettings:
    """The settings of a dataset's reader (``self.reader``) as read-only attributes."""

    reader: Any

    seed = _setting("reader.schedule", "seed", "Seed of shard order and sample shuffle.")
    shuffle = _setting("reader.schedule", "shuffle", "Whether shard order and samples are shuffled.")
    shuffle_buffer = _setting("reader.schedule", "shuffle_buffer", "Samples held by each reader's shuffle buffer.")
    max_open_shards = _setting("reader.schedule", "max_open_shards", "Shards each reader reads at once (lanes).")
    drop_last = _setting("reader.schedule", "drop_last", "Whether the fewest samples are dropped to even out ranks.")
    batch_size = _setting("reader.schedule", "batch_size", "The DataLoader's batch size workers' pieces are cut by.")
    num_samples = _setting("reader.schedule", "num_samples", "Items of an epoch (all sources); None: bare shard URLs.")
    samples_per_source = _setting("reader.schedule", "per_source", "A mixture's items per source and epoch, by name.")
    sources = _setting("reader.schedule", "sources", "A mixture's list of Source, or None (one dataset).")
    s3 = _setting("reader.engine", "s3", "S3 endpoint and credentials (None: the standard AWS environment).")
    requests = _setting("reader.engine", "requests", "Timeouts, attempts and connections of requests, or None.")
    cache_dir = _setting("reader.engine", "cache_dir", "The node cache's directory, or None.")
    cache_limit_bytes = _setting("reader.engine", "cache_limit_bytes", "The node cache's size bound in bytes.")
    on_error = _setting("reader.engine", "on_error", "'raise' or 'skip' (corrupt shards, undecodable samples).")
    verify_checksums = _setting("reader.engine", "verify_checksums", "Whether whole shards are CRC-32 checked.")
    decode = _setting("reader.options", "decode", "The sample decoder, or None.")
    log_every_s = _setting("reader.options", "log_every_s", "Seconds between reader 0's log lines, or None.")
    resampled = _setting("reader.options", "resampled", "Whether shards are drawn with replacement, endlessly.")
    replication = _setting("reader.options", "replication", "Ranks per model-parallel group.")
    unit = _setting("reader.options", "unit", "What an item is (an ItemUnit; a sample by default).")

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


class MixtureAccess:
    """Random access to a mixture's sources laid end to end (in the order given, as its
    ``shard_urls``): global index ``i`` is sample ``i - start`` of the source it falls in, a
    key is looked for in each source in order. Samples carry ``"__source__"`` (the source's
    name), as streaming gives them. Same questions as :class:`~.access.SampleAccess`.

    Args:
        parts: each source's name and :class:`~.access.SampleAccess`.
    """

    def __init__(self, parts: Sequence[tuple[str, SampleAccess]]) -> None:
        self.parts = list(parts)
        self.starts = [0]
        for _, access in self.parts:
            self.starts.append(self.starts[-1] + access.num_samples)

    @property
    def num_samples(self) -> int:
        """Samples in all sources."""
        return self.starts[-1]

    def samples(self, indices_or_keys: Sequence[int | str], decode: Any = None) -> list[Any]:
        """The samples asked for, in the order asked (global indices and keys, mixed).

        Raises:
            IndexError: an index out of range (names it and the mixture's size).
            KeyError: a key no source has. Others as :meth:`~.access.SampleAccess.samples`.
        """
        out: list[Any] = []
        for item in indices_or_keys:
            name, access, local = self._find(item)
            sample = access.samples([local])[0]
            sample["__source__"] = name
            out.append(sample if decode is None else decode(sample))
        return out

    def _find(self, item: int | str) -> tuple[str, SampleAccess, int | str]:
        if isinstance(item, str):
            for name, access in self.parts:
                if access.find(item) is not None:
                    return name, access, item
            raise KeyError(f"no sample with key {item!r} in any of the mixture's {len(self.parts)} sources")
        n = self.num_samples
        if not -n <= item < n:
            raise IndexError(f"index {item} is out of range for a mixture of {n} samples")
        i = item % n
        part = bisect.bisect_right(self.starts, i) - 1
        name, access = self.parts[part]
        return name, access, i - self.starts[part]


class SampleLookup:
    """``ds[i]``, :meth:`get` and :meth:`get_many` of a dataset (``self.index``,
    ``self.reader``, ``self.fetch``), by ranged reads (docs/random-access.md), decoded as when
    streaming (``decode``, ``fields``)."""

    reader: Any
    index: DatasetIndex | None
    fetch: Any

    def random_access(self) -> SampleAccess | MixtureAccess:
        """The :class:`~.access.SampleAccess` behind ``ds[i]``, :meth:`get` and :meth:`get_many`
        (a :class:`MixtureAccess` for a mixture: its sources laid end to end), made on first
        use with this dataset's store settings.

        Raises:
            TypeError: shard URLs without an index (pass the dataset's directory or prefix;
                ``shardstream index build`` indexes other tools' shards), a mixture with such
                a source, or one read in parts (:meth:`~.schedule.Schedule.check_lookup`).
        """
        access = self.__dict__.get("_access")
        if access is None:
            store = dataclasses.replace(self.reader.engine.store, fetch=self.fetch)
            self.reader.schedule.check_lookup(f"{self!r}: random access")
            sources = self.reader.schedule.sources
            if sources is None:
                if self.index is None:
                    raise TypeError(
                        f"{self!r}: random access needs the dataset's index; pass the directory or prefix "
                        "shardstream pack wrote (for other tools' shards, run shardstream index build first)"
                    )
                access = _access(self.index, store)
            else:
                parts = []
                for src, engine in zip(sources, self.reader.engines):
                    index = getattr(engine.shards, "index", None)
                    if index is None:
                        raise TypeError(f"{self!r}: source {src.label!r} has no index; random access needs one")
                    parts.append((src.label, _access(index, store)))
                access = MixtureAccess(parts)
            self.__dict__["_access"] = access
        return access

    def __getitem__(self, i: int | slice) -> Any:
        """The sample at global index ``i`` (shards in index order, samples in shard order, a
        mixture's sources one after another; negative ``i`` from the end), or a list for a
        slice: one ranged read of the sample's bytes, decoded as when streaming.

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


class EpochFront:
    """A dataset's epochs, ``len`` and checkpoints, here and in its DataLoader workers: the
    epoch of each pass on an :class:`~.epochs.EpochBoard` (``self._epochs``) shared with the
    workers, the pass in progress (``self._pass``, ``self._progress``), a state loaded in a
    worker (``self._loaded``), and the reader's schedule answering the counts."""

    reader: Any
    shard_urls: Sequence[str]
    _epochs: EpochBoard
    _board: StatsBoard
    _set: tuple[int, PassState]
    _pass: PassState | None
    _loaded: PassState | None
    _progress: PassProgress

    def worker_slot(self) -> WorkerSlot:  # the torch glue's
        raise NotImplementedError

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
            self.reader.schedule.prepare(epoch, self.worker_slot())  # now, so DataLoader workers forked next inherit it

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
        count = self.reader.schedule.rank_count(self._epochs.view(rank=slot.rank).upcoming, slot)
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
            progress = self._progress if self._pass is not None else PassProgress()
            return self.reader.schedule.reader_state(
                state, slot, position=progress.position, yielded=progress.delivered
            )
        if not isinstance(samples_consumed, int) or samples_consumed < 0:
            raise ValueError(f"{samples_consumed=} must be an int >= 0")
        latest = self._view(num_workers or 0).latest
        return self.reader.schedule.consumed_state(
            latest, slot, samples_consumed=samples_consumed, batch_size=batch_size, num_workers=num_workers
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next pass yields exactly the samples of that epoch
        not yet consumed (in the training process: in every DataLoader worker).

        Raises:
            ValueError: not a shardstream state, or saved for another dataset or settings.
        """
        loaded = self.reader.schedule.loaded_state(state)
        if in_worker():
            self._loaded = loaded
        else:
            self._set = self._epochs.set(loaded.epoch, loaded.segments or [])

    def shards_for(self, slot: WorkerSlot) -> list[str]:
        """The shard URLs ``slot`` reads in :attr:`epoch`, in reading order (not a mixture).

        Raises:
            TypeError: a mixture (its readers read parts of every source).
        """
        return [self.shard_urls[i] for i in self.reader.schedule.shard_ids(slot, self.epoch)]


def _access(index: DatasetIndex, store: StoreSettings) -> SampleAccess:
    return SampleAccess(index, store=store)
