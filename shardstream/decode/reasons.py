"""Why a member did not decode, in words a user can act on, and the ways out.

Pillow's own messages name its file object (``cannot identify image file <_io.BytesIO
object at 0x7f...>``): an address that says nothing. :func:`why_undecodable` says instead
that the member is empty, or is not an image format Pillow knows (with its size and first
bytes: an HTML error page saved as ``.jpg`` shows itself), or gives Pillow's reason without
the object. :data:`IMAGE_WAYS_OUT` and :data:`MEMBER_WAYS_OUT` are the hints the decoders'
``DecodeError`` messages end with (``CpuDecoder.decode_field``, the DALI loader's Pillow
fallback).
"""

from __future__ import annotations

import re

__all__ = ["IMAGE_WAYS_OUT", "MEMBER_WAYS_OUT", "why_undecodable"]

IMAGE_WAYS_OUT = (
    "find every such image with `shardstream verify --decode DATASET`; skip such samples with "
    "ShardDataset(on_error='skip') (counted in stats().skipped), or leave them out by re-packing with "
    "`shardstream pack --check-images --on-error skip`"
)
MEMBER_WAYS_OUT = (
    "fix the file and re-pack it, skip such samples with ShardDataset(on_error='skip') (counted in "
    "stats().skipped), or pass decode=None for the raw bytes"
)
_FILE_OBJECT = re.compile(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>")
_FIRST_BYTES = 8


def why_undecodable(data: bytes, exc: BaseException) -> str:
    """Why ``data`` (a member's bytes) did not decode, given what the decoder raised.

    Args:
        data: the member's bytes.
        exc: the exception its decoder raised (Pillow's, ``int()``'s, ``json``'s, ...).

    Returns:
        a phrase that completes "cannot decode: ...": ``"it is empty (0 bytes)"``; ``"not a
        recognised image format (Pillow cannot identify it: 631 bytes, starting b'<html>40')"``;
        or the exception's message without Pillow's file-object repr (``"image file is
        truncated (52 bytes not processed)"``).
    """
    if len(data) == 0:
        return "it is empty (0 bytes)"
    text = _FILE_OBJECT.sub("", str(exc)).strip()
    if isinstance(exc, OSError) and text.startswith("cannot identify image file"):
        return (
            f"not a recognised image format (Pillow cannot identify it: {len(data):,} bytes, starting "
            f"{bytes(data[:_FIRST_BYTES])!r})"
        )
    return text or type(exc).__name__
