"""Sample decoders: what a decoder is (:mod:`.protocol`: the per-sample ``Decoder``, the batched
``BatchDecoder`` a GPU loader runs and its ``CpuFallback``, and the names ``decode=`` takes),
:mod:`.cpu` (Pillow), its image steps (:mod:`.steps`), the per-sample stage a reader calls
(:mod:`.stage`: fields picked, decoded, named, transformed), why a member did not decode, in
words (:mod:`.reasons`), and the check of JPEGs before a GPU decoder (:mod:`.check`). No torch
import anywhere here (:mod:`.tensors`); the batched GPU loader is :mod:`shardstream.gpu`, DALI's
graph :mod:`shardstream.dali`."""

from .cpu import CpuDecoder, ImageFormat
from .protocol import BatchDecoder, CpuFallback, Decoder, FieldDecoder, register_decoder
from .stage import make_decoder
from .steps import CenterCrop, RandomResizedCrop, Resize

__all__ = [
    "BatchDecoder",
    "CenterCrop",
    "CpuDecoder",
    "CpuFallback",
    "Decoder",
    "FieldDecoder",
    "ImageFormat",
    "RandomResizedCrop",
    "Resize",
    "make_decoder",
    "register_decoder",
]
