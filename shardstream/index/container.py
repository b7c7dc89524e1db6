"""The binary container of the version 2 index files: a magic, a JSON header, numeric columns.

Layout (little-endian)::

    magic          8 bytes      b"SSINDEX\\0" (manifest) or b"SSTABLE\\0" (per-shard table)
    header_bytes   uint64       length of the JSON header that follows
    header         JSON, UTF-8  the file's fields, plus "columns": {name: [dtype, offset, count]}
    columns        each at its byte offset from the file's start, 8-byte aligned

A column is a flat numpy array (``dtype`` as numpy writes it, e.g. ``"<i8"``, ``"<u4"``,
``"|u1"`` for the UTF-8 bytes of concatenated strings). Readers take zero-copy views of the
file's buffer (a memory map, or the bytes of one GET), so opening costs nothing per row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import IndexFormatError

__all__ = ["ColumnSpec", "layout", "read", "to_pieces"]

ColumnSpec = tuple[str, str, int]  # (name, dtype, count)
_ALIGN = 8


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def layout(magic: bytes, fields: dict[str, Any], columns: list[ColumnSpec]) -> tuple[bytes, list[tuple[int, int]]]:
    """The bytes up to the first column, and each column's ``(offset, nbytes)``.

    The header's own length decides where the columns start, and the columns' offsets are in
    the header: the offsets are fixed first with a header padded to a stable width.
    """
    assert len(magic) == 8  # internal invariant
    placement: list[tuple[int, int]] = []
    start = 0
    for _ in range(3):  # the offsets' digits change the header length at most twice
        doc = dict(fields)
        doc["columns"] = {}
        position = start
        placement = []
        for name, dtype, count in columns:
            nbytes = np.dtype(dtype).itemsize * count
            doc["columns"][name] = [dtype, position, count]
            placement.append((position, nbytes))
            position = _aligned(position + nbytes)
        header = json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()
        needed = _aligned(16 + len(header))
        if needed == start:
            break
        start = needed
    head = magic + len(header).to_bytes(8, "little") + header
    return head + bytes(start - len(head)), placement


def to_pieces(magic: bytes, fields: dict[str, Any], columns: list[tuple[str, np.ndarray]]) -> Iterator[bytes]:
    """The whole file, from columns held in memory."""
    head, placement = layout(magic, fields, [(name, array.dtype.str, len(array)) for name, array in columns])
    yield head
    position = len(head)
    for (_, array), (offset, nbytes) in zip(columns, placement):
        if offset > position:
            yield bytes(offset - position)
        yield np.ascontiguousarray(array).tobytes()
        position = offset + nbytes


def read(buffer: Any, *, magic: bytes, url: str, kind: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The header's fields and zero-copy views of the columns of a container in ``buffer``.

    Raises:
        IndexFormatError: another magic, a damaged header, or a column outside the buffer.
    """
    view = memoryview(buffer)
    if len(view) < 16 or bytes(view[:8]) != magic:
        raise IndexFormatError(f"{url}: not a shardstream {kind} (bad magic); re-run shardstream pack")
    header_bytes = int.from_bytes(view[8:16], "little")
    try:
        doc = json.loads(bytes(view[16 : 16 + header_bytes]))
        columns = {}
        for name, (dtype, offset, count) in doc.pop("columns").items():
            dt = np.dtype(dtype)
            if offset < 16 + header_bytes or offset + dt.itemsize * count > len(view) or count < 0:
                raise ValueError(f"column {name} lies outside the file")
            columns[name] = np.frombuffer(buffer, dtype=dt, count=count, offset=offset)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise IndexFormatError(f"{url}: damaged shardstream {kind} ({exc}); re-run shardstream pack") from exc
    return doc, columns
