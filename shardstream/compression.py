"""Compressed shards (``.tar.gz``, ``.tgz``, ``.tar.zst``), told by their magic bytes rather
than by name, and decompressed as their chunks stream in: gzip by the standard library's zlib
(concatenated gzip members included), zstd by the ``zstandard`` package."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from typing import Any

from .errors import CorruptShardError

__all__ = ["compression_of", "decompressed"]

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def compression_of(head: Any) -> str | None:
    """``"gzip"`` or ``"zstd"`` when a shard's first bytes (at least 4) are that format's
    magic, else None (a plain tar)."""
    magic = bytes(head[:4])
    if magic[:2] == _GZIP_MAGIC:
        return "gzip"
    return "zstd" if magic == _ZSTD_MAGIC else None


def decompressed(chunks: Iterator[Any], url: str) -> Iterator[Any]:
    """The chunks of a shard, decompressed as they come when it is gzip (``.tar.gz``, ``.tgz``:
    the standard library's zlib, concatenated gzip members included) or zstd (``.tar.zst``:
    the ``zstandard`` package), told by their magic bytes, not by name; else as they are."""
    head: Any = b""
    for chunk in chunks:
        head = head + bytes(chunk) if head else chunk
        if len(head) >= 4:
            break
    if not len(head):
        return
    kind = compression_of(head)
    if kind == "gzip":
        yield from _gunzip(_slices(itertools.chain([head], chunks)), url)
    elif kind == "zstd":
        yield from _unzstd(_slices(itertools.chain([head], chunks)), url)
    else:
        yield head
        yield from chunks


def _slices(chunks: Iterator[Any], piece_bytes: int = 4 << 20) -> Iterator[bytes]:
    """The chunks as ``bytes`` of at most ``piece_bytes`` (a mapped shard is not copied whole)."""
    for chunk in chunks:
        for start in range(0, len(chunk), piece_bytes):
            yield bytes(chunk[start : start + piece_bytes])


def _gunzip(pieces: Iterator[bytes], url: str) -> Iterator[bytes]:
    state = zlib.decompressobj(wbits=31)
    try:
        for piece in pieces:
            while piece:
                out = state.decompress(piece, 4 << 20)
                if out:
                    yield out
                while state.unconsumed_tail:  # more output than one call gives: drain it
                    out = state.decompress(state.unconsumed_tail, 4 << 20)
                    if out:
                        yield out
                piece = b""
                if state.eof and state.unused_data:  # another gzip member follows
                    piece, state = state.unused_data, zlib.decompressobj(wbits=31)
        if not state.eof:
            raise zlib.error("the stream ends inside the compressed data")
    except zlib.error as exc:
        raise _undecodable(url, "gzip", exc) from exc


def _unzstd(pieces: Iterator[bytes], url: str) -> Iterator[bytes]:
    try:
        import zstandard
    except ImportError as exc:
        raise CorruptShardError(
            f"{url}: a zstd-compressed shard; reading it needs the zstandard package: pip install "
            "'shardstream[zstd]' (or zstandard)"
        ) from exc
    state = zstandard.ZstdDecompressor().decompressobj()
    try:
        for piece in pieces:
            out = state.decompress(piece)
            if out:
                yield out
        if not state.eof:
            raise zstandard.ZstdError("the stream ends inside the compressed data")
    except zstandard.ZstdError as exc:
        raise _undecodable(url, "zstd", exc) from exc


def _undecodable(url: str, kind: str, exc: Exception) -> CorruptShardError:
    """The error of a ``kind``-compressed shard (gzip, zstd) whose bytes do not decompress."""
    return CorruptShardError(
        f"{url}: a {kind}-compressed shard that does not decompress ({exc}); the shard is "
        "truncated or damaged, re-download or re-create it"
    )
