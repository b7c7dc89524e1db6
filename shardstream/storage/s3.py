"""S3 storage through aiobotocore: the only module that imports it.

One client per (process, :class:`~shardstream.config.S3Config`, request policy) lives on the
process's background loop (:mod:`shardstream.storage.loop`). The request policy is the
:class:`~shardstream.config.RequestConfig` given beside the S3Config, else the S3Config's own
timeout, attempt and pool fields (:meth:`S3Config.request_config`). botocore's own retries are
off: every request is tried again by :mod:`.ranged`'s one retry loop (a ranged read also
resumes a body cut mid-transfer there), 429 answers included. Every botocore/aiohttp error is
translated once, in :meth:`S3Store.error_table`, into the :mod:`shardstream.errors` tree,
naming the URL and the endpoint but never the secret.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import (
    BucketNotFoundError,
    ShardNotFoundError,
    StorageAccessError,
    StorageError,
    StorageNotFoundError,
)
from . import loop, ranged
from .ranged import RETRY_STATUSES, Answer, Mismatch, PastEnd, RangedStore, Retryable
from .requests import BucketStoreMixin, OpenRequests, PartsSink, PerProcess, aiohttp_pieces, pool_state_text

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
# throttling and transient error codes S3 and its compatibles send (botocore's standard retry mode's)
_TRANSIENT_CODES = frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "InternalError",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ServiceUnavailable",
    }
)
_clients: PerProcess[tuple[S3Config, RequestConfig], Any] = PerProcess()
_open_gets = OpenRequests()  # ranged GETs of this process in progress


def open_requests() -> int:
    """Ranged GETs this process has in progress now (each holds or waits for a pooled connection)."""
    return _open_gets.now()


def pool_state(cfg: S3Config, requests: RequestConfig | None = None) -> str:
    """How this process's S3 requests stand against its connection pool, for stall messages."""
    pool, knob = request_policy(cfg, requests)
    return pool_state_text("S3", open_requests(), pool.max_pool_connections, f"{knob}.max_pool_connections")


def request_policy(s3: S3Config, requests: RequestConfig | None) -> tuple[RequestConfig, str]:
    """The request policy of S3 and the name of what set it, for messages: ``requests`` when
    given, else ``s3``'s own timeout, attempt and pool fields."""
    if requests is not None:
        return requests, "RequestConfig"
    return s3.request_config(), "S3Config"


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


async def _client_for(cfg: S3Config, policy: RequestConfig) -> Any:
    async with _clients.lock():
        clients = _clients.mine()
        client = clients.get((cfg, policy))
        if client is None:
            warn_plain_http(cfg.resolved_endpoint_url())
            from aiobotocore.config import AioConfig
            from aiobotocore.session import AioSession

            session = AioSession(profile=cfg.profile) if cfg.profile else AioSession()
            session.register_component("data_loader", _data_loader())
            endpoint_url = cfg.resolved_endpoint_url()
            context = session.create_client(
                "s3",
                endpoint_url=endpoint_url,
                # plain http has no certificates to check: not loading the CA bundle saves
                # ~70 ms of the first request (https endpoints verify as botocore does)
                verify=False if (endpoint_url or "").lower().startswith("http://") else None,
                region_name=cfg.resolved_region_name(),
                aws_access_key_id=cfg.access_key_id,
                aws_secret_access_key=cfg.secret_access_key,
                aws_session_token=cfg.session_token,
                config=AioConfig(
                    s3={"addressing_style": cfg.resolved_addressing_style()},
                    retries={"mode": "standard", "total_max_attempts": 1},  # retried in .ranged
                    connect_timeout=policy.connect_timeout_s,
                    read_timeout=policy.read_timeout_s,
                    max_pool_connections=policy.max_pool_connections,
                ),
            )
            client = await context.__aenter__()
            clients[cfg, policy] = client
            loop.on_shutdown(lambda: context.__aexit__(None, None, None))
        return client


def _translate(
    exc: BaseException,
    *,
    url: str,
    endpoint: str,
    not_found: type[StorageNotFoundError] = ShardNotFoundError,
) -> BaseException:
    """S3's error table: a botocore/aiohttp error in the shardstream error tree (others pass
    unchanged); a :class:`~.ranged.Retryable` for what is worth another attempt."""
    import asyncio

    import aiohttp
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        HTTPClientError,
        NoCredentialsError,
        ProfileNotFound,
        ProxyConnectionError,
    )

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        metadata = exc.response.get("ResponseMetadata", {})
        status = metadata.get("HTTPStatusCode")
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
        message = f"{url}: S3 error {code} (HTTP {status}) from {endpoint}: {error.get('Message', '')}"
        if code in _TRANSIENT_CODES or status in RETRY_STATUSES:
            return Retryable(message, retry_after=metadata.get("HTTPHeaders", {}).get("retry-after"))
        return StorageError(message)
    if isinstance(exc, NoCredentialsError):
        return StorageAccessError(
            f"{url}: no AWS credentials found for {endpoint}; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or pass S3Config(...)"
        )
    if isinstance(
        exc, (EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError, aiohttp.ClientConnectorError)
    ):
        return Retryable(
            f"{url}: cannot reach S3 endpoint {endpoint} ({type(exc).__name__}); check "
            "AWS_ENDPOINT_URL and that the server is running"
        )
    if isinstance(exc, (aiohttp.ClientError, HTTPClientError, asyncio.TimeoutError)):
        return Retryable(
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


class S3Store(BucketStoreMixin, RangedStore):
    """Objects under ``s3://bucket/prefix`` (keys, listing and small writes as every bucket
    store: :class:`~.requests.BucketStoreMixin`; S3's own calls through :meth:`call`).

    Args:
        url: ``s3://bucket`` or ``s3://bucket/prefix``.
        s3: endpoint and credentials; default the standard AWS environment.
        fetch: part sizes and concurrency of uploads.
        requests: timeouts, attempts and the connection pool; default the S3Config's own
            fields (:func:`request_policy`).
    """

    def __init__(
        self,
        url: str,
        *,
        s3: S3Config | None = None,
        fetch: FetchConfig | None = None,
        requests: RequestConfig | None = None,
    ) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.s3 = s3 or S3Config()
        self.fetch = fetch or FetchConfig()
        self.requests, self.knob = request_policy(self.s3, requests)
        self.endpoint = self.s3.resolved_endpoint_url() or "AWS S3"

    label = "S3"
    version_name = "ETag"
    in_progress = _open_gets
    translate = staticmethod(_translate)
    list_page_size = 1000  # keys per LIST request (S3's own maximum)

    def url_of(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key_of(name)}"

    async def _client(self) -> Any:
        return await _client_for(self.s3, self.requests)

    async def call(
        self, operation: str, *, url: str, not_found: type[StorageNotFoundError] = ShardNotFoundError, **kwargs: Any
    ) -> Any:
        """One S3 API call, tried again and bounded as :func:`.ranged.call` says, its errors
        translated (:func:`_translate`)."""

        async def attempt() -> Any:
            return await getattr(await self._client(), operation)(**kwargs)

        return await ranged.call(self, operation, attempt, url=url, not_found=not_found)

    def check_writable(self) -> None:
        """Check the bucket exists and the credentials are accepted.

        Raises:
            BucketNotFoundError, StorageAccessError, StorageConnectionError.
        """
        loop.run(self.call("head_bucket", url=self.url, not_found=BucketNotFoundError, Bucket=self.bucket))

    async def _put(self, name: str, data: bytes, *, exclusive: bool) -> bool:
        """Put ``name`` in one request; with ``exclusive``, unless it exists (``If-None-Match:
        *``): False when it already did."""
        from botocore.exceptions import ClientError

        if not exclusive:
            await self.call("put_object", url=self.url_of(name), Bucket=self.bucket, Key=self.key_of(name), Body=data)
            return True

        async def put() -> bool:
            try:
                client = await self._client()
                await client.put_object(Bucket=self.bucket, Key=self.key_of(name), Body=data, IfNoneMatch="*")
            except ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                    return False
                raise
            return True

        return await ranged.call(self, "put_object", put, url=self.url_of(name))

    def delete(self, name: str) -> None:
        loop.run(self.call("delete_object", url=self.url_of(name), Bucket=self.bucket, Key=self.key_of(name)))

    def open_writer(self, name: str) -> _S3Sink:
        return _S3Sink(self, name)

    async def _list_page(
        self, prefix: str, *, delimiter: bool, token: str | None
    ) -> tuple[list[tuple[str, int]], list[str], str | None]:
        """One LIST page of keys under ``prefix`` (one "directory" level with ``delimiter``):
        ``([(key, size_bytes)], [folder keys], the next page's token or None)``."""
        more = {"ContinuationToken": token} if token else {}
        page = await self.call(
            "list_objects_v2",
            url=self.url_of(prefix),
            not_found=BucketNotFoundError,
            Bucket=self.bucket,
            Prefix=self.key_of("") + prefix,
            MaxKeys=self.list_page_size,
            **({"Delimiter": "/"} if delimiter else {}),
            **more,
        )
        files = [(obj["Key"], int(obj.get("Size", 0))) for obj in page.get("Contents", [])]
        folders = [common["Prefix"] for common in page.get("CommonPrefixes", [])]
        return files, folders, page["NextContinuationToken"] if page.get("IsTruncated") else None

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

    async def open_range(self, name: str, at: int, end: int | None, version: str | None) -> Answer:
        """S3's request function (:mod:`.ranged`): a GET of bytes ``[at, end)`` of ``name``,
        ``IfMatch`` the ETag ``version``; its body as the pieces aiohttp received (uncopied,
        up to 2 MiB each: :func:`.requests.aiohttp_pieces`)."""
        from botocore.exceptions import ClientError

        condition: dict[str, str] = {"IfMatch": version} if version else {}
        if end is not None or at > 0:  # "bytes=0-" of an empty object is refused
            condition["Range"] = f"bytes={at}-{'' if end is None else end - 1}"
        client = await self._client()
        try:
            response = await client.get_object(Bucket=self.bucket, Key=self.key_of(name), **condition)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "InvalidRange" or status == 416:
                raise PastEnd() from exc
            if version and (code == "PreconditionFailed" or status == 412):
                raise Mismatch() from exc
            raise
        content_range = str(response.get("ContentRange", ""))
        total = int(content_range.rsplit("/", 1)[1]) if "/" in content_range else int(response.get("ContentLength", 0))
        body = response["Body"]
        return Answer(total, str(response.get("ETag", "")), _body_pieces(body), getattr(body, "aclose", body.close))


def _body_pieces(body: Any) -> AsyncIterator[bytes]:
    """The pieces of a response body as aiohttp received them (:func:`.requests.aiohttp_pieces`;
    aiobotocore 3 names the aiohttp response ``raw_stream``, 2.x proxies it). Other HTTP
    backends are read through ``body.read``."""
    response = getattr(body, "raw_stream", body)
    return aiohttp_pieces(response) if hasattr(getattr(response, "content", None), "readchunk") else _read_pieces(body)


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

    async def _call(self, operation: str, **kwargs: Any) -> Any:
        """S3's ``operation`` on this shard's object (and on its upload, once begun)."""
        if self._upload_id is not None:
            kwargs["UploadId"] = self._upload_id
        return await self.store.call(operation, url=self.url, Bucket=self.store.bucket, Key=self.key, **kwargs)

    def _send_part(self) -> None:
        if self._upload_id is None:
            self._upload_id = loop.run(self._call("create_multipart_upload"))["UploadId"]
        number = len(self._parts) + 1
        body = bytes(self._buffer)
        self._buffer.clear()

        async def upload() -> dict[str, Any]:
            response = await self._call("upload_part", PartNumber=number, Body=body)
            return {"ETag": response["ETag"], "PartNumber": number}

        self._in_flight(loop.submit(upload()))

    def commit(self) -> None:
        self._check_open("commit")
        self._send_part()  # the last part may be smaller than 5 MiB, or empty
        parts = [f.result() for f in self._parts]
        loop.run(self._call("complete_multipart_upload", MultipartUpload={"Parts": parts}))
        self._closed = True

    def abort(self) -> None:
        if not self._drop_parts():
            return
        if self._upload_id is not None:
            try:
                loop.run(self._call("abort_multipart_upload"))
            except Exception:  # noqa: BLE001 - the upload expires server-side; the original error matters more
                pass
