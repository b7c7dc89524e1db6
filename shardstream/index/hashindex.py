"""The hash-partitioned index layout that the key index (``keys/``, :mod:`.keys`) and the
document ids of a token dataset (``docids/``, :mod:`shardstream.tokens.docids`) share, written
and read under any folder: ``DIR/header.bin`` (magic ``SSKEYHD\\0``: fields ``format``,
``version`` (1), ``hash`` ("blake2b-8"), ``num_keys``, ``partition_bits``, ``bucket_bits``,
``num_shards`` and the caller's own; one int64 entry per partition in the columns ``count``,
``capacity``, ``data_offset`` and ``bytes``) and ``DIR/part-NNNNNN.bin`` (magic
``SSKEYPT\\0``: one uint64 column ``slots``, per slot the id's hash then
``shard << 32 | row``, an empty slot ``(0, 2**64 - 1)`` after its bucket's entries). A hash's
top ``partition_bits`` bits pick the partition and the next ``bucket_bits`` its bucket of
``capacity`` slots. :func:`write_hash_index` spills ``(shard, [id bytes, ...])`` pairs to one
run file per partition (memory: a 16 MB buffer and one partition, never O(ids)), writes the
partitions and then the header; :func:`read_hash_header` reads and checks the header. The hash and
the layout's sizes are the caller's (:class:`Hashing`): :mod:`.keys` owns and tunes them.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import IndexFormatError, ShardNotFoundError
from ..storage import write_pieces
from . import container

__all__ = ["Hashing", "KeyIndexReport", "read_hash_header", "write_hash_index"]

KEYS_DIR = "keys"
FORMAT = "shardstream-keys"
VERSION = 1
HASH = "blake2b-8"
HEADER_MAGIC = b"SSKEYHD\x00"
PART_MAGIC = b"SSKEYPT\x00"
EMPTY = np.uint64(2**64 - 1)
SLOT_BYTES = 16


@dataclasses.dataclass(frozen=True)
class Hashing:
    """How ids become slots: ``hash_keys`` (id bytes -> uint64 hashes), ``layout_bits`` (an id
    count -> ``(partition_bits, bucket_bits)``) and ``buffer_keys`` (entries held before a spill)."""

    hash_keys: Callable[[Iterable[bytes]], np.ndarray]
    layout_bits: Callable[[int], tuple[int, int]]
    buffer_keys: int


def part_name(p: int, directory: str = KEYS_DIR) -> str:
    return f"{directory}/part-{p:06d}.bin"


def header_name(directory: str = KEYS_DIR) -> str:
    return f"{directory}/header.bin"


@dataclasses.dataclass(frozen=True)
class KeyIndexReport:
    """What writing a key index did.

    Attributes:
        url: the key index's header URL.
        num_keys: keys indexed (every sample of the dataset).
        num_partitions: partition files written.
        bytes: the key index's total size in bytes (header and partitions).
        seconds: wall time of the build.
        key_ranges: each shard's first and last key, when every shard's keys are strictly
            increasing and the shards' ranges follow each other in manifest order (so a reader
            may binary-search them: :meth:`Manifest.key_ranges`); else None.
    """

    url: str
    num_keys: int
    num_partitions: int
    bytes: int
    seconds: float
    key_ranges: tuple[list[str], list[str]] | None = dataclasses.field(default=None, repr=False)


def write_hash_index(
    store: Any,
    items: Iterable[tuple[int, list[bytes]]],
    *,
    num_keys: int,
    num_shards: int,
    directory: str,
    format: str,
    fields: dict[str, Any] | None = None,
    spill_dir: str | None = None,
    fix: str = "",
    hashing: Hashing,
) -> KeyIndexReport:
    """Write a hash index in the layout of ``keys/`` (module doc) under ``directory`` of
    ``store``, from ``items``: ``(shard, ids)`` pairs, ``ids`` the UTF-8 bytes of the ids of
    the shard's rows in row order (row ``r`` is ``ids[r]``; shards in any order, each once).
    Memory as :func:`write_key_index`: a 16 MB buffer and one partition, never O(ids).

    Args:
        num_keys: the ids ``items`` gives in all (decides the layout; checked).
        num_shards: the shards numbered (recorded; shard numbers are below it).
        directory: the folder (``"keys"``, ``"docids"``, ...); its old partitions beyond the
            new layout are deleted.
        format: the header's ``format`` field (what the reader checks).
        fields: more header fields (recorded as given; a reader's staleness checks).
        fix: what an error says to do (appended to it).
        hashing: the hash and the layout's sizes (:class:`Hashing`).

    Raises:
        IndexFormatError: ``items`` gave another number of ids than ``num_keys``, a shard
            number outside ``0..num_shards-1``, or a shard of 2**32 ids or more.
    """
    header_url = store.url_of(header_name(directory))
    if num_shards >= 2**32 - 1:
        raise IndexFormatError(f"{header_url}: {num_shards} shards: the index holds uint32 shard numbers; {fix}")

    def checked() -> Iterator[tuple[int, list[bytes]]]:
        for shard, ids in items:
            if not 0 <= shard < num_shards or len(ids) >= 2**32:
                raise IndexFormatError(
                    f"{header_url}: shard {shard} of {num_shards} with {len(ids)} ids cannot be indexed "
                    f"(uint32 shard and row numbers); {fix}"
                )
            yield shard, ids

    def check_count(seen: int) -> None:
        if seen != num_keys:
            raise IndexFormatError(f"{header_url}: {seen} ids given where {num_keys} were announced; {fix}")

    return write_index(
        store,
        checked(),
        num_keys=num_keys,
        fields={"num_shards": num_shards, **(fields or {})},
        directory=directory,
        format=format,
        spill_dir=spill_dir,
        check_count=check_count,
        hashing=hashing,
    )


def write_index(
    store: Any,
    items: Iterable[tuple[int, list[bytes]]],
    *,
    num_keys: int,
    fields: dict[str, Any],
    directory: str,
    format: str,
    spill_dir: str | None,
    check_count: Callable[[int], None],
    hashing: Hashing,
) -> KeyIndexReport:
    """Spill ``items`` to run files, write the partitions, then the header (last)."""
    started = time.perf_counter()
    pbits, bbits = hashing.layout_bits(num_keys)
    num_parts = 1 << pbits
    with tempfile.TemporaryDirectory(prefix="shardstream-keys-", dir=spill_dir) as tmp:
        runs = [os.path.join(tmp, f"{p}.run") for p in range(num_parts)]
        check_count(_spill_items(items, pbits, runs, hashing.hash_keys, hashing.buffer_keys))
        columns = _write_partitions(store, runs, pbits=pbits, bbits=bbits, directory=directory, format=format)
    header_fields = {
        "format": format,
        "version": VERSION,
        "hash": HASH,
        "num_keys": num_keys,
        "partition_bits": pbits,
        "bucket_bits": bbits,
        **fields,
    }
    header = b"".join(container.to_pieces(HEADER_MAGIC, header_fields, list(columns.items())))
    store.write_bytes(header_name(directory), header)
    _delete_partitions_from(store, num_parts, directory=directory)
    return KeyIndexReport(
        url=store.url_of(header_name(directory)),
        num_keys=num_keys,
        num_partitions=num_parts,
        bytes=int(columns["bytes"].sum()) + len(header),
        seconds=time.perf_counter() - started,
    )


def _spill_items(
    items: Iterable[tuple[int, list[bytes]]],
    pbits: int,
    runs: list[str],
    hash_keys: Callable[[Iterable[bytes]], np.ndarray],
    buffer_keys: int,
) -> int:
    """Hash every ``(shard, keys)``'s keys into ``(hash, shard << 32 | row)`` entries, spilled
    through a buffer of ``buffer_keys`` entries to their partitions' ``runs``; returns the keys seen."""
    buffer = np.empty((buffer_keys, 2), dtype=np.uint64)
    filled = 0
    seen = 0
    for i, keys in items:
        hashes = hash_keys(keys)
        n = len(hashes)
        locs = (np.uint64(i) << np.uint64(32)) | np.arange(n, dtype=np.uint64)
        seen += n
        start = 0
        while start < n:
            take = min(n - start, buffer_keys - filled)
            buffer[filled : filled + take, 0] = hashes[start : start + take]
            buffer[filled : filled + take, 1] = locs[start : start + take]
            filled += take
            start += take
            if filled == buffer_keys:
                _spill(buffer[:filled], pbits, runs)
                filled = 0
    _spill(buffer[:filled], pbits, runs)
    return seen


def _write_partitions(
    store: Any, runs: list[str], *, pbits: int, bbits: int, directory: str = KEYS_DIR, format: str = FORMAT
) -> dict[str, np.ndarray]:
    """Write each partition's file from its run file (removed once read); returns the header's
    columns, in order: ``count``, ``capacity``, ``data_offset`` and ``bytes``, an entry per partition."""
    num_parts = len(runs)
    counts = np.zeros(num_parts, dtype=np.int64)
    capacity = np.zeros(num_parts, dtype=np.int64)
    offsets = np.zeros(num_parts, dtype=np.int64)
    sizes = np.zeros(num_parts, dtype=np.int64)
    for p in range(num_parts):
        entries = np.fromfile(runs[p], dtype="<u8").reshape(-1, 2) if os.path.exists(runs[p]) else None
        if entries is None:
            entries = np.empty((0, 2), dtype=np.uint64)
        slots, cap = _partition_slots(entries, pbits=pbits, bbits=bbits)
        if os.path.exists(runs[p]):
            os.unlink(runs[p])
        fields = {"format": format, "version": VERSION, "partition": p, "capacity": cap, "count": len(entries)}
        head, placement = container.layout(PART_MAGIC, fields, [("slots", "<u8", len(slots))])
        write_pieces(store, part_name(p, directory), [head, slots.tobytes()])
        counts[p], capacity[p], offsets[p] = len(entries), cap, placement[0][0]
        sizes[p] = len(head) + slots.nbytes
    return {"count": counts, "capacity": capacity, "data_offset": offsets, "bytes": sizes}


def _delete_partitions_from(store: Any, num_parts: int, *, directory: str = KEYS_DIR) -> None:
    """Delete ``store``'s partition files (under ``directory``) numbered ``num_parts`` and up:
    a previous, larger index's."""
    for name in store.list_names(f"{directory}/part-"):
        if (
            name.endswith(".bin")
            and name[len(directory) + 6 : -4].isdigit()
            and int(name[len(directory) + 6 : -4]) >= num_parts
        ):
            store.delete(name)


def _spill(entries: np.ndarray, pbits: int, runs: list[str]) -> None:
    """Append ``entries`` (``(n, 2)`` uint64: hash, location) to their partitions' run files."""
    if not len(entries):
        return
    if pbits == 0:
        with open(runs[0], "ab") as f:
            f.write(np.ascontiguousarray(entries).tobytes())
        return
    parts = entries[:, 0] >> np.uint64(64 - pbits)
    order = np.argsort(parts, kind="stable")
    ordered = entries[order]
    counts = np.bincount(parts.astype(np.int64), minlength=len(runs))
    bounds = np.concatenate([[0], np.cumsum(counts)])
    for p in np.flatnonzero(counts).tolist():
        with open(runs[p], "ab") as f:
            f.write(ordered[bounds[p] : bounds[p + 1]].tobytes())


def bucket_of(hashes: np.ndarray, *, pbits: int, bbits: int) -> np.ndarray:
    if bbits == 0:
        return np.zeros(len(hashes), dtype=np.int64)
    return (
        ((hashes << np.uint64(pbits)) >> np.uint64(64 - bbits)).astype(np.int64)
        if pbits
        else (hashes >> np.uint64(64 - bbits)).astype(np.int64)
    )


def _partition_slots(entries: np.ndarray, *, pbits: int, bbits: int) -> tuple[np.ndarray, int]:
    """A partition's slots (flat uint64, 2 per slot) and its bucket capacity."""
    num_buckets = 1 << bbits
    if not len(entries):
        return np.empty(0, dtype="<u8"), 0
    entries = entries[np.lexsort((entries[:, 1], entries[:, 0]))]
    buckets = bucket_of(entries[:, 0], pbits=pbits, bbits=bbits)
    counts = np.bincount(buckets, minlength=num_buckets)
    capacity = int(counts.max())
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = buckets * capacity + (np.arange(len(entries)) - starts[buckets])
    slots = np.zeros((num_buckets * capacity, 2), dtype="<u8")
    slots[:, 1] = EMPTY
    slots[position] = entries
    return slots.reshape(-1), capacity


def read_hash_header(
    store: Any, *, directory: str = KEYS_DIR, format: str = FORMAT, fix: str
) -> tuple[dict[str, Any], dict[str, np.ndarray], str] | None:
    """The header of the hash index under ``directory`` of ``store`` (one read), checked for
    its format, version, hash and columns: ``(fields, columns, url)``, or None when there is
    none. The caller checks the fields that tie it to its dataset (staleness).

    Raises:
        IndexFormatError: damaged, of another format or version (the message ends with ``fix``).
        StorageError: the store failed.
    """
    name = header_name(directory)
    url = store.url_of(name)
    try:
        data = store.read_bytes(name)
    except ShardNotFoundError:
        return None
    fields, columns = container.read(data, magic=HEADER_MAGIC, url=url, kind="key index")
    if fields.get("format") != format or fields.get("version") != VERSION or fields.get("hash") != HASH:
        raise IndexFormatError(
            f"{url}: key index {fields.get('format')!r} version {fields.get('version')!r} hash "
            f"{fields.get('hash')!r} is not supported (reads {format!r} version {VERSION}, {HASH}); {fix}"
        )
    try:
        pbits, bbits = int(fields["partition_bits"]), int(fields["bucket_bits"])
        num_keys = int(fields["num_keys"])
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexFormatError(f"{url}: damaged key index header ({exc!r}); {fix}") from exc
    if not (0 <= pbits <= 32 and 0 <= bbits <= 40):
        raise IndexFormatError(f"{url}: partition_bits={pbits}, bucket_bits={bbits} out of range; {fix}")
    for column_name in ("count", "capacity", "data_offset", "bytes"):
        column = columns.get(column_name)
        if column is None or column.dtype.str != "<i8" or len(column) != 1 << pbits:
            raise IndexFormatError(f"{url}: column {column_name!r} missing, not <i8 or not {1 << pbits} long; {fix}")
    if int(columns["count"].sum()) != num_keys:
        raise IndexFormatError(f"{url}: its partitions' counts disagree with num_keys={num_keys}; {fix}")
    return fields, columns, url
