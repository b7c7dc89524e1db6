"""``verify(dest)``: re-read every shard and check it against the index."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import CorruptShardError, IndexFormatError, ShardNotFoundError, StorageError
from ..index import DatasetIndex, open_index
from ..storage.fetch import iter_shard_streams
from ..tarstream import Hashed, iter_members_at

__all__ = ["ShardCheck", "verify"]


@dataclass(frozen=True)
class ShardCheck:
    """The verdict on one shard: ``problems`` is empty when it matches the index."""

    url: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(
    dest: str,
    *,
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    fetch: FetchConfig | None = None,
) -> Iterator[ShardCheck]:
    """Re-read every shard of the dataset at ``dest`` (local or in a remote store), in index
    order; ``s3``, ``requests`` and ``fetch`` as for :func:`~shardstream.open_index` and
    ``ShardDataset``.

    Each shard's size, CRC-32, member count, and every member's name, offset and size are
    compared with the index (its manifest and the shard's sample table); a missing or
    unreadable shard (or table) is a failed check, and the next shard is checked all the same.

    Yields:
        One :class:`ShardCheck` per shard of the index.

    Raises:
        ShardNotFoundError: there is no index at ``dest``; IndexFormatError: it is malformed.
    """
    index = open_index(dest, s3=s3, requests=requests)
    start = 0
    while start < index.num_shards:  # a shard that cannot be opened ends one pass; the next starts after it
        urls = [index.shard_url(i) for i in range(start, index.num_shards)]
        position = start
        try:
            streams = iter_shard_streams(urls, s3=s3, requests=requests, fetch=fetch)
            for _, stream in streams:
                yield ShardCheck(index.shard_url(position), tuple(_check(Hashed(stream), index, position)))
                position += 1
        except StorageError as exc:  # the shard at `position` could not be opened
            yield ShardCheck(index.shard_url(position), (str(exc),))
            position += 1
        start = position


def _check(stream: Hashed, index: DatasetIndex, i: int) -> Iterator[str]:
    url, manifest = index.shard_url(i), index.manifest
    try:
        table = index.table(i)
    except (IndexFormatError, ShardNotFoundError, StorageError) as exc:
        yield str(exc)
        return
    names, offsets, sizes = table.member_names(), table.offsets.tolist(), table.sizes.tolist()
    found = 0
    try:
        for name, offset, payload in iter_members_at(stream, url=url, foreign=manifest.foreign):
            if found < len(names):
                if (name, offset, len(payload)) != (names[found], offsets[found], sizes[found]):
                    yield (
                        f"member {found}: found {name!r} at byte {offset}, {len(payload)} bytes; "
                        f"the index says {names[found]!r} at {offsets[found]}, {sizes[found]} bytes"
                    )
            found += 1
    except (CorruptShardError, StorageError) as exc:
        yield str(exc)
        return
    if found != len(names):
        yield f"holds {found} members, the index says {len(names)}"
    stream.drain()
    if stream.nbytes != manifest.shard_bytes[i]:
        yield f"is {stream.nbytes} bytes, the index says {manifest.shard_bytes[i]}"
    elif f"{stream.crc32:08x}" != manifest.crc32_hex(i):
        yield f"CRC-32 {stream.crc32:08x} differs from the index's {manifest.crc32_hex(i)}"
