"""NVIDIA DALI decoding and augmentation of :class:`~shardstream.dataset.ShardDataset` samples.

The only module that imports DALI (``pip install shardstream[dali]``, which installs
``nvidia-dali-cuda120``). shardstream streams the encoded bytes (S3 ranged reads, exact
epochs, resume); DALI decodes them: ``fn.decoders.image_random_crop`` on the GPU
(``device="mixed"``: nvJPEG and the hardware JPEG decoder) or, with ``device_id=None``, the
same pipeline on the CPU, then a resize, a random horizontal flip and normalisation. For
evaluation (``resize_shorter_px``) it is ``fn.decoders.image``, ``fn.resize(resize_shorter=)``
and a centre crop, with no flip.

This module is DALI's graph (:class:`_DaliGraph`, a
:class:`~shardstream.decode.protocol.BatchDecoder`) and its CPU twin for the images DALI is not
given (:class:`_DaliFallback`); :class:`DaliLoader` is :class:`shardstream.gpu.GpuLoader`, the
decoder-independent batched loader, with that graph. The loader's feeder thread assembles whole
batches of encoded bytes and labels ``prefetch_batches`` ahead, read in this process or by
DataLoader workers (``num_workers``) that send ``batch_size`` encoded images per message, in
one shared-memory block (:class:`~shardstream.collate.ByteBatch`: not pickled), so DALI's
``fn.external_source`` callback only takes a ready batch off a queue; DALI copies it into its
own pinned staging buffers for the GPU.

Epochs: each iteration of a :class:`DaliLoader` is one epoch of the dataset (call
:meth:`DaliLoader.set_epoch`). It yields ``len(loader)`` batches on every rank, because
every rank's dataset yields exactly ``len(dataset)`` samples; the short last batch is
yielded (``last_batch="partial"``, default) or dropped (``"drop"``).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .config import torchrun_env
from .dataset import ShardDataset
from .decode.check import gpu_jpeg_problem
from .decode.cpu import RandomResizedCrop, to_rgb
from .decode.protocol import BatchSource
from .gpu.items import Default
from .gpu.loader import GpuLoader

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
class _DaliFallback:
    """DALI's CPU twin (a :class:`~shardstream.decode.protocol.CpuFallback`), run by the reader:
    with ``check_images``, the images :func:`~shardstream.decode.check.gpu_jpeg_problem` says
    DALI's decoders would reject (or cannot read: not a JPEG) go to the CPU, decoded and
    augmented with Pillow as the graph does (``crop``'s ``augment``, flipped with ``flip_p``)."""

    crop: RandomResizedCrop | _ResizeCenterCrop
    flip_p: float
    check_images: bool

    def problem(self, data: bytes) -> str | None:
        """Why ``data`` goes to the CPU, or None (DALI takes it; always None without ``check_images``)."""
        return gpu_jpeg_problem(data) if self.check_images else None

    def decode(self, data: bytes, rng: Any) -> torch.Tensor:
        """``data`` decoded with Pillow: ``torch.uint8`` ``(3, crop_px, crop_px)`` on the CPU.

        Raises:
            OSError, ValueError, SyntaxError: Pillow cannot decode ``data``.
        """
        return self.crop.augment(data, rng, flip_p=self.flip_p)


def _placeholder_jpeg() -> np.ndarray:
    """A tiny JPEG that DALI decodes in the place of an image decoded on the CPU (whose
    output then replaces it)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (128, 128, 128)).save(out, "JPEG")
    return np.frombuffer(out.getvalue(), dtype=np.uint8)


_PLACEHOLDER = _placeholder_jpeg()


@dataclass(frozen=True, kw_only=True)
class _DaliGraph:
    """DALI's graph for :class:`~shardstream.gpu.GpuLoader` (a
    :class:`~shardstream.decode.protocol.BatchDecoder`): a pipeline fed by the loader's feed
    through ``fn.external_source``, built for each epoch and again after a failure. The
    settings are :class:`DaliLoader`'s arguments (``scale``, ``ratio`` None for evaluation);
    ``rank`` gives the rank whose seed the pipeline takes, when it is built."""

    batch_size: int
    crop_px: int
    resize_shorter_px: int | None
    scale: tuple[float, float] | None
    ratio: tuple[float, float] | None
    flip_p: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    dtype: torch.dtype
    device_id: int | str | None  # a GPU's number, or None: the CPU ("auto" is resolved by DaliLoader)
    num_threads: int
    seed: int
    check_images: bool
    drop_last: bool
    rank: Callable[[], int]

    name = "DALI"
    placeholder = _PLACEHOLDER

    @property
    def device(self) -> torch.device:
        """Where batches are: ``cuda:device_id``, or the CPU."""
        return torch.device("cpu") if self.device_id is None else torch.device("cuda", self.device_id)

    @property
    def fallback(self) -> _DaliFallback:
        """The CPU twin of this graph's augmentation."""
        crop: RandomResizedCrop | _ResizeCenterCrop
        if self.resize_shorter_px is None:
            assert self.scale is not None and self.ratio is not None  # internal invariant: set for training
            crop = RandomResizedCrop(size_px=self.crop_px, scale=self.scale, ratio=self.ratio)
        else:
            crop = _ResizeCenterCrop(self.resize_shorter_px, self.crop_px)
        return _DaliFallback(crop, self.flip_p, self.check_images)

    def batches(self, source: BatchSource) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """A pipeline of this graph fed by ``source``; its batches when iterated: images
        ``(B, 3, crop_px, crop_px)`` of ``dtype`` and labels int64 ``(B,)`` on :attr:`device`.
        The pipeline is built (``Pipeline.build``) by the first ``next``."""
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        pipe = self._pipeline(source)
        policy = LastBatchPolicy.DROP if self.drop_last else LastBatchPolicy.PARTIAL

        def run() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            pipe.build()
            outputs = DALIGenericIterator(
                [pipe],
                ["images", "labels"],
                last_batch_policy=policy,
                auto_reset=False,
                prepare_first_batch=False,
            )
            for out in outputs:
                yield out[0]["images"], out[0]["labels"].reshape(-1)

        return run()

    def finish(self, images: torch.Tensor) -> torch.Tensor:
        """``torch.uint8`` ``(B, 3, H, W)`` CPU images as the pipeline gives them: normalised
        to ``dtype``, on :attr:`device`."""
        device = self.device
        images = images.to(device)
        if self.dtype == torch.uint8:
            return images
        mean = torch.tensor(self.mean, device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor(self.std, device=device).view(1, 3, 1, 1) * 255
        return (images.float() - mean) / std

    def close(self) -> None:
        """Nothing to release: each pipeline goes with the iterator :meth:`batches` returned."""

    def _pipeline(self, feed: BatchSource) -> Any:
        dali = _import_dali()
        from nvidia.dali import fn, types

        gpu = self.device_id is not None
        rank = self.rank()  # data-parallel: the ranks of a replication group crop alike
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


class DaliLoader(GpuLoader):
    """Batches of decoded, augmented images from a :class:`ShardDataset`, decoded by DALI: a
    :class:`~shardstream.gpu.GpuLoader` with DALI's graph.

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
        image_ext: str = Default("jpg"),
        label_ext: str | None = Default("cls"),
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
        if dtype not in (torch.float32, torch.uint8):
            raise ValueError(f"{dtype=} must be torch.float32 or torch.uint8")
        if device_id == "auto":
            device_id = int(torchrun_env().local_rank or "0") if gpu_available() else None
        train = resize_shorter_px is None  # else evaluation: resize and centre crop, no flip
        graph = _DaliGraph(
            batch_size=batch_size,
            crop_px=crop_px,
            resize_shorter_px=resize_shorter_px,
            scale=((0.08, 1.0) if scale is None else tuple(scale)) if train else None,
            ratio=((3 / 4, 4 / 3) if ratio is None else tuple(ratio)) if train else None,
            flip_p=(0.5 if flip_p is None else flip_p) if train else 0.0,
            mean=tuple(mean),
            std=tuple(std),
            dtype=dtype,
            device_id=device_id,
            num_threads=num_threads,
            seed=seed,
            check_images=check_images,
            drop_last=last_batch == "drop",
            rank=lambda: dataset.worker_slot().rank,
        )
        super().__init__(
            dataset,
            graph,
            batch_size=batch_size,
            fields=fields,
            image_ext=image_ext,
            label_ext=label_ext,
            num_workers=num_workers,
            persistent_workers=persistent_workers,
            prefetch_batches=prefetch_batches,
            batch_timeout_s=batch_timeout_s,
            last_batch=last_batch,
        )

    # The settings of DALI's graph, as given (scale and ratio None, flip_p 0.0 for evaluation).
    crop_px = property(lambda self: self.decoder.crop_px)
    resize_shorter_px = property(lambda self: self.decoder.resize_shorter_px)
    scale = property(lambda self: self.decoder.scale)
    ratio = property(lambda self: self.decoder.ratio)
    flip_p = property(lambda self: self.decoder.flip_p)
    mean = property(lambda self: self.decoder.mean)
    std = property(lambda self: self.decoder.std)
    dtype = property(lambda self: self.decoder.dtype)
    device_id = property(lambda self: self.decoder.device_id)
    num_threads = property(lambda self: self.decoder.num_threads)
    seed = property(lambda self: self.decoder.seed)
    check_images = property(lambda self: self.decoder.check_images)
