"""The DataLoader reading a dataset's pass, checked at its first sample: batches that the
DataLoader would batch again raise, and a batch size other than the dataset's ``batch_size`` is
warned about (its ``len()`` and the batches it gives would disagree). No torch import: the
DataLoader is found among the calling frames."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .assign import in_worker

__all__ = ["checked_by_loader", "fetcher_batch_size"]

log = logging.getLogger("shardstream")

MISBATCHED = 4  # EpochBoard.once flag: warned that the DataLoader batches by another size


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
    loader_batch = fetcher_batch_size(dataset)
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


def fetcher_batch_size(dataset: object) -> int | None:
    """The batch size of the DataLoader whose fetcher is asking ``dataset``'s iterator for its
    first sample, where it batches (``auto_collation``); None where it does not, or where no
    torch ``_IterableDatasetFetcher.fetch`` of ``dataset`` is among the calling frames (another
    torch, a plain loop). Its ``possibly_batched_index`` is the DataLoader's batch of indices,
    in the training process and in DataLoader workers alike."""
    try:
        frame = sys._getframe(2)  # past this function and the generator that asks
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
