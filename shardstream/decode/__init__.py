"""Sample decoders: :mod:`.cpu` (Pillow) here; the DALI GPU path lives in its own module."""

from .cpu import CpuDecoder, ImageFormat, RandomResizedCrop, make_decoder

__all__ = ["CpuDecoder", "ImageFormat", "RandomResizedCrop", "make_decoder"]
