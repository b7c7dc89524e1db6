"""The shards a reader reads, as the engine and the schedule see them: :class:`ShardSet`.

The reading engine (:mod:`.engine`) and the epoch schedule (:mod:`.schedule`) never touch a
:class:`~shardstream.index.DatasetIndex`; they ask a :class:`ShardSet` for a shard's URL,
size, sample count, sample table, checksum and whether the shards are another tool's. Three
kinds exist today: :class:`IndexedShards` (a dataset with an index), :class:`TabledShards`
(shard URLs with their sample tables beside them: counts and tables known, sizes and
checksums not) and :class:`BareShards` (shard URLs and nothing else known); :func:`url_shards`
picks between the last two. Several datasets read as one would be one more
:class:`ShardSet` (shard ids of the sources laid end to end), with no change to the engine.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import ShardNotFoundError
from ..index import DatasetIndex, ShardTable
from ..index.resolve import LazyUrls, ShardTables

__all__ = ["BareShards", "ChainedUrls", "IndexedShards", "ItemTable", "ShardSet", "TabledShards", "url_shards"]


class ItemTable(Protocol):
    """The table of a shard of items that are not samples (an item unit's, such as token
    blocks: :mod:`shardstream.tokens.blocks`): where its items lie and how to cut them out of
    the shard's bytes. The engine reads a run of them as one byte range, as for samples, and
    hands the bytes to :meth:`batches`.

    Attributes:
        num_samples: the items in the shard.
    """

    num_samples: int

    def run_range(self, lo: int, hi: int) -> tuple[int, int]:
        """The byte range of the shard that holds items ``lo..hi``."""
        ...

    def batches(self, chunks: Iterator[Any], indices: np.ndarray, *, base_offset: int, url: str) -> Iterator[Any]:
        """The items at ``indices`` (int64, ascending), in :class:`~shardstream.tarstream.Batch` es,
        cut from ``chunks``: the shard's bytes from byte ``base_offset`` on.

        Raises:
            CorruptShardError: the bytes end early or disagree with the table.
        """
        ...


class ShardSet(Protocol):
    """Shards numbered ``0 .. num_shards - 1``.

    Attributes:
        num_shards: how many.
        sample_counts: int64 array of shape ``(num_shards,)``, the samples in each shard, or
            None where they are unknown (bare shard URLs: no exact epochs, no ``len``).
        foreign: the shards were written by another tool (links, devices and FIFOs in them
            are skipped with a warning instead of refused).
        classes: the class names the index holds (``Manifest.classes``), or None.
    """

    num_shards: int
    sample_counts: np.ndarray | None
    foreign: bool
    classes: list[str] | None

    def url(self, shard: int) -> str:
        """The shard's URL (``s3://...`` or a local path)."""
        ...

    def size_bytes(self, shard: int) -> int | None:
        """The shard's size in bytes, None where unknown."""
        ...

    def crc32_hex(self, shard: int) -> str | None:
        """The CRC-32 of the shard's bytes as 8 hex digits, None where unknown."""
        ...

    def table(self, shard: int) -> ShardTable:
        """The shard's sample table (keys, members, payload offsets).

        Raises:
            ShardNotFoundError: there is no table for this shard.
            IndexFormatError: the table is damaged or disagrees with the shard's counts.
        """
        ...

    def request_table(
        self, shard: int, *, on_retry: Callable[[BaseException], None] | None = None, cache: Any = None
    ) -> Callable[[], ShardTable]:
        """Start reading the shard's table without waiting for it (a remote one's GET runs in
        the background, ``on_retry`` told of each resumed GET; with a node ``cache``, a
        :class:`~shardstream.storage.cache.ShardCache`, read from it or written into it);
        returns the function that waits for it and gives it, raising what :meth:`table` raises."""
        ...


class IndexedShards:
    """The shards of a dataset with an index (``shardstream pack`` or ``index build``)."""

    def __init__(self, index: DatasetIndex) -> None:
        self.index = index
        self.num_shards = index.num_shards
        self.sample_counts: np.ndarray | None = index.manifest.shard_samples
        self.foreign = index.manifest.foreign
        classes = getattr(index.manifest, "classes", None)  # an index with class names (pack --labels-from-dirs)
        self.classes: list[str] | None = list(classes) if classes is not None else None

    def __repr__(self) -> str:
        return f"IndexedShards({self.index!r})"

    def url(self, shard: int) -> str:
        return self.index.shard_url(shard)

    def size_bytes(self, shard: int) -> int | None:
        return int(self.index.manifest.shard_bytes[shard])

    def crc32_hex(self, shard: int) -> str | None:
        return self.index.manifest.crc32_hex(shard)

    def table(self, shard: int) -> ShardTable:
        return self.index.table(shard)

    def request_table(
        self, shard: int, *, on_retry: Callable[[BaseException], None] | None = None, cache: Any = None
    ) -> Callable[[], ShardTable]:
        return self.index.request_table(shard, on_retry=on_retry, cache=cache)


class TabledShards:
    """Shard URLs with their sample tables beside them (:class:`~shardstream.index.resolve.ShardTables`):
    counts and tables known, sizes and checksums not (``verify_checksums`` has nothing to check
    them against, as for bare shard URLs)."""

    foreign = True  # as bare shard URLs: a whole shard parsed skips links rather than refusing them
    classes: list[str] | None = None

    def __init__(self, tables: ShardTables) -> None:
        self.tables = tables
        self.num_shards = len(tables.urls)
        self.sample_counts: np.ndarray | None = tables.sample_counts

    def __repr__(self) -> str:
        return f"TabledShards({self.tables!r})"

    def url(self, shard: int) -> str:
        return self.tables.urls[shard]

    def size_bytes(self, shard: int) -> int | None:
        return None

    def crc32_hex(self, shard: int) -> str | None:
        return None

    def table(self, shard: int) -> ShardTable:
        return self.tables.table(shard)

    def request_table(
        self, shard: int, *, on_retry: Callable[[BaseException], None] | None = None, cache: Any = None
    ) -> Callable[[], ShardTable]:
        return lambda: self.table(shard)


class BareShards:
    """Shard URLs with no index: sizes, counts, tables and checksums unknown."""

    sample_counts: np.ndarray | None = None
    foreign = True
    classes: list[str] | None = None

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = urls
        self.num_shards = len(urls)

    def __repr__(self) -> str:
        return f"BareShards({self.num_shards} shards)"

    def url(self, shard: int) -> str:
        return self.urls[shard]

    def size_bytes(self, shard: int) -> int | None:
        return None

    def crc32_hex(self, shard: int) -> str | None:
        return None

    def table(self, shard: int) -> ShardTable:
        raise ShardNotFoundError(f"{self.urls[shard]}: no sample table (the shards were given without an index)")

    def request_table(
        self, shard: int, *, on_retry: Callable[[BaseException], None] | None = None, cache: Any = None
    ) -> Callable[[], ShardTable]:
        return lambda: self.table(shard)


def url_shards(urls: Sequence[str], *, s3: Any = None, requests: Any = None) -> TabledShards | BareShards:
    """The shards of shard URLs given without an index: :class:`TabledShards` where every shard
    has its table beside it (``pack`` writes them), else :class:`BareShards`
    (:meth:`~shardstream.index.resolve.ShardTables.open`)."""
    tables = ShardTables.open(urls, s3=s3, requests=requests)
    return TabledShards(tables) if tables is not None else BareShards(urls)


class ChainedUrls(LazyUrls):
    """The shard URLs of a mixture's sources, one after another, without a list of them (a
    source's URLs are made from its index on demand)."""

    def __init__(self, parts: list[Sequence[str]]) -> None:
        self.parts = parts
        self.starts = [0]
        for part in parts:
            self.starts.append(self.starts[-1] + len(part))

    def __len__(self) -> int:
        return self.starts[-1]

    def url(self, i: int) -> str:
        part = bisect.bisect_right(self.starts, i) - 1
        return self.parts[part][i - self.starts[part]]
