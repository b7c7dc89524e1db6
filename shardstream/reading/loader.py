"""The DataLoader reading a dataset's pass, checked at its first sample: batches that the
DataLoader would batch again raise, and a batch size other than the dataset's ``batch_size`` is
warned about (its ``len()`` and the batches it gives would disagree). No torch import: the
DataLoader is found among the calling frames, by the layout of torch's private fetcher, which
is trusted only on the torch versions it was checked on (:data:`KNOWN_TORCH`; on another the
check is off, and said so once: :func:`fetcher_batch_size`)."""

from __future__ import annotations

import functools
import logging
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .assign import in_worker, loaded_torch_version

__all__ = ["KNOWN_TORCH", "checked_by_loader", "fetcher_batch_size", "known_torch"]

log = logging.getLogger("shardstream")

MISBATCHED = 4  # EpochBoard.once flag: warned that the DataLoader batches by another size
UNCHECKED_TORCH = 8  # EpochBoard.once flag: warned that this torch's DataLoader is not checked

# The first and the last torch (major, minor) whose ``_IterableDatasetFetcher`` the frame walk of
# fetcher_batch_size reads: ``fetch(self, possibly_batched_index)`` calling ``next(self.dataset_iter)``
# itself, with ``self.dataset`` and ``self.auto_collation`` set by _BaseDatasetFetcher. That is
# torch/utils/data/_utils/fetch.py in 2.13 and, by the copies of older releases on record, in every
# 1.x and 2.x before (the ``ended`` flag came later and does not matter here). The range starts at
# the oldest torch shardstream supports (pyproject: torch>=2.3) and ends at the newest its tests were
# run on (tests/test_loader_shim.py, torch 2.13.0); raise the end after that test passes on a newer one.
KNOWN_TORCH = ((2, 3), (2, 13))


def checked_by_loader(
    out: Iterator[Any], dataset: object, *, batch_size: int | None, batches: bool, once: Callable[[int], bool]
) -> Iterator[Any]:
    """``out`` (a pass of ``dataset``), once the DataLoader reading it (if any) was checked at the
    first sample (:func:`fetcher_batch_size`; O(1) a pass).

    Args:
        batch_size: the dataset's ``batch_size``; batches: whether ``out`` yields whole batches
            (``collate=``); once: ``EpochBoard.once``, true the first time a flag is asked.

    Raises (from the first ``next``):
        ValueError: ``out`` yields batches and the DataLoader batches them again.
    """
    loader_batch = fetcher_batch_size(dataset, once=once)
    if loader_batch is not None:
        if batches:
            raise ValueError(
                f"ShardDataset(collate=...) hands out whole batches of {batch_size} samples, but the "
                f"DataLoader batches them again (batch_size={loader_batch}); read it with "
                "DataLoader(dataset, batch_size=None)"
            )
        if batch_size is not None and loader_batch != batch_size and once(MISBATCHED):
            _warn(
                f"ShardDataset(batch_size={batch_size}) but the DataLoader batches {loader_batch} samples: "
                f"the dataset cuts each DataLoader worker's share into whole batches of {batch_size}, so "
                "with several workers the DataLoader gives more batches than len(loader) counts (loops that "
                "stop at len(loader), as Lightning and Hugging Face's Trainer do, miss the rest), and "
                "loader_state_dict() refuses it. Give both the same batch size: "
                f"ShardDataset(batch_size={loader_batch}) or DataLoader(batch_size={batch_size})."
            )
    yield from out


def fetcher_batch_size(dataset: object, *, once: Callable[[int], bool] | None = None) -> int | None:
    """The batch size of the DataLoader whose fetcher is asking ``dataset``'s iterator for its
    first sample, where it batches (``auto_collation``); None where it does not, or where no
    torch ``_IterableDatasetFetcher.fetch`` of ``dataset`` is among the calling frames (a plain
    loop), or where torch is not loaded (then no DataLoader can be asking). Its
    ``possibly_batched_index`` is the DataLoader's batch of indices, in the training process
    and in DataLoader workers alike.

    The frames are read only on a torch in :data:`KNOWN_TORCH` (``torch.__version__`` of the
    torch loaded, never imported here). On another torch this answers None, the check is off,
    and that is said once (``once(UNCHECKED_TORCH)``: once per dataset with
    ``EpochBoard.once``; None: once per process): a ``UserWarning`` in the training process, a
    log line in a DataLoader worker, naming the version, the versions known and what to check
    by hand. A warning, not an error: the check only names early, at the first sample, a
    DataLoader set up unlike the dataset (a ``collate=`` dataset batched again, another batch
    size); refusing to read instead would stop every training job on a torch newer than this
    release for want of a check. Nor is the walk tried on an unknown torch: a private layout
    that changed could make it answer wrong as well as not at all.
    """
    version = loaded_torch_version()
    if version is None:
        return None
    if not known_torch(version):
        if (once if once is not None else _once_here)(UNCHECKED_TORCH):
            (first, first_minor), (last, last_minor) = KNOWN_TORCH
            _warn(
                f"shardstream cannot check the DataLoader reading ShardDataset on torch {version}: it reads "
                f"torch's private DataLoader fetcher only on the torch versions it was checked on "
                f"({first}.{first_minor} to {last}.{last_minor}). Until a shardstream that knows this torch, "
                "make sure yourself that a ShardDataset(collate=...) is read with DataLoader(batch_size=None) "
                "and that DataLoader(batch_size=) equals ShardDataset(batch_size=) (else len(loader) and the "
                "batches disagree), or use a torch in that range."
            )
        return None
    return _fetcher_batch_size(dataset)


@functools.lru_cache(maxsize=8)
def known_torch(version: str) -> bool:
    """Whether torch ``version`` (``torch.__version__``, e.g. ``"2.13.0+cpu"``; a pre-release
    counts as its minor version) is in :data:`KNOWN_TORCH`."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        return False
    first, last = KNOWN_TORCH
    return first <= (int(found[1]), int(found[2])) <= last


_warned_here: set[int] = set()


def _once_here(flag: int) -> bool:
    """True the first time this process asks for ``flag`` (when no ``once`` is given)."""
    first = flag not in _warned_here
    _warned_here.add(flag)
    return first


def _fetcher_batch_size(dataset: object) -> int | None:
    """:func:`fetcher_batch_size`'s frame walk, on a torch of :data:`KNOWN_TORCH`."""
    try:
        frame = sys._getframe(3)  # past this function, fetcher_batch_size and the generator that asks
        for _ in range(4):
            if frame is None:
                return None
            fetcher = frame.f_locals.get("self") if frame.f_code.co_name == "fetch" else None
            if fetcher is not None and type(fetcher).__name__ == "_IterableDatasetFetcher":
                index = frame.f_locals.get("possibly_batched_index")
                if getattr(fetcher, "dataset", None) is not dataset or not getattr(fetcher, "auto_collation", False):
                    return None
                return len(index) if isinstance(index, Sequence) else None
            frame = frame.f_back
    except Exception:  # noqa: BLE001 - a check, never a failure of the read
        return None
    return None


def _warn(message: str) -> None:
    """``warnings.warn`` in the training process; in a DataLoader worker, a log line (a
    worker's warnings filters and output are not the training process's)."""
    if in_worker():
        log.warning("%s", message)
    else:
        warnings.warn(message, UserWarning, stacklevel=2)
