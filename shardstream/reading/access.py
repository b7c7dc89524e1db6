"""Random access: any sample of an indexed dataset by global index or by key, in one ranged
read of exactly its bytes (:class:`SampleAccess`; no torch).

How a sample is read:

- **index -> shard**: a binary search (``np.searchsorted``) over the manifest's running sample
  counts, computed once (O(shards) memory, never O(samples));
- **the shard's table** (``NAME.samples``) is fetched on first use and kept in a bounded LRU of
  ``max_tables`` tables;
- **the byte range**: a sample starts where the previous sample of its shard ends (its last
  payload's padding included, :meth:`~shardstream.index.ShardTable.sample_ends`; the first
  sample at byte 0), so the range holds its members' tar headers too, GNU long-name and PAX
  records included, and it ends after its last member's padding. The range is parsed with
  :mod:`shardstream.tarstream` and every member's name and payload offset is checked against
  the table: a shard changed since it was indexed raises CorruptShardError, never a misread;
- **a batch** is grouped by shard, and ranges of one shard less than ``merge_gap_bytes``
  apart are read as one request; all requests run at once on the storage layer's loop, with
  its retries, version pins (each shard's first answer's version pins its later reads) and
  errors;
- **hot shards**: with a node cache (``cache_dir``), a remote shard asked for
  ``hot_shard_reads`` times is fetched whole into the cache, and later reads are served there;
- **compressed shards** (gzip, zstd: their tables address the decompressed tar, and a range
  of a compressed stream cannot be decompressed alone) are read whole, through the node cache
  when one is set, and only the samples asked for are kept.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import io
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compression import compression_of
from ..config import FetchConfig, RequestConfig, S3Config, StoreSettings
from ..errors import CorruptShardError, StorageConnectionError
from ..format import split_key
from ..index import DatasetIndex, ShardTable
from ..storage import is_remote_url, loop, open_store, split_url
from ..storage.cache import ShardCache
from ..storage.fetch import iter_shard_streams
from ..tarstream import iter_members_at
from .keyfind import KeyFinder

__all__ = ["AccessStats", "SampleAccess"]

_COMPRESSED_SUFFIXES = (".gz", ".tgz", ".zst")
_REQUESTS_AT_ONCE = 64  # ranged requests in flight per read() call


@dataclass
class AccessStats:
    """What a :class:`SampleAccess` did in this process: ranged requests made (a whole-shard
    read counts as one), bytes read from the store (tables not included), tables fetched,
    shards fetched whole into the node cache, and samples read."""

    requests: int = 0
    bytes_read: int = 0
    tables_fetched: int = 0
    hot_shards_cached: int = 0
    samples_read: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "bytes_read": self.bytes_read,
            "tables_fetched": self.tables_fetched,
            "hot_shards_cached": self.hot_shards_cached,
            "samples_read": self.samples_read,
        }


class _Shard:
    """A shard's table with what random access derives from it (computed once per table)."""

    def __init__(self, table: ShardTable) -> None:
        self.table = table
        self.ends = table.sample_ends()
        self.starts = np.concatenate([np.zeros(1, np.int64), self.ends[:-1]])
        self._names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        if self._names is None:
            self._names = self.table.member_names()
        return self._names


class SampleAccess:
    """Random access to one dataset's samples (module doc: ranges, merging, hot shards).

    Args:
        index: the dataset's :class:`~shardstream.index.DatasetIndex` (``open_index``).
        store: how the shards are reached (:class:`~shardstream.config.StoreSettings`), or
            None: the same settings given one by one, as before ``store``:
        s3, requests, fetch: the store's endpoint, request policy and read settings, as
            ``ShardDataset`` takes them.
        cache_dir, cache_limit_bytes: a node-local cache for hot and compressed remote shards
            and its bound in bytes; None: no cache (hot shards keep being read by range).
        max_tables: the per-shard tables kept in memory (an LRU), in tables (> 0).
        merge_gap_bytes: two ranges of one shard less than this many bytes apart are read in
            one request, the gap included. 64 KiB by default: the goal is bytes moved at most
            1.2x the samples' bytes, and a gap of 64 KiB merged between samples of 320 KiB or
            more stays within it, while it saves a request's round trip (~1 ms on S3, worth
            ~100 KiB at 1 Gbit/s per connection); samples of ~100 KB read at random are rarely
            that close, so random reads stay one request each. 0: never merge.
        hot_shard_reads: samples read from one remote shard after which it is fetched whole
            into the node cache (only with ``cache_dir``) (> 0).

    Picklable: a DataLoader worker (fork or spawn) gets a copy without tables or connections,
    and opens its own on first use.
    """

    def __init__(
        self,
        index: DatasetIndex,
        *,
        store: StoreSettings | None = None,
        s3: S3Config | None = None,
        requests: RequestConfig | None = None,
        fetch: FetchConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        max_tables: int = 64,
        merge_gap_bytes: int = 64 << 10,
        hot_shard_reads: int = 8,
    ) -> None:
        if max_tables < 1:
            raise ValueError(f"{max_tables=} must be >= 1")
        if merge_gap_bytes < 0:
            raise ValueError(f"{merge_gap_bytes=} must be >= 0")
        if hot_shard_reads < 1:
            raise ValueError(f"{hot_shard_reads=} must be >= 1")
        if store is None:
            store = StoreSettings(
                s3=s3, requests=requests, fetch=fetch, cache_dir=cache_dir, cache_limit_bytes=cache_limit_bytes
            )
        self.index = index
        self.s3, self.requests, self.fetch = store.s3, store.requests, store.fetch_or_default
        self.cache_dir, self.cache_limit_bytes = store.cache_dir, store.cache_limit_bytes
        self.max_tables, self.merge_gap_bytes, self.hot_shard_reads = max_tables, merge_gap_bytes, hot_shard_reads
        self._cumulative = np.cumsum(np.asarray(index.manifest.shard_samples, np.int64))
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._tables: collections.OrderedDict[int, _Shard] = collections.OrderedDict()
        self._stores: dict[str, Any] = {}
        self._versions: dict[int, str] = {}  # each shard's version, from its first answer (pins later reads)
        self._reads: collections.Counter[int] = collections.Counter()  # samples read per shard
        self._compressed: set[int] = set()
        self._hot: set[int] = set()
        self._finder = KeyFinder(self.index, s3=self.s3, requests=self.requests, table_of=self._table)
        self._node_cache: ShardCache | None = None
        self._stats = AccessStats()

    def __getstate__(self) -> dict[str, Any]:
        keep = ("index", "s3", "requests", "fetch", "cache_dir", "cache_limit_bytes", "max_tables")
        state = {name: self.__dict__[name] for name in keep}
        state.update(
            merge_gap_bytes=self.merge_gap_bytes, hot_shard_reads=self.hot_shard_reads, _cumulative=self._cumulative
        )
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        return f"SampleAccess({self.index.root!r}, num_samples={self.num_samples})"

    @property
    def num_samples(self) -> int:
        """Samples in the dataset (the manifest's total)."""
        return self.index.num_samples

    def stats(self) -> dict[str, int]:
        """This process's counts: ``requests``, ``bytes_read`` (shard bytes, tables not
        included), ``tables_fetched``, ``hot_shards_cached``, ``samples_read``."""
        return self._stats.as_dict()

    # -- where a sample is -------------------------------------------------------------------

    def locate(self, i: int) -> tuple[int, int]:
        """``(shard, row)`` of the sample at global index ``i`` (shards in index order, samples
        in shard order; negative ``i`` counts from the end). O(log shards), no GET.

        Raises:
            IndexError: ``i`` is outside ``[-num_samples, num_samples)`` (names both).
            TypeError: ``i`` is not an integer.
        """
        if isinstance(i, bool):
            raise TypeError(f"sample index {i!r} must be an int, not a bool")
        i = int(i) if isinstance(i, np.integer) else i
        if not isinstance(i, int):
            raise TypeError(f"sample index {i!r} must be an int, not {type(i).__name__}")
        n = self.num_samples
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"sample index {i} is out of range: the dataset at {self.index.root} has {n} samples")
        shard = int(np.searchsorted(self._cumulative, j, side="right"))
        return shard, j - (int(self._cumulative[shard - 1]) if shard else 0)

    def global_index(self, shard: int, row: int) -> int:
        """The global index of ``row`` of ``shard``."""
        return (int(self._cumulative[shard - 1]) if shard else 0) + row

    def find(self, key: str) -> tuple[int, int] | None:
        """``(shard, row)`` of the sample with ``key``, or None where the dataset has none.

        Looked up by the shards' first and last keys where the manifest records them (a
        key-sorted pack: a binary search, no GET beyond the shard's table); else in the
        dataset's key index (``shardstream index keys``: one small ranged GET after a header
        read once per process); else, in a dataset whose shards are key-sorted, by a binary
        search over the shards' tables (O(log shards) table GETs, each table checked to be in
        order). Every candidate is checked against its shard's table.

        Raises:
            IndexFormatError: no key index, and the shards are not key-sorted (says to run
                ``shardstream index keys DEST``).
            ShardNotFoundError, IndexFormatError: a table is missing or damaged.
        """
        return self._finder.find(key)

    # -- reading -----------------------------------------------------------------------------

    def samples(
        self, indices_or_keys: Iterable[int | str], decode: Callable[[dict[str, Any]], Any] | None = None
    ) -> list[Any]:
        """The samples asked for, in the order asked: global indices (ints) and keys (strs), which
        may be mixed; each as streaming yields it (no ``__index__``), through ``decode`` (a
        reader's per-sample stage) when given. What ``ShardDataset.get_many`` and
        ``ShardMapDataset`` hand out.

        Raises:
            IndexError: as :meth:`locate`. KeyError: a key no sample has (names it and the
            dataset). Others as :meth:`find`, :meth:`read` and ``decode``.
        """
        locations = []
        for item in indices_or_keys:
            if isinstance(item, str):
                found = self.find(item)
                if found is None:
                    raise KeyError(f"no sample with key {item!r} in the dataset at {self.index.root}")
                locations.append(found)
            else:
                locations.append(self.locate(item))
        out = []
        for sample in self.read(locations):
            del sample["__index__"]  # the sample as streaming yields it
            out.append(sample if decode is None else decode(sample))
        return out

    def read(self, locations: Iterable[tuple[int, int]]) -> list[dict[str, Any]]:
        """The raw samples at ``locations`` (``(shard, row)`` pairs, from :meth:`locate` or
        :meth:`find`), in the order asked, read from the dataset's store as the module doc says.

        Returns:
            one dict per location: ``{"__key__": str, "__shard__": shard URL, "__index__": global
            index, "<ext>": bytes, ...}``, members named by the WebDataset rule
            (:func:`~shardstream.format.split_key`), as the streaming reader gives them (plus
            ``__index__``).

        Raises:
            IndexError: a shard or row out of range.
            CorruptShardError: the shard changed since it was indexed (its size, its version
                while read, or the bytes at the table's offsets: names the shard, the key and
                what differs), or its bytes are damaged.
            ShardNotFoundError, StorageAccessError, StorageConnectionError: the store's errors,
                after its retries; every request is bounded by its ``request_limit_s``.
        """
        self._check_process()
        wanted = [(int(s), int(r)) for s, r in locations]
        out: dict[int, dict[str, Any]] = {}  # by position in wanted
        by_shard: dict[int, list[int]] = collections.defaultdict(list)
        for position, (shard, row) in enumerate(wanted):
            if not 0 <= shard < self.index.num_shards:
                raise IndexError(f"shard {shard} is out of range: the dataset has {self.index.num_shards} shards")
            if not 0 <= row < int(self.index.manifest.shard_samples[shard]):
                raise IndexError(
                    f"row {row} is out of range: shard {self.index.manifest.name(shard)} holds "
                    f"{int(self.index.manifest.shard_samples[shard])} samples"
                )
            by_shard[shard].append(position)
        jobs: list[tuple[int, int, int, list[int]]] = []  # (shard, start, end, rows)
        for shard, positions in by_shard.items():
            rows = sorted({wanted[p][1] for p in positions})
            self._reads[shard] += len(rows)
            whole = self._whole_shard(shard)
            if not whole:
                jobs.extend((shard, *span) for span in self._spans(shard, rows))
                continue
            samples = self._read_whole(shard, rows)
            for p in positions:
                out[p] = dict(samples[wanted[p][1]])
        results: dict[int, list[tuple[int, list[int], Any]]] = collections.defaultdict(list)
        for shard, start, _, rows, data in self._run(jobs) if jobs else []:
            results[shard].append((start, rows, data))
        for shard, parts in results.items():
            try:
                if shard in self._compressed:
                    raise _Compressed
                samples = {}
                for start, rows, data in parts:
                    samples.update(self._parse(shard, start, data, rows))
            except _Compressed:
                samples = self._read_whole(shard, sorted({row for _, rows, _ in parts for row in rows}))
            for p in by_shard[shard]:
                out[p] = dict(samples[wanted[p][1]])
        self._stats.add(samples_read=len(wanted))
        return [out[p] for p in range(len(wanted))]

    def _spans(self, shard: int, rows: list[int]) -> list[tuple[int, int, list[int]]]:
        """Rows (sorted) as ranged requests ``(start, end, rows)``, neighbours merged."""
        info = self._shard(shard)
        spans: list[tuple[int, int, list[int]]] = []
        for row in rows:
            start, end = int(info.starts[row]), int(info.ends[row])
            if spans and start - spans[-1][1] < max(self.merge_gap_bytes, 1):
                spans[-1] = (spans[-1][0], max(end, spans[-1][1]), [*spans[-1][2], row])
            else:
                spans.append((start, end, [row]))
        return spans

    def _run(self, jobs: list[tuple[int, int, int, list[int]]]) -> list[tuple[int, int, int, list[int], Any]]:
        """The jobs' bytes, ``_REQUESTS_AT_ONCE`` requests at a time on the storage loop."""
        results: list[tuple[int, int, int, list[int], Any]] = []
        for at in range(0, len(jobs), _REQUESTS_AT_ONCE):
            chunk = jobs[at : at + _REQUESTS_AT_ONCE]
            limit_s = max(float(getattr(self._store(s)[0], "request_limit_s", 60.0)) for s, *_ in chunk)

            async def gather(chunk: list[tuple[int, int, int, list[int]]] = chunk) -> list[Any]:
                return await asyncio.gather(*(self._get(s, a, b) for s, a, b, _ in chunk))

            try:
                datas = loop.run(gather(), timeout_s=2 * limit_s + 5)
            except concurrent.futures.TimeoutError:
                urls = sorted({self.index.shard_url(s) for s, *_ in chunk})
                raise StorageConnectionError(
                    f"{', '.join(urls[:3])}{' ...' if len(urls) > 3 else ''}: no answer to {len(chunk)} ranged reads "
                    f"in {2 * limit_s + 5:.0f} s; check the store's endpoint, or raise RequestConfig's timeouts"
                ) from None
            results.extend((s, a, b, rows, data) for (s, a, b, rows), data in zip(chunk, datas))
        return results

    async def _get(self, shard: int, start: int, end: int) -> Any:
        store, name = self._store(shard)
        pieces, total, version = await store.get_range(name, start, end, version=self._versions.get(shard))
        self._check_size(shard, total)
        self._versions.setdefault(shard, version)
        data = b"".join(pieces)
        self._stats.add(requests=1, bytes_read=len(data))
        if start == 0 and compression_of(data[:4]) is not None:
            self._compressed.add(shard)
        return data

    def _check_size(self, shard: int, total: int) -> None:
        expected = int(self.index.manifest.shard_bytes[shard])
        if total != expected:
            raise CorruptShardError(
                f"{self.index.shard_url(shard)}: is {total} bytes but was {expected} bytes when indexed; the shard "
                "changed since its index was written: re-pack the dataset or re-run shardstream index build"
            )

    def _parse(self, shard: int, start: int, data: bytes, rows: list[int]) -> dict[int, dict[str, Any]]:
        """The samples ``rows`` out of ``data`` (shard bytes from ``start``), checked against the table."""
        info = self._shard(shard)
        url = self.index.shard_url(shard)
        samples: dict[int, dict[str, Any]] = {}
        for row in rows:
            a, b = int(info.starts[row]), int(info.ends[row])
            piece = data[a - start : b - start]
            try:
                members = list(
                    iter_members_at(
                        io.BytesIO(piece),
                        url=url,
                        base_offset=a,
                        end_of_archive=False,
                        foreign=self.index.manifest.foreign,
                    )
                )
            except CorruptShardError as exc:
                if self._is_compressed(shard):
                    raise _Compressed from exc
                lo, hi = int(info.table.member_start[row]), int(info.table.member_start[row + 1])
                if any(name[:1] == "/" or ".." in name.split("/") for name in info.names[lo:hi]):
                    raise  # the shard holds the indexed name, which the tar reader refuses (its message names it)
                raise self._changed(
                    shard, row, f"its bytes [{a}, {b}) are not the tar members indexed ({exc})"
                ) from exc
            samples[row] = self._sample(shard, row, members)
        return samples

    def _sample(self, shard: int, row: int, members: Sequence[tuple[str, int, Any]]) -> dict[str, Any]:
        info = self._shard(shard)
        table = info.table
        lo, hi = int(table.member_start[row]), int(table.member_start[row + 1])
        got = [(name, int(offset)) for name, offset, _ in members]
        expected = list(zip(info.names[lo:hi], table.offsets[lo:hi].tolist()))
        if got != expected:
            raise self._changed(shard, row, f"members found {got}, indexed {expected}")
        key = table.key(row)
        sample: dict[str, Any] = {
            "__key__": key,
            "__shard__": self.index.shard_url(shard),
            "__index__": self.global_index(shard, row),
        }
        for (name, _, payload), size in zip(members, table.sizes[lo:hi].tolist()):
            member_key, ext = split_key(name)
            if member_key != key or len(payload) != size:
                raise self._changed(shard, row, f"member {name!r} of {len(payload)} bytes, indexed {size} bytes")
            sample[ext] = bytes(payload)
        return sample

    def _changed(self, shard: int, row: int, detail: str) -> CorruptShardError:
        key = self._shard(shard).table.key(row)
        return CorruptShardError(
            f"{self.index.shard_url(shard)}: sample {key!r} (row {row}) does not match the index: {detail}; the shard "
            "changed since it was indexed: re-pack the dataset or re-run shardstream index build"
        )

    def _is_compressed(self, shard: int) -> bool:
        if shard in self._compressed:
            return True
        store, name = self._store(shard)
        pieces, _, _ = loop.run(
            store.get_range(name, 0, 4), timeout_s=2 * float(getattr(store, "request_limit_s", 60.0)) + 5
        )
        self._stats.add(requests=1, bytes_read=sum(map(len, pieces)))
        if compression_of(b"".join(pieces)) is not None:
            self._compressed.add(shard)
            return True
        return False

    def _whole_shard(self, shard: int) -> bool:
        """Whether ``shard`` is read whole (compressed), or through the node cache (hot)."""
        if shard in self._compressed or self.index.manifest.name(shard).endswith(_COMPRESSED_SUFFIXES):
            self._compressed.add(shard)
            return True
        url = self.index.shard_url(shard)
        return self.cache_dir is not None and is_remote_url(url) and self._reads[shard] >= self.hot_shard_reads

    def _read_whole(self, shard: int, rows: list[int]) -> dict[int, dict[str, Any]]:
        """``rows`` of ``shard`` read through :func:`iter_shard_streams`: a compressed shard
        whole (decompressed as it streams), a hot one over its cache entry (filled whole the
        first time)."""
        url = self.index.shard_url(shard)
        cache = self._cache()
        compressed = shard in self._compressed
        info = self._shard(shard)
        byte_range = None if compressed else (int(info.starts[rows[0]]), int(info.ends[rows[-1]]))
        if not compressed and shard not in self._hot:
            self._hot.add(shard)
            self._stats.add(hot_shards_cached=1)
        wanted = set(rows)
        samples: dict[int, dict[str, Any]] = {}
        starts = info.table.member_start
        streams = iter_shard_streams(
            [url],
            sizes_bytes=[int(self.index.manifest.shard_bytes[shard])],
            byte_ranges=[byte_range],
            s3=self.s3,
            requests=self.requests,
            fetch=self.fetch,
            cache=cache,
        )
        try:
            for _, stream in streams:
                members = iter_members_at(
                    stream,
                    url=url,
                    base_offset=0 if byte_range is None else byte_range[0],
                    end_of_archive=byte_range is None,
                    foreign=compressed or self.index.manifest.foreign,
                )
                row = rows[0] if byte_range is not None else 0
                pending: list[tuple[str, int, Any]] = []
                member = int(starts[row])
                for name, offset, payload in members:
                    if row >= info.table.num_samples:
                        break
                    pending.append((name, offset, payload))
                    member += 1
                    if member == int(starts[row + 1]):
                        if row in wanted:
                            samples[row] = self._sample(shard, row, pending)
                            if len(samples) == len(wanted):
                                break
                        pending, row = [], row + 1
        finally:
            streams.close()
        self._stats.add(requests=1, bytes_read=int(info.ends[rows[-1]]) - (0 if byte_range is None else byte_range[0]))
        if len(samples) != len(wanted):
            missing = sorted(wanted - samples.keys())[0]
            raise self._changed(shard, missing, "the shard ends before this sample")
        return samples

    # -- per-process state -------------------------------------------------------------------

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's connections belong to its loop
            self._reset()

    def _cache(self) -> ShardCache | None:
        if self.cache_dir is None or self.cache_limit_bytes is None:  # StoreSettings: both or neither
            return None
        if self._node_cache is None:
            self._node_cache = ShardCache(self.cache_dir, cache_limit_bytes=self.cache_limit_bytes)
        return self._node_cache

    def _table(self, shard: int) -> ShardTable:
        return self._shard(shard).table

    def _shard(self, shard: int) -> _Shard:
        with self._lock:
            info = self._tables.get(shard)
            if info is not None:
                self._tables.move_to_end(shard)
                return info
        info = _Shard(self.index.table(shard))
        with self._lock:
            self._tables[shard] = info
            self._stats.add(tables_fetched=1)
            while len(self._tables) > self.max_tables:
                self._tables.popitem(last=False)
        return info

    def _store(self, shard: int) -> tuple[Any, str]:
        root, name = split_url(self.index.shard_url(shard))
        with self._lock:
            store = self._stores.get(root)
            if store is None:
                store = self._stores[root] = open_store(
                    root or os.sep, s3=self.s3, requests=self.requests, fetch=self.fetch
                )
        return store, name


class _Compressed(Exception):
    """A ranged read found the shard compressed: it is read whole instead."""
