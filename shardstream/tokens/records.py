"""Reading the records out of one chunk of a ``pack-text`` input (:func:`read_chunk`): the
JSON Lines, Parquet and Arrow item readers, each yielding documents and problems in order. A
JSON line is an object whose ``text_field`` is a string; its id is its ``id_field`` (a string,
or a number written as text) or, without ``id_field``, ``RELPATH:LINE`` (lines counted from 1)
/ ``RELPATH:ROW`` (Parquet and Arrow rows counted from 0 across the file), ``RELPATH`` relative
to SOURCE (a file given as SOURCE: its name). Blank lines are no documents and are passed over.
What cannot be a document is a :class:`~shardstream.tokens.sources.TextProblem` naming the file
and line (or row): ``bad_json``, ``no_text``, ``no_id``, ``bad_id``, ``unreadable`` (a file
that cannot be read or decompressed from that line on), and, found while packing, ``empty``
and ``tokenizer_error``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ..errors import ShardNotFoundError, StorageError
from .sources import (
    _BLOCK,
    BAD_ID,
    BAD_JSON,
    NO_ID,
    NO_TEXT,
    UNREADABLE,
    Chunk,
    TextProblem,
    _arrow_reader,
    _decompressed,
    _read_error,
    _utf8,
    open_binary,
)

__all__ = ["Item", "read_chunk"]

# An item of a chunk, in order: (units of the chunk consumed after it, text or None, id or problem).
Item = tuple[int, str | None, Any]


def read_chunk(chunk: Chunk, skip: int, *, text_field: str, id_field: str | None, store: Any = None) -> Iterator[Item]:
    """The documents and problems of ``chunk`` after its first ``skip`` units (lines or rows,
    those a resumed stream had consumed), in order, each as ``(units consumed after it, text,
    id)`` or ``(units consumed after it, None, TextProblem)``.

    Raises:
        StorageError: the store failed (an outage is no bad input: the pack stops).
    """
    fmt = chunk.file.fmt
    if fmt == "parquet":
        yield from _parquet_items(chunk, skip, text_field, id_field, store)
    elif fmt == "arrow":
        yield from _arrow_items(chunk, skip, text_field, id_field, store)
    else:
        yield from _jsonl_items(chunk, skip, text_field, id_field, store)


def _lines(f: Any, limit: int | None, skip_lines: int = 0) -> Iterator[bytes]:
    """The lines of binary stream ``f`` (without their line break), at most ``limit`` bytes read,
    after the first ``skip_lines`` (passed over by counting line breaks). Reads with ``read1``
    where there is one, so the lines of a file damaged further on come out before the read that
    fails."""
    pending = b""
    read = getattr(f, "read1", f.read)
    while True:
        want = _BLOCK if limit is None else min(_BLOCK, limit)
        block = read(want) if want > 0 else b""
        if not block:
            break
        if limit is not None:
            limit -= len(block)
        data = pending + block
        if skip_lines:
            breaks = data.count(b"\n")
            if breaks < skip_lines:
                skip_lines -= breaks
                pending = data[data.rfind(b"\n") + 1 :]
                continue
            data = data.split(b"\n", skip_lines)[-1]
            skip_lines = 0
        parts = data.split(b"\n")
        pending = parts.pop()
        yield from parts
    if pending and not skip_lines:
        yield pending


def _jsonl_items(chunk: Chunk, skip: int, text_field: str, id_field: str | None, store: Any) -> Iterator[Item]:
    file = chunk.file
    url, rel, first = file.url, file.rel, chunk.first
    loads = json.loads
    unit = 0
    try:
        raw = open_binary(file, store)
    except (FileNotFoundError, ShardNotFoundError):
        yield (0, None, TextProblem(url, UNREADABLE, "vanished before it was read"))
        return
    except StorageError:
        raise
    except OSError as exc:
        yield (0, None, TextProblem(url, UNREADABLE, f"cannot read: {exc.strerror or exc}"))
        return
    plain = file.fmt == "jsonl"
    with raw:
        try:
            if chunk.start:
                raw.seek(chunk.start)
            stream = _decompressed(file.fmt, raw)
            limit = chunk.end - chunk.start if chunk.end >= 0 else None
            for line in _lines(stream, limit, 0 if plain else first):  # a compressed run: skip the lines before it
                unit += 1
                if unit <= skip or not line or line.isspace():
                    if unit == chunk.units:
                        break
                    continue
                yield _jsonl_item(line, unit, first + unit, url, rel, text_field, id_field, loads)
                if unit == chunk.units:
                    break
        except Exception as exc:
            if isinstance(exc, StorageError) or not _read_error(exc):
                raise
            if unit + 1 > skip:  # else the interrupted run reported it
                where = first + unit + 1
                yield (unit + 1, None, TextProblem(url, UNREADABLE, f"cannot read on from here: {exc}", line=where))


def _jsonl_item(
    line: bytes, unit: int, number: int, url: str, rel: str, text_field: str, id_field: str | None, loads: Any
) -> Item:
    """The item of JSON line ``number`` of a file (``unit`` of its chunk)."""
    try:
        doc = loads(line)
    except (ValueError, RecursionError) as exc:
        reason = f"not UTF-8: {exc}" if isinstance(exc, UnicodeDecodeError) else f"not JSON: {exc}"
        return (unit, None, TextProblem(url, BAD_JSON, reason, line=number))
    if type(doc) is not dict:
        return (unit, None, TextProblem(url, BAD_JSON, f"a JSON {type(doc).__name__}, not an object", line=number))
    text = doc.get(text_field)
    if type(text) is not str:
        return (unit, None, TextProblem(url, NO_TEXT, _no_text(text, text_field, text_field in doc), line=number))
    if id_field is None:
        return (unit, text, f"{rel}:{number}")
    doc_id, problem = _id_of(doc.get(id_field), id_field)
    if problem is not None:
        return (unit, None, TextProblem(url, problem[0], problem[1], line=number))
    return (unit, text, doc_id)


def _no_text(value: Any, field: str, present: bool) -> str:
    if not present:
        return f"no field {field!r}"
    return f"field {field!r} is {'null' if value is None else 'a JSON ' + type(value).__name__}, not a string"


def _id_of(value: Any, field: str) -> tuple[str, tuple[str, str] | None]:
    """A document's id from its ``field`` value (None where it has none): a string as it is, a
    number as text; else why not."""
    if type(value) is str:
        if value.isascii() or _utf8(value):
            return value, None
        return "", (BAD_ID, f"id {field!r} is not valid Unicode (a lone surrogate escape)")
    if value is None:
        return "", (NO_ID, f"no id {field!r} (missing or null)")
    if type(value) is int or type(value) is float:
        return str(value), None
    return "", (BAD_ID, f"id {field!r} is a {type(value).__name__}, not a string or number")


def _columns(
    table_or_batch: Any, text_field: str, id_field: str | None
) -> tuple[list[Any], list[Any] | None, str | None]:
    """The text and id values of a table or batch (python lists), or why they cannot be read."""
    names = table_or_batch.schema.names
    if text_field not in names:
        return [], None, f"no column {text_field!r}"
    texts = table_or_batch.column(text_field).to_pylist()
    if id_field is None:
        return texts, None, None
    if id_field not in names:
        return texts, None, f"no id column {id_field!r}"
    return texts, table_or_batch.column(id_field).to_pylist(), None


def _row_items(
    url: str,
    rel: str,
    texts: list[Any],
    ids: list[Any] | None,
    id_field: str | None,
    text_field: str,
    first_row: int,
    unit: int,
    skip: int,
    missing_id: str | None,
) -> Iterator[Item]:
    """Items of rows ``first_row + i`` (the chunk's units ``unit + i + 1``), those past ``skip``."""
    for i, text in enumerate(texts):
        after = unit + i + 1
        if after <= skip:
            continue
        row = first_row + i
        if type(text) is not str:
            yield (after, None, TextProblem(url, NO_TEXT, f"column {text_field!r} is null", row=row))
            continue
        if id_field is None:
            yield (after, text, f"{rel}:{row}")
            continue
        if missing_id is not None:
            yield (after, None, TextProblem(url, NO_ID, missing_id, row=row))
            continue
        assert ids is not None  # internal: read with the texts
        doc_id, problem = _id_of(ids[i], id_field)
        if problem is not None:
            yield (after, None, TextProblem(url, problem[0], problem[1], row=row))
        else:
            yield (after, text, doc_id)


def _parquet_items(chunk: Chunk, skip: int, text_field: str, id_field: str | None, store: Any) -> Iterator[Item]:
    import pyarrow.parquet as pq

    file = chunk.file
    if skip >= chunk.units:
        return
    columns = [text_field] if id_field is None else [text_field, id_field]
    try:
        with open_binary(file, store) as f:
            parquet = pq.ParquetFile(f)
            names = parquet.schema_arrow.names
            table = parquet.read_row_group(chunk.row_group, columns=[c for c in columns if c in names])
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged file are many: reported
        yield (
            chunk.units,
            None,
            TextProblem(file.url, UNREADABLE, f"cannot read row group {chunk.row_group}: {exc}", row=chunk.first),
        )
        return
    texts, ids, missing = _columns(table, text_field, id_field)
    yield from _row_items(file.url, file.rel, texts, ids, id_field, text_field, chunk.first, 0, skip, missing)


def _arrow_items(chunk: Chunk, skip: int, text_field: str, id_field: str | None, store: Any) -> Iterator[Item]:
    import pyarrow as pa

    file = chunk.file
    unit = 0
    try:
        f = pa.memory_map(file.path) if store is None else open_binary(file, store)
    except (FileNotFoundError, ShardNotFoundError):
        yield (0, None, TextProblem(file.url, UNREADABLE, "vanished before it was read"))
        return
    except StorageError:
        raise
    except OSError as exc:
        yield (0, None, TextProblem(file.url, UNREADABLE, f"cannot read: {exc.strerror or exc}"))
        return
    with f:
        try:
            for batch in _arrow_reader(f):
                rows = batch.num_rows
                if unit + rows > skip:
                    texts, ids, missing = _columns(batch, text_field, id_field)
                    yield from _row_items(
                        file.url, file.rel, texts, ids, id_field, text_field, unit, unit, skip, missing
                    )
                unit += rows
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged file are many: reported
            if unit + 1 > skip:
                yield (unit + 1, None, TextProblem(file.url, UNREADABLE, f"cannot read on from here: {exc}", row=unit))
