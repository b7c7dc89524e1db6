"""The batched GPU loader, of any batched decoder: :class:`GpuLoader` reads a
:class:`~shardstream.dataset.ShardDataset` (in this process, or in DataLoader workers that send
whole batches in shared memory), assembles batches ahead (:class:`~.feed.Feed`), has a
:class:`~shardstream.decode.protocol.BatchDecoder` (a graph: DALI's in :mod:`shardstream.dali`)
decode them, and does the rest the same way for every decoder: the CPU fallback for images the
decoder leaves out or fails on, skipping bad samples (``on_error``), counters, persistent
workers and their shutdown.

Epochs: each iteration is one epoch of the dataset (call :meth:`GpuLoader.set_epoch`). It
yields ``len(loader)`` batches on every rank, because every rank's dataset yields exactly
``len(dataset)`` samples; the short last batch is yielded (``last_batch="partial"``, default)
or dropped (``"drop"``).

torch and the dataset module are imported when a loader is made, not with this module, so
that importing :mod:`shardstream.gpu` stays torch-free.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import gc
import logging
import multiprocessing.util  # noqa: F401 - its exit hook registered before ours, which then runs first
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..decode.protocol import BatchDecoder
from ..errors import DecodeError
from .feed import Batch, Feed
from .items import Default, Encoder, Item, Members, SharedEncoder

if TYPE_CHECKING:
    import torch

    from ..dataset import ShardDataset

__all__ = ["GpuLoader"]

log = logging.getLogger("shardstream")


def _forked(loader: Any) -> Iterator[Any]:
    """``iter(loader)``, whose DataLoader workers are forked here, with the collector's objects
    frozen around the fork: a DALI pipeline of an earlier epoch left as garbage would otherwise be
    collected in a worker, whose ``Pipeline.__del__`` waits forever on DALI threads that exist only
    in this process (a worker then never sends a batch). Garbage is collected here first, where
    those threads run; the workers inherit the rest frozen, as CPython's docs advise for fork."""
    gc.collect()
    gc.freeze()
    try:
        return iter(loader)
    finally:
        gc.unfreeze()


def _shut_down(loader: Any) -> None:
    """Stop a DataLoader's workers: torch tells them to stop and joins each for at most 5 s,
    then terminates it. Done in the caller's thread, not in one of its own: a thread left
    running could hold a lock when the next epoch forks its workers."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()


_OPEN: weakref.WeakSet[GpuLoader] = weakref.WeakSet()  # loaders that may hold persistent workers


@atexit.register  # registered after multiprocessing's own exit hook, so it runs before it
def _close_at_exit() -> None:
    """At interpreter exit, stop every loader's persistent workers the way an epoch's end
    does, so they run their exit hooks (removing their shared-memory slots); else
    multiprocessing would terminate them."""
    for loader in list(_OPEN):
        with contextlib.suppress(Exception):
            loader.close()


class GpuLoader:
    """Batches of decoded images and labels from a :class:`ShardDataset`, decoded by
    ``decoder`` (module doc). A GPU decoder is a :class:`BatchDecoder` given here: a graph,
    not a copy of this loader (:class:`shardstream.dali.DaliLoader` is this loader with DALI's).

    Args:
        dataset: a ShardDataset with ``decode=None`` (raw bytes; the decoder decodes), no
            ``fields=`` of its own (give them here) and no ``collate``.
        decoder: the batched decoder (:class:`~shardstream.decode.protocol.BatchDecoder`).
        batch_size: images per batch.
        fields: which members hold the image and the label: ``{"image": "jpg;jpeg;png",
            "label": "cls"}`` or ``("jpg;jpeg;png", "cls")`` (image first; alternatives
            separated by ``;``, matched case-insensitively by the last dot part of a member's
            name). A single image field gives labels of -1. Replaces ``image_ext`` /
            ``label_ext``: giving both is a ValueError.
        image_ext, label_ext: without ``fields``, the members holding the encoded image and
            the integer label (ASCII, as ``.cls``), named exactly (default ``"jpg"`` and
            ``"cls"``); ``label_ext=None``: labels are -1.
        num_workers: DataLoader processes reading the dataset, each sending ``batch_size``
            encoded images per message (0: a thread of this process reads it).
        persistent_workers: keep the ``num_workers`` processes from one epoch to the next
            (forked once, in the first epoch) until :meth:`close` or until the loader is
            garbage-collected; False: fork them anew each epoch.
        prefetch_batches: whole batches read ahead of the decoder.
        batch_timeout_s: the longest wait, in seconds, for one batch from the reader (the
            feed thread or a DataLoader worker); longer raises TimeoutError instead of hanging.
        last_batch: ``"partial"`` yields the short last batch; ``"drop"`` drops it.

    Images ``decoder.fallback.problem`` sends to the CPU are decoded there by the reader, with
    ``decoder.fallback``, and go into their batch in their place. If the decoder fails on a
    batch, the batches it holds are decoded on the CPU and the decoder's graph is built again.
    An image nobody can decode, and a sample without the image or label member, follow the
    dataset's ``on_error``: ``"raise"`` raises; ``"skip"`` repeats the previous good sample
    in its place, so every rank keeps ``len(loader)`` batches. :meth:`stats` counts all of it.

    Yields:
        ``(images, labels)``: images ``(B, C, H, W)`` (NCHW) of the decoder's dtype on
        ``decoder.device``, labels int64 ``(B,)`` on the same device. ``B`` is
        ``batch_size`` except a partial last batch.

    Raises:
        TypeError: ``decoder`` is not a BatchDecoder.
        ValueError: bad arguments (a dataset that decodes, has fields or a collate; ``fields``
            of another shape, or beside ``image_ext`` / ``label_ext``).
        DecodeError: a label is not an integer (names shard and key); with
            ``on_error="raise"``, an image no decoder can read (names shard, key and
            member), or a sample lacks the image or label member.
        MissingFieldError: (a KeyError) with ``fields`` and ``on_error="raise"``, a sample
            lacks a field: names shard, key, the fields asked for and the members present.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        decoder: BatchDecoder,
        *,
        batch_size: int,
        fields: Mapping[str, str] | Sequence[str] | None = None,
        image_ext: str = Default("jpg"),
        label_ext: str | None = Default("cls"),
        num_workers: int = 0,
        persistent_workers: bool = True,
        prefetch_batches: int = 2,
        batch_timeout_s: float = 300.0,
        last_batch: str = "partial",
    ) -> None:
        if not isinstance(decoder, BatchDecoder):
            raise TypeError(
                f"decoder={decoder!r} is not a BatchDecoder (shardstream.decode.protocol): it needs name, device, "
                "fallback, placeholder, batches(), finish() and close()"
            )
        owner = type(self).__name__
        _check_dataset(dataset, owner=owner, decoder=decoder.name)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"{batch_size=} must be an int >= 1")
        members = Members.of(fields, image_ext, label_ext, owner=owner)
        if last_batch not in ("partial", "drop"):
            raise ValueError(f"{last_batch=} must be 'partial' or 'drop'")
        if prefetch_batches < 1:
            raise ValueError(f"{prefetch_batches=} must be >= 1")
        if not batch_timeout_s > 0:
            raise ValueError(f"{batch_timeout_s=} must be > 0 seconds")
        self.dataset = dataset
        self.decoder = decoder
        self.batch_size = batch_size
        self._members = members
        self.fields = members.fields
        self.image_ext = None if fields is not None else str(image_ext)  # as given, or None with fields
        self.label_ext = None if fields is not None or label_ext is None else str(label_ext)
        self.num_workers = num_workers
        self.persistent_workers = persistent_workers
        self._loader: Any = None  # the DataLoader whose workers persist across epochs
        self._running = False  # an epoch of this loader is being iterated
        self._retired: list[tuple[Any, Feed]] = []  # loaders of failed epochs and their feeds, to stop
        self.prefetch_batches = prefetch_batches
        self.batch_timeout_s = batch_timeout_s
        self.last_batch = last_batch
        self._consumed = 0
        self._stats = {"images": 0, "cpu_decoded": 0, "skipped": 0, "pipeline_rebuilds": 0}
        self._reasons: collections.Counter[str] = collections.Counter()

    def close(self) -> None:
        """Stop the persistent reading workers (``num_workers``), if any, and those of epochs
        that failed, waiting for them to exit (torch joins each for at most 5 s, then
        terminates it); the next epoch forks new ones. An epoch running meanwhile fails.
        Called at interpreter exit for every loader not closed, so that the workers exit
        cleanly and remove their shared-memory slots."""
        loader, self._loader = self._loader, None
        _shut_down(loader)
        self._retire()

    def _retire(self) -> None:
        """Stop the workers of epochs that failed (in this, the caller's thread: before the
        next epoch forks), but for those a feed thread is still inside; those are dropped."""
        while self._retired:
            loader, feed = self._retired.pop()
            if not feed.running:
                _shut_down(loader)

    def stats(self) -> dict[str, Any]:
        """Counters since this loader was made: ``images`` yielded, ``cpu_decoded`` (decoded
        on the CPU instead of by the decoder: odd formats, damaged files, batches the decoder
        failed on), ``skipped`` (undecodable, replaced by a repeat under ``on_error="skip"``),
        ``pipeline_rebuilds`` (decoder failures recovered from), and ``cpu_reasons``: why,
        by kind (e.g. ``{"not a JPEG": 3, "junk before a marker": 1}``)."""
        return {**self._stats, "cpu_reasons": dict(self._reasons)}

    @property
    def device(self) -> torch.device:
        """Where batches are: the decoder's device (``cuda:N``, or the CPU)."""
        return self.decoder.device

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        n = len(self.dataset)
        return n // self.batch_size if self.last_batch == "drop" else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The data state after the batches yielded so far in this epoch (see
        :meth:`ShardDataset.state_dict`); resume with ``loader.dataset.load_state_dict``."""
        batch_size = self.batch_size if self.num_workers else None
        return self.dataset.state_dict(self._consumed, batch_size=batch_size, num_workers=self.num_workers)

    def _encoder(self) -> Encoder:
        return Encoder(self._members, self.decoder.fallback, self.dataset.on_error, self.decoder.name)

    def _items(self, keep: bool = False) -> Iterator[Item]:
        """The samples as :class:`~.items.Item` s in the dataset's order: read here, or by
        DataLoader workers that each send ``batch_size`` of them at a time (round-robin over
        workers, each worker's last batch possibly short), which ``state_dict`` accounts for.

        The workers are forked here, in the caller's thread, before the epoch's feed thread
        and the decoder start: a fork while those threads run can copy a lock one of them
        holds into the worker, which then never sends a batch. With ``keep`` they are the
        persistent workers (forked in the first epoch, reset in the next ones); else they are
        the epoch's own.
        """
        encoder = self._encoder()
        if self.num_workers == 0:
            return (encoder.item(sample) for sample in self.dataset)
        from torch.utils.data import DataLoader

        self._retire()
        loader = self._loader if keep else None
        if loader is not None:
            try:
                batches = iter(loader)  # the workers reset for this epoch
            except RuntimeError as exc:  # they did not come back from the last one (torch): new ones
                log.warning("%s's reading workers did not reset (%s); starting new ones", type(self).__name__, exc)
                self._loader = None
                _shut_down(loader)
                loader = None
        if loader is None:
            loader = DataLoader(
                self.dataset,
                batch_size=self.batch_size,
                num_workers=self.num_workers,
                collate_fn=SharedEncoder(encoder),
                timeout=self.batch_timeout_s,
                persistent_workers=keep,
            )
            if keep:
                self._loader = loader
                _OPEN.add(self)
            try:
                batches = _forked(loader)
            except BaseException:
                if keep:
                    self._loader = None
                raise
        return (item for batch in batches for item in SharedEncoder.items(batch))

    def _on_cpu(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole batch decoded on the CPU (the decoder failed on it or on one beside it)."""
        import torch

        encoder = self._encoder()
        failed = f"{self.decoder.name} failed on its batch"
        images = []
        for i, item in enumerate(batch.items):
            if i in batch.cpu:
                images.append(batch.cpu[i])
                continue
            assert item.data is not None  # internal invariant: not CPU-decoded means the decoder's bytes
            done = encoder.on_cpu(item.data, item.label, failed, item.where)
            if done.cpu is None:  # undecodable, on_error="skip": a repeat of a good one
                self._stats["skipped"] += 1
                log.warning("skipping a sample: %s", done.problem)
            else:
                self._stats["cpu_decoded"] += 1
                self._reasons[failed] += 1
            images.append(done.cpu)
        good = [x for x in images if x is not None]
        if not good:
            raise DecodeError(
                f"no image of a batch {self.decoder.name} failed on can be decoded ({batch.items[0].where}, ...)"
            )
        filled = [x if x is not None else good[0] for x in images]
        labels = torch.tensor([x.label for x in batch.items], dtype=torch.int64, device=self.device)
        return self.decoder.finish(torch.stack(filled)), labels

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._running:
            raise RuntimeError(
                f"{type(self).__name__}: an epoch of this loader is still being iterated; finish it, or drop its "
                "iterator (del it, or leave its loop), before starting another: two epochs at once would read the "
                "dataset twice at once"
            )
        keep = self.persistent_workers
        self._running = True
        try:
            items = self._items(keep)
        except BaseException:
            self._running = False
            raise
        feed = Feed(
            items,
            batch_size=self.batch_size,
            drop_last=self.last_batch == "drop",
            prefetch_batches=self.prefetch_batches,
            batch_timeout_s=self.batch_timeout_s,
            placeholder=self.decoder.placeholder,
            name=self.decoder.name,
        )
        self._consumed = 0
        failed = True  # an epoch that raised: its workers are not reused
        try:
            yield from self._decoded(feed)
            failed = False
        except GeneratorExit:  # the caller left the epoch early: the workers are reset and reused
            failed = False
            raise
        finally:
            self._running = False
            self._end_epoch(feed, keep=keep, failed=failed)

    def _decoded(self, feed: Feed) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's batches: the decoder's, the images decoded on the CPU put in their places;
        when the decoder fails, the batches it holds decoded on the CPU and its graph built again
        for the rest (at most 3 failures in a row)."""
        decoder = self.decoder
        failures = 0  # in a row, with no batch from the decoder between them
        while not (feed.ended and not feed.fed):
            batches = decoder.batches(feed)
            try:
                for images, labels in batches:
                    batch = feed.fed.popleft()
                    for i, image in batch.cpu.items():  # decoded on the CPU: in their places
                        images[i] = decoder.finish(image[None])[0]
                    failures = 0
                    yield self._count(images, labels)
                break
            except Exception as exc:
                if feed.error is not None:  # the reader's error, passed through the decoder
                    raise feed.error from None
                failures += 1
                if failures > 3:
                    raise
                # The decoder failed on an image it took: its graph is dead. The batches it
                # holds are decoded on the CPU; a new graph takes the rest.
                self._stats["pipeline_rebuilds"] += 1
                log.warning(
                    "%s failed (%s); decoding its %d batches on the CPU and rebuilding the pipeline",
                    decoder.name,
                    str(exc).strip().splitlines()[0][:300],
                    len(feed.fed),
                )
                while feed.fed:
                    yield self._count(*self._on_cpu(feed.fed.popleft()))
            finally:
                close = getattr(batches, "close", None)  # a generator's: the graph goes with it
                if close is not None:
                    close()
                del batches

    def _end_epoch(self, feed: Feed, *, keep: bool, failed: bool) -> None:
        """Stop the feed; retire persistent workers whose epoch failed (a worker's error, a
        timeout), or that the feed thread still waits on: the next epoch forks new ones, and
        stops these first (close() and the interpreter's exit do too), so the error is raised
        now, not after torch's joins of workers that may be stuck. Counters taken in."""
        feed.close()
        if keep and (failed or feed.running or feed.reader_failed) and self._loader is not None:
            self._retired.append((self._loader, feed))
            self._loader = None
        self._stats["skipped"] += feed.skipped
        feed.skipped = 0
        self._reasons.update(feed.counts)
        self._stats["cpu_decoded"] += sum(feed.counts.values())
        feed.counts.clear()

    def _count(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._consumed += len(labels)
        self._stats["images"] += len(labels)
        return images, labels


def _check_dataset(dataset: Any, *, owner: str, decoder: str) -> None:
    """``dataset`` is a ShardDataset that gives raw samples one at a time.

    Raises:
        ValueError: it is not a ShardDataset, or has ``fields=``, a ``decode`` or a ``collate``.
    """
    from ..dataset import ShardDataset  # here: importing shardstream.gpu stays torch-free

    if not isinstance(dataset, ShardDataset):
        raise ValueError(f"dataset must be a ShardDataset, not {type(dataset).__name__}")
    if getattr(dataset, "fields", None) is not None:  # before decode: fields= sets one
        raise ValueError(
            f"construct the ShardDataset without fields=: {owner} picks the members itself; "
            f"pass the fields to {owner}(fields=...) instead"
        )
    if dataset.decode is not None:
        raise ValueError(f"construct the ShardDataset with decode=None: {decoder} decodes the raw bytes")
    if dataset.collate is not None:
        raise ValueError(f"construct the ShardDataset without collate=: {owner} makes its own batches of the samples")
