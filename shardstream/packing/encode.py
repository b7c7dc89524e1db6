"""Samples written from code (:class:`shardstream.ShardWriter`, :func:`shardstream.pack_samples`):
a dict of values -> a key and tar members, by the same key rules as ``pack``.

A sample is ``{"__key__": "000123", "jpg": jpeg_bytes, "cls": 3, "json": {...}}``. Each other
entry is a member named ``KEY.EXT``; its value becomes bytes by the last part of ``EXT``
(``"seg.png"`` -> ``png``, compared lower-case) and the value's type:

========================================  ===============================================
value                                     member bytes
========================================  ===============================================
``bytes``, ``bytearray``, ``memoryview``  as they are
anything under ``json``                   ``json.dumps(value)`` as UTF-8 (dicts, lists, ...)
``str``                                   UTF-8
``int`` (and numpy integers)              decimal text: ``3`` -> ``b"3"``
``float`` (and numpy floats)              shortest round-trip text: ``0.1`` -> ``b"0.1"``
``numpy.ndarray`` under ``npy``           ``numpy.save`` format (no pickles)
``PIL.Image.Image`` under an image ext.   encoded in that format (JPEG at quality 90)
========================================  ===============================================

Anything else (``bool``, ``None``, a tensor, an array not under ``npy``, an image not under an
image extension) is a ``TypeError`` naming the key and extension. ``__shard__`` and
``__url__`` (fields readers add) are not written, so samples read from a dataset can be
written again.

Keys and extensions follow the WebDataset rule (:mod:`shardstream.format`): the key's file
name (after its last ``/``) holds no dot but a leading one, an extension is non-empty and
holds no ``/``; neither holds a line break or text that is not UTF-8; a key is not absolute
and has no ``..`` component (``tar -x`` would write outside its directory); two extensions of
one sample may not differ only in case (they collide on case-folding file systems).
"""

from __future__ import annotations

import io
import json
import numbers
import sys
from collections.abc import Mapping
from typing import Any

from ..format import RESERVED_FIELDS, split_key

__all__ = ["IMAGE_FORMATS", "JPEG_QUALITY", "encode_sample", "sample_key"]

JPEG_QUALITY = 90  # webdataset's writer default
IMAGE_FORMATS = {
    "jpg": "JPEG",
    "jpeg": "JPEG",
    "png": "PNG",
    "webp": "WEBP",
    "ppm": "PPM",
    "pgm": "PPM",
    "pbm": "PPM",
    "bmp": "BMP",
    "gif": "GIF",
    "tif": "TIFF",
    "tiff": "TIFF",
}
_SKIPPED = RESERVED_FIELDS - {"__key__"}
_BYTES = (bytes, bytearray, memoryview)
_CHECKED_EXTENSIONS: dict[str, str] = {}  # extension -> its kind, for extensions already checked


def sample_key(sample: Any) -> str:
    """The sample's ``__key__``, checked.

    Raises:
        TypeError: ``sample`` is not a mapping, or the key is not a str.
        ValueError: the key is missing or breaks a key rule (module doc); names it.
    """
    if not isinstance(sample, Mapping):
        raise TypeError(
            "a sample is a dict of extension -> value with a '__key__', "
            f"not a {type(sample).__name__}: {_short(sample)}"
        )
    key = sample.get("__key__")
    if key is None:
        fields = sorted(map(str, sample))
        raise ValueError(f"a sample needs a '__key__' (its name, e.g. '000123'); this one has {fields}")
    if not isinstance(key, str):
        raise TypeError(f"'__key__' must be a str, not a {type(key).__name__}: {key!r}")
    problem = _key_problem(key)
    if problem is not None:
        raise ValueError(f"sample key {key!r}: {problem}")
    return key


def _key_problem(key: str) -> str | None:
    if not key:
        return "is empty"
    if "\n" in key or "\r" in key:
        return "holds a line break"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 text"
    if key.startswith("/") or key.endswith("/") or ".." in key.split("/") or "" in key.split("/"):
        return "must be a relative path with no empty or '..' part (tar -x would write elsewhere)"
    if split_key(key + ".x")[0] != key:
        return (
            "its file name holds a dot, where WebDataset readers would end the key "
            "(use e.g. '_' instead of '.' in keys)"
        )
    return None


def _extension_kind(key: str, ext: Any) -> str:
    """The lower-cased last part of a valid extension (raises naming key and extension)."""
    kind = _CHECKED_EXTENSIONS.get(ext) if isinstance(ext, str) else None
    if kind is not None:
        return kind
    if not isinstance(ext, str):
        raise TypeError(f"sample {key!r}: extension {ext!r} must be a str, not a {type(ext).__name__}")
    problem = None
    if not ext:
        problem = "is empty"
    elif "/" in ext or "\n" in ext or "\r" in ext:
        problem = "holds a '/' or a line break"
    elif ext.startswith(".") or ext.endswith(".") or ".." in ext:
        problem = "starts or ends with a dot, or holds two in a row"
    elif ext.startswith("__") and ext.endswith("__"):
        problem = "is a reserved field name (only '__key__' is written)"
    else:
        try:
            ext.encode("utf-8")
        except UnicodeEncodeError:
            problem = "is not valid UTF-8 text"
    if problem is not None:
        raise ValueError(f"sample {key!r}: extension {ext!r} {problem}")
    kind = ext.rsplit(".", 1)[-1].lower()
    if len(_CHECKED_EXTENSIONS) < 4096:
        _CHECKED_EXTENSIONS[ext] = kind
    return kind


def encode_sample(sample: Any, *, jpeg_quality: int = JPEG_QUALITY) -> tuple[str, list[tuple[str, bytes]]]:
    """``sample`` as ``(key, [(member name, payload), ...])``, members sorted by name.

    Raises:
        TypeError: ``sample`` is not a mapping, or a value has a type that its extension
            cannot hold (module doc's table); names the key and extension.
        ValueError: a key or extension breaks a rule, two extensions collide, or an image
            cannot be saved in its extension's format; names the key and extension.
    """
    key = sample_key(sample)
    members: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    for ext, value in sample.items():
        if ext == "__key__" or ext in _SKIPPED:
            continue
        kind = _extension_kind(key, ext)
        folded = ext.lower()
        if folded in seen:
            raise ValueError(
                f"sample {key!r}: extensions that differ only in case collide on case-folding "
                f"file systems ({ext!r}); rename one"
            )
        seen.add(folded)
        members.append((f"{key}.{ext}", _payload(key, ext, kind, value, jpeg_quality)))
    if not members:
        raise ValueError(f"sample {key!r} has no member: add at least one extension -> value")
    members.sort()
    return key, members


def _payload(key: str, ext: str, kind: str, value: Any, jpeg_quality: int) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if kind == "json":
        try:
            return json.dumps(value).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise TypeError(f"sample {key!r}, extension {ext!r}: not JSON-serialisable ({exc})") from exc
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"sample {key!r}, extension {ext!r}: the str is not valid UTF-8 ({exc})") from exc
    if isinstance(value, bool):
        raise TypeError(f"sample {key!r}, extension {ext!r}: a bool is ambiguous; write int(value) or 'true'/'false'")
    if isinstance(value, numbers.Integral):
        return str(int(value)).encode()
    if isinstance(value, numbers.Real):
        return repr(float(value)).encode()
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        if kind != "npy":
            raise TypeError(f"sample {key!r}, extension {ext!r}: a numpy array goes under an extension ending in 'npy'")
        if value.dtype.hasobject:
            raise TypeError(f"sample {key!r}, extension {ext!r}: a numpy array of Python objects cannot be saved")
        out = io.BytesIO()
        numpy.save(out, value, allow_pickle=False)
        return out.getvalue()
    image_module = sys.modules.get("PIL.Image")
    if image_module is not None and isinstance(value, image_module.Image):
        if kind not in IMAGE_FORMATS:
            raise TypeError(
                f"sample {key!r}, extension {ext!r}: a PIL image goes under an image extension "
                f"({', '.join(sorted(IMAGE_FORMATS))})"
            )
        out = io.BytesIO()
        options = {"quality": jpeg_quality} if IMAGE_FORMATS[kind] == "JPEG" else {}
        try:
            value.save(out, format=IMAGE_FORMATS[kind], **options)
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(
                f"sample {key!r}, extension {ext!r}: Pillow cannot save a {value.mode} image as "
                f"{IMAGE_FORMATS[kind]} ({exc}); convert it first (e.g. image.convert('RGB'))"
            ) from exc
        return out.getvalue()
    raise TypeError(
        f"sample {key!r}, extension {ext!r}: cannot write a {type(value).__name__}; give bytes, str, int, "
        "float, a JSON value under 'json', a numpy array under 'npy' or a PIL image under an image extension"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
