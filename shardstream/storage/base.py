"""The storage protocol every backend implements, URL parsing, and the counters the fetcher
reports to.

Two protocols: :class:`Store` (a directory of objects: names, small reads and writes, atomic
shard writers, listing) is what every backend gives; :class:`RemoteStore` adds what the
fetcher needs to stream shards from a server (an object's size and version, a ranged read
pinned to that version, and the bounds of one request). Local directories are read in place
and are not remote; every URL scheme registered with :func:`register_store` (the built-in
ones are :data:`REMOTE_SCHEMES`) names a remote store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, runtime_checkable

__all__ = [
    "REMOTE_SCHEMES",
    "Counters",
    "OnRetry",
    "RemoteStore",
    "ShardSink",
    "Store",
    "is_remote_url",
    "is_s3_url",
    "register_store",
    "remote_schemes",
    "scheme_of",
    "split_url",
    "store_factory",
    "write_pieces",
]

#: Called with each failure a request is tried again after (a reader counts its retries).
OnRetry = Callable[[BaseException], None]

#: URL schemes of remote stores, each with the module that reads it (loaded on first use).
REMOTE_SCHEMES = ("s3", "http", "https", "hf", "gs", "gcs", "az", "abfs", "abfss")
"""The schemes of the built-in remote stores (registered by :mod:`.schemes`)."""

StoreFactory = Callable[..., "Store"]
"""``factory(url, *, s3, requests, fetch) -> Store``: the store of a URL of its scheme (see
:func:`register_store`)."""

_FACTORIES: dict[str, StoreFactory] = {}


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
    """A directory of objects: a local directory, an S3/GCS/Azure prefix, an http(s) or Hub folder.

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


@runtime_checkable
class RemoteStore(Store, Protocol):
    """A store on a server, read by ranged requests (S3, http(s), the Hub, GCS, Azure).

    Every method raises the :mod:`shardstream.errors` tree, translated once in the backend
    (its error table): ShardNotFoundError (404), StorageAccessError (401/403, naming the
    credential to check), StorageConnectionError (unreachable, or still failing after
    ``RequestConfig.max_attempts``; 429/503 are retried after their ``Retry-After``),
    CorruptShardError (a range past the end, or the object changed between two requests),
    StorageError (anything else). Secrets are never part of a message. The ranged read and
    its retries are :mod:`.ranged`'s, the same for every backend.
    """

    endpoint: str  # the server, named in messages ("http://127.0.0.1:8333", "AWS S3")
    label: str  # the kind of store in messages ("S3", "HTTP", "GCS", "Azure", "the Hub")

    @property
    def request_limit_s(self) -> float:
        """The longest one request may take, every attempt included (seconds): a reader that
        got no data for this long reports a stall instead of hanging."""

    def pool_state(self) -> str:
        """How this process's requests stand against the connection pool (for stall messages)."""

    async def head(self, name: str) -> tuple[int, str]:
        """``(size_bytes, version)`` of object ``name``; the version (ETag, GCS generation,
        Hub commit and ETag) is what :meth:`get_range` pins."""

    async def get_range(
        self, name: str, start: int, end: int | None, *, on_retry: OnRetry | None = None, version: str | None = None
    ) -> tuple[list[bytes], int, str]:
        """Bytes ``[start, end)`` of ``name`` (``end=None``: to its end) as pieces, with the
        object's total size and version. A body cut mid-transfer is fetched again from its
        first missing byte, pinned to the version of the first response (or to ``version``,
        when given, from the first request on; ``on_retry`` is told of each retry); a changed
        object raises CorruptShardError, never a mix."""

    def list_dir(self, prefix: str) -> Iterator[tuple[str, int, bool]]:
        """One "directory" level under ``prefix`` (``""`` or ending in ``/``), page by page:
        ``(name, size_bytes, is_dir)`` with names relative to the store's root."""


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


def scheme_of(url: str) -> str | None:
    """The remote scheme of ``url`` (``"s3"``, ``"https"``, ``"hf"`` ...), or None for a local
    path or ``file://`` URL.

    Raises:
        ValueError: ``s3:`` without a bucket (see :func:`is_s3_url`), or a scheme no store
            reads (names the schemes that are read).
    """
    if is_s3_url(url):
        return "s3"
    head, sep, rest = url.partition("://")
    if not sep or not head.isascii() or not head.replace("+", "").isalnum():
        return None
    scheme = head.lower()
    if scheme == "file":
        return None
    if scheme not in _FACTORIES:
        raise ValueError(
            f"{url!r}: unsupported URL scheme {scheme!r}; use a local path or one of "
            + ", ".join(f"{s}://" for s in remote_schemes())
            + " (or register a store for it: shardstream.register_store)"
        )
    if not rest or rest.startswith("/"):
        raise ValueError(f"{url!r} names no bucket, container or host after {scheme}://")
    return scheme


def register_store(scheme: str, factory: StoreFactory, *, replace: bool = False) -> None:
    """Read and write ``scheme://`` URLs through the stores ``factory`` makes: every reader and
    writer (``ShardDataset``, ``ShardMapDataset``, ``pack``, the CLI) then opens them with
    ``factory(url, s3=..., requests=..., fetch=...)``, ``url`` being the location of a
    directory of objects (a dataset's root; its shards and tables are names under it). The
    built-in stores are registered through this too (:data:`REMOTE_SCHEMES`).

    The store it returns is a :class:`RemoteStore` (a directory of objects read by ranged
    requests: :class:`~.ranged.RangedStore` gives most of it from a backend's ``head``,
    ``open_range`` and ``error_table``); the keyword arguments are the caller's
    :class:`~shardstream.config.S3Config` (meant for S3, None otherwise),
    :class:`~shardstream.config.RequestConfig` (None: the defaults) and
    :class:`~shardstream.config.FetchConfig` (None: the defaults). Register in every process
    that reads (at import of the module that defines the store: DataLoader workers that are
    spawned import it again).

    Raises:
        ValueError: ``scheme`` is not a lowercase URL scheme (letters, digits, ``+``), is
            ``file`` (local paths), or already has a store and ``replace`` is False.
    """
    if not (isinstance(scheme, str) and scheme.isascii() and scheme.replace("+", "").isalnum()):
        raise ValueError(f"register_store: {scheme!r} is not a URL scheme (letters, digits and '+', as 's3')")
    if scheme != scheme.lower() or scheme == "file":
        raise ValueError(f"register_store: {scheme!r} must be lowercase and not 'file' (local paths)")
    if scheme in _FACTORIES and not replace:
        raise ValueError(
            f"register_store: {scheme}:// already has a store ({_FACTORIES[scheme]!r}); pass replace=True to replace it"
        )
    _FACTORIES[scheme] = factory


def store_factory(scheme: str) -> StoreFactory:
    """The factory registered for ``scheme`` (:func:`register_store`).

    Raises:
        KeyError: none is.
    """
    return _FACTORIES[scheme]


def remote_schemes() -> tuple[str, ...]:
    """Every scheme with a store, in the order registered (the built-in ones first)."""
    return tuple(_FACTORIES)


def is_remote_url(url: str) -> bool:
    """``url`` names an object or prefix in a remote store (any scheme with a store:
    :func:`register_store`); False for local paths and ``file://`` URLs.

    Raises:
        ValueError: as :func:`scheme_of`.
    """
    return scheme_of(url) is not None


def split_url(url: str) -> tuple[str, str]:
    """``"s3://b/p/x.tar"`` -> ``("s3://b/p", "x.tar")``; other URLs and local paths likewise."""
    root, _, name = url.rstrip("/").rpartition("/")
    return root, name
