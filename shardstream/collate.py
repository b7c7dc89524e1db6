"""Batches of raw bytes that cross from DataLoader workers through shared memory, not pickle.

A DataLoader worker hands its batches to the training process through a pipe: the default
collate gives a dict of lists of ``bytes``, which is pickled, written, read and unpickled
(four copies and a Python object per payload), and caps raw bytes at a few hundred MB/s
whatever the readers do. :class:`ByteCollate` puts a batch's payloads into one ``uint8``
tensor instead (its offsets and labels in the same block), written by the worker into one of
its *slots*: shared-memory files it keeps and reuses (``/dev/shm``, :mod:`shardstream.storage.shm`),
so only the slot's name and the batch's layout are pickled. The training process maps the slot
(once: mappings are kept) and, when the last view into the batch is gone (garbage-collected),
marks the slot free in the worker's control file; the worker writes a later batch there. A
worker that finds no free slot makes another, so nothing waits on the training process; a
slot's pages are faulted in once, not every batch. Where ``/dev/shm`` has no room the batch is
pickled instead (slower, never a crash).

There, a :class:`ByteBatch` reads like the default collate's dict of lists (``batch["jpg"]``
is a sequence of the samples' ``.jpg`` payloads), each payload a ``memoryview`` into the
block (zero-copy: ``bytes(view)``, ``io.BytesIO(view)``, ``np.frombuffer(view, np.uint8)``
and Pillow take it as it is). A view must not be written to.

Usage::

    dataset = ShardDataset(url, batch_size=64)
    loader = DataLoader(dataset, batch_size=64, num_workers=8, collate_fn=ByteCollate(label_field="cls"))
    for batch in loader:
        images = batch["jpg"]  # 64 memoryviews
        labels = batch.labels  # torch.int64 (64,)

:class:`shardstream.dali.DaliLoader` feeds DALI from its workers this way.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import multiprocessing.util
import operator
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import torch

from .reading.batching import parse_label
from .reading.filerun import FileRun
from .storage.shm import SharedFile

__all__ = ["ByteBatch", "ByteCollate"]

_ALIGN = 8  # the offsets and labels (int64) start on an 8-byte boundary of the block
MAX_SLOTS = 256  # a worker's slots (one control byte each); beyond, a batch is pickled
_MIN_SLOT_BYTES = 1 << 20


class ByteBatch:
    """A batch of samples whose ``bytes`` members lie in one ``uint8`` block (module doc).

    It reads like the default collate's dict of lists (``batch[name]``, ``in``, ``iter``,
    ``items()``, ``values()``, ``get()``; ``batch.keys`` is the samples' keys, a list, not the
    dict method): ``batch["__key__"]`` the samples' keys, ``batch[field]`` for each member
    field a sequence of ``memoryview`` s (one a sample, in order, into :attr:`data`), and the
    samples' other fields (``"__shard__"``, ``"__source__"``, values that are not bytes) as
    lists. It is not a ``collections.abc.Mapping``, so that torch's ``default_convert``
    (``DataLoader(batch_size=None)``), ``pin_memory`` and frameworks that rebuild mappings
    (moving a batch to a device) hand it on as it is rather than take it apart.

    Attributes:
        data: ``torch.uint8`` tensor of shape ``(payload_bytes,)`` on the CPU (in shared
            memory when it came from a DataLoader worker): every payload, one after another.
        offsets: ``torch.int64`` tensor of shape ``(num_samples * len(fields) + 1,)``: member
            ``f`` of sample ``i`` is ``data[offsets[i * F + f] : offsets[i * F + f + 1]]``
            (``F = len(fields)``).
        labels: ``torch.int64`` tensor of shape ``(num_samples,)``: the integer in each
            sample's ``label_field`` member (ASCII digits, as ``.cls``), or None without one.
        fields: the member fields held in :attr:`data`, in each sample's order.
        keys: the samples' keys (``list[str]``).
        extras: the samples' other fields, a list each.
    """

    def __init__(
        self,
        block: np.ndarray,
        *,
        payload_bytes: int,
        fields: tuple[str, ...],
        keys: list[str],
        has_labels: bool,
        extras: dict[str, list[Any]],
        slot: tuple[str, str, int] | None = None,
    ) -> None:
        self._block = block  # uint8: payloads, then (8-aligned) the int64 offsets, then the labels
        self._payload_bytes = payload_bytes
        self.fields, self.keys, self.extras = fields, keys, extras
        self._has_labels = has_labels
        self._slot = slot  # (slot file, control file, slot number) in a worker; None: in memory
        self._views: tuple[memoryview, list[int]] | None = None

    @property
    def num_samples(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        """Bytes of payload in the batch."""
        return self._payload_bytes

    @property
    def data(self) -> torch.Tensor:
        return torch.from_numpy(self._block[: self._payload_bytes])

    @property
    def offsets(self) -> torch.Tensor:
        return torch.from_numpy(self._ends())

    @property
    def labels(self) -> torch.Tensor | None:
        if not self._has_labels:
            return None
        at = _aligned(self._payload_bytes) + 8 * (len(self.keys) * len(self.fields) + 1)
        return torch.from_numpy(self._block[at : at + 8 * len(self.keys)].view(np.int64))

    def _ends(self) -> np.ndarray:
        at = _aligned(self._payload_bytes)
        return self._block[at : at + 8 * (len(self.keys) * len(self.fields) + 1)].view(np.int64)

    def __reduce__(self) -> tuple[Any, ...]:
        layout = (self._payload_bytes, self.fields, self.keys, self._has_labels, self.extras)
        if self._slot is not None:  # written into a worker's slot: only its name crosses
            return _from_slot, (*self._slot, len(self._block), *layout)
        return _from_bytes, (self._block, *layout)

    def __repr__(self) -> str:
        return f"ByteBatch({self.num_samples} samples, fields={self.fields}, {self.nbytes} bytes)"

    def __getitem__(self, field: str) -> Sequence[Any]:
        if field == "__key__":
            return self.keys
        if field in self.extras:
            return self.extras[field]
        try:
            f = self.fields.index(field)
        except ValueError:
            raise KeyError(
                f"{field!r}: not a field of this batch (it has {['__key__', *self.fields, *self.extras]})"
            ) from None
        return _Members(self, f)

    def __iter__(self) -> Iterator[str]:
        yield "__key__"
        yield from self.fields
        yield from self.extras

    def __len__(self) -> int:
        return 1 + len(self.fields) + len(self.extras)

    def __contains__(self, field: object) -> bool:
        return field == "__key__" or field in self.fields or field in self.extras

    def values(self) -> list[Sequence[Any]]:
        return [self[field] for field in self]

    def items(self) -> list[tuple[str, Sequence[Any]]]:
        return [(field, self[field]) for field in self]

    def get(self, field: str, default: Any = None) -> Any:
        return self[field] if field in self else default

    def arrays(self, field: str) -> list[np.ndarray]:
        """The samples' ``field`` payloads as ``uint8`` numpy views into :attr:`data`."""
        f, step = self.fields.index(field), len(self.fields)
        ends = self._bounds()[1]
        block = self._block
        return [block[ends[at] : ends[at + 1]] for at in range(f, step * self.num_samples, step)]

    def samples(self) -> Iterator[dict[str, Any]]:
        """Each sample as a dict, as the dataset gave it (payloads as memoryviews)."""
        members = [self[field] for field in self.fields]
        for i, key in enumerate(self.keys):
            sample: dict[str, Any] = {"__key__": key}
            for field, values in zip(self.fields, members):
                sample[field] = values[i]
            for field, values in self.extras.items():
                sample[field] = values[i]
            yield sample

    def pin_memory(self) -> ByteBatch:
        """This batch copied into pinned memory (what ``DataLoader(pin_memory=True)`` calls)."""
        pinned = torch.from_numpy(self._block).pin_memory()
        return ByteBatch(
            pinned.numpy(),
            payload_bytes=self._payload_bytes,
            fields=self.fields,
            keys=self.keys,
            has_labels=self._has_labels,
            extras=self.extras,
        )

    def _bounds(self) -> tuple[memoryview, list[int]]:
        if self._views is None:
            self._views = (memoryview(self._block), self._ends().tolist())
        return self._views


class _Members(Sequence[memoryview]):
    """One field's payloads of a :class:`ByteBatch`, as memoryviews."""

    def __init__(self, batch: ByteBatch, field: int) -> None:
        self.batch, self.field = batch, field

    def __len__(self) -> int:
        return self.batch.num_samples

    @overload
    def __getitem__(self, i: int) -> memoryview: ...

    @overload
    def __getitem__(self, i: slice) -> list[memoryview]: ...

    def __getitem__(self, i: int | slice) -> memoryview | list[memoryview]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = self.batch.num_samples
        if not -n <= i < n:
            raise IndexError(f"sample {i} of a batch of {n}")
        view, ends = self.batch._bounds()
        at = (i % n) * len(self.batch.fields) + self.field
        return view[ends[at] : ends[at + 1]]

    def __iter__(self) -> Iterator[memoryview]:
        view, ends = self.batch._bounds()
        step = len(self.batch.fields)
        for at in range(self.field, step * self.batch.num_samples, step):
            yield view[ends[at] : ends[at + 1]]


@dataclass(frozen=True)
class ByteCollate:
    """A DataLoader ``collate_fn``: samples (dicts from :class:`~shardstream.ShardDataset`
    with ``decode=None``) -> one :class:`ByteBatch`.

    Every ``bytes``-like member goes into the batch's one block; ``label_field``'s member is
    parsed as an integer into ``labels`` instead; the other fields are kept as lists. In a
    DataLoader worker the block is one of the worker's shared-memory slots, so it crosses to
    the training process without pickling (module doc).

    Args:
        label_field: the member holding each sample's integer label (ASCII, e.g. ``"cls"``),
            or None.

    Raises:
        ValueError: samples of a batch hold different member fields, or a label is not an
            integer (names the shard and key).
    """

    label_field: str | None = None

    def __call__(self, samples: Sequence[dict[str, Any]] | ByteBatch) -> ByteBatch:
        if isinstance(samples, ByteBatch):  # made by the dataset (ShardDataset(collate=...)): as it is
            return samples
        if not samples:
            raise ValueError("ByteCollate: an empty batch")
        if isinstance(samples[0], ByteBatch):
            raise ValueError(
                "ByteCollate got a list of batches: the dataset makes them already (ShardDataset(collate=...)); "
                "read it with DataLoader(dataset, batch_size=None)"
            )
        first, label_field = samples[0], self.label_field
        if not isinstance(first, dict):
            raise ValueError(
                f"ByteCollate takes samples as dicts, not a {type(first).__name__}; with ShardDataset(fields=...) "
                "name the fields with a dict, e.g. fields={'image': 'jpg;png', 'label': 'cls'} with "
                "ByteCollate(label_field='label')"
            )
        fields = tuple(
            f for f, v in first.items() if f != label_field and isinstance(v, (bytes, bytearray, memoryview))
        )
        others = [f for f in first if f not in fields and f not in ("__key__", label_field)]
        width = len(fields) + len(others) + 1 + (label_field is not None)
        try:  # a column at a time, in C (itemgetter, map); a sample that differs is named below
            if any(len(sample) != width for sample in samples):
                raise KeyError
            keys: list[str] = [sample["__key__"] for sample in samples]
            payloads: list[Any] = []
            if len(fields) == 1:  # itemgetter of one field gives the value, of several a tuple
                payloads = list(map(operator.itemgetter(fields[0]), samples))
            elif fields:
                payloads = list(itertools.chain.from_iterable(map(operator.itemgetter(*fields), samples)))
            extras = {f: list(map(operator.itemgetter(f), samples)) for f in others}
            labels = [] if label_field is None else list(map(operator.itemgetter(label_field), samples))
        except KeyError:
            _refuse(samples, first)
            raise  # internal invariant: _refuse raises
        if labels and label_field is not None:  # (there are labels only with a label_field)
            try:  # ASCII digits (.cls) or ints, at once; else each read as _label says, or named
                if not set(map(type, labels)) <= {bytes, int}:
                    raise TypeError
                labels = list(map(int, labels))
            except (TypeError, ValueError):
                labels = [_label(sample, label_field) for sample in samples]
        sizes = np.fromiter(map(len, payloads), np.int64, len(payloads))
        ends = np.zeros(len(payloads) + 1, np.int64)
        np.cumsum(sizes, out=ends[1:])
        total = int(ends[-1])
        at = _aligned(total)
        block, slot = _block(at + 8 * (len(ends) + len(labels)))
        out = memoryview(block)
        for payload, a, b in zip(payloads, ends[:-1].tolist(), ends[1:].tolist()):
            out[a:b] = payload
        labelled = label_field is not None
        return _written(block, slot, ends, labels, fields=fields, keys=keys, labelled=labelled, extras=extras)

    def from_samples(self, samples: list[dict[str, Any]]) -> ByteBatch:
        """The batch of ``samples`` (:class:`~shardstream.reading.batching.Batcher`): ``self(samples)``."""
        return self(samples)

    def from_runs(self, pieces: Sequence[tuple[FileRun, int, int]]) -> ByteBatch | None:
        """The batch of file-run ``pieces`` (:class:`~shardstream.reading.batching.RunBatcher`): :meth:`gather`."""
        return self.gather(pieces)

    def gather(self, pieces: Sequence[tuple[FileRun, int, int]]) -> ByteBatch | None:
        """One batch read straight from local shard files: samples ``i`` to ``j - 1`` of each
        ``(run, i, j)``, in order, their payloads read into the block by ``preadv`` (no
        sample dict, no ``bytes`` object, one copy); what :class:`~shardstream.ShardDataset`
        calls with ``collate=ByteCollate(...)`` for reads in shard order. None: the runs hold
        different members (the caller collates their samples instead, which names them).

        Raises:
            CorruptShardError: a shard is shorter than its index says, or a header disagrees
                with it (naming shard, member and byte).
            ValueError: a label is not an integer (naming shard and key).
        """
        extensions = pieces[0][0].extensions
        if any(run.extensions != extensions for run, _, _ in pieces):
            return None
        label = self.label_field
        aside = extensions.index(label) if label in extensions else None
        if label is not None and aside is None:
            return None
        fields = tuple(e for e in extensions if e != label)
        kept = [run.kept_sizes(i, j, aside) for run, i, j in pieces]
        ends = np.zeros(sum(map(len, kept)) + 1, np.int64)
        np.cumsum(np.fromiter(itertools.chain.from_iterable(kept), np.int64, len(ends) - 1), out=ends[1:])
        keys = list(itertools.chain.from_iterable(run.keys[i:j] for run, i, j in pieces))
        total = int(ends[-1])
        at = _aligned(total)
        block, slot = _block(at + 8 * (len(ends) + (len(keys) if label is not None else 0)))
        out = memoryview(block)
        labels: list[int] = []
        put = 0
        try:
            for (run, i, j), part in zip(pieces, kept):
                size = sum(part)
                raw = run.read_into(i, j, out[put : put + size], aside=aside)
                put += size
                if label is not None:
                    labels += _labels(raw, run, i, label)
        except BaseException:
            del out
            _release(slot)  # the batch is not made: its slot is free again
            raise
        shards = list(itertools.chain.from_iterable(itertools.repeat(run.url, j - i) for run, i, j in pieces))
        extras = {"__shard__": shards}
        return _written(block, slot, ends, labels, fields=fields, keys=keys, labelled=label is not None, extras=extras)


def _written(
    block: np.ndarray,
    slot: tuple[str, str, int] | None,
    ends: np.ndarray,
    labels: list[int],
    *,
    fields: tuple[str, ...],
    keys: list[str],
    labelled: bool,
    extras: dict[str, list[Any]],
) -> ByteBatch:
    """The batch of ``block``, whose payloads are in place: its offsets (``ends``) and
    ``labels`` are put after them (module doc's layout)."""
    at = _aligned(int(ends[-1]))
    block[at : at + 8 * len(ends)].view(np.int64)[:] = ends
    if labelled:
        block[at + 8 * len(ends) :].view(np.int64)[:] = labels
    return ByteBatch(
        block, payload_bytes=int(ends[-1]), fields=fields, keys=keys, has_labels=labelled, extras=extras, slot=slot
    )


def _labels(raw: list[bytes], run: FileRun, first: int, field: str) -> list[int]:
    """Integer labels of samples ``first`` on of ``run``, from their ``field`` members."""
    try:
        return list(map(int, raw))
    except ValueError:
        return [
            _label({"__key__": key, "__shard__": run.url, field: value}, field)
            for key, value in zip(run.keys[first:], raw)
        ]


def _release(slot: tuple[str, str, int] | None) -> None:
    """Mark a slot this worker took (:meth:`_Slots.take`) free again."""
    slots = _slots.get(os.getpid())
    if slot is not None and slots is not None:
        slots.flags[slot[2]] = 0


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _Slots:
    """A DataLoader worker's slots (module doc): shared-memory files it writes batches into,
    and a control file of one byte a slot (1: a batch in it is in use, 0: free), which the
    training process clears when it lets go of the batch."""

    def __init__(self) -> None:
        self.control = SharedFile("shardstream-batch", MAX_SLOTS)
        buffer = self.control.buffer()
        assert buffer is not None  # internal invariant: just created, by this process
        self.flags = buffer
        self.files: list[SharedFile] = []
        # A DataLoader worker ends in os._exit after multiprocessing's exit hooks, not
        # weakref's: remove the files there. A worker killed outright leaves them to the
        # next process's sweep of files whose process is gone (SharedFile).
        multiprocessing.util.Finalize(self, _Slots.remove, args=(self.control, self.files), exitpriority=10)

    @staticmethod
    def remove(control: SharedFile, files: list[SharedFile]) -> None:
        for shared in (control, *files):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(shared.path)

    def take(self, nbytes: int) -> tuple[np.ndarray, tuple[str, str, int]] | None:
        """A free slot of at least ``nbytes`` (a new or larger one where none is), marked in
        use: its block and ``(slot file, control file, number)``; None: no room left."""
        free = [i for i in range(len(self.files)) if self.flags[i] == 0]
        fits = [i for i in free if self.files[i].num_bytes >= nbytes]
        if fits:
            i = fits[0]
        elif free or len(self.files) < MAX_SLOTS:
            i = free[0] if free else len(self.files)
            size = max(_MIN_SLOT_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())
            try:
                made = SharedFile("shardstream-batch", size)
                with open(made.path, "r+b") as f:  # reserve the pages: no room is an error here, not a SIGBUS later
                    os.posix_fallocate(f.fileno(), 0, size)
            except OSError:
                return None
            if i == len(self.files):
                self.files.append(made)
            else:  # the old file's pages go when the reader's last view of them does
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.files[i].path)
                self.files[i] = made
        else:
            return None
        buffer = self.files[i].buffer()
        if buffer is None:
            return None
        self.flags[i] = 1
        return np.frombuffer(buffer, np.uint8, nbytes), (self.files[i].path, self.control.path, i)


_slots: dict[int, _Slots | None] = {}  # by process (None: it could make none): a forked worker starts with none


def _block(nbytes: int) -> tuple[np.ndarray, tuple[str, str, int] | None]:
    """A ``uint8`` block of ``nbytes``: a worker's slot in a DataLoader worker (module doc),
    else memory of this process."""
    if torch.utils.data.get_worker_info() is not None:
        pid = os.getpid()
        if pid not in _slots:
            _slots.clear()
            try:
                _slots[pid] = _Slots()
            except OSError:
                _slots[pid] = None
        slots = _slots[pid]
        taken = slots.take(nbytes) if slots is not None else None
        if taken is not None:
            return taken
    return np.empty(nbytes, np.uint8), None


def _from_bytes(block: np.ndarray, *layout: Any) -> ByteBatch:
    payload_bytes, fields, keys, has_labels, extras = layout
    return ByteBatch(block, payload_bytes=payload_bytes, fields=fields, keys=keys, has_labels=has_labels, extras=extras)


_maps: dict[str, mmap.mmap] = {}  # slot and control files mapped in this (the training) process
_makers: dict[str, int | None] = {}  # the process that made each of _maps' files (_maker)
_maps_lock = threading.RLock()


def _mapped(path: str) -> mmap.mmap:
    """``path`` (a worker's slot or control file) mapped, once. Mapping a new file drops the
    mappings of workers that have exited (their batches keep their own reference): one
    liveness check a process that made mapped files, not one a file."""
    mapping = _maps.get(path)
    if mapping is not None:
        return mapping
    with _maps_lock:
        try:
            with open(path, "r+b") as f:
                mapping = mmap.mmap(f.fileno(), 0)
        except FileNotFoundError:
            raise RuntimeError(
                f"{path}: the shared-memory batch of a DataLoader worker is gone (the worker exited, or "
                "something removed it from /dev/shm)"
            ) from None
        gone = {pid for pid in set(_makers.values()) if pid is not None and not _alive(pid)}
        if gone:
            for kept in [p for p, pid in _makers.items() if pid in gone]:
                del _maps[kept], _makers[kept]
        _maps[path], _makers[path] = mapping, _maker(path)
        return mapping


def _maker(path: str) -> int | None:
    """The id of the process that made ``path`` (``shardstream-batch-PID-...``); None if the
    name does not say."""
    try:
        return int(os.path.basename(path).split("-")[2])
    except (ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """The process ``pid`` still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _from_slot(path: str, control: str, number: int, nbytes: int, *layout: Any) -> ByteBatch:
    """The training process's side: the batch's block mapped from the worker's slot; the slot
    is freed (its control byte cleared) when the block's last view is collected. The finalizer
    takes the control file's mapping itself: it may run inside the garbage collector, in any
    allocation, so it takes no lock."""
    block = np.frombuffer(_mapped(path), np.uint8, nbytes)
    weakref.finalize(block, _free, _mapped(control), number)
    return _from_bytes(block, *layout)


def _free(flags: mmap.mmap, number: int) -> None:
    with contextlib.suppress(ValueError):  # closed: the process is ending
        flags[number] = 0


def _label(sample: dict[str, Any], field: str) -> int:
    return parse_label(sample, field, hint="; pass ByteCollate(label_field=None) or the member that holds the label")


def _refuse(samples: Sequence[dict[str, Any]], first: dict[str, Any]) -> None:
    """Raise the error naming the first sample whose fields differ from ``first``'s."""
    sample = next((s for s in samples if s.keys() != first.keys()), first)
    raise ValueError(
        f"{sample.get('__shard__')}: sample {sample.get('__key__')!r} has fields {sorted(sample)}, but the "
        f"batch's first sample {first.get('__key__')!r} has {sorted(first)}; ByteCollate needs the same members "
        "in every sample of a batch (use a collate_fn of your own for datasets whose samples differ)"
    )
