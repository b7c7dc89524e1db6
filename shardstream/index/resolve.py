"""Opening a dataset's index: a directory or S3 prefix (or its index file) -> a
:class:`DatasetIndex`; what ``ShardDataset`` takes as its source -> shard URLs and the index;
shard URLs with their sample tables beside them (``NAME.samples``) -> :class:`ShardTables`;
and ``shardstream index upgrade`` (version 1 -> 2, in place, shards untouched).

Opening reads ``index.bin`` only: one mapped file locally, one GET on S3 (the bytes go into a
shared-memory file, :mod:`shardstream.storage.shm`, that DataLoader workers map instead of copying).
A version 1 ``index.json`` still opens, converted in memory, at its old cost per sample.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from ..config import RequestConfig
from ..errors import (
    IndexFormatError,
    ShardNotFoundError,
    StorageAccessError,
    StorageConnectionError,
    UnfinishedPackError,
)
from ..format import SHARD_SUFFIXES
from ..storage import LocalStore, is_remote_url, loop, open_store, pin_urls, split_url, write_pieces
from ..storage.cache import Busy
from .keys import write_with_keys
from .manifest import MANIFEST_NAME, TABLE_SUFFIX, Manifest
from .status import unfinished_pack
from .table import MAGIC as TABLE_MAGIC
from .table import ShardTable
from .v1 import INDEX_NAME, Index, MemberEntry, SampleEntry, ShardEntry

__all__ = [
    "TABLES_KEPT",
    "DatasetIndex",
    "ShardTables",
    "ShardUrls",
    "open_index",
    "resolve_source",
    "upgrade",
    "warn_if_partial",
]

log = logging.getLogger("shardstream")
TABLES_KEPT = 64  # per-shard tables a process keeps (a reader needs one or two at a time)
_TABLES_KEPT = TABLES_KEPT


class DatasetIndex:
    """An opened dataset: its :class:`Manifest`, where its shards and tables are, and the
    per-shard tables read on demand.

    Attributes:
        manifest: the shards' columns.
        root: URL of the directory (or S3 prefix) holding the index, shards and tables.
        s3, requests: how its store is reached (:func:`open_index`).
    """

    def __init__(
        self,
        manifest: Manifest,
        *,
        root: str,
        s3: Any = None,
        requests: RequestConfig | None = None,
        legacy_tables: list[ShardTable] | None = None,
    ) -> None:
        self.manifest = manifest
        self.root = root.rstrip("/") or "/"
        self.s3 = s3
        self.requests = requests
        self._legacy_tables = legacy_tables
        self._tables: collections.OrderedDict[int, ShardTable] = collections.OrderedDict()
        self._store: Any = None
        self._pending: collections.OrderedDict[int, concurrent.futures.Future[Any]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"DatasetIndex({self.root!r}, num_shards={self.num_shards}, num_samples={self.num_samples})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tables"], state["_store"] = collections.OrderedDict(), None
        del state["_pending"], state["_lock"], state["_pid"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pending, self._lock, self._pid = collections.OrderedDict(), threading.Lock(), os.getpid()

    @property
    def num_shards(self) -> int:
        return self.manifest.num_shards

    @property
    def num_samples(self) -> int:
        return self.manifest.num_samples

    def shard_url(self, i: int) -> str:
        return _join(self.manifest.shards_url or self.root, self.manifest.name(i))

    def table(self, i: int) -> ShardTable:
        """Shard ``i``'s sample table (read once, then kept among the last few used).

        Raises:
            ShardNotFoundError: the table is missing; IndexFormatError: it is damaged or
                disagrees with the manifest.
        """
        if self._legacy_tables is not None:
            return self._legacy_tables[i]
        with self._lock:
            table = self._tables.get(i)
            if table is not None:
                self._tables.move_to_end(i)
                return table
        store = self._table_store()
        name = self.manifest.table_name(i)
        try:
            data = store.read_bytes(name)
        except ShardNotFoundError as exc:
            raise self._missing(i) from exc
        return self._keep(i, data)

    def request_table(
        self, i: int, *, on_retry: Callable[[BaseException], None] | None = None, cache: Any = None
    ) -> Callable[[], ShardTable]:
        """Start reading shard ``i``'s table now, without waiting for it (a remote table's GET
        runs on the background loop beside the shard's own): returns the function that waits
        for it and gives it, as :meth:`table` would. Local tables, and those in memory, are
        read when that function is called. Requests not collected are dropped (cancelled)
        beyond the last 64. ``on_retry`` is told of each resumed GET.

        The function raises what :meth:`table` raises, and StorageConnectionError when the
        GET has not answered within the store's bound on one request.
        """
        if self._legacy_tables is not None or i in self._tables or not is_remote_url(self.root):
            return lambda: self.table(i)
        if cache is not None:  # the node cache holds remote tables too, so a later epoch asks the store for nothing
            url = self._table_store().url_of(self.manifest.table_name(i))
            entry = cache.open(url)
            if entry is not None:
                with entry:
                    data = entry.read()
                return lambda: self._keep(i, data)
            started = self._submit(i, on_retry)
            return lambda: self._collect(i, started, read=lambda data: _into_cache(cache, url, data))
        future = self._submit(i, on_retry)
        return lambda: self._collect(i, future)

    def _submit(self, i: int, on_retry: Callable[[BaseException], None] | None) -> concurrent.futures.Future[Any]:
        """The GET of shard ``i``'s table, started on the background loop (or the one under way)."""
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's requests run on its loop, not ours
                self._pending, self._pid = collections.OrderedDict(), os.getpid()
            future = self._pending.get(i)
            if future is None:
                store = self._table_store()
                future = loop.submit(store.get_range(self.manifest.table_name(i), 0, None, on_retry=on_retry))
                self._pending[i] = future
                while len(self._pending) > _TABLES_KEPT:
                    self._pending.popitem(last=False)[1].cancel()
        return future

    def _collect(
        self, i: int, future: concurrent.futures.Future[Any], *, read: Callable[[bytes], None] | None = None
    ) -> ShardTable:
        """Shard ``i``'s table once its GET ``future`` answers (``read`` is given its bytes)."""
        store = self._table_store()
        try:
            if i in self._tables:
                return self.table(i)
            pieces, _, _ = loop.result_within(future, store, store.url_of(self.manifest.table_name(i)))
        except ShardNotFoundError as exc:
            raise self._missing(i) from exc
        finally:
            with self._lock:
                if self._pending.get(i) is future:
                    del self._pending[i]
        data = b"".join(pieces)
        table = self._keep(i, data)
        if read is not None:
            read(data)
        return table

    def _table_store(self) -> Any:
        if self._store is None:
            self._store = open_store(self.root, s3=self.s3, requests=self.requests)
        return self._store

    def _missing(self, i: int) -> ShardNotFoundError:
        return ShardNotFoundError(
            f"{self._table_store().url_of(self.manifest.table_name(i))}: the sample table of shard "
            f"{self.manifest.name(i)} is missing; re-run shardstream pack (or shardstream index upgrade)"
        )

    def _keep(self, i: int, data: bytes) -> ShardTable:
        """Shard ``i``'s table parsed from ``data``, kept among the last few used."""
        table = ShardTable.parse(
            data,
            url=self._table_store().url_of(self.manifest.table_name(i)),
            num_samples=int(self.manifest.shard_samples[i]),
            num_members=int(self.manifest.shard_members[i]),
        )
        return _keep_table(
            self._tables,
            self._lock,
            i,
            table,
            shard=self.manifest.name(i),
            fix="shardstream pack (or shardstream index build)",
        )

    def as_v1(self) -> Index:
        """Every shard and sample as objects, as a version 1 :class:`Index` (reads every
        table: a cost per sample, for small datasets, tests and tools)."""
        manifest = self.manifest
        return Index(
            shards=tuple(
                ShardEntry(
                    manifest.name(i),
                    int(manifest.shard_bytes[i]),
                    manifest.crc32_hex(i),
                    samples=tuple(
                        SampleEntry(key, tuple(MemberEntry(*m) for m in members))
                        for key, members in self.table(i).samples()
                    ),
                )
                for i in range(self.num_shards)
            )
        )


class LazyUrls(Sequence[str]):
    """Shard URLs made on access (no string per shard held): a subclass gives ``__len__`` and
    ``url(i)`` for ``0 <= i < len``; indexing (negative from the end) and slices come here."""

    def url(self, i: int) -> str:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self.url(j) for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"shard {i} of {len(self)}")
        return self.url(i % len(self))


class ShardUrls(LazyUrls):
    """The shard URLs of a :class:`DatasetIndex`, made on access (no string per shard held)."""

    def __init__(self, index: DatasetIndex) -> None:
        self._index = index

    def __len__(self) -> int:
        return self._index.num_shards

    def url(self, i: int) -> str:
        return self._index.shard_url(i)

    def __iter__(self) -> Iterator[str]:
        return (self._index.shard_url(j) for j in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"ShardUrls({len(self)} shards under {self._index.root!r})"


def _into_cache(cache: Any, url: str, data: bytes) -> None:
    """``data`` (a sample table just read from ``url``) written into the node ``cache`` when it
    has room and no other process is writing it."""
    fill = cache.fill(url, size_bytes=len(data), wait=False)
    if fill is None or isinstance(fill, Busy):
        return
    try:
        fill.write(data)
        fill.commit()
    except BaseException:
        fill.abort()
        raise


def open_index(
    location: str | os.PathLike[str], *, s3: Any = None, requests: RequestConfig | None = None
) -> DatasetIndex:
    """Open the index of the dataset at ``location``: a local directory or a remote prefix
    (``s3://bucket/prefix``, ``https://...``, ``hf://datasets/...``, ``gs://...``, ``az://...``;
    ``index.bin``, else a version 1 ``index.json``), or the path of either file.

    Args:
        location: as above.
        s3: an :class:`~shardstream.config.S3Config` for ``s3://`` locations.
        requests: a :class:`~shardstream.config.RequestConfig` for the requests to a remote
            store (timeouts, attempts, connections); the index keeps it for its tables.

    Raises:
        UnfinishedPackError: no index there, but a pack that has not finished (says how far
            it got and how to finish it).
        ShardNotFoundError: no index there (names what to pass instead).
        IndexFormatError: the index is malformed.
    """
    text = os.fspath(location)
    if text.endswith((".json", ".bin")):
        root, name = split_url(text if is_remote_url(text) else os.path.abspath(text))
        names = [name]
    else:
        root = text.rstrip("/") if is_remote_url(text) else os.path.abspath(text)
        names = [MANIFEST_NAME, INDEX_NAME]
    store = open_store(root or os.sep, s3=s3, requests=requests)
    for name in names:
        if name.endswith(".bin"):
            manifest = _read_manifest(store, name)
            if manifest is not None:
                return DatasetIndex(manifest, root=store.url, s3=s3, requests=requests)
        else:
            try:
                data = store.read_bytes(name)
            except ShardNotFoundError:
                continue
            manifest, tables = legacy(Index.from_json(data, url=store.url_of(name)), url=store.url_of(name))
            return DatasetIndex(manifest, root=store.url, s3=s3, requests=requests, legacy_tables=tables)
    unfinished = unfinished_pack(store, None) if MANIFEST_NAME in names else None
    if unfinished is not None:
        raise UnfinishedPackError(f"{unfinished.describe()} (it has no index yet, so it is not a dataset)")
    raise ShardNotFoundError(
        f"{store.url_of(names[0])}: no index here; pass a directory or s3:// prefix written by "
        "shardstream pack, its index file, or shard URLs (a list or a brace pattern)"
    )


def _read_manifest(store: Any, name: str) -> Manifest | None:
    url = store.url_of(name)
    if isinstance(store, LocalStore):
        try:
            return Manifest.open_file(url, url=url)
        except FileNotFoundError:
            return None
    try:
        data = store.read_bytes(name)
    except ShardNotFoundError:
        return None
    from ..storage.shm import SharedFile

    try:  # workers map the shared copy instead of each holding one
        shared = SharedFile("shardstream-index", len(data))
        buffer = shared.buffer()
        assert buffer is not None  # internal invariant: just created
        buffer[: len(data)] = data
        return Manifest.parse(buffer, url=url, source=("shm", shared))
    except OSError:  # no room in /dev/shm: a private copy
        return Manifest.parse(data, url=url)


def legacy(index: Index, *, url: str) -> tuple[Manifest, list[ShardTable]]:
    """A version 1 index as a manifest and in-memory tables (its cost is per sample)."""
    manifest = Manifest.from_columns(
        names=[s.name for s in index.shards],
        shard_bytes=[s.bytes for s in index.shards],
        shard_samples=[s.num_samples for s in index.shards],
        shard_members=[s.num_members for s in index.shards],
        crc32=[int(s.crc32, 16) for s in index.shards],
        url=url,
    )
    tables = [
        ShardTable.from_samples(s.name, ((x.key, [(m.name, m.offset, m.size) for m in x.members]) for x in s.samples))
        for s in index.shards
    ]
    return manifest, tables


def resolve_source(
    source: Any, *, s3: Any = None, requests: RequestConfig | None = None
) -> tuple[Sequence[str], DatasetIndex | None]:
    """Shard URLs (and the index, when there is one) of a ``ShardDataset`` source: a dataset
    location (see :func:`open_index`), a shard URL, a brace pattern, or a list of shard URLs
    (``hf://`` revisions pinned to their commit, asked under ``requests``)."""
    if isinstance(source, (list, tuple)):
        urls = pin_urls([_normalize(os.fspath(u)) for u in source], requests=requests)
        if not urls:
            raise ValueError("source is an empty list of shard URLs")
        return urls, None
    text = os.fspath(source)
    if "{" in text:
        from braceexpand import braceexpand

        return pin_urls([_normalize(u) for u in braceexpand(text)], requests=requests), None
    if text.endswith(SHARD_SUFFIXES):
        return pin_urls([_normalize(text)], requests=requests), None
    index = open_index(_normalize(text), s3=s3, requests=requests)
    warn_if_partial(index)
    return ShardUrls(index), index


def warn_if_partial(index: DatasetIndex) -> None:
    """Log a warning when ``index`` is partial (``index build --partial`` over an unfinished
    pack), naming what it misses: a reader then reads only part of the data."""
    if index.manifest.partial:
        log.warning("%s: a partial index, read as it is: it %s", index.manifest.url, index.manifest.partial)


class ShardTables:
    """The sample tables beside shards given by URL (``NAME.samples`` beside shard ``NAME``, as
    ``pack`` writes them): each shard's sample count, read by :meth:`open`, and each table on
    demand (the last few kept). No index needed: shard URLs with tables read in exact epochs.

    Attributes:
        urls: the shard URLs.
        sample_counts: int64 array of shape ``(len(urls),)``.
    """

    def __init__(
        self, urls: Sequence[str], sample_counts: np.ndarray, *, s3: Any = None, requests: RequestConfig | None = None
    ) -> None:
        self.urls, self.sample_counts = urls, sample_counts
        self.s3, self.requests = s3, requests
        self._stores: dict[str, Any] = {}
        self._tables: collections.OrderedDict[int, ShardTable] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ShardTables({len(self.urls)} shards, num_samples={int(self.sample_counts.sum())})"

    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__, "_stores": {}, "_tables": collections.OrderedDict()}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, urls: Sequence[str], *, s3: Any = None, requests: RequestConfig | None = None) -> ShardTables | None:
        """The tables of ``urls``, or None where the first shard has none (not found, or not
        readable: such shard URLs read as today, without counts). Reads every table's header
        (locally) or whole table (remote stores: one GET each, 16 at once): O(shards).

        Raises:
            IndexFormatError: a table is damaged. Storage errors of the tables after the first.
        """
        probe = cls(urls, np.zeros(len(urls), np.int64), s3=s3, requests=requests)
        try:
            first = probe._count(0)
        except (ShardNotFoundError, StorageAccessError, StorageConnectionError) as exc:
            log.debug("%s: no sample table beside it (%s); the shard URLs read without counts", urls[0], exc)
            return None
        counts = [first]
        if len(urls) > 1:
            with concurrent.futures.ThreadPoolExecutor(min(16, len(urls) - 1)) as pool:
                counts += pool.map(probe._maybe_count, range(1, len(urls)))
        if None in counts:
            missing = urls[counts.index(None)]
            log.warning(
                "%s%s: no sample table beside this shard, though %s%s has one: the shard URLs read without counts "
                "(no len(), no exact epochs); re-run shardstream pack, or read the dataset by its directory",
                missing,
                TABLE_SUFFIX,
                urls[0],
                TABLE_SUFFIX,
            )
            return None
        probe.sample_counts = np.asarray(counts, np.int64)
        return probe

    def table(self, i: int) -> ShardTable:
        """Shard ``i``'s sample table, checked against its count and its shard's name.

        Raises:
            ShardNotFoundError: it is gone; IndexFormatError: it is damaged or another shard's.
        """
        with self._lock:
            table = self._tables.get(i)
            if table is not None:
                self._tables.move_to_end(i)
                return table
        store, name = self._where(i)
        table = ShardTable.parse(store.read_bytes(name), url=store.url_of(name), num_samples=int(self.sample_counts[i]))
        return _keep_table(self._tables, self._lock, i, table, shard=split_url(self.urls[i])[1], fix="shardstream pack")

    def _where(self, i: int) -> tuple[Any, str]:
        """The store holding shard ``i``'s table, and the table's name in it."""
        root, name = split_url(self.urls[i])
        with self._lock:
            store = self._stores.get(root)
            if store is None:
                store = self._stores[root] = open_store(root or os.sep, s3=self.s3, requests=self.requests)
        return store, name + TABLE_SUFFIX

    def _maybe_count(self, i: int) -> int | None:
        try:
            return self._count(i)
        except ShardNotFoundError:
            return None

    def _count(self, i: int) -> int:
        """Shard ``i``'s sample count, from its table's header."""
        store, name = self._where(i)
        url = store.url_of(name)
        if isinstance(store, LocalStore):
            try:
                with open(url, "rb") as f:
                    head = f.read(16)
                    data = head + f.read(int.from_bytes(head[8:16], "little")) if len(head) == 16 else head
            except (FileNotFoundError, NotADirectoryError) as exc:
                raise ShardNotFoundError(f"{url}: no such file") from exc
        else:
            data = store.read_bytes(name)
        if data[:8] != TABLE_MAGIC or len(data) < 16:
            raise IndexFormatError(f"{url}: not a shardstream sample table (bad magic); re-run shardstream pack")
        try:
            count = json.loads(data[16 : 16 + int.from_bytes(data[8:16], "little")])["num_samples"]
        except (ValueError, KeyError, TypeError) as exc:
            raise IndexFormatError(f"{url}: damaged shardstream sample table ({exc}); re-run shardstream pack") from exc
        if not isinstance(count, int) or count < 0:
            raise IndexFormatError(f"{url}: num_samples={count!r} is not a count; re-run shardstream pack")
        return count


def upgrade(dest: str | os.PathLike[str], *, s3: Any = None, requests: RequestConfig | None = None) -> dict[str, int]:
    """Convert a version 1 dataset in place: write each shard's table beside it, then its
    key index (``keys/``) and ``index.bin``, then remove ``index.json``. The shards are not touched.

    Returns:
        The totals.

    Raises:
        ShardNotFoundError: no ``index.json`` at ``dest``; IndexFormatError: it is malformed.
    """
    store = open_store(os.fspath(dest), s3=s3, requests=requests)
    index = Index.from_json(store.read_bytes(INDEX_NAME), url=store.url_of(INDEX_NAME))
    manifest, tables = legacy(index, url=store.url_of(MANIFEST_NAME))
    for i, table in enumerate(tables):
        write_pieces(store, manifest.table_name(i), table.pieces())
    write_with_keys(store, manifest)  # the key index, then index.bin, as pack writes them
    store.delete(INDEX_NAME)
    return manifest.totals()


def _join(root: str, name: str) -> str:
    return f"{root}{name}" if root.endswith("/") else f"{root}/{name}"


def _normalize(url: str) -> str:
    if is_remote_url(url):  # raises on an unsupported scheme
        return url
    if url.startswith("file://"):
        url = url[len("file://") :]
    return os.path.abspath(url)


def _keep_table(tables: Any, lock: Any, i: int, table: ShardTable, *, shard: str, fix: str) -> ShardTable:
    """``table`` checked to be shard ``shard``'s (by file name) and kept as shard ``i``'s in the
    bounded LRU ``tables`` (an OrderedDict, at most ``_TABLES_KEPT``) under ``lock``.

    Raises:
        IndexFormatError: it names another shard: the tables were mixed up; says to re-run ``fix``.
    """
    if table.shard not in ("", "None") and table.shard.rsplit("/", 1)[-1] != shard.rsplit("/", 1)[-1]:
        raise IndexFormatError(
            f"{table.url}: is the sample table of shard {table.shard!r}, not of {shard!r}; the tables were "
            f"mixed up or copied over each other, re-run {fix}"
        )
    with lock:
        tables[i] = table
        while len(tables) > _TABLES_KEPT:
            tables.popitem(last=False)
    return table
