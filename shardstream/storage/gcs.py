"""Google Cloud Storage through gcsfs: ``gs://BUCKET/PREFIX`` (also ``gcs://``); the only module
that imports gcsfs.

One ``gcsfs.GCSFileSystem`` per process and endpoint lives on the process's background loop
(:mod:`shardstream.storage.loop`), made for it on first use (``asynchronous=True``, the loop
given, ``skip_instance_cache=True``, no listings cache; built in a worker thread, as importing
gcsfs and google.auth's credential lookup may block); filesystems inherited across a fork are
kept alive and never used (fsspec filesystems are not fork-safe). The store object holds only
its URL and settings, so it pickles cheaply into DataLoader workers.

What it does with GCS's JSON API:

- ``head`` and listings are metadata requests; an object's version is its *generation*;
- a ranged read is :mod:`.ranged`'s, with one request function (:meth:`GcsStore.open_range`: a
  media download on gcsfs's aiohttp session, streamed piece by piece) and one error table
  (:func:`_translate`); every request after the first of a call names the generation the
  first answer had (``generation=``: a replaced object is then 404 or that older generation,
  never a mix), and a body cut mid-transfer is fetched again from its first missing byte;
  gcsfs keeps its own connection pool, so ranged reads take one of
  ``RequestConfig.max_pool_connections`` slots per process instead;
- a shard is written as one *resumable upload* (:meth:`GcsStore.open_writer`), in chunks of
  ``FetchConfig.upload_part_bytes`` (rounded down to GCS's 256 KiB grain), finalised at
  ``commit``: nothing is visible under the name before; ``abort`` cancels the session (GCS
  drops an unfinished session after a week in any case);
- small objects are single requests; ``create_exclusive`` sends ``ifGenerationMatch=0``.

Credentials: with ``STORAGE_EMULATOR_HOST`` set (a local emulator) none are sent; otherwise
gcsfs's chain: ``GOOGLE_APPLICATION_CREDENTIALS`` or ``gcloud auth application-default
login`` (google.auth's default), the metadata server on Google Cloud, else anonymous access
(public buckets only). Zonal (Rapid) buckets, which need gcsfs's gRPC path, are not handled.

Every gcsfs/aiohttp/google-auth error is translated once, in :func:`_translate`, into the
:mod:`shardstream.errors` tree, naming the URL and the endpoint, never a token.

What the local emulator (``gcp-storage-emulator``, see ``tests/servers/emulators.py``)
does not cover: it is single-threaded, checks no credentials, returns every listing in one page,
ignores ``generation=`` pins and ``ifGenerationMatch`` preconditions (so ``create_exclusive``
overwrites there), and sends no ``x-goog-generation`` header. With ``STORAGE_EMULATOR_HOST``
set, a ranged read therefore asks for the generation before its first request and again after
its last, and refuses the bytes if it changed (real GCS needs neither request).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

from ..config import FetchConfig, RequestConfig, gcs_emulator_host
from ..errors import (
    BucketNotFoundError,
    CorruptShardError,
    ShardNotFoundError,
    StorageAccessError,
    StorageConnectionError,
    StorageError,
    StorageNotFoundError,
)
from . import loop
from .ranged import RETRY_STATUSES, Answer, Mismatch, PastEnd, RangedStore, Retryable, Status
from .requests import (
    BucketStoreMixin,
    OpenRequests,
    PerProcess,
    aiohttp_pieces,
    content_range,
    detach_finalizers,
    scrub,
)

__all__ = ["GcsStore", "parse_gcs_url"]

_UPLOAD_GRAIN = 256 << 10  # GCS: every chunk of a resumable upload but the last is a multiple of this
_ACCESS_HINT = (
    "check the credentials (GOOGLE_APPLICATION_CREDENTIALS naming a service-account key file, "
    "or `gcloud auth application-default login`, or the VM's service account) and that they may "
    "use the bucket (roles/storage.objectAdmin to write, objectViewer to read)"
)
# upload_id=: a resumable upload's session URI lets anyone holding it write the object (Google: treat it
# as a credential)

_filesystems: PerProcess[tuple[str | None, float, float], Any] = PerProcess()  # by endpoint and timeouts
_open_requests = OpenRequests()  # ranged reads of this process in progress


def parse_gcs_url(url: str) -> tuple[str, str, str]:
    """``"gs://bucket/some/prefix/"`` -> ``("gs", "bucket", "some/prefix")`` (``gcs://`` likewise).

    Raises:
        ValueError: not a ``gs://`` or ``gcs://`` URL, or no bucket.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("gs", "gcs"):
        raise ValueError(f"{url!r} is not a gs:// URL")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket; write gs://BUCKET/PREFIX")
    if "?" in url or "#" in url:
        raise ValueError(f"{url!r}: a dataset URL takes no ?query or #generation; give the bucket and prefix")
    return scheme.lower(), bucket, prefix.strip("/")


def _emulator_endpoint() -> str | None:
    """``STORAGE_EMULATOR_HOST`` as a URL (as gcsfs and google-cloud-storage read it), or None."""
    host = gcs_emulator_host()
    if host is None:
        return None
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


class _ScrubLog(logging.Filter):
    """Takes tokens and upload session URIs out of the records of gcsfs's logger, which logs the
    URL of every request (an upload session's among them) and errors naming it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is the handler's to report
            return True
        scrubbed = scrub(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        if record.exc_info and record.exc_info[0] is not None:
            trace = logging.Formatter().formatException(record.exc_info)
            scrubbed = scrub(trace)
            if scrubbed != trace:  # keep the text only: the exception itself names the session
                record.exc_info, record.exc_text = None, scrubbed
        return True


_SCRUB_LOG = _ScrubLog()


async def _filesystem(endpoint_url: str | None, http: RequestConfig) -> Any:
    """This process's ``GCSFileSystem`` for ``endpoint_url`` (None: Google's) with ``http``'s
    timeouts, made on first use."""
    key = (endpoint_url, http.connect_timeout_s, http.read_timeout_s)
    async with _filesystems.lock():
        filesystems = _filesystems.mine()
        fs = filesystems.get(key)
        if fs is None:
            import aiohttp

            running = asyncio.get_running_loop()

            def make() -> Any:  # importing gcsfs and google.auth's lookup take a while: not on the loop
                from gcsfs.core import GCSFileSystem  # the plain class: no zonal/HNS probes of each bucket

                return GCSFileSystem(
                    token="anon" if endpoint_url else None,
                    endpoint_url=endpoint_url,
                    asynchronous=True,
                    loop=running,
                    skip_instance_cache=True,
                    use_listings_cache=False,
                    requests_timeout=aiohttp.ClientTimeout(
                        total=None, sock_connect=http.connect_timeout_s, sock_read=http.read_timeout_s
                    ),
                    session_kwargs={"trust_env": True},  # HTTPS_PROXY / NO_PROXY, as gsutil and requests
                )

            logging.getLogger("gcsfs").addFilter(_SCRUB_LOG)  # once: addFilter skips a filter already there
            fs = await running.run_in_executor(None, make)
            session = await fs._set_session()
            detach_finalizers(fs)
            filesystems[key] = fs
            loop.on_shutdown(session.close)
        return fs


async def _fresh_credentials(fs: Any) -> None:
    """Refresh an expiring access token in a worker thread (google.auth refreshes with blocking
    requests, which gcsfs would otherwise do on the loop)."""
    credentials = getattr(fs.credentials, "credentials", None)
    if credentials is None:
        return  # anonymous
    expiry = getattr(credentials, "expiry", None)
    soon = expiry is not None and expiry - datetime.now(timezone.utc).replace(tzinfo=None) < timedelta(minutes=10)
    if soon or not getattr(credentials, "valid", True):
        await asyncio.to_thread(fs.credentials.maybe_refresh)


def _translate(
    exc: BaseException,
    *,
    url: str,
    endpoint: str,
    not_found: type[StorageNotFoundError] = ShardNotFoundError,
) -> BaseException:
    """GCS's error table: a gcsfs/aiohttp/google-auth error, or a :class:`~.ranged.Status` of
    a download, in the shardstream error tree (others pass unchanged); a
    :class:`~.ranged.Retryable` for what is worth another attempt. gcsfs raises
    FileNotFoundError for 404, ``OSError("Forbidden...")`` for 403, FileExistsError for 412,
    ``ValueError("Bad Request...")`` and ``HttpError`` for the rest (after its own retries)."""
    import aiohttp
    import google.auth.exceptions
    import requests
    from gcsfs.retry import HttpError, NonRetryableError

    bucket = url.split("://", 1)[-1].split("/", 1)[0]
    if isinstance(exc, (StorageError, CorruptShardError)):
        return exc
    if isinstance(exc, Status):  # an answer to one of our downloads
        if exc.status in RETRY_STATUSES:
            return Retryable(
                f"{url}: HTTP {exc.status} {exc.reason} from {endpoint}".strip(), retry_after=exc.retry_after
            )
        exc = HttpError({"code": exc.status, "message": exc.body or exc.reason})
    if isinstance(exc, FileNotFoundError) or (isinstance(exc, HttpError) and exc.code == 404):
        if not_found is BucketNotFoundError:
            return BucketNotFoundError(f"gs://{bucket}: no such bucket at {endpoint} (create it, or check the name)")
        return not_found(f"{url}: no such object at {endpoint} (check the URL and prefix)")
    if isinstance(exc, FileExistsError) or (isinstance(exc, HttpError) and exc.code == 412):
        return CorruptShardError(
            f"{url}: changed while it was being used (GCS precondition failed); do not overwrite shards of a "
            "dataset in use"
        )
    if isinstance(exc, (google.auth.exceptions.GoogleAuthError, NonRetryableError)):
        return StorageAccessError(
            f"{url}: no usable Google credentials for {endpoint} ({type(exc).__name__}); {_ACCESS_HINT}"
        )
    if (isinstance(exc, HttpError) and exc.code in (401, 403)) or (
        type(exc) is OSError and str(exc).startswith("Forbidden")
    ):
        code = getattr(exc, "code", None) or 403
        return StorageAccessError(f"{url}: {endpoint} refused the request (HTTP {code}); {_ACCESS_HINT}")
    if isinstance(exc, aiohttp.ClientConnectorError) or isinstance(exc, requests.exceptions.ProxyError):
        return Retryable(
            f"{url}: cannot reach {endpoint} ({type(exc).__name__}); check the network "
            "(and STORAGE_EMULATOR_HOST where an emulator is meant)"
        )
    if isinstance(exc, aiohttp.ClientError):
        return Retryable(
            f"{url}: the connection to {endpoint} failed ({type(exc).__name__}: {scrub(str(exc))}); "
            "retry, and check the network"
        )
    if isinstance(exc, HttpError):
        if exc.code in RETRY_STATUSES:
            return StorageConnectionError(
                f"{url}: {endpoint} still answers HTTP {exc.code} after gcsfs's retries; retry later"
            )
        return StorageError(f"{url}: GCS error (HTTP {exc.code}) from {endpoint}: {scrub(str(exc.message))[:300]}")
    if isinstance(exc, ValueError) and str(exc).startswith("Bad Request"):
        return StorageError(f"{url}: GCS refused the request as invalid (HTTP 400): {scrub(str(exc))[:300]}")
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):  # one class from Python 3.11
        return Retryable(f"{url}: no answer from {endpoint} in time ({type(exc).__name__})")
    return exc


async def _body(response: Any) -> str:
    """The start of an error answer's body ("" when it cannot be read: its status still says what
    went wrong)."""
    import aiohttp

    try:
        return (await response.read())[:300].decode(errors="replace")
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return ""


class GcsStore(BucketStoreMixin, RangedStore):
    """Objects under ``gs://bucket/prefix`` (module doc).

    Args:
        url: ``gs://bucket`` or ``gs://bucket/prefix`` (``gcs://`` likewise).
        fetch: the chunk size of shard uploads (``upload_part_bytes``); reads are cut into
            parts by the fetcher.
        requests: timeouts, attempts and waits of a ranged read, and the ranged reads in flight
            per process (gcsfs's session keeps its own pool); default
            :class:`~shardstream.config.RequestConfig`.

    Attributes:
        list_page_size: objects asked for per listing request (GCS's maximum is 1000).
    """

    label = "GCS"
    list_page_size = 1000
    version_name = "generation"
    in_progress = _open_requests
    translate = staticmethod(_translate)
    library_pool = True

    def __init__(self, url: str, *, fetch: FetchConfig | None = None, requests: RequestConfig | None = None) -> None:
        scheme, self.bucket, self.prefix = parse_gcs_url(url)
        self.url = f"{scheme}://{self.bucket}/{self.prefix}" if self.prefix else f"{scheme}://{self.bucket}"
        self.fetch = fetch or FetchConfig()
        self.requests = requests or RequestConfig()
        self.endpoint_url = _emulator_endpoint()  # fixed here, so workers use the parent's choice
        self.endpoint = self.endpoint_url or "Google Cloud Storage"

    @property
    def answers_name_version(self) -> bool:  # type: ignore[override]
        """Real GCS names each answer's generation (``x-goog-generation``); the emulator does not."""
        return self.endpoint_url is None

    # -- requests -----------------------------------------------------------------------------

    async def _fs(self) -> Any:
        return await _filesystem(self.endpoint_url, self.requests)

    async def _call(self, method: str, path: str, *args: str, **kwargs: Any) -> Any:
        """gcsfs's ``_call`` (its retries included) with fresh credentials."""
        fs = await self._fs()
        await _fresh_credentials(fs)
        return await fs._call(method, path, *args, **kwargs)

    async def _object(self, name: str) -> dict[str, Any]:
        """The object resource of ``name`` (size, generation ...)."""
        return await self._run(
            "get object",
            self._call("GET", "b/{}/o/{}", self.bucket, self.key_of(name), json_out=True),
            url=self.url_of(name),
        )

    async def _missing(self, name: str, answer: str = "") -> StorageNotFoundError:
        """The error for a 404 on ``name``: BucketNotFoundError where the bucket is what is missing.

        GCS's answer (``answer``, the 404's body where at hand) says which; otherwise the bucket
        is asked for, and a refusal counts as a bucket that exists (a reader with objectViewer
        only may read objects but not get the bucket; a missing bucket is 404 to anyone)."""
        said = answer.lower()
        bucket_missing = "bucket does not exist" in said
        if not bucket_missing and "no such object" not in said:
            try:
                await self._run("get bucket", self._call("GET", "b/{}", self.bucket), url=self.url)
            except ShardNotFoundError:
                bucket_missing = True
            except StorageAccessError:
                pass
        if bucket_missing:
            return BucketNotFoundError(
                f"{self.url}: no such bucket gs://{self.bucket} at {self.endpoint} (create it, or check the name)"
            )
        return ShardNotFoundError(f"{self.url_of(name)}: no such object at {self.endpoint} (check the URL and prefix)")

    # -- the Store protocol ---------------------------------------------------------------------

    def check_writable(self) -> None:
        """Check the bucket exists and the credentials may create objects in it (GCS's
        ``testIamPermissions``, which needs no permission of its own).

        Raises:
            BucketNotFoundError, StorageAccessError, StorageConnectionError, StorageError.
        """

        async def check() -> None:
            answer = await self._run(
                "test permissions",
                self._call(
                    "GET",
                    "b/{}/iam/testPermissions",
                    self.bucket,
                    json_out=True,
                    permissions="storage.objects.create",
                ),
                url=self.url,
                not_found=BucketNotFoundError,
            )
            if "storage.objects.create" not in answer.get("permissions", []):
                raise StorageAccessError(
                    f"{self.url}: the credentials may not create objects in gs://{self.bucket} at {self.endpoint}; "
                    + _ACCESS_HINT
                )

        loop.run(check())

    async def _put(self, name: str, data: bytes, *, exclusive: bool) -> bool:
        """Write ``name`` in one request (``exclusive``: with ``ifGenerationMatch=0``); False when
        it exists and ``exclusive``."""

        async def put() -> bool:
            fs = await self._fs()
            await _fresh_credentials(fs)
            try:
                await fs._pipe_file(
                    f"{self.bucket}/{self.key_of(name)}",
                    bytes(data),
                    content_type="application/octet-stream",
                    mode="create" if exclusive else "overwrite",
                )
            except FileExistsError:  # gcsfs's 412: ifGenerationMatch=0 failed, the object exists
                if exclusive:
                    return False
                raise
            return True

        return await self._run("upload", put(), url=self.url_of(name), not_found=BucketNotFoundError)

    def delete(self, name: str) -> None:
        """Delete ``name``; a missing object is no error."""

        async def delete() -> None:
            try:
                await self._run(
                    "delete", self._call("DELETE", "b/{}/o/{}", self.bucket, self.key_of(name)), url=self.url_of(name)
                )
            except ShardNotFoundError:
                pass

        loop.run(delete())

    def open_writer(self, name: str) -> _GcsSink:
        """A resumable upload of ``name``, finalised by ``commit`` (module doc)."""
        return _GcsSink(self, name)

    async def _list_page(
        self, prefix: str, *, delimiter: bool, token: str | None
    ) -> tuple[list[tuple[str, int]], list[str], str | None]:
        """One page under ``prefix``: ``(key, size_bytes)`` of its objects, the keys of its
        folders (with ``delimiter``), and the token of the next page (None after the last)."""
        params: dict[str, Any] = {"prefix": self.key_of("") + prefix, "maxResults": self.list_page_size}
        if delimiter:
            params["delimiter"] = "/"
        if token:
            params["pageToken"] = token
        page = await self._run(
            "list",
            self._call("GET", "b/{}/o", self.bucket, json_out=True, **params),
            url=self.url_of(prefix),
            not_found=BucketNotFoundError,
        )
        files = [(item["name"], int(item.get("size", 0))) for item in page.get("items", [])]
        return files, list(page.get("prefixes", [])), page.get("nextPageToken") or None

    def remove_partials(self, is_mine: Callable[[str], bool], *, folders: tuple[str, ...] = ("",)) -> int:
        """Nothing to find: an unfinished resumable upload (a killed writer's) is no object, cannot
        be listed, and GCS drops it a week after it began; returns 0."""
        return 0

    # -- the RemoteStore protocol ------------------------------------------------------------------

    async def head(self, name: str) -> tuple[int, str]:
        """``(size_bytes, generation)`` of object ``name``.

        Raises:
            ShardNotFoundError, BucketNotFoundError, StorageAccessError, StorageConnectionError,
            StorageError.
        """
        try:
            resource = await self._object(name)
        except ShardNotFoundError as exc:
            raise await self._missing(name) from exc
        return int(resource.get("size", 0)), str(resource.get("generation", ""))

    async def open_range(self, name: str, at: int, end: int | None, version: str | None) -> Answer:
        """GCS's request function (:mod:`.ranged`): a media download of bytes ``[at, end)`` of
        ``name``, of generation ``version`` when given, on gcsfs's aiohttp session."""
        fs = await self._fs()
        media = f"{fs.base.rstrip('/').rsplit('/storage/v1', 1)[0]}/download/storage/v1/b/{quote(self.bucket, safe='')}"
        media += f"/o/{quote(self.key_of(name), safe='')}?alt=media" + (f"&generation={version}" if version else "")
        headers = {"Accept-Encoding": "identity", "User-Agent": "shardstream"}
        if at > 0 or end is not None:
            headers["Range"] = f"bytes={at}-{'' if end is None else end - 1}"
        await _fresh_credentials(fs)
        fs.credentials.apply(headers)
        response = await fs.session.get(media, headers=headers, timeout=fs.requests_timeout)
        try:
            status = response.status
            if status == 404 and version is None:
                raise await self._missing(name, await _body(response))
            if status == 412:
                raise Mismatch()
            if status == 416:  # from past the end; from the end itself is empty, not an error
                raise PastEnd()
            if status not in (200, 206):
                body = await _body(response) if status not in RETRY_STATUSES else ""
                raise Status(status, response.reason or "", retry_after=response.headers.get("Retry-After"), body=body)
            total = self._check_span(response, name=name, at=at, end=end)
        except BaseException:
            response.release()
            raise
        return Answer(total, response.headers.get("x-goog-generation"), aiohttp_pieces(response), response.release)

    def _check_span(self, response: Any, *, name: str, at: int, end: int | None) -> int:
        """The object's size from an answer to a read from byte ``at``; refuses an answer that
        is not the range asked for (one from past the end, as the emulator sends, gives a size
        below ``at``: :mod:`.ranged` says so)."""
        url = self.url_of(name)
        if response.status == 206:
            try:
                first, _, size = content_range(response.headers.get("Content-Range", ""))
            except ValueError:
                raise StorageError(
                    f"{url}: {self.endpoint} answered 206 with Content-Range "
                    f"{response.headers.get('Content-Range')!r}, not one byte range"
                ) from None
            if size is None:
                raise StorageError(f"{url}: {self.endpoint} does not tell the object's size")
        else:  # 200: the whole object, asked for only from byte 0 without an end
            length = response.headers.get("x-goog-stored-content-length") or response.headers.get("Content-Length")
            if at != 0 or end is not None or length is None or not length.isdigit():
                raise StorageError(f"{url}: {self.endpoint} answered 200 to a ranged read of bytes from {at}")
            first, size = 0, int(length)
        if size < at:  # the emulator's answer from past the end (GCS says 416)
            return size
        if first != at:
            raise StorageError(f"{url}: asked for bytes from {at}, {self.endpoint} sent them from {first}")
        return size


class _GcsSink:
    """A resumable upload: chunks of ``fetch.upload_part_bytes`` (whole 256 KiB grains) go up
    one after the other while the shard is written; the last one finalises the object."""

    def __init__(self, store: GcsStore, name: str) -> None:
        self.store = store
        self.name = name
        self.url = store.url_of(name)
        self._buffer = bytearray()
        self._sent = 0  # bytes handed to uploads
        self._location: str | None = None
        self._pending: concurrent.futures.Future[Any] | None = None
        self._closed = False
        self._chunk_bytes = max(_UPLOAD_GRAIN, store.fetch.upload_part_bytes // _UPLOAD_GRAIN * _UPLOAD_GRAIN)

    def write(self, data: bytes | memoryview) -> None:
        if self._closed:
            raise ValueError(f"{self.url}: write after commit or abort")
        self._buffer += data
        if len(self._buffer) >= self._chunk_bytes:
            self._send(final=False)

    def _send(self, *, final: bool) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()  # chunks of one upload go in order
        size = len(self._buffer) if final else len(self._buffer) // _UPLOAD_GRAIN * _UPLOAD_GRAIN
        chunk = bytes(self._buffer[:size])
        del self._buffer[:size]
        offset = self._sent
        self._sent += size
        self._pending = loop.submit(
            self.store._run(
                "upload",
                self._upload(chunk, offset, self._sent if final else None),
                url=self.url,
                not_found=BucketNotFoundError,
            )
        )

    async def _upload(self, chunk: bytes, offset: int, total: int | None) -> Any:
        """PUT ``chunk`` at ``offset`` (``total``: the object's size, for the last chunk),
        sending again what GCS did not keep (it answers 308 with the range it persisted).

        Errors of the session's requests are raised ``from None``: gcsfs's name the session URI,
        whose ``upload_id`` lets anyone holding it write the object."""
        store = self.store
        fs = await store._fs()
        await _fresh_credentials(fs)
        if self._location is None:
            from gcsfs.core import initiate_upload

            self._location = await initiate_upload(
                fs, store.bucket, store.key_of(self.name), "application/octet-stream"
            )
        view = memoryview(chunk)
        for _ in range(10):  # each round sends again what GCS had not kept
            size = "*" if total is None else str(total)
            span = f"bytes {offset}-{offset + len(view) - 1}/{size}" if len(view) else f"bytes */{size}"
            await _fresh_credentials(fs)
            try:
                headers, contents = await fs._call(
                    "PUT", self._location, headers={"Content-Range": span, "Content-Length": str(len(view))}, data=view
                )
            except Exception as exc:  # noqa: BLE001 - translated, without the session URI in the chain
                raise self._session_error(exc) from None
            kept = headers.get("Range")
            persisted = int(kept.rsplit("-", 1)[1]) + 1 if kept else (offset + len(view) if contents else 0)
            if persisted >= offset + len(view):
                return json.loads(contents) if total is not None and contents else None
            view = view[max(persisted - offset, 0) :]
            offset = max(persisted, offset)
        raise StorageError(f"{self.url}: {store.endpoint} keeps refusing the bytes of a resumable upload")

    def _session_error(self, exc: BaseException) -> BaseException:
        """The error of a request of the upload session: 404/410 is a session GCS no longer has
        (a week old, or cancelled), not a missing bucket; the rest as :func:`_translate` says."""
        from gcsfs.retry import HttpError

        if isinstance(exc, FileNotFoundError) or (isinstance(exc, HttpError) and exc.code in (404, 410)):
            return StorageError(
                f"{self.url}: {self.store.endpoint} no longer has this upload's resumable session (expired after "
                "a week, or cancelled); re-run the pack, which resumes"
            )
        translated = _translate(exc, url=self.url, endpoint=self.store.endpoint)
        if translated is exc and not isinstance(exc, (StorageError, CorruptShardError)):
            return StorageError(
                f"{self.url}: the resumable upload to {self.store.endpoint} failed ({type(exc).__name__})"
            )
        return translated

    def commit(self) -> None:
        if self._closed:
            raise ValueError(f"{self.url}: commit after commit or abort")
        self._send(final=True)
        assert self._pending is not None  # internal invariant: _send just submitted the last chunk
        pending, self._pending = self._pending, None
        resource = pending.result()
        if isinstance(resource, dict) and "size" in resource and int(resource["size"]) != self._sent:
            raise StorageError(f"{self.url}: GCS stored {resource['size']} bytes of the {self._sent} sent")
        self._closed = True

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pending is not None:
            self._pending.cancel()
            concurrent.futures.wait([self._pending])
            self._pending = None
        location, self._location = self._location, None
        if location is not None:

            async def cancel() -> None:  # one DELETE of the session (GCS answers 499), without gcsfs's retries
                import aiohttp

                fs = await self.store._fs()
                await _fresh_credentials(fs)
                headers = {"Content-Length": "0"}
                fs.credentials.apply(headers)
                timeout = aiohttp.ClientTimeout(total=self.store.requests.connect_timeout_s)
                async with fs.session.delete(location, headers=headers, timeout=timeout):
                    pass

            try:
                loop.run(cancel())
            except Exception:  # noqa: BLE001 - GCS drops the session within a week; the original error matters more
                pass
