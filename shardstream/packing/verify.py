"""``verify(dest)``: re-read every shard and check it against the index; with ``decode=True``
also decode every image member (:func:`~.imagecheck.image_problem`, on a thread pool)."""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import CorruptShardError, IndexFormatError, ShardNotFoundError, StorageError
from ..index import DatasetIndex, open_index
from ..storage.fetch import iter_shard_streams
from ..tarstream import Hashed, iter_members_at
from .imagecheck import IMAGE_EXTENSIONS, image_problem

__all__ = ["ShardCheck", "verify"]


@dataclass(frozen=True)
class ShardCheck:
    """The verdict on one shard: ``problems`` is empty when it matches the index (and, with
    ``decode=True``, every image member decodes).

    Attributes:
        url: the shard's URL.
        problems: one line per problem, without the URL.
        num_images: image members decoded (0 without ``decode=True``, or when the shard or its
            table could not be read).
        num_undecodable: those of them that did not decode (each is also in ``problems``).
    """

    url: str
    problems: tuple[str, ...]
    num_images: int = 0
    num_undecodable: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(
    dest: str,
    *,
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    fetch: FetchConfig | None = None,
    decode: bool = False,
    decode_threads: int | None = None,
    on_images: Callable[[int], None] | None = None,
) -> Iterator[ShardCheck]:
    """Re-read every shard of the dataset at ``dest`` (local or in a remote store), in index
    order; ``s3``, ``requests`` and ``fetch`` as for :func:`~shardstream.open_index` and
    ``ShardDataset``.

    Each shard's size, CRC-32, member count, and every member's name, offset and size are
    compared with the index (its manifest and the shard's sample table); a missing or
    unreadable shard (or table) is a failed check, and the next shard is checked all the same.

    Args:
        decode: also decode every image member (by extension: ``jpg``, ``png``, ``webp``, ...,
            any case) with Pillow, as the member is read (no extra request); each one that does
            not decode adds ``"sample 'KEY' member 'NAME' does not decode: REASON"`` to its
            shard's problems. At most ``2 * decode_threads`` members wait in memory.
        decode_threads: threads that decode (Pillow releases the GIL while it decodes); default:
            the CPUs this process may use.
        on_images: called in the caller's thread with the number of images just decoded (for a
            progress bar).

    Yields:
        One :class:`ShardCheck` per shard of the index.

    Raises:
        ShardNotFoundError: there is no index at ``dest``; IndexFormatError: it is malformed.
        ValueError: ``decode_threads`` is < 1.
    """
    if decode_threads is not None and decode_threads < 1:
        raise ValueError(f"{decode_threads=} must be >= 1 (or None: one per CPU)")
    index = open_index(dest, s3=s3, requests=requests)
    threads = decode_threads or _usable_cpus()
    pool = ThreadPoolExecutor(threads, "verify-decode") if decode else None
    new_images = (lambda: _Images(pool, 2 * threads, on_images)) if pool is not None else None
    try:
        yield from _verify(index, s3=s3, requests=requests, fetch=fetch, new_images=new_images)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)  # at most a window of decodes still runs


def _usable_cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's limit), else the CPU count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _verify(
    index: DatasetIndex,
    *,
    s3: S3Config | None,
    requests: RequestConfig | None,
    fetch: FetchConfig | None,
    new_images: Callable[[], _Images] | None,
) -> Iterator[ShardCheck]:
    start = 0
    while start < index.num_shards:  # a shard that cannot be opened ends one pass; the next starts after it
        urls = [index.shard_url(i) for i in range(start, index.num_shards)]
        position = start
        try:
            streams = iter_shard_streams(urls, s3=s3, requests=requests, fetch=fetch)
            for _, stream in streams:
                images = new_images() if new_images is not None else None
                problems = tuple(_check(Hashed(stream), index, position, images))
                counts = (images.num_images, images.num_undecodable) if images is not None else (0, 0)
                yield ShardCheck(index.shard_url(position), problems, *counts)
                position += 1
        except StorageError as exc:  # the shard at `position` could not be opened
            yield ShardCheck(index.shard_url(position), (str(exc),))
            position += 1
        start = position


class _Images:
    """One shard's image decodes on the shared pool, a bounded window of them in flight;
    their problems come back in member order."""

    def __init__(self, pool: ThreadPoolExecutor, window: int, on_images: Callable[[int], None] | None) -> None:
        self._pool, self._window, self._on_images = pool, window, on_images
        self._pending: collections.deque[tuple[str, str, Future[str | None]]] = collections.deque()
        self.num_images = self.num_undecodable = 0

    def submit(self, key: str, name: str, payload: Any) -> Iterator[str]:
        """Queues ``name`` when it is an image; yields the problems of decodes that had to end first."""
        if name.rsplit(".", 1)[-1].lower() not in IMAGE_EXTENSIONS:
            return
        # bytes(): a copy the thread owns (a payload may be a view of a chunk the reader reuses).
        self._pending.append((key, name, self._pool.submit(image_problem, name, bytes(payload))))
        if len(self._pending) > self._window:
            yield from self._resolve(len(self._pending) - self._window)

    def finish(self) -> Iterator[str]:
        yield from self._resolve(len(self._pending))

    def _resolve(self, count: int) -> Iterator[str]:
        for _ in range(count):
            key, name, future = self._pending.popleft()
            reason = future.result()
            self.num_images += 1
            if self._on_images is not None:
                self._on_images(1)
            if reason is not None:
                self.num_undecodable += 1
                yield f"sample {key!r} member {name!r} does not decode: {reason}"


def _check(stream: Hashed, index: DatasetIndex, i: int, images: _Images | None) -> Iterator[str]:
    url, manifest = index.shard_url(i), index.manifest
    try:
        table = index.table(i)
        keys = table.keys() if images is not None else []
    except (IndexFormatError, ShardNotFoundError, StorageError) as exc:
        yield str(exc)
        return
    names, offsets, sizes = table.member_names(), table.offsets.tolist(), table.sizes.tolist()
    starts = table.member_start.tolist()
    found = sample = 0
    try:
        for name, offset, payload in iter_members_at(stream, url=url, foreign=manifest.foreign):
            if found < len(names):
                if (name, offset, len(payload)) != (names[found], offsets[found], sizes[found]):
                    yield (
                        f"member {found}: found {name!r} at byte {offset}, {len(payload)} bytes; "
                        f"the index says {names[found]!r} at {offsets[found]}, {sizes[found]} bytes"
                    )
                if images is not None:
                    while starts[sample + 1] <= found:
                        sample += 1
                    yield from images.submit(keys[sample], name, payload)
            found += 1
    except (CorruptShardError, StorageError) as exc:
        if images is not None:
            yield from images.finish()
        yield str(exc)
        return
    if images is not None:
        yield from images.finish()
    if found != len(names):
        yield f"holds {found} members, the index says {len(names)}"
    stream.drain()
    if stream.nbytes != manifest.shard_bytes[i]:
        yield f"is {stream.nbytes} bytes, the index says {manifest.shard_bytes[i]}"
    elif f"{stream.crc32:08x}" != manifest.crc32_hex(i):
        yield f"CRC-32 {stream.crc32:08x} differs from the index's {manifest.crc32_hex(i)}"
