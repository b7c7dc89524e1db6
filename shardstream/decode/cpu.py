"""CPU decoding of samples with Pillow.

By the last part of a member's extension (``"seg.png"`` -> ``"png"``):

- images (``jpg jpeg png ppm pgm pbm bmp gif webp tif tiff``) -> a ``PIL.Image.Image`` in RGB,
  a ``numpy.ndarray`` of shape ``(H, W, 3)`` dtype ``uint8``, or a CPU ``torch.Tensor`` of
  shape ``(3, H, W)`` dtype ``torch.uint8``;
- ``cls``, ``cls2``, ``index``, ``label`` -> ``int``;
- ``json`` -> the parsed object; ``txt``, ``text`` -> ``str`` (UTF-8);
- ``npy`` -> a ``numpy.ndarray`` (``numpy.load``, pickled objects refused);
- anything else stays ``bytes``, as do ``__key__`` and ``__shard__``.

Tensors are made with the torch this process has loaded (:mod:`.tensors`): this package
never imports torch.

Images go through the decoder's steps while they are decoded (:mod:`.steps`:
:class:`RandomResizedCrop` for training; :class:`Resize` then :class:`CenterCrop` for
evaluation), then its ``transform``. With ``ShardDataset(fields=...)`` only the picked
members are decoded, each by the extension of the member that matched
(:mod:`shardstream.decode.stage`).
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

from ..errors import DecodeError, MissingDependencyError
from .reasons import IMAGE_WAYS_OUT, MEMBER_WAYS_OUT, why_undecodable
from .steps import CenterCrop, RandomResizedCrop, Resize, Step, as_steps, to_rgb
from .tensors import chw_uint8

__all__ = ["CenterCrop", "CpuDecoder", "ImageFormat", "RandomResizedCrop", "Resize", "to_rgb"]

ImageFormat = Literal["pil", "numpy", "torch"]
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "gif", "webp", "tif", "tiff"})
INT_EXTENSIONS = frozenset({"cls", "cls2", "index", "label"})
TEXT_EXTENSIONS = frozenset({"txt", "text"})

Sample = dict[str, Any]


class _TooLarge(ValueError):
    """An image over ``max_image_pixels``: its message carries its own way out."""


def _kind(extension: str) -> str:
    """The last part of a member's extension, lower-cased (``"seg.PNG"`` -> ``"png"``)."""
    return extension.rsplit(".", 1)[-1].lower()


class CpuDecoder:
    """Decode a raw sample dict (module doc) in the calling process.

    Args:
        image: what images become: ``"pil"``, ``"numpy"`` (HWC uint8) or ``"torch"``
            (CHW uint8, CPU).
        steps: image steps applied while decoding, in order: one (``RandomResizedCrop(224)``)
            or a sequence (``[Resize(256), CenterCrop(224)]``); None: the full image. Any
            object with a ``pil(image, rng)`` method is a step (:class:`~.steps.Step`).
        crop: the former name of ``steps`` (either may be given, not both).
        transform: a callable applied to each decoded sample, last, in the process that
            decodes (a DataLoader worker): it gets the decoded dict, or with
            ``ShardDataset(fields=...)`` the named sample (a dict of the field names, or a
            tuple), so a torchvision v2 transform taking ``(image, label)`` works. What it
            returns is handed on. Its exceptions propagate as they are (raise
            :class:`~shardstream.errors.DecodeError` to have ``on_error="skip"`` skip a sample).
        rng: random source for random steps; default the ``random`` module's, which torch's
            DataLoader seeds differently in each worker.
        max_image_pixels: images with more pixels (width x height, from the header, before
            any decoding) are refused as possible decompression bombs; default Pillow's
            ``Image.MAX_IMAGE_PIXELS`` (89,478,485); None: no limit.

    Raises:
        ValueError: an unknown ``image``, both ``steps`` and ``crop``, or a bad
            ``max_image_pixels``. TypeError: a step that is not one.

    Raises (when called):
        DecodeError: a member cannot be decoded, or an image is larger than
            ``max_image_pixels``; names the shard, key and extension, says why and the ways
            out (:meth:`decode_field`).
        MissingDependencyError: (an ImportError) ``"torch"``, or ``"numpy"`` with one
            :class:`RandomResizedCrop` (torch's resize), where this process has not loaded
            torch: this package never imports it (:mod:`.tensors`); a ShardDataset does.
    """

    def __init__(
        self,
        image: ImageFormat = "numpy",
        *,
        steps: RandomResizedCrop
        | Resize
        | CenterCrop
        | Sequence[RandomResizedCrop | Resize | CenterCrop]
        | None = None,
        crop: RandomResizedCrop | Resize | CenterCrop | Sequence[RandomResizedCrop | Resize | CenterCrop] | None = None,
        transform: Callable[[Any], Any] | None = None,
        rng: random.Random | None = None,
        max_image_pixels: int | str | None = "pillow",
    ) -> None:
        if image not in get_args(ImageFormat):
            raise ValueError(f"image={image!r} must be one of {get_args(ImageFormat)}")
        if steps is not None and crop is not None:
            raise ValueError("pass the image steps as steps= (crop= is its former name), not both")
        if max_image_pixels == "pillow":
            from PIL import Image

            max_image_pixels = Image.MAX_IMAGE_PIXELS
        if max_image_pixels is not None and (not isinstance(max_image_pixels, int) or max_image_pixels < 1):
            raise ValueError(f"{max_image_pixels=} must be an int >= 1 or None")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform={transform!r} must be callable")
        self.image = image
        self.steps = as_steps(steps if steps is not None else crop)
        self.transform = transform
        self.rng = rng
        self.max_image_pixels = max_image_pixels

    def __repr__(self) -> str:
        return f"CpuDecoder({self.image!r}, steps={list(self.steps)!r}, transform={self.transform!r})"

    @property
    def crop(self) -> Step | tuple[Step, ...] | None:
        """The steps as the former ``crop`` attribute: one step, a tuple of several, or None."""
        return None if not self.steps else self.steps[0] if len(self.steps) == 1 else self.steps

    def __call__(self, sample: Sample) -> Any:
        out: Sample = {}
        for field, value in sample.items():
            out[field] = value if field.startswith("__") else self.decode_field(sample, field)
        return out if self.transform is None else self.transform(out)

    def decode_field(self, sample: dict[str, Any], member: str) -> Any:
        """``sample[member]`` decoded by its extension (:meth:`decode_member`).

        Raises:
            DecodeError: it cannot be decoded; names the shard, the key and the member, says
                why (empty, not an image format Pillow knows, Pillow's reason: without
                Pillow's file-object repr, :func:`~.reasons.why_undecodable`) and the ways out
                (``shardstream verify --decode``, ``ShardDataset(on_error="skip")``, re-packing
                with ``pack --check-images``).
            MissingDependencyError: a tensor is asked for and torch is not loaded
                (:func:`~.tensors.loaded_torch`); raised as it is.
        """
        data = sample[member]
        try:
            return self.decode_member(member, data)
        except MissingDependencyError:  # torch not loaded here: not the member's fault
            raise
        except Exception as exc:
            if isinstance(exc, _TooLarge):
                ways_out = "or skip such samples with ShardDataset(on_error='skip')"
            elif _kind(member) in IMAGE_EXTENSIONS:
                ways_out = IMAGE_WAYS_OUT
            else:
                ways_out = MEMBER_WAYS_OUT
            raise DecodeError(
                f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}, member {member!r}: cannot decode: "
                f"{why_undecodable(data, exc)}; {ways_out}"
            ) from exc

    def decode_member(self, extension: str, data: bytes) -> Any:
        """Decode one member's bytes by the last part of its extension, lower-cased."""
        kind = _kind(extension)
        if kind in IMAGE_EXTENSIONS:
            return self._image(data)
        if kind in INT_EXTENSIONS:
            return int(data)
        if kind == "json":
            return json.loads(data)
        if kind in TEXT_EXTENSIONS:
            return bytes(data).decode("utf-8")
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
                raise _TooLarge(
                    f"the image is {width}x{height} pixels, more than max_image_pixels={self.max_image_pixels} "
                    "(a decompression bomb?); raise CpuDecoder(max_image_pixels=...) if it is genuine"
                )
        steps, rng = self.steps, self.rng or random  # the module has the same methods
        if len(steps) == 1 and isinstance(steps[0], RandomResizedCrop) and self.image != "pil":
            tensor = steps[0]._crop_tensor(image, rng)  # torch's resize of the crop: faster than Pillow's
            return tensor if self.image == "torch" else tensor.permute(1, 2, 0).contiguous().numpy()
        for step in steps:
            image = step.pil(image, rng)
        image = to_rgb(image)
        if self.image == "pil":
            return image
        import numpy as np

        array = np.array(image)  # writable (asarray of a PIL image is read-only)
        if self.image == "numpy":
            return array
        return chw_uint8(array)
