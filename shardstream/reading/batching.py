"""The batching seam: how a reader turns its samples (or unread file runs) into batches. No torch.

A :class:`Batcher` makes one batch from a list of samples (:meth:`Batcher.from_samples`);
one that can also read a batch straight from local shard files implements
:class:`RunBatcher` (:meth:`RunBatcher.from_runs`, over :class:`~.filerun.FileRun` s, the
public read-only view of a run). :class:`shardstream.collate.ByteCollate` is a
``RunBatcher``; a plain DataLoader ``collate_fn`` is wrapped in a :class:`CollateBatcher`;
:class:`shardstream.dali.DaliLoader`'s encoder is a ``Batcher``. The reader asks
:func:`reads_runs` once whether its engine should hand file runs on, and :func:`batches`
cuts what it delivers into batches, counting each delivered piece once.

Labels are parsed in one place, :func:`parse_label`, for every batcher.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import DecodeError
from .filerun import FileRun

__all__ = [
    "Batcher",
    "CollateBatcher",
    "GatheringBatcher",
    "RunBatcher",
    "RunPiece",
    "as_batcher",
    "batches",
    "parse_label",
    "reads_runs",
]

RunPiece = tuple[FileRun, int, int]
"""Samples ``i`` to ``j - 1`` of a :class:`~.filerun.FileRun`: ``(run, i, j)``."""


@runtime_checkable
class Batcher(Protocol):
    """Makes one batch from a list of samples (dicts ``{"__key__", "__shard__", "<ext>": ...}``
    as the reader delivers them)."""

    def from_samples(self, samples: list[Any]) -> Any: ...


@runtime_checkable
class RunBatcher(Batcher, Protocol):
    """A :class:`Batcher` that can also read a batch straight from local shard files."""

    def from_runs(self, pieces: Sequence[tuple[FileRun, int, int]]) -> Any | None:
        """The batch of ``pieces``' samples, in order, read from their files; None: not these
        (the caller makes it :meth:`from_samples` instead, which names what differs)."""
        ...


class CollateBatcher:
    """A plain ``collate_fn`` (a callable taking a list of samples) as a :class:`Batcher`.

    Args:
        collate_fn: e.g. ``torch.utils.data.default_collate``.
    """

    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.collate_fn = collate_fn

    def __repr__(self) -> str:
        return f"CollateBatcher({self.collate_fn!r})"

    def from_samples(self, samples: list[Any]) -> Any:
        return self.collate_fn(samples)


class GatheringBatcher(CollateBatcher):
    """A ``collate_fn`` that can also read a batch from file runs (a :class:`RunBatcher`).

    Args:
        collate_fn: makes a batch from samples.
        from_runs: makes one from file-run pieces, or declines with None (``ByteCollate.gather``).
    """

    def __init__(self, collate_fn: Callable[[list[Any]], Any], from_runs: Callable[..., Any]) -> None:
        super().__init__(collate_fn)
        self._from_runs = from_runs

    def from_runs(self, pieces: Sequence[tuple[FileRun, int, int]]) -> Any | None:
        return self._from_runs(pieces)


def as_batcher(collate: Any) -> Batcher:
    """``collate`` as a :class:`Batcher`. A callable is called with each batch's samples (a
    ``collate_fn``), and its ``from_runs`` or ``gather`` method, if it has one, reads batches
    from file runs; an object that is not callable must be a :class:`Batcher`.

    Raises:
        ValueError: ``collate`` is neither callable nor a Batcher.
    """
    if callable(collate):
        runs = getattr(collate, "from_runs", None) or getattr(collate, "gather", None)
        return GatheringBatcher(collate, runs) if callable(runs) else CollateBatcher(collate)
    if callable(getattr(collate, "from_samples", None)):
        return collate
    raise ValueError(f"collate={collate!r} must be callable (a DataLoader collate_fn)")


def reads_runs(batcher: Batcher | None, *, decode: Any, on_error: str) -> bool:
    """Whether the reader asks its engine for unread file runs (the engine then decides, per
    run, which it can hand on): only for a :class:`RunBatcher` of undecoded samples whose
    corrupt runs raise (a skipped sample must be replaced by a repeat, which needs samples)."""
    return isinstance(batcher, RunBatcher) and decode is None and on_error == "raise"


def batches(
    items: Iterator[Any],
    batcher: Batcher,
    batch_size: int,
    count: Callable[[Sequence[RunPiece]], None],
) -> Iterator[Any]:
    """A batch of each ``batch_size`` consecutive samples of ``items`` (the last short).

    ``items`` are samples or :class:`~.filerun.FileRun` s (unread runs of samples). A batch
    made of file runs alone goes to the batcher's ``from_runs`` and is counted here by
    ``count``; one that mixes them with samples, or that ``from_runs`` declines, is made from
    samples (the runs' samples read here, and counted)."""
    from_runs = batcher.from_runs if isinstance(batcher, RunBatcher) else None
    pieces: list[RunPiece] = []
    samples: list[Any] = []
    held = 0  # samples of the batch in the making, in pieces or samples

    def read(runs: list[RunPiece]) -> list[Any]:
        count(runs)
        return [sample for run, i, j in runs for sample in run.samples(i, j)]

    def made() -> Any:
        if pieces:
            batch = from_runs(pieces) if from_runs is not None else None
            if batch is None:
                return batcher.from_samples(read(pieces))
            count(pieces)
            return batch
        return batcher.from_samples(samples)

    for item in items:
        if isinstance(item, FileRun):
            i = 0
            while i < item.num_samples:
                j = min(item.num_samples, i + batch_size - held)
                if samples:  # the batch began with samples: these come as samples too
                    samples += read([(item, i, j)])
                else:
                    pieces.append((item, i, j))
                held += j - i
                i = j
                if held == batch_size:
                    yield made()
                    pieces, samples, held = [], [], 0
            continue
        if pieces:
            samples, pieces = read(pieces), []
        samples.append(item)
        held += 1
        if held == batch_size:
            yield batcher.from_samples(samples)
            samples, held = [], 0
    if held:
        yield made()


def parse_label(sample: dict[str, Any], field: str, *, hint: str = "") -> int:
    """The integer label in ``sample[field]`` (ASCII digits, as ``.cls``, or an int).

    Raises:
        DecodeError: (a ValueError) the member is not an integer, naming shard, key and
            member; ``hint`` (e.g. ``"; pass ...") is appended as the way out.
    """
    raw = sample[field]
    try:
        return int(bytes(raw) if isinstance(raw, memoryview) else raw)
    except ValueError:
        raise DecodeError(
            f"{sample.get('__shard__')}: sample {sample.get('__key__')!r} member {field!r} is not an integer "
            f"label ({bytes(raw[:40])!r}){hint}"
        ) from None
