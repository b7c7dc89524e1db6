"""Image steps that :class:`~shardstream.decode.cpu.CpuDecoder` applies while it decodes:
:class:`RandomResizedCrop` for training, :class:`Resize` and :class:`CenterCrop` for evaluation
(torchvision's ``Resize(int)`` and ``CenterCrop`` on PIL images, pixel for pixel).

A step takes an opened PIL image, which may not be decoded yet, and returns an RGB PIL image
(:class:`Step`). A step that comes first may set a JPEG's draft mode before it is decoded, so
a large JPEG decodes straight at a reduced DCT scale (1/2, 1/4, 1/8) that still covers what
the step needs: :class:`RandomResizedCrop` and :class:`Resize` do when ``draft=True``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .tensors import resized_chw_uint8

__all__ = ["CenterCrop", "RandomResizedCrop", "Resize", "Step", "as_steps", "to_rgb"]


@runtime_checkable
class Step(Protocol):
    """One image step of a :class:`~shardstream.decode.cpu.CpuDecoder`."""

    def pil(self, image: Any, rng: Any) -> Any:
        """``image`` (an opened ``PIL.Image.Image``, perhaps not yet decoded) after this step,
        in RGB; ``rng`` is the random source of random steps."""
        ...


@dataclass(frozen=True)
class Resize:
    """Resize so the shorter side is ``shorter_side_px``, keeping the aspect ratio, as
    torchvision's ``Resize(shorter_side_px)`` does on a PIL image: the longer side becomes
    ``int(shorter_side_px * long / short)`` (rounded down), resampled by Pillow's bilinear
    filter (antialiased when downsizing).

    Attributes:
        shorter_side_px: the shorter side of the output, in pixels (>= 1).
        draft: when the image is a JPEG not yet decoded and is made smaller, decode it at the
            smallest DCT scale whose size still covers the output (Pillow's draft mode), then
            resize: several times faster on large JPEGs, within a few grey levels of a full
            decode. False: decode at full size first, as torchvision does (the same pixels).

    Raises:
        ValueError: ``shorter_side_px`` is not an int >= 1.
    """

    shorter_side_px: int
    draft: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.shorter_side_px, int) or isinstance(self.shorter_side_px, bool):
            raise ValueError(f"shorter_side_px={self.shorter_side_px!r} must be an int >= 1 (pixels)")
        if self.shorter_side_px < 1:
            raise ValueError(f"shorter_side_px={self.shorter_side_px!r} must be an int >= 1 (pixels)")

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """``(width, height)`` in pixels of the output for a ``width`` x ``height`` image
        (torchvision's ``_compute_resized_output_size`` for an int size)."""
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.shorter_side_px, int(self.shorter_side_px * long / short)
        return (new_short, new_long) if width <= height else (new_long, new_short)

    def pil(self, image: Any, rng: Any = None) -> Any:
        from PIL import Image

        size = self.output_size(*image.size)
        if self.draft and image.format == "JPEG" and (size[0] < image.size[0] or size[1] < image.size[1]):
            image.draft("RGB", size)  # a no-op once decoded; keeps the size >= the output's
        image = to_rgb(image)
        if image.size == size:
            return image
        return image.resize(size, Image.Resampling.BILINEAR)


@dataclass(frozen=True)
class CenterCrop:
    """Crop the centre ``size_px`` x ``size_px`` pixels, as torchvision's ``CenterCrop``: the
    offset is ``round((side - size_px) / 2)`` (Python's rounding, half to even). An image
    smaller than the crop on a side is padded with black (zeros) on that side, the extra
    pixel of an odd difference going right or bottom, as torchvision pads it.

    Attributes:
        size_px: the output's height and width, in pixels (>= 1).

    Raises:
        ValueError: ``size_px`` is not an int >= 1.
    """

    size_px: int

    def __post_init__(self) -> None:
        if not isinstance(self.size_px, int) or isinstance(self.size_px, bool) or self.size_px < 1:
            raise ValueError(f"size_px={self.size_px!r} must be an int >= 1 (pixels)")

    def box(self, width: int, height: int) -> tuple[int, int, int, int]:
        """The crop box ``(left, top, right, bottom)`` in pixels of a ``width`` x ``height``
        image; negative or past the edge where the image is smaller (padded there)."""
        size = self.size_px
        left = round((width - size) / 2.0) if size <= width else -((size - width) // 2)
        top = round((height - size) / 2.0) if size <= height else -((size - height) // 2)
        return left, top, left + size, top + size

    def pil(self, image: Any, rng: Any = None) -> Any:
        image = to_rgb(image)  # first: Pillow pads a crop past the edge with zeros, black in RGB
        box = self.box(*image.size)
        if box == (0, 0, *image.size):
            return image
        return image.crop(box)


@dataclass(frozen=True, kw_only=True)
class RandomResizedCrop:
    """Crop a random area and aspect ratio, then resize to ``size_px`` x ``size_px``.

    The parameters follow torchvision's ``RandomResizedCrop``. JPEGs are decoded with
    Pillow's draft mode at the smallest DCT scale that still covers the crop at full
    resolution, so large images decode faster.

    Attributes:
        size_px: output height and width in pixels.
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio (width / height).
        draft: decode JPEGs at a reduced DCT scale where the crop allows (False: always
            at full size, as torchvision's transform does).
    """

    size_px: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    draft: bool = True

    def box(self, width: int, height: int, rng: Any) -> tuple[int, int, int, int]:
        """A crop box ``(left, top, right, bottom)`` in pixels of a ``width`` x ``height`` image."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                left = rng.randint(0, width - w)
                top = rng.randint(0, height - h)
                return left, top, left + w, top + h
        aspect = width / height  # fallback: a centre crop within the ratio range
        if aspect < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif aspect > self.ratio[1]:
            w, h = round(height * self.ratio[1]), height
        else:
            w, h = width, height
        left, top = (width - w) // 2, (height - h) // 2
        return left, top, left + w, top + h

    def __call__(self, data: bytes, rng: Any) -> Any:
        """Decode image bytes into a cropped, resized RGB ``PIL.Image.Image``."""
        from PIL import Image

        return self.pil(Image.open(io.BytesIO(data)), rng)

    def tensor(self, data: bytes, rng: Any) -> Any:
        """Decode image bytes into a cropped, resized CPU ``torch.Tensor`` of shape
        ``(3, size_px, size_px)``, dtype ``torch.uint8``.

        Same crop as :meth:`__call__`, resized by torch's antialiased bilinear uint8 kernel,
        about 3x faster than Pillow's on these sizes (values within a few levels of it).

        Raises:
            MissingDependencyError: torch is not loaded (:func:`.tensors.loaded_torch`).
        """
        from PIL import Image

        return self._crop_tensor(Image.open(io.BytesIO(data)), rng)

    def pil(self, image: Any, rng: Any) -> Any:
        """:meth:`__call__` of an opened, not yet decoded image (the :class:`Step` protocol)."""
        from PIL import Image

        image, box = self._draft_for_crop(image, rng)
        return to_rgb(image).resize((self.size_px, self.size_px), Image.Resampling.BILINEAR, box=box)

    def augment(self, data: bytes, rng: Any, *, flip_p: float = 0.0) -> Any:
        """What a DALI pipeline of ``decoders.image_random_crop`` (EXIF orientation applied,
        as DALI does), ``resize`` and a random horizontal flip makes of image bytes, done with
        Pillow and torch on the CPU: a ``torch.uint8`` tensor ``(3, size_px, size_px)``.

        Raises:
            OSError, ValueError, SyntaxError: Pillow cannot decode ``data``.
            MissingDependencyError: torch is not loaded (:func:`.tensors.loaded_torch`).
        """
        from PIL import Image, ImageOps

        image = Image.open(io.BytesIO(data))
        image.load()  # decode it all here, so a damaged file fails here
        tensor = self._crop_tensor(ImageOps.exif_transpose(image), rng)
        return tensor.flip(-1) if rng.random() < flip_p else tensor

    def _crop_tensor(self, image: Any, rng: Any) -> Any:
        """:meth:`tensor` of an opened, not yet decoded image.

        Raises:
            MissingDependencyError: torch is not loaded (:func:`.tensors.loaded_torch`).
        """
        import numpy as np

        image, (left, top, right, bottom) = self._draft_for_crop(image, rng)
        left, top = int(left), int(top)
        # never past the edge: Image.crop would pad with black there
        right = min(max(math.ceil(right), left + 1), image.size[0])
        bottom = min(max(math.ceil(bottom), top + 1), image.size[1])
        region = to_rgb(image.crop((left, top, right, bottom)))  # copy only the crop's pixels
        return resized_chw_uint8(np.array(region), self.size_px)

    def _draft_for_crop(self, image: Any, rng: Any) -> tuple[Any, tuple[float, float, float, float]]:
        """An opened image set to decode JPEGs at the smallest DCT scale still covering the
        crop, and the crop box in its pixels."""
        width, height = image.size
        left, top, right, bottom = self.box(width, height, rng)
        if image.format != "JPEG" or not self.draft:
            return image, (left, top, right, bottom)
        request = (
            math.ceil(width * self.size_px / (right - left)),
            math.ceil(height * self.size_px / (bottom - top)),
        )
        image.draft("RGB", request)
        # the DCT scale rounds odd sizes up, so each axis has its own factor
        fx, fy = image.size[0] / width, image.size[1] / height
        return image, (left * fx, top * fy, right * fx, bottom * fy)


def to_rgb(image: Any) -> Any:
    """A PIL image in RGB: 16-bit and 32-bit grey (``I;16``, ``I``; 16-bit PNGs) scaled to 8
    bits by their top byte, as DALI does (Pillow's own ``convert("RGB")`` clips them to white);
    palette, alpha, CMYK and grey images converted by Pillow (alpha dropped)."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    if image.mode.startswith("I;16") or image.mode in ("I", "F"):
        import numpy as np

        pixels = np.asarray(image)
        if image.mode.startswith("I;16") or (image.mode == "I" and pixels.max(initial=0) > 255):
            pixels = np.clip(pixels.astype(np.int64), 0, 65535) >> 8  # 16-bit samples
        grey = np.clip(pixels, 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    return image.convert("RGB")


def as_steps(steps: Step | Sequence[Step] | None) -> tuple[Step, ...]:
    """``steps`` (one step, a sequence of them, or None) as a tuple.

    Raises:
        TypeError: an entry is not a step (no ``pil(image, rng)`` method); names it.
    """
    if steps is None:
        return ()
    out = tuple(steps) if isinstance(steps, Sequence) else (steps,)
    for step in out:
        if not isinstance(step, Step):
            raise TypeError(
                f"{step!r} is not an image step; pass Resize(...), CenterCrop(...), RandomResizedCrop(...) or a "
                "sequence of them"
            )
    return out
