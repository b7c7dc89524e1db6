"""http(s) storage through aiohttp: shards read by ranged GETs from any server that honours
``Range`` (nginx, Apache, a CDN, ``python -m http.server`` does not).

What it insists on, where a generic HTTP client would not:

- a ranged GET must come back ``206 Partial Content`` with a ``Content-Range`` that starts at
  the byte asked for; a server that ignores ``Range`` (``200`` with the whole object) is an
  error naming the URL, never a silent whole-object download for every part;
- an object's version is its ``ETag`` (else ``Last-Modified``); every request after the first
  of a read carries ``If-Match`` (a strong ETag), and every answer's version is compared, so a
  replaced object is :class:`~shardstream.errors.CorruptShardError`, never a mix of two;
- a body cut mid-transfer is fetched again from its first missing byte; 429 and 5xx answers
  and refused connections are tried again after ``Retry-After`` (or a short backoff), at most
  ``RequestConfig.max_attempts`` times, and every wait is bounded (:mod:`.ranged`, the one
  retry loop of every store: this module gives it one request and one error table);
- redirects are followed here, one hop at a time, and headers meant for one host (a token)
  are sent to that host only (:meth:`HttpStore._headers_for`), never to the host it
  redirects to.

Servers have no listing and take no writes: :meth:`HttpStore.list_names` and every write raise
errors that say what to do instead. One ``aiohttp.ClientSession`` per process lives on the
process's background loop (:mod:`.loop`), made in the process that uses it.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urljoin, urlsplit

from ..config import FetchConfig, RequestConfig, http_proxy, ssl_cert_paths
from ..errors import (
    ReadOnlyStoreError,
    ShardNotFoundError,
    StorageAccessError,
    StorageConnectionError,
    StorageError,
    StorageNotFoundError,
)
from . import loop, ranged
from .ranged import RETRY_STATUSES, Answer, Mismatch, PastEnd, RangedStore, Retryable, Status
from .requests import OpenRequests, PerProcess, aiohttp_pieces, content_range

__all__ = ["HttpStore"]

_HEAD_REFUSED = frozenset({403, 405, 501})  # e.g. a URL signed for GET only: ask by a 1-byte GET
_sessions: PerProcess[tuple[RequestConfig, str | None, str | None], Any] = PerProcess()  # per config and CA settings
_open_requests = OpenRequests()


def _ssl_context() -> ssl.SSLContext | bool:
    """``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` (OpenSSL's own variables) as a context, or, where
    neither is set, True: aiohttp's own verifying context of the system's CAs, made once at its
    import (making another loaded the CA bundle again: 30-55 ms, on every reader process's way to
    its first sample, plain-http endpoints too)."""
    cafile, capath = ssl_cert_paths()
    if cafile is None and capath is None:
        return True
    return ssl.create_default_context(cafile=cafile, capath=capath)


async def _session_for(cfg: RequestConfig) -> Any:
    """This process's session for ``cfg`` (sessions inherited across a fork are kept, unused)."""
    import aiohttp

    sessions = _sessions.mine()
    key = (cfg, *ssl_cert_paths())
    session = sessions.get(key)
    if session is None:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=cfg.max_pool_connections, ssl=_ssl_context()),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s),
            trust_env=False,  # proxies are looked up once per host (_proxy_for), .netrc never read
            auto_decompress=False,  # byte ranges are of the stored bytes
        )
        sessions[key] = session
        loop.on_shutdown(session.close)
    return session


@functools.lru_cache(maxsize=256)
def _proxy_for_host(scheme: str, host: str) -> str | None:
    return http_proxy(scheme, host)


def _proxy_for(url: str) -> str | None:
    """The proxy ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` name for ``url`` (as curl and
    requests read them), looked up once per scheme and host: aiohttp's own lookup
    (``trust_env``) runs for every request and reads ``~/.netrc`` too."""
    parts = urlsplit(url)
    return _proxy_for_host(parts.scheme, parts.netloc)


def _content_range(value: str) -> tuple[int, int, int | None]:
    """``"bytes 10-19/100"`` -> ``(10, 20, 100)`` (end exclusive; total None for ``*``).

    Raises:
        ValueError: not a byte range of a real server (the last byte before the first).
    """
    first, last, total = content_range(value)
    if last < 0:
        raise ValueError(value)
    return first, last + 1, total


def _version(headers: Any) -> str:
    """An answer's version: its ETag, else its Last-Modified, else ""."""
    return str(headers.get("ETag") or headers.get("Last-Modified") or "")


class HttpStore(RangedStore):
    """Objects under an ``http://`` or ``https://`` URL (a "directory" on a web server), read only.

    Args:
        url: ``https://host[:port]/path`` of the dataset (or of the folder of its shards).
        fetch: unused here (reads are cut into parts by the fetcher); accepted as by every store.
        requests: timeouts, attempts, pool size and redirects; default
            :class:`~shardstream.config.RequestConfig`.
    """

    label = "HTTP"
    in_progress = _open_requests

    def __init__(self, url: str, *, fetch: FetchConfig | None = None, requests: RequestConfig | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{url!r} is not an http(s):// URL with a host")
        if parts.username is not None or parts.password is not None:
            bare = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
            raise ValueError(
                f"{bare}: credentials in an http(s) URL are not sent (they would show in logs and errors); "
                "serve the shards without them, or put them behind an S3, GCS or Azure store"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"{url!r}: a dataset URL takes no ?query or #fragment; give the folder's URL")
        self.url = url.rstrip("/")
        self.endpoint = f"{parts.scheme.lower()}://{parts.netloc}"
        self.requests = requests or RequestConfig()
        self._locations: dict[str, tuple[str, float]] = {}  # object URL -> (redirect target, expiry)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_locations": {}}

    # -- names and URLs ---------------------------------------------------------------------

    async def _object_url(self, name: str) -> str:
        """The URL requested for ``name`` (the Hub's store maps its names to resolve URLs)."""
        return self.url_of(name)

    def _headers_for(self, url: str) -> dict[str, str]:
        """Headers for a request to ``url``'s host; none here (the Hub's store adds its token
        for the Hub's host only)."""
        return {}

    # -- requests ---------------------------------------------------------------------------

    def error_table(
        self, exc: BaseException, *, url: str, not_found: type[StorageNotFoundError] = ShardNotFoundError
    ) -> BaseException:
        """The error table of http(s) and the Hub: an answer's status or aiohttp's error in the
        shardstream error tree (others pass unchanged)."""
        import aiohttp

        if isinstance(exc, Status):
            status, reason = exc.status, exc.reason
            if status in (404, 410):
                return not_found(f"{url}: no such object at {self.endpoint} (HTTP {status}; check the URL)")
            if status in (401, 403):
                return StorageAccessError(
                    f"{url}: {self.endpoint} refused access (HTTP {status} {reason}); {self._access_hint()}"
                )
            if status in RETRY_STATUSES:
                return Retryable(f"{url}: HTTP {status} {reason} from {self.endpoint}", retry_after=exc.retry_after)
            return StorageError(f"{url}: HTTP {status} {reason} from {self.endpoint}")
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return StorageConnectionError(
                f"{url}: the TLS certificate of {exc.host} is not trusted ({exc.certificate_error}); "
                "point SSL_CERT_FILE at the CA bundle that signed it"
            )
        if isinstance(exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, OSError)):
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return Retryable(
                f"{url}: the connection to {self.endpoint} failed ({detail}); check the server and network"
            )
        if isinstance(exc, (aiohttp.ClientError, ValueError)):  # ValueError: e.g. a .netrc entry beside a token
            return StorageError(f"{url}: request to {self.endpoint} failed: {exc}")
        return exc

    async def _send(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str],
        shown_url: str,
        passthrough: frozenset[int] = frozenset(),
    ) -> Any:
        """One request with its redirects, tried again as :func:`.ranged.call` says; the answer
        (status < 300, 304, 412, 416, or one of ``passthrough``) is returned unread, to be
        closed by the caller.

        Raises:
            ShardNotFoundError (404, 410), StorageAccessError (401, 403),
            StorageConnectionError (unreachable, or 429/5xx after every attempt), StorageError.
        """
        return await ranged.call(
            self,
            method,
            lambda: self._send_once(method, url, headers=headers, passthrough=passthrough),
            url=shown_url,
        )

    async def _send_once(
        self, method: str, url: str, *, headers: dict[str, str], passthrough: frozenset[int] = frozenset()
    ) -> Any:
        """One attempt of a request, following its redirects one hop at a time; the answer as
        :meth:`_send` says, or :class:`~.ranged.Status` for any other. A redirect target kept
        from an earlier request that now answers 404 or 401/403 (an expired signed URL) is
        dropped and the origin asked again, once, in the same attempt."""
        cfg = self.requests
        session = await _session_for(cfg)
        target = self._cached_location(url) or url
        while True:
            from_cache = target != url
            hops = 0
            while True:
                try:
                    response = await session.request(
                        method,
                        target,
                        headers={**headers, **self._headers_for(target)},
                        allow_redirects=False,
                        proxy=_proxy_for(target),
                    )
                except Exception:
                    if target != url:  # a cached or redirected location may have gone stale: start over
                        self._locations.pop(url, None)
                    raise
                if response.status in (301, 302, 303, 307, 308) and "Location" in response.headers:
                    response.release()
                    hops += 1
                    if hops > cfg.max_redirects:
                        raise StorageError(
                            f"{url}: more than {cfg.max_redirects} redirects (RequestConfig.max_redirects)"
                        )
                    target = urljoin(target, response.headers["Location"])
                    if response.status in (302, 303, 307) and target != url:
                        self._locations[url] = (target, time.monotonic() + 300.0)
                    continue
                break
            status = response.status
            if status < 300 or status in (304, 412, 416) or status in passthrough:
                return response
            retry_after, reason = response.headers.get("Retry-After"), response.reason or ""
            response.release()
            if status in (404, 410, 401, 403) and from_cache:
                self._locations.pop(url, None)  # a stale or expired redirect target: ask the origin again,
                target = url  # which is no new attempt (and happens once: not cached now)
                continue
            raise Status(status, reason, retry_after=retry_after)

    def _cached_location(self, url: str) -> str | None:
        hit = self._locations.get(url)
        if hit is None or hit[1] < time.monotonic():
            self._locations.pop(url, None)
            return None
        return hit[0]

    def _access_hint(self) -> str:
        return "the server wants credentials shardstream does not send to plain http(s) URLs; make the files readable"

    # -- reading ------------------------------------------------------------------------------

    async def head(self, name: str) -> tuple[int, str]:
        """``(size_bytes, version)`` of ``name`` from a HEAD request (a ``bytes=0-0`` GET where
        HEAD is refused or gives no length).

        Raises:
            ShardNotFoundError, StorageAccessError, StorageConnectionError, StorageError.
        """
        url, shown = await self._object_url(name), self.url_of(name)
        with _open_requests:
            response = await self._send(
                "HEAD", url, headers={"Accept-Encoding": "identity"}, shown_url=shown, passthrough=_HEAD_REFUSED
            )
            response.release()
            length = response.headers.get("Content-Length")
            if response.status == 200 and length is not None and length.isdigit():
                return int(length), _version(response.headers)
            response = await self._send(
                "GET", url, headers={"Range": "bytes=0-0", "Accept-Encoding": "identity"}, shown_url=shown
            )
            response.release()
        try:
            if response.status == 206:
                _, _, total = _content_range(response.headers.get("Content-Range", ""))
                if total is not None:
                    return total, _version(response.headers)
        except ValueError as exc:
            raise StorageError(f"{shown}: malformed Content-Range from {self.endpoint} ({exc})") from exc
        if response.status == 416:  # an empty object has no byte 0
            return 0, _version(response.headers)
        raise StorageError(
            f"{shown}: {self.endpoint} tells neither the size of the object (HEAD gave no Content-Length) "
            "nor a Content-Range; serve it from a server that supports byte ranges"
        )

    async def open_range(self, name: str, at: int, end: int | None, version: str | None) -> Answer:
        """The request function of http(s) and the Hub (:mod:`.ranged`): a GET of bytes
        ``[at, end)`` of ``name``, ``If-Match`` the version where it is a strong ETag (every
        answer's version is compared in any case); refuses an answer that is not the range
        asked for (a server that ignores ``Range``)."""
        headers = {"Accept-Encoding": "identity"}
        if version and not version.startswith("W/") and version.startswith('"'):
            headers["If-Match"] = version
        if at > 0 or end is not None:
            headers["Range"] = f"bytes={at}-{'' if end is None else end - 1}"
        response = await self._send_once("GET", await self._object_url(name), headers=headers)
        try:
            if response.status == 416:
                size = response.headers.get("Content-Range", "").rpartition("/")[2]
                raise PastEnd(int(size) if size.isdigit() else None, _version(response.headers) or None)
            if response.status == 412:
                raise Mismatch()
            total = self._check_span(response, at=at, end=end, shown=self.url_of(name))
        except BaseException:
            response.release()
            raise
        return Answer(total, _version(response.headers), aiohttp_pieces(response), response.release)

    def _check_span(self, response: Any, *, at: int, end: int | None, shown: str) -> int:
        """The object's size from an answer to a ranged GET from byte ``at``; refuses an answer
        that is not the range asked for."""
        if response.status == 206:
            try:
                first, _, size = _content_range(response.headers.get("Content-Range", ""))
            except ValueError:
                raise StorageError(
                    f"{shown}: {self.endpoint} answered 206 with Content-Range "
                    f"{response.headers.get('Content-Range')!r}, not one byte range; this server cannot be read"
                ) from None
            if first != at:
                raise StorageError(f"{shown}: asked for bytes from {at}, {self.endpoint} sent them from {first}")
        elif response.status == 200 and at == 0:
            length = response.headers.get("Content-Length")
            size = int(length) if length is not None and length.isdigit() else None
            if end is not None and (size is None or size > end):
                raise self._ignored_range(shown)
        else:
            if response.status == 200:
                raise self._ignored_range(shown)
            raise StorageError(f"{shown}: unexpected HTTP {response.status} from {self.endpoint} to a ranged GET")
        if size is None:
            raise StorageError(f"{shown}: {self.endpoint} does not tell the object's size (no total in Content-Range)")
        return size

    def _ignored_range(self, shown: str) -> StorageError:
        return StorageError(
            f"{shown}: {self.endpoint} ignored the Range header (it answered 200 with the whole object); "
            "shardstream reads shards in ranged parts and will not download a whole object for each part: "
            "serve the files from a server that supports byte ranges (nginx, Apache, a CDN, S3)"
        )

    # -- what plain servers cannot do ---------------------------------------------------------

    def list_names(self, prefix: str = "") -> list[str]:
        """Raises StorageError: web servers have no listing (names what to pass instead)."""
        raise StorageError(
            f"{self.url_of(prefix)}: an {self.label} server has no listing; name the shards with a brace "
            "pattern (https://host/ds/data-{000000..000099}.tar) or index them into a writable place "
            "(shardstream index build URLS --output DIR) and read that index"
        )

    def list_dir(self, prefix: str) -> Iterator[tuple[str, int, bool]]:
        """Raises StorageError as :meth:`list_names`."""
        self.list_names(prefix)
        return iter(())

    def _read_only(self, name: str) -> ReadOnlyStoreError:
        return ReadOnlyStoreError(
            f"{self.url_of(name)}: {self.label} URLs are read-only in shardstream; write the dataset to a local "
            "directory, s3://, gs:// or az:// (or index shards you cannot write beside with "
            "`shardstream index build URLS --output DIR`)"
        )

    def check_writable(self) -> None:
        raise self._read_only("")

    def write_bytes(self, name: str, data: bytes) -> None:
        raise self._read_only(name)

    def create_exclusive(self, name: str, data: bytes) -> bool:
        raise self._read_only(name)

    def delete(self, name: str) -> None:
        raise self._read_only(name)

    def open_writer(self, name: str) -> Any:
        raise self._read_only(name)

    def remove_empty_dirs(self, folders: tuple[str, ...]) -> None:
        """Nothing to do: nothing is written here."""

    def remove_partials(self, is_mine: Callable[[str], bool], *, folders: tuple[str, ...] = ("",)) -> int:
        """Nothing to do: nothing is written here."""
        return 0
