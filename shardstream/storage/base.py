"""The storage protocol every backend implements, URL parsing, and the counters the fetcher
reports to."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

__all__ = ["Counters", "ShardSink", "Store", "is_s3_url", "split_url", "write_pieces"]


class Counters(Protocol):
    """Where :func:`~shardstream.storage.fetch.iter_shard_streams` counts what it does (the
    reader's metrics row, :class:`shardstream.reading.stats.ReaderStats`, is one).

    Counters it adds to: ``stall_s`` (seconds waited on data), ``cache_hits``,
    ``cache_misses``, ``cache_fills``, ``cache_waits``, ``cache_bypasses``, ``retries``; the
    gauge it sets: ``bytes_in_flight`` (bytes fetched and not yet consumed).
    """

    def add(self, field: str, amount: float) -> None: ...

    def set(self, field: str, value: float) -> None: ...


class ShardSink(Protocol):
    """A shard being written. Nothing is visible under its name before :meth:`commit`."""

    def write(self, data: bytes | memoryview, /) -> None: ...

    def commit(self) -> None:
        """Publish the object under its final name (rename / complete multipart upload)."""

    def abort(self) -> None:
        """Drop everything written; idempotent."""


@runtime_checkable
class Store(Protocol):
    """A directory of objects: a local directory or an S3 prefix.

    Names are plain relative names (``"data-000000.tar"``, ``"index.bin"``).
    """

    url: str

    def url_of(self, name: str) -> str: ...

    def check_writable(self) -> None:
        """Fail early with a clear error if objects cannot be written here."""

    def exists(self, name: str) -> bool: ...

    def read_bytes(self, name: str) -> bytes: ...

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write a small object atomically."""

    def delete(self, name: str) -> None: ...

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Write a small object atomically unless it exists; False when it already did."""

    def open_writer(self, name: str) -> ShardSink: ...

    def list_names(self, prefix: str = "") -> list[str]:
        """Sorted names starting with ``prefix``."""

    def remove_empty_dirs(self, folders: tuple[str, ...]) -> None:
        """Remove these directories ("" is the root) where empty (local stores)."""

    def remove_partials(self, is_mine: Callable[[str], bool], *, folders: tuple[str, ...] = ("",)) -> int:
        """Drop what killed writers of the names ``is_mine`` accepts left behind (in the top
        directory and ``folders``); returns a count."""


def write_pieces(store: Store, name: str, pieces: Iterable[bytes]) -> None:
    """Write ``name`` from ``pieces`` as they come (a table or index of any size, never
    joined in memory), published whole or not at all."""
    sink = store.open_writer(name)
    try:
        for piece in pieces:
            sink.write(piece)
        sink.commit()
    finally:
        sink.abort()


def is_s3_url(url: str) -> bool:
    """``url`` is an S3 URL (``s3://BUCKET/...``).

    Raises:
        ValueError: it starts with ``s3:`` but names no bucket (``s3://``, ``s3:/bucket/x``),
            which would otherwise be taken for a local path.
    """
    if url.startswith("s3://") and len(url) > 5 and url[5] != "/":
        return True
    if url[:3].lower() == "s3:":
        raise ValueError(f"{url!r} names no bucket: write s3://BUCKET/PREFIX (two slashes, then a bucket name)")
    return False


def split_url(url: str) -> tuple[str, str]:
    """``"s3://b/p/x.tar"`` -> ``("s3://b/p", "x.tar")``; local paths likewise."""
    root, _, name = url.rstrip("/").rpartition("/")
    return root, name
