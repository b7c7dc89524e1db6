"""The feed of a batched decoder: whole batches of :class:`~.items.Item` s assembled ahead in
a thread (:class:`Feed`), so that the decoder's source callback (DALI's
``fn.external_source``) only takes a ready batch off a queue. Nothing here imports torch or a
decoder.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import DecodeError
from ..reading.repeat import Repeater
from .items import Item

if TYPE_CHECKING:
    import torch

__all__ = ["Batch", "Feed", "reason"]

log = logging.getLogger("shardstream")


class Batch(NamedTuple):
    """A batch handed to the batched decoder: its items (kept until the decoder gives the batch
    back, to decode it on the CPU if the decoder fails) and which of them were decoded on the
    CPU (position -> image)."""

    items: list[Item]
    cpu: dict[int, torch.Tensor]


def reason(problem: str) -> str:
    """A problem without its byte offsets, to count alike ones together."""
    return problem.split(" at byte ")[0]


class Feed:
    """Whole batches assembled ahead in a thread from :class:`Item` s: the decoder's source
    callback (:class:`~shardstream.decode.protocol.BatchSource`) only pops them. Skipped items
    (``on_error="skip"``) are replaced by a repeat of the previous good one (of the next, at
    the start), so every batch keeps its size. Ends the epoch with StopIteration; errors from
    reading are re-raised in the caller's thread.

    Args:
        items: the epoch's items, in order (read by the feed thread).
        batch_size: items per batch.
        drop_last: drop a short last batch (else it is fed).
        prefetch_batches: whole batches assembled ahead.
        batch_timeout_s: the longest wait, in seconds, for one batch from ``items``.
        placeholder: the encoded image (1-D ``uint8``) fed in the place of one decoded on the CPU.
        name: the batched decoder's name, in messages (``"DALI"``).
    """

    _END = object()

    def __init__(
        self,
        items: Iterator[Item],
        *,
        batch_size: int,
        drop_last: bool,
        prefetch_batches: int,
        batch_timeout_s: float,
        placeholder: np.ndarray,
        name: str,
    ) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=prefetch_batches)
        self._batch_timeout_s = batch_timeout_s
        self._placeholder = placeholder
        self._name = name
        self._stop = threading.Event()
        self._args = (items, batch_size, drop_last)
        self.fed: collections.deque[Batch] = collections.deque()  # handed to the decoder, not yet given back
        self.error: BaseException | None = None  # what the reader raised
        self.reader_failed = False  # the reader raised, whether or not the consumer saw it
        self.ended = False
        self.counts: collections.Counter[str] = collections.Counter()  # problems of CPU-decoded images
        self.skipped = 0
        self._thread = threading.Thread(target=self._run, name=f"shardstream-{name.lower()}-feed", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _good(self, items: Iterator[Item]) -> Iterator[Item]:
        """Items with skipped ones replaced by repeats (counted), as the reader does for samples."""
        repeater: Repeater[Item] = Repeater(lambda good, skipped: good._replace(where=skipped.where))
        first: Item | None = None
        for item in items:
            skipped = item.data is None and item.cpu is None
            if skipped:
                self.skipped += 1
                if self.skipped == 1:  # once a pass; stats() counts the rest
                    log.warning("skipping bad samples (first: %s)", item.problem)
                first = first or item
            elif item.problem is not None:
                self.counts[reason(item.problem)] += 1
            yield from repeater.take(item, skipped=skipped)
        if repeater.owed:
            raise DecodeError(f"no image of this epoch's samples could be decoded (first: {first.problem})")

    def _run(self) -> None:
        items, batch_size, drop_last = self._args
        batch: list[Item] = []
        try:
            for item in self._good(items):
                batch.append(item)
                if len(batch) == batch_size:
                    if not self._put(batch):
                        return
                    batch = []
            if batch and not drop_last:
                self._put(batch)
            self._put(self._END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self.reader_failed = True
            self._put(exc)
        finally:
            self._args = None  # type: ignore[assignment]  # the reader goes with the thread, not with the feed

    def _get(self) -> Any:
        """The next batch (or end, or error) from the feed thread, waiting at most
        ``batch_timeout_s``: a reader that is stuck is an error, not a hang."""
        deadline = time.monotonic() + self._batch_timeout_s
        while True:
            try:
                return self._queue.get(timeout=min(1.0, self._batch_timeout_s))
            except queue.Empty:
                if not self._thread.is_alive():  # it always puts END or an error before ending
                    try:
                        return self._queue.get_nowait()
                    except queue.Empty:
                        self.error = RuntimeError(
                            f"the {self._name} feed thread ended without a batch, an end or an error"
                        )
                        raise self.error from None
                if time.monotonic() > deadline:
                    self.error = TimeoutError(  # the reader's failure, not the decoder's: raised as it is
                        f"no batch from the dataset's reader in {self._batch_timeout_s:g} s (batch_timeout_s): "
                        "its reads are stuck; see the log for the store's retries"
                    )
                    raise self.error from None

    def __call__(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The next batch's encoded images and labels (:class:`~shardstream.decode.protocol.BatchSource`).

        Raises:
            StopIteration: the epoch has ended.
            Exception: the reader's error, as it is; TimeoutError: no batch in ``batch_timeout_s``.
        """
        item = self._get()
        if item is self._END:
            self.ended = True
            self._queue.put(item)  # the decoder may ask again while draining its prefetch
            raise StopIteration
        if isinstance(item, BaseException):
            self.error = item
            raise item
        cpu = {i: x.cpu for i, x in enumerate(item) if x.cpu is not None}
        self.fed.append(Batch(item, cpu))
        images = [self._placeholder if x.data is None else np.frombuffer(x.data, dtype=np.uint8) for x in item]
        return images, [np.array([x.label], dtype=np.int64) for x in item]

    def close(self) -> None:
        """Stop the feed thread, waiting at most 10 s (it may be inside the reader)."""
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def running(self) -> bool:
        """The feed thread still runs (after :meth:`close`: still inside the reader)."""
        return self._thread.is_alive()
