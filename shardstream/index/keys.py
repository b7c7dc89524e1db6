"""The key index, ``keys/`` beside ``index.bin``: sample key -> ``(shard, row)``, hash-partitioned.

Serves a lookup by key in any dataset (shuffled, foreign, written by any of our writers) with one
small ranged read, after a header read once per process that is O(partitions), never
O(keys). Files (container: :mod:`.container`):

- ``keys/header.bin`` (magic ``SSKEYHD\\0``): fields ``format`` ("shardstream-keys"),
  ``version`` (1), ``hash`` ("blake2b-8"), ``num_keys``, ``partition_bits``, ``bucket_bits``,
  ``num_shards``, ``num_samples`` and ``manifest_crc32`` (of the manifest it was built from:
  a stale key index is refused). Columns, one entry per partition: ``count`` (keys),
  ``capacity`` (slots per bucket), ``data_offset`` (byte where its slots start in its file),
  ``bytes`` (its file's size); all int64.
- ``keys/part-NNNNNN.bin`` (magic ``SSKEYPT\\0``): one column ``slots`` (uint64,
  ``2 * buckets * capacity``): per slot the key's hash, then ``shard << 32 | row``;
  an empty slot is ``(0, 2**64 - 1)``, and a bucket's empty slots follow its entries.

A key's hash ``h`` is the first 8 bytes of BLAKE2b (digest_size=8) of its UTF-8 bytes, read
little-endian. Its top ``partition_bits`` bits pick the partition, the next ``bucket_bits``
its bucket; a bucket holds ``capacity`` slots (the partition's fullest bucket), so a lookup
reads exactly ``16 * capacity`` bytes at ``data_offset + 16 * capacity * bucket``: about 4 KB
(a bucket holds 128 to 256 keys on average). Equal hashes give several candidates; the caller
checks the key in the shard's table.

The same layout indexes other ids under another folder (the document ids of a token dataset,
``docids/``: :mod:`shardstream.tokens.docids`): :func:`write_hash_index` takes any
``(shard, [id bytes, ...])`` pairs, :func:`read_hash_header` and :class:`KeyIndex` (given
``directory``, ``shard_rows`` and ``fix``) read them back.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import itertools
import logging
import math
import os
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..config import RequestConfig
from ..errors import CorruptShardError, IndexFormatError, ShardNotFoundError
from ..storage import LocalStore, loop, open_store, write_pieces
from .hashindex import (
    EMPTY,
    FORMAT,
    KEYS_DIR,
    SLOT_BYTES,
    Hashing,
    KeyIndexReport,
    bucket_of,
    part_name,
    read_hash_header,
    write_index,
)
from .hashindex import write_hash_index as _write_hash_index
from .manifest import MANIFEST_NAME, Manifest
from .table import ShardTable

__all__ = [
    "KEYS_DIR",
    "KeyIndex",
    "KeyIndexReport",
    "build_key_index",
    "hash_keys",
    "read_hash_header",
    "write_hash_index",
    "write_key_index",
    "write_with_keys",
]

log = logging.getLogger("shardstream")

_BUCKET_KEYS = 256  # mean keys per bucket lies in (128, 256]: a lookup reads about 4 KB
_PARTITION_KEYS = 1 << 21  # keys a partition holds on average at most: sorted in memory (64 MB of work arrays)
_BUFFER_KEYS = 1 << 20  # entries held before they are spilled to the partitions' run files (16 MB)
_TABLES_AHEAD = 16  # tables read ahead of the one being hashed


def hash_keys(keys: Iterable[bytes]) -> np.ndarray:
    """The 64-bit key hash of each key: the first 8 bytes of BLAKE2b (``digest_size=8``) of its
    UTF-8 bytes, little-endian. Stable across processes, machines and versions.

    Returns:
        uint64 array of shape ``(len(keys),)``.
    """
    return np.frombuffer(b"".join([hashlib.blake2b(k, digest_size=8).digest() for k in keys]), dtype="<u8")


def layout_bits(num_keys: int) -> tuple[int, int]:
    """``(partition_bits, bucket_bits)`` for ``num_keys`` keys: partitions of at most about
    2 Mi keys, buckets of 128 to 256 keys on average."""
    total = max(0, math.ceil(math.log2(num_keys / _BUCKET_KEYS))) if num_keys > _BUCKET_KEYS else 0
    partition = max(0, math.ceil(math.log2(num_keys / _PARTITION_KEYS))) if num_keys > _PARTITION_KEYS else 0
    partition = min(partition, total)
    return partition, total - partition


def manifest_crc32(manifest: Manifest) -> int:
    """A fingerprint of a manifest's shards (CRC-32 of its shard CRCs and sample counts)."""
    crc = zlib.crc32(np.ascontiguousarray(manifest.crc32, dtype="<u4").tobytes())
    return zlib.crc32(np.ascontiguousarray(manifest.shard_samples, dtype="<i8").tobytes(), crc)


# writing


def _hashing() -> Hashing:
    """This module's hash and layout sizes, as they are now (tests tune them here)."""
    return Hashing(hash_keys=hash_keys, layout_bits=layout_bits, buffer_keys=_BUFFER_KEYS)


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
) -> KeyIndexReport:
    """:func:`.hashindex.write_hash_index` with the key index's hash and layout (:func:`hash_keys`,
    :func:`layout_bits`): ``(shard, ids)`` pairs -> an index of ``keys/``'s layout under ``directory``."""
    return _write_hash_index(
        store,
        items,
        num_keys=num_keys,
        num_shards=num_shards,
        directory=directory,
        format=format,
        fields=fields,
        spill_dir=spill_dir,
        fix=fix,
        hashing=_hashing(),
    )


def write_key_index(
    store: Any,
    manifest: Manifest,
    *,
    tables: Iterable[ShardTable] | None = None,
    spill_dir: str | None = None,
    progress: bool = False,
) -> KeyIndexReport:
    """Write ``store``'s ``keys/`` for the dataset ``manifest`` describes, from its shards'
    tables: one pass over the tables, memory bounded by a 16 MB buffer and one partition
    (about 2 Mi keys), never O(keys). Entries are spilled to ``spill_dir`` (a temporary
    directory by default: 16 bytes per key) and sorted one partition at a time.

    Args:
        store: the dataset's store (its tables are read from it, ``keys/`` written to it).
        manifest: the dataset's manifest (before or after it is written).
        tables: the shards' tables in manifest order (default: read from ``store``).
        progress: log a line every 10,000 shards.

    Returns:
        A :class:`KeyIndexReport`, with the per-shard key ranges when the keys are sorted.

    Raises:
        ShardNotFoundError: a table is missing; IndexFormatError: a table is damaged or
            disagrees with the manifest; StorageError: the store failed.
    """
    num_keys = manifest.num_samples
    _check_numbering(store, manifest)
    ranges = _Ranges(manifest.num_shards)

    def check_count(seen: int) -> None:
        if seen != num_keys:
            raise IndexFormatError(
                f"{store.url_of(MANIFEST_NAME)}: the tables hold {seen} samples, the manifest {num_keys}; "
                "re-run shardstream pack (or shardstream index build)"
            )

    report = write_index(
        store,
        _table_items(store, manifest, tables, ranges, progress=progress),
        num_keys=num_keys,
        fields={"num_shards": manifest.num_shards, "num_samples": num_keys, "manifest_crc32": manifest_crc32(manifest)},
        directory=KEYS_DIR,
        format=FORMAT,
        spill_dir=spill_dir,
        check_count=check_count,
        hashing=_hashing(),
    )
    return dataclasses.replace(report, key_ranges=ranges.result())


def _check_numbering(store: Any, manifest: Manifest) -> None:
    """Raise IndexFormatError unless every shard and row number fits the key index's uint32."""
    if manifest.num_shards >= 2**32 - 1 or int(manifest.shard_samples.max(initial=0)) >= 2**32:
        raise IndexFormatError(
            f"{store.url}: {manifest.num_shards} shards, or a shard of 2**32 samples or more: the key index holds "
            "uint32 shard and row numbers; pack into fewer, smaller shards"
        )


def _table_items(
    store: Any,
    manifest: Manifest,
    tables: Iterable[ShardTable] | None,
    ranges: _Ranges,
    *,
    progress: bool,
) -> Iterator[tuple[int, list[bytes]]]:
    """Every table's ``(shard, key bytes)`` in manifest order (``ranges`` sees each table's keys)."""
    for i, table in enumerate(tables if tables is not None else _read_tables(store, manifest)):
        keys = _key_bytes(table)
        ranges.add(i, keys)
        yield i, keys
        if progress and (i + 1) % 10_000 == 0:
            log.warning("%s: key index: %d of %d shards read", store.url, i + 1, manifest.num_shards)


def build_key_index(
    dest: str | os.PathLike[str],
    *,
    s3: Any = None,
    requests: RequestConfig | None = None,
    progress: bool = False,
) -> KeyIndexReport:
    """``shardstream index keys DEST``: add a key index to an existing dataset (any writer's,
    a foreign one indexed by ``index build`` included), from its tables, in one pass with
    bounded memory (:func:`write_key_index`). When its keys are sorted (:meth:`Manifest.key_ranges`),
    ``index.bin`` is rewritten with each shard's first and last key.

    Args:
        dest: the dataset's directory or ``s3://`` prefix (where ``index.bin`` is).
        s3, requests: how the store is reached, as for :func:`~shardstream.open_index`.
        progress: log progress every 10,000 shards.

    Raises:
        ShardNotFoundError: no ``index.bin`` at ``dest`` (a version 1 dataset: run
            ``shardstream index upgrade DEST`` first), or a table is missing;
        IndexFormatError: the index or a table is damaged.
    """
    store = open_store(os.fspath(dest), s3=s3, requests=requests)
    try:
        data = store.read_bytes(MANIFEST_NAME)
    except ShardNotFoundError as exc:
        raise ShardNotFoundError(
            f"{store.url_of(MANIFEST_NAME)}: no version 2 index here; pass a dataset written by shardstream pack or "
            "index build (run shardstream index upgrade DEST on a version 1 dataset first)"
        ) from exc
    manifest = Manifest.parse(data, url=store.url_of(MANIFEST_NAME))
    report = write_key_index(store, manifest, progress=progress)
    if report.key_ranges is not None or manifest.key_ranges() is not None:
        manifest.set_key_ranges(report.key_ranges)
        write_pieces(store, MANIFEST_NAME, manifest.pieces())
    return report


def write_with_keys(store: Any, manifest: Manifest) -> KeyIndexReport | None:
    """Write a dataset's key index, then its ``index.bin`` (with the shards' key ranges when
    sorted): what every writer (``pack``, ``ShardWriter``, ``pack_samples``, the Ray writers,
    ``index build``, ``index merge``) does once the tables are written. The manifest goes
    last, so a dataset whose ``index.bin`` is there has its key index. A dataset of no
    sample gets none (and None is returned).

    Raises:
        what :func:`write_key_index` raises.
    """
    report = None
    if manifest.num_samples:  # an empty dataset is removed, not published
        report = write_key_index(store, manifest)
        manifest.set_key_ranges(report.key_ranges)
    write_pieces(store, MANIFEST_NAME, manifest.pieces())
    return report


class _Ranges:
    """Each shard's first and last key, while every shard's keys are strictly increasing and
    each shard's first key follows the previous shard's last (else nothing is kept)."""

    def __init__(self, num_shards: int) -> None:
        self.first: list[str] | None = []
        self.last: list[str] = []
        self.num_shards = num_shards

    def add(self, i: int, keys: list[bytes]) -> None:
        if self.first is None:
            return
        if (
            not keys
            or (self.last and keys[0] <= self.last[-1].encode())
            or any(a >= b for a, b in itertools.pairwise(keys))
        ):
            self.first = None  # UTF-8 byte order is code-point order: str comparison agrees
            return
        try:
            self.first.append(keys[0].decode("utf-8"))
            self.last.append(keys[-1].decode("utf-8"))
        except UnicodeDecodeError:
            self.first = None

    def result(self) -> tuple[list[str], list[str]] | None:
        if self.first is None or len(self.first) != self.num_shards:
            return None
        return self.first, self.last


def _key_bytes(table: ShardTable) -> list[bytes]:
    blob = table._keys.tobytes()  # the UTF-8 keys, undecoded
    bounds = table._key_offsets.tolist()
    return [blob[a:b] for a, b in itertools.pairwise(bounds)]


def _read_tables(store: Any, manifest: Manifest) -> Iterator[ShardTable]:
    """The manifest's tables from ``store``, in order, a few read ahead in threads."""

    def read(i: int) -> ShardTable:
        name = manifest.table_name(i)
        try:
            data = store.read_bytes(name)
        except ShardNotFoundError as exc:
            raise ShardNotFoundError(
                f"{store.url_of(name)}: the sample table of shard {manifest.name(i)} is missing; re-run "
                "shardstream pack (or shardstream index build)"
            ) from exc
        return ShardTable.parse(
            data,
            url=store.url_of(name),
            num_samples=int(manifest.shard_samples[i]),
            num_members=int(manifest.shard_members[i]),
        )

    if isinstance(store, LocalStore) or manifest.num_shards < 2:
        yield from (read(i) for i in range(manifest.num_shards))
        return
    with concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="shardstream-keys") as pool:
        pending: list[concurrent.futures.Future[ShardTable]] = []
        for i in range(manifest.num_shards):
            pending.append(pool.submit(read, i))
            if len(pending) > _TABLES_AHEAD:
                yield pending.pop(0).result()  # read_bytes is bounded by the store's request limit
        for future in pending:
            yield future.result()


# reading


class KeyIndex:
    """A dataset's key index, opened: its header (O(partitions)), and lookups by key, one
    ranged read of a few KB each (module doc). Picklable (the store is reopened).

    Another index of the same layout (:func:`write_hash_index`) is read the same way, given
    ``directory`` (its folder), ``shard_rows`` (rows per shard, default the manifest's samples
    per shard: a location beyond them is refused as damage) and ``fix`` (what its errors say
    to do, default: rebuild the key index).

    Attributes:
        url: the header's URL; num_keys: keys indexed; num_partitions: partition files.
    """

    def __init__(
        self,
        *,
        root: str,
        manifest: Manifest,
        fields: dict[str, Any],
        columns: dict[str, np.ndarray],
        url: str,
        s3: Any = None,
        requests: RequestConfig | None = None,
        directory: str = KEYS_DIR,
        shard_rows: np.ndarray | None = None,
        fix: str | None = None,
    ) -> None:
        self.root, self.url, self.s3, self.requests = root, url, s3, requests
        self.directory = directory
        self._fix = fix if fix is not None else f"run shardstream index keys {root} to rebuild the key index"
        self._shard_samples = manifest.shard_samples if shard_rows is None else np.asarray(shard_rows)
        self.num_keys = int(fields["num_keys"])
        self._pbits, self._bbits = int(fields["partition_bits"]), int(fields["bucket_bits"])
        self.num_partitions = 1 << self._pbits
        self._count, self._capacity = columns["count"], columns["capacity"]
        self._offset, self._bytes = columns["data_offset"], columns["bytes"]
        self._store: Any = None

    def __repr__(self) -> str:
        return f"KeyIndex({self.url!r}, num_keys={self.num_keys}, num_partitions={self.num_partitions})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None
        return state

    @classmethod
    def open(cls, index: Any, *, s3: Any = None, requests: RequestConfig | None = None) -> KeyIndex | None:
        """The key index of the dataset ``index`` opened (its ``keys/header.bin``, one read), or
        None when it has none (write one with ``shardstream index keys DEST``).

        Args:
            index: the opened dataset (:func:`~shardstream.open_index`).
            s3, requests: how its store is reached (default: as ``index`` was opened).

        Raises:
            IndexFormatError: the header is damaged, of another version, or was built for
                other shards (stale: run ``shardstream index keys DEST`` again).
            StorageError: the store failed.
        """
        s3 = s3 if s3 is not None else index.s3
        requests = requests if requests is not None else index.requests
        store = open_store(index.root, s3=s3, requests=requests)
        fix = f"run shardstream index keys {index.root} to rebuild it"
        header = read_hash_header(store, fix=fix)
        if header is None:
            return None
        fields, columns, url = header
        manifest = index.manifest
        if (
            fields.get("num_shards") != manifest.num_shards
            or fields.get("num_samples") != manifest.num_samples
            or int(fields["num_keys"]) != manifest.num_samples
            or fields.get("manifest_crc32") != manifest_crc32(manifest)
        ):
            raise IndexFormatError(
                f"{url}: built for other shards than {manifest.url} holds ({fields.get('num_shards')} shards, "
                f"{fields.get('num_samples')} samples); the key index is stale, {fix}"
            )
        return cls(
            root=index.root, manifest=manifest, fields=fields, columns=columns, url=url, s3=s3, requests=requests
        )

    def lookup(self, key: str | bytes) -> list[tuple[int, int]]:
        """Every ``(shard, row)`` whose key hash equals ``key``'s: the candidates, in (shard,
        row) order, ``[]`` when no sample has that hash. One ranged read of one bucket (about
        4 KB); the caller checks the key in the shard's table (a collision gives several).
        ``key`` is a str (hashed as UTF-8) or the bytes that were indexed.

        Raises:
            IndexFormatError: the partition file is damaged or truncated (named);
            ShardNotFoundError: it is missing; StorageError: the store failed.
        """
        h = int(hash_keys([key if isinstance(key, bytes) else key.encode("utf-8")])[0])
        p = h >> (64 - self._pbits) if self._pbits else 0
        bucket = ((h << self._pbits) & (2**64 - 1)) >> (64 - self._bbits) if self._bbits else 0
        capacity = int(self._capacity[p])
        if capacity == 0:
            return []
        start = int(self._offset[p]) + SLOT_BYTES * capacity * bucket
        end = start + SLOT_BYTES * capacity
        name = part_name(p, self.directory)
        data = self._read(name, start, end)
        if len(data) != end - start:
            raise IndexFormatError(
                f"{self._url_of(name)}: truncated ({len(data)} of {end - start} bytes at {start}); {self._fix}"
            )
        slots = np.frombuffer(data, dtype="<u8").reshape(-1, 2)
        used = slots[:, 1] != EMPTY
        n = int(used.sum())
        hashes = slots[:n, 0]
        if (
            not used[:n].all()
            or (n and (bucket_of(hashes, pbits=self._pbits, bbits=self._bbits) != bucket).any())
            or (self._pbits and n and ((hashes >> np.uint64(64 - self._pbits)) != p).any())
            or (hashes[1:] < hashes[:-1]).any()
        ):
            raise IndexFormatError(f"{self._url_of(name)}: damaged bucket {bucket} at byte {start}; {self._fix}")
        hits = slots[:n][hashes == np.uint64(h), 1]
        shards = (hits >> np.uint64(32)).astype(np.int64)
        rows = (hits & np.uint64(0xFFFFFFFF)).astype(np.int64)
        if len(hits) and (
            (shards >= len(self._shard_samples)).any()
            or (rows >= self._shard_samples[np.minimum(shards, len(self._shard_samples) - 1)]).any()
        ):
            raise IndexFormatError(
                f"{self._url_of(name)}: bucket {bucket} names a shard or row the dataset does not have; {self._fix}"
            )
        return sorted(zip(shards.tolist(), rows.tolist()))

    def _url_of(self, name: str) -> str:
        return self._get_store().url_of(name)

    def _get_store(self) -> Any:
        if self._store is None:
            self._store = open_store(self.root, s3=self.s3, requests=self.requests)
        return self._store

    def _read(self, name: str, start: int, end: int) -> bytes:
        store = self._get_store()
        if isinstance(store, LocalStore):
            with store.open_read(name, buffer_bytes=0) as f:
                return os.pread(f.fileno(), end - start, start)
        future = loop.submit(store.get_range(name, start, end))
        try:
            pieces, _, _ = loop.result_within(future, store, store.url_of(name))
        except CorruptShardError as exc:
            raise IndexFormatError(f"{store.url_of(name)}: truncated or changed ({exc}); {self._fix}") from exc
        return b"".join(pieces)
