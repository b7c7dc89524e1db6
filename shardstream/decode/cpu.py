"""CPU decoding of samples with Pillow.

By the last part of a member's extension (``"seg.png"`` -> ``"png"``):

- images (``jpg jpeg png ppm pgm pbm bmp gif webp tif tiff``) -> a ``PIL.Image.Image`` in RGB,
  a ``numpy.ndarray`` of shape ``(H, W, 3)`` dtype ``uint8``, or a CPU ``torch.Tensor`` of
  shape ``(3, H, W)`` dtype ``torch.uint8``;
- ``cls``, ``cls2``, ``index``, ``label`` -> ``int``;
- ``json`` -> the parsed object; ``txt``, ``text`` -> ``str`` (UTF-8);
- ``npy`` -> a ``numpy.ndarray`` (``numpy.load``, pickled objects refused);
- anything else stays ``bytes``, as do ``__key__`` and ``__shard__``.
"""

from __future__ import annotations

import io
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..errors import DecodeError

__all__ = ["CpuDecoder", "ImageFormat", "RandomResizedCrop", "make_decoder", "to_rgb"]

ImageFormat = Literal["pil", "numpy", "torch"]
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "gif", "webp", "tif", "tiff"})
INT_EXTENSIONS = frozenset({"cls", "cls2", "index", "label"})
TEXT_EXTENSIONS = frozenset({"txt", "text"})

Sample = dict[str, Any]


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

        return self._crop_pil(Image.open(io.BytesIO(data)), rng)

    def tensor(self, data: bytes, rng: Any) -> Any:
        """Decode image bytes into a cropped, resized CPU ``torch.Tensor`` of shape
        ``(3, size_px, size_px)``, dtype ``torch.uint8``.

        Same crop as :meth:`__call__`, resized by torch's antialiased bilinear uint8 kernel,
        about 3x faster than Pillow's on these sizes (values within a few levels of it).
        """
        from PIL import Image

        return self._crop_tensor(Image.open(io.BytesIO(data)), rng)

    def _crop_pil(self, image: Any, rng: Any) -> Any:
        """:meth:`__call__` of an opened, not yet decoded image."""
        from PIL import Image

        image, box = self._draft_for_crop(image, rng)
        return to_rgb(image).resize((self.size_px, self.size_px), Image.Resampling.BILINEAR, box=box)

    def augment(self, data: bytes, rng: Any, *, flip_p: float = 0.0) -> Any:
        """What a DALI pipeline of ``decoders.image_random_crop`` (EXIF orientation applied,
        as DALI does), ``resize`` and a random horizontal flip makes of image bytes, done with
        Pillow and torch on the CPU: a ``torch.uint8`` tensor ``(3, size_px, size_px)``.

        Raises:
            OSError, ValueError, SyntaxError: Pillow cannot decode ``data``.
        """
        from PIL import Image, ImageOps

        image = Image.open(io.BytesIO(data))
        image.load()  # decode it all here, so a damaged file fails here
        tensor = self._crop_tensor(ImageOps.exif_transpose(image), rng)
        return tensor.flip(-1) if rng.random() < flip_p else tensor

    def _crop_tensor(self, image: Any, rng: Any) -> Any:
        """:meth:`tensor` of an opened, not yet decoded image."""
        import numpy as np
        import torch
        import torch.nn.functional as F

        image, (left, top, right, bottom) = self._draft_for_crop(image, rng)
        left, top = int(left), int(top)
        # never past the edge: Image.crop would pad with black there
        right = min(max(math.ceil(right), left + 1), image.size[0])
        bottom = min(max(math.ceil(bottom), top + 1), image.size[1])
        region = to_rgb(image.crop((left, top, right, bottom)))  # copy only the crop's pixels
        batch = torch.from_numpy(np.array(region)).permute(2, 0, 1).unsqueeze(0)
        resized = F.interpolate(batch, size=(self.size_px, self.size_px), mode="bilinear", antialias=True)
        return resized[0].contiguous()

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


class CpuDecoder:
    """Decode a raw sample dict (module doc) in the calling process.

    Args:
        image: what images become: ``"pil"``, ``"numpy"`` (HWC uint8) or ``"torch"``
            (CHW uint8, CPU).
        crop: a :class:`RandomResizedCrop` applied while decoding images, or None to keep
            the full image.
        rng: random source for crops; default the ``random`` module's, which torch's
            DataLoader seeds differently in each worker.
        max_image_pixels: images with more pixels (width x height, from the header, before
            any decoding) are refused as possible decompression bombs; default Pillow's
            ``Image.MAX_IMAGE_PIXELS`` (89,478,485); None: no limit.

    Raises (when called):
        DecodeError: a member cannot be decoded, or an image is larger than
            ``max_image_pixels``; names the shard, key and extension.
    """

    def __init__(
        self,
        image: ImageFormat = "numpy",
        *,
        crop: RandomResizedCrop | None = None,
        rng: random.Random | None = None,
        max_image_pixels: int | str | None = "pillow",
    ) -> None:
        if image not in get_args(ImageFormat):
            raise ValueError(f"image={image!r} must be one of {get_args(ImageFormat)}")
        if max_image_pixels == "pillow":
            from PIL import Image

            max_image_pixels = Image.MAX_IMAGE_PIXELS
        if max_image_pixels is not None and (not isinstance(max_image_pixels, int) or max_image_pixels < 1):
            raise ValueError(f"{max_image_pixels=} must be an int >= 1 or None")
        self.image = image
        self.crop = crop
        self.rng = rng
        self.max_image_pixels = max_image_pixels

    def __call__(self, sample: Sample) -> Sample:
        out: Sample = {}
        for field, value in sample.items():
            if field.startswith("__"):
                out[field] = value
                continue
            try:
                out[field] = self.decode_member(field, value)
            except Exception as exc:
                raise DecodeError(
                    f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}, member "
                    f"{field!r}: cannot decode ({exc}); re-pack the file or pass decode=None"
                ) from exc
        return out

    def decode_member(self, extension: str, data: bytes) -> Any:
        """Decode one member's bytes by the last part of its extension."""
        kind = extension.rsplit(".", 1)[-1].lower()
        if kind in IMAGE_EXTENSIONS:
            return self._image(data)
        if kind in INT_EXTENSIONS:
            return int(data)
        if kind == "json":
            return json.loads(data)
        if kind in TEXT_EXTENSIONS:
            return data.decode("utf-8")
        if kind == "npy":
            import numpy as np

            return np.load(io.BytesIO(data), allow_pickle=False)
        return data

    def _image(self, data: bytes) -> Any:
        from PIL import Image

        image = Image.open(io.BytesIO(data))  # reads the header only; decoding comes later
        if self.max_image_pixels is not None:
            width, height = image.size
            if width * height > self.max_image_pixels:
                raise ValueError(
                    f"the image is {width}x{height} pixels, more than max_image_pixels={self.max_image_pixels} "
                    "(a decompression bomb?); raise CpuDecoder(max_image_pixels=...) if it is genuine"
                )
        if self.crop is not None and self.image != "pil":
            tensor = self.crop._crop_tensor(image, self.rng or random)  # the module has the same methods
            return tensor if self.image == "torch" else tensor.permute(1, 2, 0).contiguous().numpy()
        if self.crop is not None:
            image = self.crop._crop_pil(image, self.rng or random)
        else:
            image = to_rgb(image)
        if self.image == "pil":
            return image
        import numpy as np

        array = np.array(image)  # writable (asarray of a PIL image is read-only)
        if self.image == "numpy":
            return array
        import torch

        return torch.from_numpy(array).permute(2, 0, 1)


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


def make_decoder(decode: ImageFormat | Callable[[Sample], Any] | None) -> Callable[[Sample], Any] | None:
    """``None`` (raw bytes), a callable used as is, or a named :class:`CpuDecoder` format.

    Raises:
        ValueError: an unknown name; the message lists the choices.
    """
    if decode is None or callable(decode):
        return decode
    if decode in get_args(ImageFormat):
        return CpuDecoder(decode)
    raise ValueError(f"decode={decode!r} must be None, a callable, or one of {get_args(ImageFormat)}")
