"""Azure Blob Storage through adlfs and the async Azure SDK: ``az://CONTAINER/PREFIX``,
``abfs://CONTAINER/PREFIX`` and ``abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX``; the
only module that imports adlfs and ``azure.storage.blob``.

One ``adlfs.AzureBlobFileSystem`` per process and account lives on the process's background
loop (:mod:`shardstream.storage.loop`), made for it on first use (``asynchronous=True``, the
loop given, ``skip_instance_cache=True``; built in a worker thread, as importing the SDK and
making credentials take a while); filesystems inherited across a fork are kept alive and never
used. adlfs resolves the credentials; the requests go through the
``azure.storage.blob.aio`` clients it holds (``fs.service_client``), because adlfs's own methods
cannot pin a version or stage blocks. The store object holds only its URL and settings, so it
pickles cheaply into DataLoader workers.

What it does:

- ``head`` reads the blob's properties; an object's version is its *ETag*;
- a ranged read is :mod:`.ranged`'s, with one request function (:meth:`AzureStore.open_range`:
  ``download_blob(offset=, length=)`` without the SDK's retries) and one error table
  (:func:`_translate`); every request after the first of a call carries the first answer's
  ETag with ``If-Match`` (``MatchConditions.IfNotModified``), and the ETag of every answer is
  recorded (``raw_response_hook``: the SDK re-sends a first request whose body was cut without
  one), so a replaced blob is :class:`CorruptShardError`, never a mix; a body cut mid-transfer
  is fetched again from its first missing byte (the SDK itself also re-reads a cut first
  answer, up to 3 times, which ``on_retry`` is not told of); the SDK keeps its own connection
  pool, so ranged reads take one of ``RequestConfig.max_pool_connections`` slots per process
  instead, and its other requests are retried by the SDK, ``RequestConfig.max_attempts`` in all;
- a shard is written as a block blob (:meth:`AzureStore.open_writer`): one ``stage_block`` per
  ``FetchConfig.upload_part_bytes``, several in flight, and ``commit_block_list`` at ``commit``;
  staged blocks are invisible, so nothing shows under the name before, and ``abort`` just drops
  them (Azure discards uncommitted blocks after a week, or at the blob's next commit);
- small objects are single uploads; ``create_exclusive`` uploads with ``If-None-Match: *``.

Credentials, in adlfs's order: ``AZURE_STORAGE_CONNECTION_STRING``; else the account (from an
``abfss://CONTAINER@ACCOUNT...`` URL or ``AZURE_STORAGE_ACCOUNT_NAME``) with
``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``, or a service principal
(``AZURE_STORAGE_CLIENT_ID`` / ``_SECRET`` / ``TENANT_ID``); else ``DefaultAzureCredential``
(environment, managed identity, ``az login`` ...); ``AZURE_STORAGE_ANON=true`` reads public
containers without any.

Every Azure/adlfs/aiohttp error is translated once, in :func:`_translate`, into the
:mod:`shardstream.errors` tree, naming the URL and the account, never a key, SAS token or
connection string.

What the local emulator (Azurite, see ``tests/servers/emulators.py``) does not cover:
it has no hierarchical namespace (the ADLS Gen2 directory features behind ``abfs``, unused
here: this module speaks the Blob API, which such accounts also serve), no Azure AD tokens (only
account keys and SAS), and a read starting past a blob's end comes back empty instead of 416
(handled alike).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from typing import Any

from ..config import FetchConfig, RequestConfig, azure_account_name, azure_connection_string, azure_storage_env
from ..errors import (
    BucketNotFoundError,
    CorruptShardError,
    ShardNotFoundError,
    StorageAccessError,
    StorageError,
    StorageNotFoundError,
)
from . import loop
from .ranged import RETRY_STATUSES, Answer, Mismatch, PastEnd, RangedStore, Retryable, changed
from .requests import BucketStoreMixin, OpenRequests, PartsSink, PerProcess, detach_finalizers, scrub

__all__ = ["AzureStore", "parse_azure_url"]

_ACCESS_HINT = (
    "check the credentials: AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
    "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, or an Azure AD identity (`az login`, "
    "managed identity; DefaultAzureCredential) with a Storage Blob Data role on the container"
)

# by account, account host, credentials fingerprint and timeouts
_filesystems: PerProcess[tuple[str | None, str | None, str, float, float], Any] = PerProcess()
_containers: PerProcess[tuple[int, str], Any] = PerProcess()  # ContainerClient by (id of its filesystem, container)
_environment: tuple[tuple[str, str], ...] | None = None  # the AZURE_STORAGE_* variables last fingerprinted
_fingerprint = ""  # their digest
_open_requests = OpenRequests()  # ranged reads of this process in progress


def parse_azure_url(url: str) -> tuple[str, str, str | None, str | None, str]:
    """``"abfss://data@acct.dfs.core.windows.net/some/prefix"`` ->
    ``("abfss", "data", "acct", "acct.blob.core.windows.net", "some/prefix")``; ``"az://data/p"``
    -> ``("az", "data", None, None, "p")`` (the account then comes from the environment).

    Raises:
        ValueError: not an ``az://``, ``abfs://`` or ``abfss://`` URL, or no container.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("az", "abfs", "abfss"):
        raise ValueError(f"{url!r} is not an az://, abfs:// or abfss:// URL")
    if "?" in url or "#" in url:
        raise ValueError(f"{url!r}: a dataset URL takes no ?query (put SAS tokens in AZURE_STORAGE_SAS_TOKEN)")
    netloc, _, prefix = rest.partition("/")
    container, at, host = netloc.partition("@")
    if not container or (at and not host):
        raise ValueError(f"{url!r} names no container; write az://CONTAINER/PREFIX or abfss://CONTAINER@ACCOUNT.dfs...")
    account = account_host = None
    if host:
        account = host.split(".", 1)[0]
        if "." in host:  # the blob endpoint of the account's cloud (the dfs one serves ADLS Gen2)
            account_host = host.replace(".dfs.", ".blob.", 1)
    return scheme.lower(), container, account, account_host, prefix.strip("/")


def _connection_fields() -> dict[str, str]:
    """The fields of ``AZURE_STORAGE_CONNECTION_STRING`` that are not secret (account name,
    endpoints), for naming the account in messages."""
    fields: dict[str, str] = {}
    for part in azure_connection_string().split(";"):
        key, sep, value = part.partition("=")
        if sep and key.strip().lower() in ("accountname", "blobendpoint"):
            fields[key.strip().lower()] = value.strip().split("?", 1)[0].rstrip("/")
    return fields


def _credentials_fingerprint() -> str:
    """A digest of the ``AZURE_STORAGE_*`` variables adlfs reads, so that a process whose
    environment changed (a test pointing at another server) gets a client of its own; hashed
    again only when they changed."""
    global _environment, _fingerprint
    environment = azure_storage_env()
    if environment != _environment:
        import hashlib

        text = "\0".join(f"{name}={value}" for name, value in sorted(environment))
        _environment, _fingerprint = environment, hashlib.sha256(text.encode()).hexdigest()
    return _fingerprint


def _error_code(exc: BaseException) -> str:
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or "")


async def _filesystem(account: str | None, account_host: str | None, http: RequestConfig) -> Any:
    """This process's ``AzureBlobFileSystem`` for the account (None: the environment's) with
    ``http``'s timeouts, made on first use."""
    filesystems = _filesystems.mine()
    key = (account, account_host, _credentials_fingerprint(), http.connect_timeout_s, http.read_timeout_s)
    fs = filesystems.get(key)
    if fs is not None:  # the usual case: no lock (the dict changes only on this loop)
        return fs
    async with _filesystems.lock():
        fs = filesystems.get(key)
        if fs is None:
            running = asyncio.get_running_loop()

            def make() -> Any:  # importing the SDK and making credentials take a while: not on the loop
                from adlfs import AzureBlobFileSystem

                return AzureBlobFileSystem(
                    account_name=account,
                    account_host=account_host,
                    asynchronous=True,
                    loop=running,
                    skip_instance_cache=True,
                    use_listings_cache=False,
                    connection_timeout=math.ceil(http.connect_timeout_s),
                    read_timeout=math.ceil(http.read_timeout_s),
                )

            fs = await running.run_in_executor(None, make)
            detach_finalizers(fs)
            filesystems[key] = fs

            async def close(fs: Any = fs) -> None:
                await fs.service_client.close()
                if getattr(fs, "credential", None) is not None and hasattr(fs.credential, "close"):
                    await fs.credential.close()

            loop.on_shutdown(close)
        return fs


def _container_client(fs: Any, container: str) -> Any:
    """This process's ``ContainerClient`` of ``container`` on ``fs`` (from :func:`_filesystem`),
    made on first use; it shares ``fs``'s connections."""
    key = (id(fs), container)  # a filesystem lives as long as its process: its id is never reused
    containers = _containers.mine()
    client = containers.get(key)
    if client is None:
        client = containers[key] = fs.service_client.get_container_client(container)
    return client


def _translate(
    exc: BaseException,
    *,
    url: str,
    endpoint: str,
    not_found: type[StorageNotFoundError] = ShardNotFoundError,
) -> BaseException:
    """Azure's error table: an Azure SDK/adlfs/aiohttp error in the shardstream error tree
    (others pass unchanged); a :class:`~.ranged.Retryable` for what is worth another attempt.
    Only error codes and the first line of the service's message are kept."""
    import aiohttp
    from azure.core.exceptions import (
        AzureError,
        ClientAuthenticationError,
        HttpResponseError,
        IncompleteReadError,
        ResourceModifiedError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(exc, (StorageError, CorruptShardError)):
        return exc
    container = url.split("://", 1)[-1].split("/", 1)[0]
    code = _error_code(exc)
    status = getattr(exc, "status_code", None)
    if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
        detail = f"{type(exc).__name__}" + (f" {code}" if code else "") + (f", HTTP {status}" if status else "")
        return StorageAccessError(
            f"{url}: {endpoint} refused the request or no credentials work ({detail}); {_ACCESS_HINT}"
        )
    if status == 404 or code in ("ContainerNotFound", "BlobNotFound", "ResourceNotFound"):
        if code == "ContainerNotFound" or not_found is BucketNotFoundError:
            return BucketNotFoundError(
                f"{url}: no such container {container} at {endpoint} (create it, or check the name)"
            )
        return not_found(f"{url}: no such blob at {endpoint} (check the URL and prefix)")
    if isinstance(exc, ResourceModifiedError) or status == 412:
        return CorruptShardError(
            f"{url}: changed while it was being used (Azure {code or 'ConditionNotMet'}); do not overwrite "
            "shards of a dataset in use"
        )
    if isinstance(exc, ServiceRequestError) or isinstance(exc, aiohttp.ClientConnectorError):
        return Retryable(
            f"{url}: cannot reach {endpoint} ({type(exc).__name__}); check the network and the account's "
            "endpoint (AZURE_STORAGE_CONNECTION_STRING's BlobEndpoint for an emulator)"
        )
    if isinstance(exc, (ServiceResponseError, IncompleteReadError, aiohttp.ClientError)) or (
        isinstance(exc, HttpResponseError) and status is None  # the SDK's wrapper of a body cut in its own retries
    ):
        return Retryable(
            f"{url}: the connection to {endpoint} failed during the transfer "
            f"({type(getattr(exc, 'error', None) or exc).__name__}); retry, and check the network"
        )
    if isinstance(exc, HttpResponseError):
        message = scrub(str(getattr(exc, "message", "") or "").split("\n", 1)[0])[:300]
        if status in RETRY_STATUSES:
            response = getattr(exc, "response", None)
            return Retryable(
                f"{url}: {endpoint} answers HTTP {status} {code}".rstrip(),
                retry_after=response.headers.get("Retry-After") if response is not None else None,
            )
        return StorageError(f"{url}: Azure error {code or '?'} (HTTP {status}) from {endpoint}: {message}")
    if isinstance(exc, AzureError):
        return StorageError(f"{url}: Azure request to {endpoint} failed ({type(exc).__name__})")
    if isinstance(exc, ValueError) and ("connect to account" in str(exc) or "connection_string" in str(exc)):
        return StorageAccessError(
            f"{url}: cannot make an Azure client for {endpoint} (no account or unusable credentials); {_ACCESS_HINT}"
        )
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):  # one class from Python 3.11
        return Retryable(f"{url}: no answer from {endpoint} in time ({type(exc).__name__})")
    return exc


class AzureStore(BucketStoreMixin, RangedStore):
    """Blobs under ``az://container/prefix`` (module doc).

    Args:
        url: ``az://CONTAINER[/PREFIX]``, ``abfs://CONTAINER[/PREFIX]`` or
            ``abfss://CONTAINER@ACCOUNT.dfs.core.windows.net[/PREFIX]``.
        fetch: the block size of shard uploads (``upload_part_bytes``) and the blocks in flight
            (``max_inflight_upload_parts``); reads are cut into parts by the fetcher.
        requests: timeouts, attempts and waits (a ranged read's; the SDK's other requests
            take ``max_attempts`` too), and the ranged reads in flight per process (the SDK
            keeps its own pool); default :class:`~shardstream.config.RequestConfig`.

    Attributes:
        list_page_size: blobs asked for per listing request (Azure's maximum is 5000).
    """

    label = "Azure"
    list_page_size = 5000
    version_name = "ETag"
    in_progress = _open_requests
    translate = staticmethod(_translate)
    library_pool = True

    def __init__(self, url: str, *, fetch: FetchConfig | None = None, requests: RequestConfig | None = None) -> None:
        scheme, self.container, self.account, self.account_host, self.prefix = parse_azure_url(url)
        base, _, _ = url.partition("://")[2].partition("/")
        self.url = f"{scheme}://{base}/{self.prefix}" if self.prefix else f"{scheme}://{base}"
        self.fetch = fetch or FetchConfig()
        self.requests = requests or RequestConfig()
        fields = _connection_fields()
        if fields.get("blobendpoint") and (self.account is None or self.account == fields.get("accountname")):
            self.endpoint = fields["blobendpoint"]
        else:
            account = self.account or fields.get("accountname") or azure_account_name()
            self.endpoint = f"Azure Blob Storage account {account}" if account else "Azure Blob Storage"
        self._conflict = (
            fields.get("accountname")
            if self.account and fields.get("accountname") and fields["accountname"] != self.account
            else None
        )

    # -- requests -----------------------------------------------------------------------------

    async def _fs(self) -> Any:
        if self._conflict is not None:
            raise StorageAccessError(
                f"{self.url}: the URL names account {self.account} but AZURE_STORAGE_CONNECTION_STRING is for "
                f"account {self._conflict} (adlfs would use it); unset it, or write az://{self.container}/..."
            )
        return await _filesystem(self.account, self.account_host, self.requests)

    async def _container(self) -> Any:
        return _container_client(await self._fs(), self.container)

    async def _blob(self, name: str) -> Any:
        return (await self._container()).get_blob_client(self.key_of(name))

    def _timeouts(self) -> dict[str, Any]:
        """The request policy of one SDK operation: its timeouts and its retries (the SDK's own)."""
        return {**self._socket_timeouts(), "retry_total": self.requests.max_attempts - 1}

    def _socket_timeouts(self) -> dict[str, Any]:
        return {"connection_timeout": self.requests.connect_timeout_s, "read_timeout": self.requests.read_timeout_s}

    # -- the Store protocol ---------------------------------------------------------------------

    def check_writable(self) -> None:
        """Check the container exists and the credentials are accepted (its properties).

        Raises:
            BucketNotFoundError, StorageAccessError, StorageConnectionError, StorageError.
        """

        async def check() -> None:
            container = await self._container()
            await container.get_container_properties(**self._timeouts())

        loop.run(self._run("get container properties", check(), url=self.url, not_found=BucketNotFoundError))

    async def _put(self, name: str, data: bytes, *, exclusive: bool) -> bool:
        """Upload ``name`` at once (``exclusive``: with ``If-None-Match: *``); False when it exists
        and ``exclusive``."""
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError

        async def put() -> bool:
            blob = await self._blob(name)
            try:
                await blob.upload_blob(bytes(data), overwrite=not exclusive, max_concurrency=1, **self._timeouts())
            except (ResourceExistsError, ResourceModifiedError):  # 409 BlobAlreadyExists / 412
                if exclusive:
                    return False
                raise
            return True

        return await self._run("upload", put(), url=self.url_of(name))

    def delete(self, name: str) -> None:
        """Delete ``name``; a missing blob is no error."""

        async def delete() -> None:
            from azure.core.exceptions import ResourceNotFoundError

            blob = await self._blob(name)
            try:
                await blob.delete_blob(**self._timeouts())
            except ResourceNotFoundError as exc:
                if _error_code(exc) == "ContainerNotFound":
                    raise

        loop.run(self._run("delete", delete(), url=self.url_of(name)))

    def open_writer(self, name: str) -> _AzureSink:
        """A block-blob upload of ``name``, committed by ``commit`` (module doc)."""
        return _AzureSink(self, name)

    async def _list_page(
        self, prefix: str, *, delimiter: bool, token: str | None
    ) -> tuple[list[tuple[str, int]], list[str], str | None]:
        """One page under ``prefix``: ``(key, size_bytes)`` of its blobs, the keys of its
        folders (with ``delimiter``), and the token of the next page (None after the last)."""
        from azure.storage.blob.aio import BlobPrefix

        async def page() -> tuple[list[Any], str | None]:
            container = await self._container()
            options = {"name_starts_with": self.key_of("") + prefix, "results_per_page": self.list_page_size}
            if delimiter:
                paged = container.walk_blobs(delimiter="/", **options, **self._timeouts())
            else:
                paged = container.list_blobs(**options, **self._timeouts())
            pages = paged.by_page(continuation_token=token)
            try:
                items = [item async for item in await pages.__anext__()]
            except StopAsyncIteration:
                return [], None
            return items, pages.continuation_token or None

        items, next_token = await self._run("list", page(), url=self.url_of(prefix), not_found=BucketNotFoundError)
        files = [(item.name, int(item.size or 0)) for item in items if not isinstance(item, BlobPrefix)]
        return files, [item.name for item in items if isinstance(item, BlobPrefix)], next_token

    def remove_partials(self, is_mine: Callable[[str], bool], *, folders: tuple[str, ...] = ("",)) -> int:
        """Nothing to remove: a killed writer leaves only uncommitted blocks, which are no blob,
        are not listed, and Azure discards after a week (or at the blob's next commit); returns 0."""
        return 0

    # -- the RemoteStore protocol ------------------------------------------------------------------

    async def head(self, name: str) -> tuple[int, str]:
        """``(size_bytes, etag)`` of blob ``name``.

        Raises:
            ShardNotFoundError, BucketNotFoundError, StorageAccessError, StorageConnectionError,
            StorageError.
        """

        async def properties() -> Any:
            blob = await self._blob(name)
            return await blob.get_blob_properties(**self._timeouts())

        props = await self._run("get blob properties", properties(), url=self.url_of(name))
        return int(props.size), str(props.etag)

    async def open_range(self, name: str, at: int, end: int | None, version: str | None) -> Answer:
        """Azure's request function (:mod:`.ranged`): ``download_blob`` of bytes ``[at, end)``
        of ``name`` without the SDK's retries, ``If-Match`` the ETag ``version``; the ETag of
        every answer the SDK gets (its own re-reads of a cut body included) must be one."""
        from azure.core import MatchConditions
        from azure.core.exceptions import HttpResponseError, ResourceModifiedError

        blob = await self._blob(name)
        seen: list[str] = []  # the ETag of every answer, the SDK's own re-reads included

        def record(pipeline_response: Any) -> None:
            answer = pipeline_response.http_response
            if answer.status_code < 300:
                seen.append(str(answer.headers.get("ETag", "")))

        def check_seen() -> str | None:
            """The version pinned: ``version``, else the first answer's; raises if any answer had another."""
            pinned = version or (seen[0] if seen else None)
            for other in seen:
                if other != pinned:
                    raise changed(self, self.url_of(name), pinned, f"then {other}")
            return pinned

        options: dict[str, Any] = {
            "max_concurrency": 1,
            "retry_total": 0,
            "raw_response_hook": record,
            **self._socket_timeouts(),
        }
        if at > 0 or end is not None:
            options["offset"] = at
            options["length"] = None if end is None else end - at
        if version:
            options.update(etag=version, match_condition=MatchConditions.IfNotModified)
        try:
            downloader = await blob.download_blob(**options)
        except ResourceModifiedError as exc:
            raise Mismatch() from exc
        except HttpResponseError as exc:
            if exc.status_code == 416:  # from past the end; from the end itself is empty, not an error
                raise PastEnd() from exc
            raise
        etag = check_seen() or str(downloader.properties.etag)
        content_range = downloader.properties.content_range
        total = int(str(content_range).rsplit("/", 1)[1]) if content_range else int(downloader.properties.size)

        async def pieces() -> Any:
            try:
                async for chunk in downloader.chunks():
                    if chunk:
                        yield chunk
            finally:
                check_seen()

        return Answer(total, etag, pieces(), lambda: None)


class _AzureSink(PartsSink):
    """A block blob in the making: blocks of ``fetch.upload_part_bytes`` are staged (up to
    ``max_inflight_upload_parts`` at once) while the shard is written; ``commit`` commits the
    block list, which publishes the blob whole."""

    def __init__(self, store: AzureStore, name: str) -> None:
        super().__init__(store.url_of(name), store.fetch)
        self.store = store
        self.name = name
        self._ids: list[str] = []
        self._id_prefix = uuid.uuid4().hex  # block ids of one blob all have the same length

    def _send_part(self) -> None:
        store = self.store
        block_id = f"{self._id_prefix}-{len(self._ids):06d}"
        self._ids.append(block_id)
        body = bytes(self._buffer)
        self._buffer.clear()

        async def stage() -> None:
            blob = await store._blob(self.name)
            await blob.stage_block(block_id, body, length=len(body), **store._timeouts())

        self._in_flight(loop.submit(store._run("stage block", stage(), url=self.url)))

    def commit(self) -> None:
        self._check_open("commit")
        if self._buffer:
            self._send_part()
        for block in self._parts:
            block.result()
        store = self.store

        async def commit() -> None:
            blob = await store._blob(self.name)
            await blob.commit_block_list(list(self._ids), **store._timeouts())

        loop.run(store._run("commit block list", commit(), url=self.url))
        self._closed = True

    def abort(self) -> None:
        """Drop the staged blocks (they stay uncommitted and invisible until Azure discards them)."""
        self._drop_parts()
