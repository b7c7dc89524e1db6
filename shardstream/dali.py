"""NVIDIA DALI decoding and augmentation of :class:`~shardstream.dataset.ShardDataset` samples.

The only module that imports DALI (``pip install shardstream[dali]``, which installs
``nvidia-dali-cuda120``). shardstream streams the encoded bytes (S3 ranged reads, exact
epochs, resume); DALI decodes them: ``fn.decoders.image_random_crop`` on the GPU
(``device="mixed"``: nvJPEG and the hardware JPEG decoder) or, with ``device_id=None``, the
same pipeline on the CPU, then a resize, a random horizontal flip and normalisation. For
evaluation (``resize_shorter_px``) it is ``fn.decoders.image``, ``fn.resize(resize_shorter=)``
and a centre crop, with no flip.

A feeder thread assembles whole batches of encoded bytes and labels ``prefetch_batches``
ahead, read in this process or by DataLoader workers (``num_workers``) that send
``batch_size`` encoded images per message, in one shared-memory block
(:class:`~shardstream.collate.ByteBatch`: not pickled), so DALI's ``fn.external_source``
callback only takes a ready batch off a queue; DALI copies it into its own pinned staging
buffers for the GPU.

Epochs: each iteration of a :class:`DaliLoader` is one epoch of the dataset (call
:meth:`DaliLoader.set_epoch`). It yields ``len(loader)`` batches on every rank, because
every rank's dataset yields exactly ``len(dataset)`` samples; the short last batch is
yielded (``last_batch="partial"``, default) or dropped (``"drop"``).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import gc
import io
import logging
import queue
import random
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from .collate import ByteBatch, ByteCollate
from .dataset import ShardDataset
from .decode.check import gpu_jpeg_problem
from .decode.cpu import RandomResizedCrop, to_rgb
from .decode.reasons import IMAGE_WAYS_OUT, why_undecodable
from .errors import DecodeError
from .fields import Fields, FieldSpec, MissingFieldError
from .reading.batching import parse_label
from .reading.repeat import Repeater

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "DaliLoader", "dali_available", "gpu_available"]

log = logging.getLogger("shardstream")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _import_dali() -> Any:
    try:
        import nvidia.dali as dali
    except ImportError as exc:
        raise ImportError(
            "shardstream.dali needs NVIDIA DALI: pip install 'shardstream[dali]' (nvidia-dali-cuda120; "
            "for a CUDA 13 build of torch, pip install nvidia-dali-cuda130)"
        ) from exc
    return dali


def dali_available() -> bool:
    """Whether NVIDIA DALI can be imported."""
    try:
        _import_dali()
    except ImportError:
        return False
    return True


def gpu_available() -> bool:
    """Whether DALI sees a CUDA GPU and torch can use it (else pipelines run on the CPU)."""
    if not torch.cuda.is_available():
        return False
    _import_dali()
    from nvidia.dali.backend import GetCUDADeviceCount

    return GetCUDADeviceCount() > 0


class _Item(NamedTuple):
    """One sample on its way to a batch: ``data`` (encoded JPEG bytes DALI decodes) or
    ``cpu`` (the image already decoded and augmented on the CPU: ``torch.uint8``
    ``(3, crop_px, crop_px)``), or neither (undecodable or lacking a member, skipped by
    ``on_error="skip"``)."""

    data: bytes | np.ndarray | None  # an ndarray: a view into a worker's shared batch
    label: int
    cpu: torch.Tensor | None
    problem: str | None  # why it is not decoded by DALI (None: it is)
    where: str  # "shard: sample 'key', member 'jpg'", for errors


class _Default(str):
    """The default of ``image_ext`` / ``label_ext``: a ``str`` equal to it, told apart from the
    same value given by the caller (which ``fields=`` refuses beside it)."""


@dataclass(frozen=True)
class _Members:
    """Which members of a sample hold the image and the label: the fields of ``fields=``
    (matched by :meth:`Fields.match`: case-insensitively, by the last dot part of the member's
    name, the first alternative present winning), or else the members named exactly
    ``image_ext`` and ``label_ext`` (None: no label, -1)."""

    fields: Fields | None
    image: str  # image_ext; with fields, the name of the image field
    label: str | None  # label_ext; with fields, the name of the label field (None: no label)

    @classmethod
    def of(cls, fields: FieldSpec | None, image_ext: str, label_ext: str | None) -> _Members:
        """``fields=`` checked for DaliLoader, or the extension arguments.

        Raises:
            ValueError: ``fields`` with ``image_ext`` / ``label_ext`` given too, or a spec that is
                not one image field, or an image and a label field (the message quotes it).
        """
        if fields is None:
            return cls(None, str(image_ext), None if label_ext is None else str(label_ext))
        given = [
            f"{name}={value!r}"
            for name, value in (("image_ext", image_ext), ("label_ext", label_ext))
            if not isinstance(value, _Default)
        ]
        if given:
            raise ValueError(
                f"fields={fields!r} and {', '.join(given)} are both given: fields= replaces the extension "
                "arguments; pass one of them"
            )
        shapes = "{'image': 'jpg;jpeg;png', 'label': 'cls'} or ('jpg;jpeg;png', 'cls') (a label-less ('jpg;jpeg',))"
        try:
            parsed = Fields.parse(fields)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"DaliLoader(fields=...): {exc}; DaliLoader takes {shapes}") from exc
        if parsed.as_tuple:
            if len(parsed.names) > 2:
                raise ValueError(
                    f"fields={fields!r} names {len(parsed.names)} fields; DaliLoader yields (images, labels): "
                    f"give the image field first, then the label field: {shapes}"
                )
            return cls(parsed, parsed.names[0], parsed.names[1] if len(parsed.names) == 2 else None)
        if "image" not in parsed.names or not set(parsed.names) <= {"image", "label"}:
            raise ValueError(
                f"fields={fields!r}: DaliLoader takes the keys 'image' and, optionally, 'label' "
                f"(it yields (images, labels)), got {list(parsed.names)}: {shapes}"
            )
        return cls(parsed, "image", "label" if "label" in parsed.names else None)

    def pick(self, sample: dict[str, Any]) -> tuple[str, str | None]:
        """The names of the sample's image member and label member (None: no label).

        Raises:
            MissingFieldError: (with ``fields``) the sample lacks one; names the shard, the key,
                the fields asked for and the members the sample has.
            DecodeError: (without) the same, naming the extension asked for.
        """
        if self.fields is None:
            for ext in (self.image, self.label):
                if ext is not None and ext not in sample:
                    raise DecodeError(
                        f"{sample.get('__shard__')}: sample {sample.get('__key__')!r} has no {ext!r} member "
                        f"(it has {sorted(k for k in sample if not k.startswith('__'))}); set image_ext / label_ext, "
                        "or pass fields=('jpg;jpeg', 'cls') to match extensions case-insensitively"
                    )
            return self.image, self.label
        try:
            chosen = dict(zip(self.fields.names, self.fields.match(sample)))
        except MissingFieldError as exc:  # again, with the shard and key, as the CPU reader does
            raise MissingFieldError(
                f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}: {exc}; add the alternative the "
                "sample has to fields=, or pass ShardDataset(on_error='skip') to skip such samples (counted in "
                "DaliLoader.stats()['skipped'])"
            ) from None
        return chosen[self.image], None if self.label is None else chosen[self.label]


@dataclass(frozen=True)
class _ResizeCenterCrop:
    """What DALI's evaluation pipeline (``decoders.image`` with EXIF orientation applied,
    ``resize(resize_shorter=shorter_px)``, a ``size_px`` square crop at the centre) makes of
    image bytes, done with Pillow on the CPU, to the same rounding as DALI's: the resized
    longer side and the crop's corner are rounded half up, and the scale is exactly
    ``shorter / shorter_px`` on both axes (DALI's ``subpixel_scale``), the resized image
    centred on the source. Only the crop's pixels are resampled (Pillow's ``resize`` with a
    ``box``, bilinear and antialiased as DALI's linear resize): within 1 level of DALI's CPU
    pipeline on photos (tests/test_dali_fields.py)."""

    shorter_px: int
    size_px: int

    def box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The crop's area ``(left, top, right, bottom)`` in pixels of a ``width`` x ``height`` image."""
        short = min(width, height)
        scale = short / self.shorter_px  # source pixels per output pixel
        out_w = (2 * width * self.shorter_px + short) // (2 * short)  # round(width / scale), half up
        out_h = (2 * height * self.shorter_px + short) // (2 * short)
        left = (out_w - self.size_px + 1) // 2  # DALI's crop_pos 0.5, rounded half up
        top = (out_h - self.size_px + 1) // 2
        x0 = (width - out_w * scale) / 2 + left * scale
        y0 = (height - out_h * scale) / 2 + top * scale
        span = self.size_px * scale
        return max(0.0, x0), max(0.0, y0), min(float(width), x0 + span), min(float(height), y0 + span)

    def augment(self, data: bytes, rng: Any, *, flip_p: float = 0.0) -> torch.Tensor:
        """A ``torch.uint8`` tensor ``(3, size_px, size_px)``; ``rng`` and ``flip_p`` (0 here) are
        for the interface of :meth:`RandomResizedCrop.augment`.

        Raises:
            OSError, ValueError, SyntaxError: Pillow cannot decode ``data``.
        """
        from PIL import Image, ImageOps

        image = Image.open(io.BytesIO(data))
        image.load()  # decode it all here, so a damaged file fails here
        image = to_rgb(ImageOps.exif_transpose(image))
        size = (self.size_px, self.size_px)
        out = image.resize(size, Image.Resampling.BILINEAR, box=self.box(*image.size))
        tensor = torch.from_numpy(np.array(out)).permute(2, 0, 1).contiguous()
        return tensor.flip(-1) if flip_p and rng.random() < flip_p else tensor


@dataclass(frozen=True)
class _Encoder:
    """The DataLoader collate of the readers (workers, or a thread of this process): each
    sample's image bytes and label, and for an image DALI's GPU decoders would reject (see
    :mod:`shardstream.decode.check`) or cannot read (not a JPEG), the image decoded and
    augmented here with Pillow instead. A worker sends a batch of them in one message."""

    members: _Members
    crop: RandomResizedCrop | _ResizeCenterCrop
    flip_p: float
    on_error: str
    check_images: bool

    def __call__(self, samples: list[dict[str, Any]]) -> list[_Item]:
        return [self.item(sample) for sample in samples]

    from_samples = __call__  # a Batcher (shardstream.reading.batching)

    def item(self, sample: dict[str, Any]) -> _Item:
        try:
            image, label_member = self.members.pick(sample)
        except (DecodeError, MissingFieldError) as exc:  # a member missing: a bad sample, as an undecodable one
            if self.on_error == "raise":
                raise
            return _Item(None, -1, None, str(exc), f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}")
        data = sample[image]
        label = -1 if label_member is None else parse_label(sample, label_member)
        where = f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}, member {image!r}"
        problem = gpu_jpeg_problem(data) if self.check_images else None
        if problem is None:
            return _Item(data, label, None, None, where)
        return self.on_cpu(data, label, problem, where)

    def on_cpu(self, data: bytes, label: int, problem: str, where: str) -> _Item:
        """The item decoded by Pillow; undecodable: ``on_error`` ("raise": DecodeError)."""
        try:
            return _Item(None, label, self.crop.augment(data, random, flip_p=self.flip_p), problem, where)
        except Exception as exc:  # Pillow raises many kinds for bad input
            reason = why_undecodable(data, exc)
            checked = "" if not data else f" (DALI's check: {problem})"
            error = DecodeError(f"{where}: no decoder can read this image: {reason}{checked}; {IMAGE_WAYS_OUT}")
            if self.on_error == "raise":
                raise error from exc
            return _Item(None, label, None, str(error), where)


@dataclass(frozen=True)
class _SharedEncoder:
    """The workers' collate: a batch of :class:`_Item` s with the encoded images in one
    shared-memory block (:class:`~shardstream.collate.ByteBatch`), which crosses to this
    process without pickling; :meth:`items` gives the items back here, each image a numpy
    view into the block (which DALI copies from)."""

    encoder: _Encoder

    def __call__(self, samples: list[dict[str, Any]]) -> ByteBatch:
        return self.from_samples(samples)

    def from_samples(self, samples: list[dict[str, Any]]) -> ByteBatch:
        """The batch of ``samples`` (a :class:`~shardstream.reading.batching.Batcher`)."""
        return ByteCollate()(
            [
                {
                    "__key__": x.where,
                    "data": b"" if x.data is None else x.data,
                    "encoded": x.data is not None,
                    "label": x.label,
                    "cpu": x.cpu,
                    "problem": x.problem,
                }
                for x in self.encoder(samples)
            ]
        )

    @staticmethod
    def items(batch: ByteBatch) -> Iterator[_Item]:
        for where, data, encoded, label, cpu, problem in zip(
            batch.keys, batch.arrays("data"), batch["encoded"], batch["label"], batch["cpu"], batch["problem"]
        ):
            yield _Item(data if encoded else None, label, cpu, problem, where)


class _Batch(NamedTuple):
    """A batch handed to DALI: its items (kept until DALI gives the batch back, to decode it
    on the CPU if DALI fails) and which of them were decoded on the CPU (position -> image)."""

    items: list[_Item]
    cpu: dict[int, torch.Tensor]


class _Feed:
    """Whole batches assembled ahead in a thread from :class:`_Item` s: DALI's callback only
    pops them. Skipped items (``on_error="skip"``) are replaced by a repeat of the previous
    good one (of the next, at the start), so every batch keeps its size. Ends the epoch with
    StopIteration; errors from reading are re-raised in the caller's thread."""

    _END = object()

    def __init__(
        self,
        items: Iterator[_Item],
        *,
        batch_size: int,
        drop_last: bool,
        prefetch_batches: int,
        batch_timeout_s: float,
    ) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=prefetch_batches)
        self._batch_timeout_s = batch_timeout_s
        self._stop = threading.Event()
        self._args = (items, batch_size, drop_last)
        self.fed: collections.deque[_Batch] = collections.deque()  # handed to DALI, not yet given back
        self.error: BaseException | None = None  # what the reader raised
        self.reader_failed = False  # the reader raised, whether or not the consumer saw it
        self.ended = False
        self.counts: collections.Counter[str] = collections.Counter()  # problems of CPU-decoded images
        self.skipped = 0
        self._thread = threading.Thread(target=self._run, name="shardstream-dali-feed", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _good(self, items: Iterator[_Item]) -> Iterator[_Item]:
        """Items with skipped ones replaced by repeats (counted), as the reader does for samples."""
        repeater: Repeater[_Item] = Repeater(lambda good, skipped: good._replace(where=skipped.where))
        first: _Item | None = None
        for item in items:
            skipped = item.data is None and item.cpu is None
            if skipped:
                self.skipped += 1
                if self.skipped == 1:  # once a pass; stats() counts the rest
                    log.warning("skipping bad samples (first: %s)", item.problem)
                first = first or item
            elif item.problem is not None:
                self.counts[_reason(item.problem)] += 1
            yield from repeater.take(item, skipped=skipped)
        if repeater.owed:
            raise DecodeError(f"no image of this epoch's samples could be decoded (first: {first.problem})")

    def _run(self) -> None:
        items, batch_size, drop_last = self._args
        batch: list[_Item] = []
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
                        self.error = RuntimeError("the DALI feed thread ended without a batch, an end or an error")
                        raise self.error from None
                if time.monotonic() > deadline:
                    self.error = TimeoutError(  # the reader's failure, not DALI's: raised as it is
                        f"no batch from the dataset's reader in {self._batch_timeout_s:g} s (batch_timeout_s): "
                        "its reads are stuck; see the log for the store's retries"
                    )
                    raise self.error from None

    def __call__(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        item = self._get()
        if item is self._END:
            self.ended = True
            self._queue.put(item)  # DALI may ask again while draining its prefetch
            raise StopIteration
        if isinstance(item, BaseException):
            self.error = item
            raise item
        cpu = {i: x.cpu for i, x in enumerate(item) if x.cpu is not None}
        self.fed.append(_Batch(item, cpu))
        images = [_PLACEHOLDER if x.data is None else np.frombuffer(x.data, dtype=np.uint8) for x in item]
        return images, [np.array([x.label], dtype=np.int64) for x in item]

    def close(self) -> None:
        """Stop the feed thread, waiting at most 10 s (it may be inside the reader)."""
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def running(self) -> bool:
        """The feed thread still runs (after :meth:`close`: still inside the reader)."""
        return self._thread.is_alive()


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


def _reason(problem: str) -> str:
    """A problem without its byte offsets, to count alike ones together."""
    return problem.split(" at byte ")[0]


def _placeholder_jpeg() -> np.ndarray:
    """A tiny JPEG that DALI decodes in the place of an image decoded on the CPU (whose
    output then replaces it)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (128, 128, 128)).save(out, "JPEG")
    return np.frombuffer(out.getvalue(), dtype=np.uint8)


_PLACEHOLDER = _placeholder_jpeg()


def _shut_down(loader: Any) -> None:
    """Stop a DataLoader's workers: torch tells them to stop and joins each for at most 5 s,
    then terminates it. Done in the caller's thread, not in one of its own: a thread left
    running could hold a lock when the next epoch forks its workers."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()


_OPEN: weakref.WeakSet[DaliLoader] = weakref.WeakSet()  # loaders that may hold persistent workers


@atexit.register  # registered after multiprocessing's own exit hook, so it runs before it
def _close_at_exit() -> None:
    """At interpreter exit, stop every loader's persistent workers the way an epoch's end
    does, so they run their exit hooks (removing their shared-memory slots); else
    multiprocessing would terminate them."""
    for loader in list(_OPEN):
        with contextlib.suppress(Exception):
            loader.close()


class DaliLoader:
    """Batches of decoded, augmented images from a :class:`ShardDataset`, decoded by DALI.

    Args:
        dataset: a ShardDataset with ``decode=None`` (raw bytes; DALI decodes) and no
            ``fields=`` of its own (give them here).
        batch_size: images per batch.
        fields: which members hold the image and the label, as ``ShardDataset(fields=...)``
            takes them: ``{"image": "jpg;jpeg;png", "label": "cls"}`` or
            ``("jpg;jpeg;png", "cls")`` (image first). Alternatives are separated by ``;`` and
            match the last dot part of a member's name case-insensitively (``"jpg;jpeg"``
            finds a ``JPEG`` member), the first present winning. A single image field
            (``{"image": "jpg;jpeg"}`` or ``("jpg;jpeg",)``) gives labels of -1. Replaces
            ``image_ext`` / ``label_ext``: giving both is a ValueError.
        image_ext, label_ext: without ``fields``, the members holding the encoded image and
            the integer label (ASCII, as ``.cls``), named exactly (default ``"jpg"`` and
            ``"cls"``); ``label_ext=None``: labels are -1.
        crop_px: output height and width in pixels: of the random resized crop (training),
            or of the centre crop (with ``resize_shorter_px``).
        resize_shorter_px: evaluation instead of training augmentation: each whole image
            is resized so that its shorter side is this many pixels (aspect ratio kept), then
            the centre ``crop_px`` x ``crop_px`` square is cut out; no flip (torchvision's
            ``Resize(256)`` + ``CenterCrop(224)`` with ``resize_shorter_px=256, crop_px=224``).
            Must be at least ``crop_px``. None (default): training augmentation.
        scale: range of the crop's area as a fraction of the image's (training only;
            default ``(0.08, 1.0)``).
        ratio: range of the crop's aspect ratio, width / height (training only; default
            ``(3/4, 4/3)``).
        flip_p: probability of a horizontal flip (training only; default 0.5).
        mean, std: per-channel normalisation, in units of the [0, 1] range (ImageNet's by
            default); ignored for ``dtype=torch.uint8``.
        dtype: ``torch.float32`` (normalised) or ``torch.uint8`` (0-255, not normalised).
        device_id: the GPU to decode on (``"auto"``: ``LOCAL_RANK``'s GPU when DALI sees one,
            else the CPU); ``None``: the CPU.
        num_threads: DALI CPU threads.
        num_workers: DataLoader processes reading the dataset, each sending ``batch_size``
            encoded images per message (0: a thread of this process reads it).
        persistent_workers: keep the ``num_workers`` processes from one epoch to the next
            (forked once, in the first epoch) until :meth:`close` or until the loader is
            garbage-collected; False: fork them anew each epoch.
        prefetch_batches: whole batches read ahead of DALI.
        batch_timeout_s: the longest wait, in seconds, for one batch from the reader (the
            feed thread or a DataLoader worker); longer raises TimeoutError instead of hanging.
        last_batch: ``"partial"`` yields the short last batch; ``"drop"`` drops it.
        seed: DALI's random seed (crops, flips); rank-specific seeds are derived from it.
            Evaluation has no randomness.
        check_images: check each image's structure before DALI sees it
            (:func:`shardstream.decode.check.gpu_jpeg_problem`, ~4 µs an image) and decode
            those it would reject on the CPU. False: every image goes to DALI (a failure
            still falls back, a batch at a time, at the cost of rebuilding the pipeline).

    Odd images (README, "DALI and odd images"): plain 8-bit JPEGs (baseline or progressive,
    grey or colour) go to DALI. Anything else (PNG, WebP, GIF, 16-bit PNG, CMYK JPEG, and
    JPEGs that are damaged in ways Pillow tolerates and DALI does not) is decoded with Pillow
    by the reader (a DataLoader worker or the feed thread) with the same augmentation: random
    resized crop of the same ``scale`` and ``ratio``, EXIF orientation applied (as DALI does),
    resize, flip, normalisation (for evaluation: the same resize of the shorter side and
    centre crop, to DALI's rounding), so it comes out with the same shape and dtype and goes
    into its batch in its place. If DALI still fails on a batch, the pipeline is rebuilt and
    the batches it held are decoded on the CPU. An image nobody can decode, and a sample
    without the image or label member, follow the dataset's ``on_error``: ``"raise"`` raises
    DecodeError naming shard, key and member (MissingFieldError, with ``fields``, naming
    shard, key, the fields asked for and the members present); ``"skip"`` repeats the
    previous good sample in its place, so every rank keeps ``len(loader)`` batches.
    :meth:`stats` counts all of it.

    Yields:
        ``(images, labels)``: images ``(B, 3, crop_px, crop_px)`` (NCHW) of ``dtype`` on
        ``cuda:device_id`` (or the CPU), labels int64 ``(B,)`` on the same device. ``B`` is
        ``batch_size`` except a partial last batch.

    Raises:
        ImportError: DALI is not installed (names the extra to install).
        ValueError: bad arguments (``fields`` of another shape, or beside ``image_ext`` /
            ``label_ext``; ``scale``, ``ratio`` or ``flip_p`` with ``resize_shorter_px``).
        DecodeError: a label is not an integer (names shard and key); with
            ``on_error="raise"``, an image no decoder can read (names shard, key and
            member), or a sample lacks the image or label member (names shard, key, the
            extension asked for and the members present).
        MissingFieldError: (a KeyError; :mod:`shardstream.fields`) with ``fields`` and
            ``on_error="raise"``, a sample lacks a field: names shard, key, the fields asked
            for and the members present.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        *,
        batch_size: int,
        fields: Mapping[str, str] | Sequence[str] | None = None,
        image_ext: str = _Default("jpg"),
        label_ext: str | None = _Default("cls"),
        crop_px: int = 224,
        resize_shorter_px: int | None = None,
        scale: tuple[float, float] | None = None,
        ratio: tuple[float, float] | None = None,
        flip_p: float | None = None,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
        device_id: int | str | None = "auto",
        num_threads: int = 2,
        num_workers: int = 0,
        persistent_workers: bool = True,
        prefetch_batches: int = 2,
        batch_timeout_s: float = 300.0,
        last_batch: str = "partial",
        seed: int = 0,
        check_images: bool = True,
    ) -> None:
        _import_dali()
        if not isinstance(dataset, ShardDataset):
            raise ValueError(f"dataset must be a ShardDataset, not {type(dataset).__name__}")
        if getattr(dataset, "fields", None) is not None:  # before decode: fields= sets one
            raise ValueError(
                "construct the ShardDataset without fields=: DaliLoader picks the members itself; "
                "pass the fields to DaliLoader(fields=...) instead"
            )
        if dataset.decode is not None:
            raise ValueError("construct the ShardDataset with decode=None: DALI decodes the raw bytes")
        if dataset.collate is not None:
            raise ValueError(
                "construct the ShardDataset without collate=: DaliLoader makes its own batches of the samples"
            )
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"{batch_size=} must be an int >= 1")
        members = _Members.of(fields, image_ext, label_ext)
        if not isinstance(crop_px, int) or crop_px < 1:
            raise ValueError(f"{crop_px=} must be an int >= 1")
        if resize_shorter_px is not None:
            if not isinstance(resize_shorter_px, int) or resize_shorter_px < crop_px:
                raise ValueError(
                    f"{resize_shorter_px=} must be an int >= crop_px ({crop_px}): the centre crop is cut from "
                    "the image resized to it"
                )
            training = [n for n, v in (("scale", scale), ("ratio", ratio), ("flip_p", flip_p)) if v is not None]
            if training:
                raise ValueError(
                    f"{', '.join(training)} set the training crop and flip; with {resize_shorter_px=} the loader "
                    "resizes and centre-crops each image, with no flip: leave them out"
                )
        if last_batch not in ("partial", "drop"):
            raise ValueError(f"{last_batch=} must be 'partial' or 'drop'")
        if dtype not in (torch.float32, torch.uint8):
            raise ValueError(f"{dtype=} must be torch.float32 or torch.uint8")
        if prefetch_batches < 1:
            raise ValueError(f"{prefetch_batches=} must be >= 1")
        if not batch_timeout_s > 0:
            raise ValueError(f"{batch_timeout_s=} must be > 0 seconds")
        if device_id == "auto":
            import os

            device_id = int(os.environ.get("LOCAL_RANK", "0")) if gpu_available() else None
        self.dataset = dataset
        self.batch_size = batch_size
        self._members = members
        self.fields = members.fields
        self.image_ext = None if fields is not None else str(image_ext)  # as given, or None with fields
        self.label_ext = None if fields is not None or label_ext is None else str(label_ext)
        self.crop_px, self.resize_shorter_px = crop_px, resize_shorter_px
        if resize_shorter_px is None:  # training: a random resized crop and a flip
            self.scale = (0.08, 1.0) if scale is None else tuple(scale)
            self.ratio = (3 / 4, 4 / 3) if ratio is None else tuple(ratio)
            self.flip_p = 0.5 if flip_p is None else flip_p
        else:  # evaluation: resize and centre crop
            self.scale = self.ratio = None
            self.flip_p = 0.0
        self.mean, self.std = tuple(mean), tuple(std)
        self.dtype = dtype
        self.device_id = device_id
        self.num_threads, self.num_workers = num_threads, num_workers
        self.persistent_workers = persistent_workers
        self._loader: Any = None  # the DataLoader whose workers persist across epochs
        self._running = False  # an epoch of this loader is being iterated
        self._retired: list[tuple[Any, _Feed]] = []  # loaders of failed epochs and their feeds, to stop
        self.prefetch_batches = prefetch_batches
        self.batch_timeout_s = batch_timeout_s
        self.last_batch = last_batch
        self.seed = seed
        self.check_images = check_images
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
        with Pillow instead of DALI: odd formats, damaged files, batches DALI failed on),
        ``skipped`` (undecodable, replaced by a repeat under ``on_error="skip"``),
        ``pipeline_rebuilds`` (DALI failures recovered from), and ``cpu_reasons``: why,
        by kind (e.g. ``{"not a JPEG": 3, "junk before a marker": 1}``)."""
        return {**self._stats, "cpu_reasons": dict(self._reasons)}

    @property
    def device(self) -> torch.device:
        """Where batches are: ``cuda:device_id``, or the CPU."""
        return torch.device("cpu") if self.device_id is None else torch.device("cuda", self.device_id)

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

    def _encoder(self) -> _Encoder:
        crop: RandomResizedCrop | _ResizeCenterCrop
        if self.resize_shorter_px is None:
            crop = RandomResizedCrop(size_px=self.crop_px, scale=self.scale, ratio=self.ratio)
        else:
            crop = _ResizeCenterCrop(self.resize_shorter_px, self.crop_px)
        return _Encoder(
            self._members,
            crop,
            self.flip_p,
            self.dataset.on_error,
            self.check_images,
        )

    def _items(self, keep: bool = False) -> Iterator[_Item]:
        """The samples as :class:`_Item` s in the dataset's order: read here, or by DataLoader
        workers that each send ``batch_size`` of them at a time (round-robin over workers,
        each worker's last batch possibly short), which ``state_dict`` accounts for.

        The workers are forked here, in the caller's thread, before the epoch's feed thread
        and DALI pipeline start: a fork while those threads run can copy a lock one of them
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
                log.warning("DaliLoader's reading workers did not reset (%s); starting new ones", exc)
                self._loader = None
                _shut_down(loader)
                loader = None
        if loader is None:
            loader = DataLoader(
                self.dataset,
                batch_size=self.batch_size,
                num_workers=self.num_workers,
                collate_fn=_SharedEncoder(encoder),
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
        return (item for batch in batches for item in _SharedEncoder.items(batch))

    def _finish(self, images: torch.Tensor) -> torch.Tensor:
        """``torch.uint8`` ``(B, 3, H, W)`` CPU images as the pipeline gives them: normalised
        to ``dtype``, on ``device``."""
        images = images.to(self.device)
        if self.dtype == torch.uint8:
            return images
        mean = torch.tensor(self.mean, device=self.device).view(1, 3, 1, 1) * 255
        std = torch.tensor(self.std, device=self.device).view(1, 3, 1, 1) * 255
        return (images.float() - mean) / std

    def _on_cpu(self, batch: _Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole batch decoded with Pillow (DALI failed on it or on one beside it)."""
        encoder = self._encoder()
        images = []
        for i, item in enumerate(batch.items):
            if i in batch.cpu:
                images.append(batch.cpu[i])
                continue
            assert item.data is not None  # internal invariant: not CPU-decoded means DALI's bytes
            done = encoder.on_cpu(item.data, item.label, "DALI failed on its batch", item.where)
            if done.cpu is None:  # undecodable, on_error="skip": a repeat of a good one
                self._stats["skipped"] += 1
                log.warning("skipping a sample: %s", done.problem)
            else:
                self._stats["cpu_decoded"] += 1
                self._reasons["DALI failed on its batch"] += 1
            images.append(done.cpu)
        good = [x for x in images if x is not None]
        if not good:
            raise DecodeError(f"no image of a batch DALI failed on can be decoded ({batch.items[0].where}, ...)")
        filled = [x if x is not None else good[0] for x in images]
        labels = torch.tensor([x.label for x in batch.items], dtype=torch.int64, device=self.device)
        return self._finish(torch.stack(filled)), labels

    def _pipeline(self, feed: _Feed) -> Any:
        dali = _import_dali()
        from nvidia.dali import fn, types

        gpu = self.device_id is not None
        rank = self.dataset.worker_slot().rank  # data-parallel: the ranks of a replication group crop alike
        pipe = dali.Pipeline(
            batch_size=self.batch_size,
            num_threads=self.num_threads,
            device_id=self.device_id,
            seed=self.seed * 1000 + rank + 1,
            prefetch_queue_depth=2,
        )
        with pipe:
            jpegs, labels = fn.external_source(source=feed, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT64])
            if self.resize_shorter_px is None:  # training: random resized crop, flip
                images = fn.decoders.image_random_crop(
                    jpegs,
                    device="mixed" if gpu else "cpu",
                    output_type=types.RGB,
                    random_area=list(self.scale),
                    random_aspect_ratio=list(self.ratio),
                    num_attempts=10,
                )
                images = fn.resize(images, resize_x=self.crop_px, resize_y=self.crop_px)
                crop: dict[str, Any] = {"mirror": fn.random.coin_flip(probability=self.flip_p)}
            else:  # evaluation: the whole image, its shorter side resized, then the centre square
                images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)
                images = fn.resize(images, resize_shorter=self.resize_shorter_px)
                # crop_mirror_normalize's crop is fn.crop's (crop_pos_x/y 0.5: the centre, rounded
                # half up), done in the same pass as the normalisation
                crop = {"crop": (self.crop_px, self.crop_px), "crop_pos_x": 0.5, "crop_pos_y": 0.5}
            uint8 = self.dtype == torch.uint8
            images = fn.crop_mirror_normalize(
                images,
                dtype=types.UINT8 if uint8 else types.FLOAT,
                output_layout="CHW",
                mean=[0.0] * 3 if uint8 else [m * 255 for m in self.mean],
                std=[1.0] * 3 if uint8 else [s * 255 for s in self.std],
                **crop,
            )
            pipe.set_outputs(images, labels.gpu() if gpu else labels)
        return pipe

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        if self._running:
            raise RuntimeError(
                "DaliLoader: an epoch of this loader is still being iterated; finish it, or drop its iterator "
                "(del it, or leave its loop), before starting another: two epochs at once would read the "
                "dataset twice at once"
            )
        keep = self.persistent_workers
        self._running = True
        try:
            items = self._items(keep)
        except BaseException:
            self._running = False
            raise
        feed = _Feed(
            items,
            batch_size=self.batch_size,
            drop_last=self.last_batch == "drop",
            prefetch_batches=self.prefetch_batches,
            batch_timeout_s=self.batch_timeout_s,
        )
        self._consumed = 0
        policy = LastBatchPolicy.DROP if self.last_batch == "drop" else LastBatchPolicy.PARTIAL
        failures = 0  # in a row, with no batch from DALI between them
        failed = True  # an epoch that raised: its workers are not reused
        try:
            while not (feed.ended and not feed.fed):
                pipe = self._pipeline(feed)
                try:
                    pipe.build()
                    batches = DALIGenericIterator(
                        [pipe],
                        ["images", "labels"],
                        last_batch_policy=policy,
                        auto_reset=False,
                        prepare_first_batch=False,
                    )
                    for out in batches:
                        batch = feed.fed.popleft()
                        images, labels = out[0]["images"], out[0]["labels"].reshape(-1)
                        for i, image in batch.cpu.items():  # decoded on the CPU: in their places
                            images[i] = self._finish(image[None])[0]
                        failures = 0
                        yield self._count(images, labels)
                    break
                except Exception as exc:
                    if feed.error is not None:  # the reader's error, passed through DALI
                        raise feed.error from None
                    failures += 1
                    if failures > 3:
                        raise
                    # DALI failed on an image it took: the pipeline is dead. The batches it
                    # holds are decoded on the CPU; a new pipeline takes the rest.
                    self._stats["pipeline_rebuilds"] += 1
                    log.warning(
                        "DALI failed (%s); decoding its %d batches on the CPU and rebuilding the pipeline",
                        str(exc).strip().splitlines()[0][:300],
                        len(feed.fed),
                    )
                    while feed.fed:
                        batch = feed.fed.popleft()
                        yield self._count(*self._on_cpu(batch))
                finally:
                    del pipe
            failed = False
        except GeneratorExit:  # the caller left the epoch early: the workers are reset and reused
            failed = False
            raise
        finally:
            self._running = False
            # Persistent workers whose epoch failed (a worker's error, a timeout), or that the
            # feed thread still waits on, are retired: the next epoch forks new ones, and stops
            # these first (close() and the interpreter's exit do too), so the error is raised
            # now, not after torch's joins of workers that may be stuck.
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
