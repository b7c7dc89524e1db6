"""``verify(dest)``: re-read every shard and check it against the index."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from .config import FetchConfig, S3Config
from .errors import CorruptShardError, StorageError
from .fetch import iter_shard_streams
from .index import INDEX_NAME, Index, ShardEntry
from .storage import open_store
from .tarstream import ReadStream, iter_members_at

__all__ = ["ShardCheck", "verify"]


@dataclass(frozen=True)
class ShardCheck:
    """The verdict on one shard: ``problems`` is empty when it matches the index."""

    url: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


class _Hashing:
    """A stream that counts and checksums what is read through it."""

    def __init__(self, stream: ReadStream) -> None:
        self.stream = stream
        self.crc32 = 0
        self.bytes = 0

    def read(self, n: int) -> bytes:
        data = self.stream.read(n)
        self.crc32 = zlib.crc32(data, self.crc32)
        self.bytes += len(data)
        return data


def verify(dest: str, *, s3: S3Config | None = None, fetch: FetchConfig | None = None) -> Iterator[ShardCheck]:
    """Re-read every shard of the dataset at ``dest`` (local or S3), in index order.

    Each shard's size, CRC-32, sample count, and every member's name, offset and size are
    compared with ``index.json``; a missing or unreadable shard is a failed check, and the
    next shard is checked all the same.

    Yields:
        One :class:`ShardCheck` per shard of the index.

    Raises:
        ShardNotFoundError: there is no index at ``dest``; IndexFormatError: it is malformed.
    """
    store = open_store(dest, s3=s3, fetch=fetch)
    index = Index.from_json(store.read_bytes(INDEX_NAME), url=store.url_of(INDEX_NAME))
    urls = [store.url_of(shard.name) for shard in index.shards]
    checked = 0
    try:
        for (url, stream), shard in zip(iter_shard_streams(urls, s3=s3, fetch=fetch), index.shards):
            yield ShardCheck(url, tuple(_check(_Hashing(stream), shard, url)))
            checked += 1
    except StorageError as exc:  # the shard at position `checked` could not be opened
        yield ShardCheck(urls[checked], (str(exc),))
        yield from verify_rest(urls[checked + 1 :], index.shards[checked + 1 :], s3=s3, fetch=fetch)


def verify_rest(urls: list[str], shards: tuple[ShardEntry, ...], *, s3: S3Config | None, fetch: FetchConfig | None) -> Iterator[ShardCheck]:
    for url, shard in zip(urls, shards):
        try:
            for _, stream in iter_shard_streams([url], s3=s3, fetch=fetch):
                yield ShardCheck(url, tuple(_check(_Hashing(stream), shard, url)))
        except StorageError as exc:
            yield ShardCheck(url, (str(exc),))


def _check(stream: _Hashing, shard: ShardEntry, url: str) -> Iterator[str]:
    expected = [m for sample in shard.samples for m in sample.members]
    found = 0
    try:
        for name, offset, payload in iter_members_at(stream, url=url):
            if found < len(expected):
                m = expected[found]
                if (name, offset, len(payload)) != (m.name, m.offset, m.size):
                    yield (f"member {found}: found {name!r} at byte {offset}, {len(payload)} bytes; "
                           f"the index says {m.name!r} at {m.offset}, {m.size} bytes")
            found += 1
    except (CorruptShardError, StorageError) as exc:
        yield str(exc)
        return
    if found != len(expected):
        yield f"holds {found} members, the index says {len(expected)}"
    while stream.read(1 << 20):
        pass
    if stream.bytes != shard.bytes:
        yield f"is {stream.bytes} bytes, the index says {shard.bytes}"
    elif f"{stream.crc32:08x}" != shard.crc32:
        yield f"CRC-32 {stream.crc32:08x} differs from the index's {shard.crc32}"
