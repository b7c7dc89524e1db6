"""S3 storage through aiobotocore: the only module that imports it.

One client per (process, :class:`~shardstream.config.S3Config`) lives on the process's
background loop (:mod:`shardstream.storage.loop`). Every botocore/aiohttp error is translated
once, in :func:`_translate`, into the :mod:`shardstream.errors` tree, naming the URL and the
endpoint but never the secret.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ..config import FetchConfig, S3Config
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
from .requests import OpenRequests, PartsSink, PerProcess, aiohttp_pieces, pool_state_text

__all__ = ["S3Store", "open_requests", "parse_s3_url", "pool_state"]

_ACCESS_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "403",
        "Forbidden",
        "ExpiredToken",
        "InvalidToken",
        "AuthorizationHeaderMalformed",
    }
)
_clients: PerProcess[S3Config, Any] = PerProcess()
_open_gets = OpenRequests()  # ranged GETs of this process in progress


def open_requests() -> int:
    """Ranged GETs this process has in progress now (each holds or waits for a pooled connection)."""
    return _open_gets.now()


def pool_state(cfg: S3Config) -> str:
    """How this process's S3 requests stand against its connection pool, for stall messages."""
    return pool_state_text("S3", open_requests(), cfg.max_pool_connections, "S3Config.max_pool_connections")


def parse_s3_url(url: str) -> tuple[str, str]:
    """``"s3://bucket/some/prefix/"`` -> ``("bucket", "some/prefix")``.

    Raises:
        ValueError: not an ``s3://`` URL or no bucket.
    """
    if not url.startswith("s3://"):
        raise ValueError(f"{url!r} is not an s3:// URL")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket; write s3://BUCKET/PREFIX")
    return bucket, prefix.strip("/")


_warned_endpoints: set[str] = set()


def warn_plain_http(endpoint: str | None) -> None:
    """Warn once per endpoint that an ``http://`` endpoint off this machine sends requests and
    data unencrypted (loopback endpoints, like the local test server, are fine)."""
    from urllib.parse import urlsplit

    if not endpoint or not endpoint.lower().startswith("http://") or endpoint in _warned_endpoints:
        return
    host = (urlsplit(endpoint).hostname or "").lower()
    if host == "localhost" or host == "::1" or host.startswith("127."):
        return
    _warned_endpoints.add(endpoint)
    import warnings

    warnings.warn(
        f"S3 endpoint {endpoint} is plain http:// on another host: requests and data travel unencrypted "
        "(signatures do not hide them); use https:// unless the network is trusted",
        stacklevel=3,
    )


_loader: Any = None


def _data_loader() -> Any:
    """botocore's loader of service models, one per process and kept across forks: a client
    made with it reads no JSON again (5 ms, not 60-80 ms), so a forked DataLoader worker's
    first client, made with the parent's loader, costs its first GET nothing worth
    counting. It holds parsed model files only, no connection or credentials."""
    global _loader
    if _loader is None:
        from botocore.loaders import create_loader

        _loader = create_loader()
    return _loader


async def _client_for(cfg: S3Config) -> Any:
    async with _clients.lock():
        clients = _clients.mine()
        client = clients.get(cfg)
        if client is None:
            warn_plain_http(cfg.resolved_endpoint_url())
            from aiobotocore.config import AioConfig
            from aiobotocore.session import AioSession

            session = AioSession(profile=cfg.profile) if cfg.profile else AioSession()
            session.register_component("data_loader", _data_loader())
            context = session.create_client(
                "s3",
                endpoint_url=cfg.resolved_endpoint_url(),
                region_name=cfg.resolved_region_name(),
                aws_access_key_id=cfg.access_key_id,
                aws_secret_access_key=cfg.secret_access_key,
                aws_session_token=cfg.session_token,
                config=AioConfig(
                    s3={"addressing_style": cfg.resolved_addressing_style()},
                    retries={"mode": "standard", "total_max_attempts": cfg.max_attempts},
                    connect_timeout=cfg.connect_timeout_s,
                    read_timeout=cfg.read_timeout_s,
                    max_pool_connections=cfg.max_pool_connections,
                ),
            )
            client = await context.__aenter__()
            clients[cfg] = client
            loop.on_shutdown(lambda: context.__aexit__(None, None, None))
        return client


def _throttled_s(exc: BaseException) -> float | None:
    """Seconds to wait before trying again after a 429 answer (its ``Retry-After``, at most
    30 s; 1 s without one), or None for any other error. Some S3-compatible servers throttle
    with 429, which botocore's retry modes do not retry."""
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return None
    metadata = exc.response.get("ResponseMetadata", {})
    if metadata.get("HTTPStatusCode") != 429:
        return None
    try:
        return min(max(float(metadata.get("HTTPHeaders", {}).get("retry-after", 1.0)), 0.0), 30.0)
    except ValueError:
        return 1.0


def _translate(
    exc: BaseException,
    *,
    url: str,
    endpoint: str,
    not_found: type[StorageNotFoundError] = ShardNotFoundError,
) -> BaseException:
    """Map a botocore/aiohttp error to the shardstream error tree (others pass unchanged)."""
    import aiohttp
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ProfileNotFound,
        ReadTimeoutError,
        ResponseStreamingError,
    )

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        bucket = url[len("s3://") :].split("/", 1)[0]
        if code == "NoSuchBucket":
            return BucketNotFoundError(
                f"s3://{bucket}: no such bucket at {endpoint} (create it, or check the bucket name)"
            )
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            if not_found is BucketNotFoundError:
                return BucketNotFoundError(
                    f"s3://{bucket}: no such bucket at {endpoint} (create it, or check the bucket name)"
                )
            return not_found(f"{url}: no such object at {endpoint} (check the URL and prefix)")
        if code in _ACCESS_CODES or status == 403:
            return StorageAccessError(
                f"{url}: {endpoint} refused the request ({code}); check the credentials "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or S3Config) and "
                "the bucket's permissions"
            )
        return StorageError(f"{url}: S3 error {code} (HTTP {status}) from {endpoint}: {error.get('Message', '')}")
    if isinstance(exc, NoCredentialsError):
        return StorageAccessError(
            f"{url}: no AWS credentials found for {endpoint}; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or pass S3Config(...)"
        )
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError, aiohttp.ClientConnectorError)):
        return StorageConnectionError(
            f"{url}: cannot reach S3 endpoint {endpoint} ({type(exc).__name__}); check "
            "AWS_ENDPOINT_URL and that the server is running"
        )
    if isinstance(exc, (aiohttp.ClientError, ResponseStreamingError, ReadTimeoutError)):
        return StorageConnectionError(
            f"{url}: the connection to {endpoint} failed during the transfer "
            f"({type(exc).__name__}: {exc}); retry, and check the server and network"
        )
    if isinstance(exc, ProfileNotFound):
        return StorageAccessError(f"{url}: {exc}; check AWS_PROFILE or --profile")
    if isinstance(exc, BotoCoreError):
        return StorageError(f"{url}: S3 request to {endpoint} failed: {exc}")
    if isinstance(exc, ValueError) and "endpoint" in str(exc).lower():
        return StorageError(f"{url}: bad S3 endpoint {endpoint!r} ({exc}); write it as http(s)://HOST:PORT")
    return exc


class S3Store:
    """Objects under ``s3://bucket/prefix``.

    Args:
        url: ``s3://bucket`` or ``s3://bucket/prefix``.
        s3: endpoint and credentials; default the standard AWS environment.
        fetch: part sizes and concurrency of uploads.
    """

    def __init__(self, url: str, *, s3: S3Config | None = None, fetch: FetchConfig | None = None) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.s3 = s3 or S3Config()
        self.fetch = fetch or FetchConfig()
        self.endpoint = self.s3.resolved_endpoint_url() or "AWS S3"

    label = "S3"
    list_page_size = 1000  # keys per LIST request (S3's own maximum)

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r})"

    @property
    def request_limit_s(self) -> float:
        """One request's bound, every attempt included: ``max_attempts * (connect_timeout_s + read_timeout_s)``."""
        cfg = self.s3
        return cfg.max_attempts * (cfg.connect_timeout_s + cfg.read_timeout_s)

    def pool_state(self) -> str:
        return pool_state(self.s3)

    def key_of(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def url_of(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key_of(name)}"

    async def call(
        self, operation: str, *, url: str, not_found: type[StorageNotFoundError] = ShardNotFoundError, **kwargs: Any
    ) -> Any:
        """Await one S3 API call, translating its errors (see :func:`_translate`).

        The call (up to the response headers, all attempts included) is bounded by
        ``max_attempts * (connect_timeout_s + read_timeout_s)``: aiohttp does not bound the
        wait for a pooled connection, and nothing may hang.
        """
        cfg = self.s3
        limit_s = cfg.max_attempts * (cfg.connect_timeout_s + cfg.read_timeout_s)
        try:
            client = await _client_for(cfg)
            for attempt in range(1, cfg.max_attempts + 1):
                try:
                    return await asyncio.wait_for(getattr(client, operation)(**kwargs), limit_s)
                except Exception as exc:
                    wait_s = _throttled_s(exc)  # botocore retries 503 SlowDown, not a bare 429
                    if wait_s is None or attempt == cfg.max_attempts:
                        raise
                    await asyncio.sleep(wait_s)
        except asyncio.TimeoutError:
            raise StorageConnectionError(
                f"{url}: no answer from {self.endpoint} to {operation} within {limit_s:.0f} s: {pool_state(cfg)}"
            ) from None
        except Exception as exc:
            raise _translate(exc, url=url, endpoint=self.endpoint, not_found=not_found) from exc

    def check_writable(self) -> None:
        """Check the bucket exists and the credentials are accepted.

        Raises:
            BucketNotFoundError, StorageAccessError, StorageConnectionError.
        """
        loop.run(self.call("head_bucket", url=self.url, not_found=BucketNotFoundError, Bucket=self.bucket))

    def exists(self, name: str) -> bool:
        try:
            loop.run(self.call("head_object", url=self.url_of(name), Bucket=self.bucket, Key=self.key_of(name)))
        except ShardNotFoundError:
            return False
        return True

    def read_bytes(self, name: str) -> bytes:
        """The whole object; a body cut mid-transfer is resumed as :meth:`get_range` does."""
        return b"".join(loop.run(self.get_range(name, 0, None))[0])

    def write_bytes(self, name: str, data: bytes) -> None:
        loop.run(self.call("put_object", url=self.url_of(name), Bucket=self.bucket, Key=self.key_of(name), Body=data))

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Put ``name`` unless it exists (``If-None-Match: *``); False when it already did."""
        from botocore.exceptions import ClientError

        url = self.url_of(name)

        async def put() -> bool:
            try:
                client = await _client_for(self.s3)
                await client.put_object(Bucket=self.bucket, Key=self.key_of(name), Body=data, IfNoneMatch="*")
            except ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                    return False
                raise _translate(exc, url=url, endpoint=self.endpoint) from exc
            except Exception as exc:
                raise _translate(exc, url=url, endpoint=self.endpoint) from exc
            return True

        return loop.run(put())

    def delete(self, name: str) -> None:
        loop.run(self.call("delete_object", url=self.url_of(name), Bucket=self.bucket, Key=self.key_of(name)))

    def open_writer(self, name: str) -> _S3Sink:
        return _S3Sink(self, name)

    def list_names(self, prefix: str = "") -> list[str]:
        """Sorted names of the objects whose name starts with ``prefix``, page by page."""
        root = self.key_of("")

        async def list_all() -> list[str]:
            names: list[str] = []
            token: dict[str, str] = {}
            while True:
                page = await self.call(
                    "list_objects_v2",
                    url=self.url,
                    not_found=BucketNotFoundError,
                    Bucket=self.bucket,
                    Prefix=root + prefix,
                    MaxKeys=self.list_page_size,
                    **token,
                )
                names.extend(obj["Key"][len(root) :] for obj in page.get("Contents", []))
                if not page.get("IsTruncated"):
                    return sorted(names)
                token = {"ContinuationToken": page["NextContinuationToken"]}

        return loop.run(list_all())

    def list_dir(self, prefix: str) -> Iterator[tuple[str, int, bool]]:
        """One "directory" level under ``prefix`` (``""`` or ending in ``/``), page by page:
        ``(name, size_bytes, is_dir)`` with names relative to this store's prefix."""
        root = self.key_of("")
        token: dict[str, str] = {}
        while True:
            page = loop.run(
                self.call(
                    "list_objects_v2",
                    url=self.url_of(prefix),
                    not_found=BucketNotFoundError,
                    Bucket=self.bucket,
                    Prefix=root + prefix,
                    Delimiter="/",
                    MaxKeys=self.list_page_size,
                    **token,
                )
            )
            for common in page.get("CommonPrefixes", []):
                yield common["Prefix"][len(root) :], 0, True
            for obj in page.get("Contents", []):
                yield obj["Key"][len(root) :], obj["Size"], False
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def remove_empty_dirs(self, folders: tuple[str, ...]) -> None:
        """Nothing to do: S3 has no directories."""

    def remove_partials(self, is_mine: Callable[[str], bool], *, folders: tuple[str, ...] = ("",)) -> int:
        """Abort unfinished multipart uploads (left by killed writers) of names ``is_mine``
        accepts, anywhere under the prefix (``folders`` matters only to local stores)."""
        root = self.key_of("")

        async def abort_all() -> int:
            page = await self.call(
                "list_multipart_uploads",
                url=self.url,
                not_found=BucketNotFoundError,
                Bucket=self.bucket,
                Prefix=root,
            )
            aborted = 0
            for upload in page.get("Uploads", []):
                if is_mine(upload["Key"][len(root) :]):
                    await self.call(
                        "abort_multipart_upload",
                        url=self.url,
                        Bucket=self.bucket,
                        Key=upload["Key"],
                        UploadId=upload["UploadId"],
                    )
                    aborted += 1
            return aborted

        return loop.run(abort_all())

    async def head(self, name: str) -> tuple[int, str]:
        """``(size_bytes, etag)`` of object ``name``.

        Raises:
            ShardNotFoundError, StorageAccessError, StorageConnectionError, StorageError.
        """
        response = await self.call("head_object", url=self.url_of(name), Bucket=self.bucket, Key=self.key_of(name))
        return int(response["ContentLength"]), str(response.get("ETag", ""))

    async def get_range(
        self, name: str, start: int, end: int | None, *, on_retry: Callable[[BaseException], None] | None = None
    ) -> tuple[list[bytes], int, str]:
        """Bytes ``[start, end)`` of object ``name`` (``end=None``: to its end) as the pieces
        they arrived in (uncopied, up to 256 KiB each from aiohttp), with the object's total
        size and ETag.

        A body cut off mid-transfer (which botocore neither wraps nor retries) is resumed at
        the first byte not received, with a ranged GET conditioned on the ETag of the first
        response (``IfMatch``), up to ``S3Config.max_attempts`` attempts in all; ``on_retry``
        is told of each. Nothing received is fetched twice.

        Returns:
            ``(pieces, object_size_bytes, etag)``; the pieces hold fewer bytes than asked only
            when the object ends before ``end``.

        Raises:
            ShardNotFoundError: no such object; CorruptShardError: ``start`` lies beyond its
                end, or the object changed between attempts (its ETag no longer matches).
            StorageAccessError, StorageConnectionError, StorageError: other S3 failures.
        """
        with _open_gets:
            return await self._get_range(name, start, end, on_retry)

    async def _get_range(
        self, name: str, start: int, end: int | None, on_retry: Callable[[BaseException], None] | None
    ) -> tuple[list[bytes], int, str]:
        import aiohttp
        from botocore.exceptions import ResponseStreamingError

        url = self.url_of(name)
        pieces: list[bytes] = []
        received = 0
        etag: str | None = None
        total = 0
        for attempt in range(1, self.s3.max_attempts + 1):
            condition: dict[str, str] = {"IfMatch": etag} if etag else {}
            if end is not None or start + received > 0:  # "bytes=0-" of an empty object is refused
                condition["Range"] = f"bytes={start + received}-{'' if end is None else end - 1}"
            try:
                response = await self.call(
                    "get_object", url=url, Bucket=self.bucket, Key=self.key_of(name), **condition
                )
            except StorageError as exc:
                if "InvalidRange" in str(exc):
                    size, version = await self.head(name)
                    if start + received == size and (etag is None or version == etag):
                        return pieces, size, version  # from the end to the end: nothing
                    raise CorruptShardError(
                        f"{url}: ends before byte {start + received}; the shard is shorter than its index "
                        "says (stale index or truncated upload), re-pack or re-upload it"
                    ) from exc
                if etag and ("PreconditionFailed" in str(exc) or "HTTP 412" in str(exc)):
                    raise CorruptShardError(
                        f"{url}: changed while it was being read (ETag {etag} no longer matches at byte "
                        f"{start + received}); do not overwrite shards of a dataset in use"
                    ) from exc
                raise
            etag = etag or str(response.get("ETag", ""))
            content_range = str(response.get("ContentRange", ""))
            total = (
                int(content_range.rsplit("/", 1)[1]) if "/" in content_range else int(response.get("ContentLength", 0))
            )
            try:
                async with response["Body"] as body:
                    async for piece in _body_pieces(body):
                        pieces.append(piece)
                        received += len(piece)
            except (
                aiohttp.ClientPayloadError,
                aiohttp.ClientConnectionError,
                ResponseStreamingError,
                asyncio.TimeoutError,
            ) as exc:
                if attempt == self.s3.max_attempts:
                    raise _translate(exc, url=url, endpoint=self.endpoint) from exc
                if on_retry is not None:
                    on_retry(exc)
                if end is not None and received >= end - start:
                    break  # all bytes are here; only the end of the response was lost
                continue
            break
        return pieces, total or start + received, etag or ""


def _body_pieces(body: Any) -> AsyncIterator[bytes]:
    """The pieces of a response body as aiohttp received them (:func:`.requests.aiohttp_pieces`;
    aiobotocore 3 names the aiohttp response ``raw_stream``, 2.x proxies it). Other HTTP
    backends are read through ``body.read``."""
    content = getattr(getattr(body, "raw_stream", body), "content", None)
    return aiohttp_pieces(content) if hasattr(content, "readchunk") else _read_pieces(body)


async def _read_pieces(body: Any) -> AsyncIterator[bytes]:
    while piece := await body.read(1 << 20):
        yield piece


class _S3Sink(PartsSink):
    """A multipart upload: parts of ``fetch.upload_part_bytes`` go up while the shard is written."""

    def __init__(self, store: S3Store, name: str) -> None:
        super().__init__(store.url_of(name), store.fetch)
        self.store = store
        self.key = store.key_of(name)
        self._upload_id: str | None = None

    def _send_part(self) -> None:
        store = self.store
        if self._upload_id is None:
            response = loop.run(store.call("create_multipart_upload", url=self.url, Bucket=store.bucket, Key=self.key))
            self._upload_id = response["UploadId"]
        number = len(self._parts) + 1
        body = bytes(self._buffer)
        self._buffer.clear()

        async def upload() -> dict[str, Any]:
            response = await store.call(
                "upload_part",
                url=self.url,
                Bucket=store.bucket,
                Key=self.key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=body,
            )
            return {"ETag": response["ETag"], "PartNumber": number}

        self._in_flight(loop.submit(upload()))

    def commit(self) -> None:
        self._check_open("commit")
        self._send_part()  # the last part may be smaller than 5 MiB, or empty
        parts = [f.result() for f in self._parts]
        store = self.store
        loop.run(
            store.call(
                "complete_multipart_upload",
                url=self.url,
                Bucket=store.bucket,
                Key=self.key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": parts},
            )
        )
        self._closed = True

    def abort(self) -> None:
        if not self._drop_parts():
            return
        if self._upload_id is not None:
            store = self.store
            try:
                loop.run(
                    store.call(
                        "abort_multipart_upload",
                        url=self.url,
                        Bucket=store.bucket,
                        Key=self.key,
                        UploadId=self._upload_id,
                    )
                )
            except Exception:  # noqa: BLE001 - the upload expires server-side; the original error matters more
                pass
