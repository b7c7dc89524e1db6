"""Sample decoders: :mod:`.cpu` (Pillow), its image steps (:mod:`.steps`), and the per-sample
stage a reader calls (:mod:`.stage`: fields picked, decoded, named, transformed), and why a
member did not decode, in words (:mod:`.reasons`); the DALI GPU path lives in its own module."""

from .cpu import CpuDecoder, ImageFormat
from .stage import make_decoder
from .steps import CenterCrop, RandomResizedCrop, Resize

__all__ = ["CenterCrop", "CpuDecoder", "ImageFormat", "RandomResizedCrop", "Resize", "make_decoder"]
