"""NVIDIA DALI decoding and augmentation of :class:`~shardstream.dataset.ShardDataset` samples.

The only module that imports DALI (``pip install shardstream[dali]``, which installs
``nvidia-dali-cuda120``). shardstream streams the encoded bytes (S3 ranged reads, exact
epochs, resume); DALI decodes them: ``fn.decoders.image_random_crop`` on the GPU
(``device="mixed"``: nvJPEG and the hardware JPEG decoder) or, with ``device_id=None``, the
same pipeline on the CPU, then a resize, a random horizontal flip and normalisation.

A feeder thread assembles whole batches of encoded bytes and labels ``prefetch_batches``
ahead, read in this process or by DataLoader workers (``num_workers``) that send
``batch_size`` encoded images per message, so DALI's ``fn.external_source`` callback only
takes a ready batch off a queue; DALI copies it into its own pinned staging buffers for the
GPU.

Epochs: each iteration of a :class:`DaliLoader` is one epoch of the dataset (call
:meth:`DaliLoader.set_epoch`). It yields ``len(loader)`` batches on every rank, because
every rank's dataset yields exactly ``len(dataset)`` samples; the short last batch is
yielded (``last_batch="partial"``, default) or dropped (``"drop"``).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .dataset import ShardDataset
from .errors import DecodeError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "DaliLoader", "dali_available", "gpu_available"]

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


class _Feed:
    """Whole batches ``(encoded images, labels)`` assembled ahead in a thread from
    ``(image bytes, label)`` pairs: DALI's callback only pops them. Ends the epoch with
    StopIteration; errors from reading are re-raised in the caller's thread."""

    _END = object()

    def __init__(self, pairs: Iterator[tuple[bytes, int]], *, batch_size: int, drop_last: bool,
                 prefetch_batches: int) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=prefetch_batches)
        self._stop = threading.Event()
        self._args = (pairs, batch_size, drop_last)
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

    def _run(self) -> None:
        pairs, batch_size, drop_last = self._args
        images: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        try:
            for image, label in pairs:
                images.append(np.frombuffer(image, dtype=np.uint8))
                labels.append(np.array([label], dtype=np.int64))
                if len(images) == batch_size:
                    if not self._put((images, labels)):
                        return
                    images, labels = [], []
            if images and not drop_last:
                self._put((images, labels))
            self._put(self._END)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)

    def __call__(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        item = self._queue.get()
        if item is self._END:
            self._queue.put(item)  # DALI may ask again while draining its prefetch
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _member(sample: dict[str, Any], ext: str) -> bytes:
    try:
        return sample[ext]
    except KeyError:
        raise DecodeError(
            f"{sample.get('__shard__')}: sample {sample.get('__key__')!r} has no {ext!r} member "
            f"(it has {sorted(k for k in sample if not k.startswith('__'))}); set image_ext / label_ext"
        ) from None


def _encoded(samples: list[dict[str, Any]], *, image_ext: str, label_ext: str | None) -> list[tuple[bytes, int]]:
    """``(image bytes, label)`` of each sample: the DataLoader collate of the workers, so a
    worker sends a batch of them in one message instead of one message per sample."""
    return [(_member(sample, image_ext), _label(sample, label_ext)) for sample in samples]


def _label(sample: dict[str, Any], ext: str | None) -> int:
    if ext is None:
        return -1
    raw = _member(sample, ext)
    try:
        return int(raw)
    except ValueError:
        raise DecodeError(
            f"{sample.get('__shard__')}: sample {sample.get('__key__')!r} member {ext!r} is not an integer "
            f"label ({bytes(raw[:40])!r})"
        ) from None


class DaliLoader:
    """Batches of decoded, augmented images from a :class:`ShardDataset`, decoded by DALI.

    Args:
        dataset: a ShardDataset with ``decode=None`` (raw bytes; DALI decodes).
        batch_size: images per batch.
        image_ext, label_ext: the members holding the encoded image and the integer label
            (ASCII, as ``.cls``); ``label_ext=None``: labels are -1.
        crop_px: output height and width in pixels (random resized crop, then resize).
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio (width / height).
        flip_p: probability of a horizontal flip.
        mean, std: per-channel normalisation, in units of the [0, 1] range (ImageNet's by
            default); ignored for ``dtype=torch.uint8``.
        dtype: ``torch.float32`` (normalised) or ``torch.uint8`` (0-255, not normalised).
        device_id: the GPU to decode on (``"auto"``: ``LOCAL_RANK``'s GPU when DALI sees one,
            else the CPU); ``None``: the CPU.
        num_threads: DALI CPU threads.
        num_workers: DataLoader processes reading the dataset, each sending ``batch_size``
            encoded images per message (0: a thread of this process reads it).
        prefetch_batches: whole batches read ahead of DALI.
        last_batch: ``"partial"`` yields the short last batch; ``"drop"`` drops it.
        seed: DALI's random seed (crops, flips); rank-specific seeds are derived from it.

    Yields:
        ``(images, labels)``: images ``(B, 3, crop_px, crop_px)`` (NCHW) of ``dtype`` on
        ``cuda:device_id`` (or the CPU), labels int64 ``(B,)`` on the same device. ``B`` is
        ``batch_size`` except a partial last batch.

    Raises:
        ImportError: DALI is not installed (names the extra to install).
        ValueError: bad arguments.
        DecodeError: a sample lacks the image or label member, or a label is not an integer
            (names shard and key); DALI's own errors for undecodable images.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        *,
        batch_size: int,
        image_ext: str = "jpg",
        label_ext: str | None = "cls",
        crop_px: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip_p: float = 0.5,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
        device_id: int | str | None = "auto",
        num_threads: int = 2,
        num_workers: int = 0,
        prefetch_batches: int = 2,
        last_batch: str = "partial",
        seed: int = 0,
    ) -> None:
        _import_dali()
        if not isinstance(dataset, ShardDataset):
            raise ValueError(f"dataset must be a ShardDataset, not {type(dataset).__name__}")
        if dataset.decode is not None:
            raise ValueError("construct the ShardDataset with decode=None: DALI decodes the raw bytes")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"{batch_size=} must be an int >= 1")
        if last_batch not in ("partial", "drop"):
            raise ValueError(f"{last_batch=} must be 'partial' or 'drop'")
        if dtype not in (torch.float32, torch.uint8):
            raise ValueError(f"{dtype=} must be torch.float32 or torch.uint8")
        if prefetch_batches < 1:
            raise ValueError(f"{prefetch_batches=} must be >= 1")
        if device_id == "auto":
            import os

            device_id = int(os.environ.get("LOCAL_RANK", "0")) if gpu_available() else None
        self.dataset = dataset
        self.batch_size = batch_size
        self.image_ext, self.label_ext = image_ext, label_ext
        self.crop_px, self.scale, self.ratio, self.flip_p = crop_px, scale, ratio, flip_p
        self.mean, self.std = tuple(mean), tuple(std)
        self.dtype = dtype
        self.device_id = device_id
        self.num_threads, self.num_workers = num_threads, num_workers
        self.prefetch_batches = prefetch_batches
        self.last_batch = last_batch
        self.seed = seed
        self._consumed = 0

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

    def _pairs(self) -> Iterator[tuple[bytes, int]]:
        """``(image bytes, label)`` in the dataset's order: read here, or by DataLoader
        workers that each send ``batch_size`` of them at a time (round-robin over workers,
        each worker's last batch possibly short), which ``state_dict`` accounts for."""
        encoded = functools.partial(_encoded, image_ext=self.image_ext, label_ext=self.label_ext)
        if self.num_workers == 0:
            return (pair for sample in self.dataset for pair in encoded([sample]))
        from torch.utils.data import DataLoader

        loader = DataLoader(self.dataset, batch_size=self.batch_size, num_workers=self.num_workers, collate_fn=encoded)
        return (pair for batch in loader for pair in batch)

    def _pipeline(self, feed: _Feed) -> Any:
        dali = _import_dali()
        from nvidia.dali import fn, types

        gpu = self.device_id is not None
        slot = self.dataset.__dict__.get("_parent_rank") or (0, 1)
        pipe = dali.Pipeline(batch_size=self.batch_size, num_threads=self.num_threads, device_id=self.device_id,
                             seed=self.seed * 1000 + slot[0] + 1, prefetch_queue_depth=2)
        with pipe:
            jpegs, labels = fn.external_source(source=feed, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT64])
            images = fn.decoders.image_random_crop(
                jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB,
                random_area=list(self.scale), random_aspect_ratio=list(self.ratio), num_attempts=10,
            )
            images = fn.resize(images, resize_x=self.crop_px, resize_y=self.crop_px)
            uint8 = self.dtype == torch.uint8
            images = fn.crop_mirror_normalize(
                images,
                dtype=types.UINT8 if uint8 else types.FLOAT,
                output_layout="CHW",
                mean=[0.0] * 3 if uint8 else [m * 255 for m in self.mean],
                std=[1.0] * 3 if uint8 else [s * 255 for s in self.std],
                mirror=fn.random.coin_flip(probability=self.flip_p),
            )
            pipe.set_outputs(images, labels.gpu() if gpu else labels)
        return pipe

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        feed = _Feed(self._pairs(), batch_size=self.batch_size, drop_last=self.last_batch == "drop",
                     prefetch_batches=self.prefetch_batches)
        self._consumed = 0
        try:
            pipe = self._pipeline(feed)
            pipe.build()
            policy = LastBatchPolicy.DROP if self.last_batch == "drop" else LastBatchPolicy.PARTIAL
            batches = DALIGenericIterator([pipe], ["images", "labels"], last_batch_policy=policy, auto_reset=False,
                                          prepare_first_batch=False)
            for out in batches:
                images, labels = out[0]["images"], out[0]["labels"].reshape(-1)
                self._consumed += len(labels)
                yield images, labels
        finally:
            feed.close()
