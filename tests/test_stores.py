"""One conformance suite that every store backend runs, against real local servers.

Backends: ``local`` (a directory), ``s3`` (SeaweedFS), ``http`` (nginx), ``https`` (nginx with a
self-signed certificate trusted through ``SSL_CERT_FILE``), ``hf`` (a fake of the Hub's revision,
tree and resolve endpoints, redirecting to a second host), ``gs`` (gcp-storage-emulator) and
``az`` (Azurite). Faults come from the servers themselves or from a fault-injecting proxy in
front of them (:class:`~servers.faultproxy.FaultProxy`): a body cut mid-transfer, a
429/503 with ``Retry-After``, a 403. Each test runs on every backend its subject applies to; the
parameter lists say which and why the others are left out (no backend is skipped at run time).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from servers.faultproxy import FaultProxy

from shardstream import S3Config
from shardstream.errors import (
    CorruptShardError,
    ReadOnlyStoreError,
    ShardNotFoundError,
    StorageAccessError,
    StorageError,
)
from shardstream.storage import loop, open_store

pytestmark = pytest.mark.timeout(120)

ALL = ["local", "s3", "http", "https", "hf", "gs", "az"]
REMOTE_WITH_FAULTS = ["s3", "http", "hf", "gs", "az"]  # https: nginx direct (no injector); local: no wire
WRITABLE = ["local", "s3", "gs", "az"]
READ_ONLY = ["http", "https", "hf"]
LISTING = ["local", "s3", "hf", "gs", "az"]  # web servers have no listing (test_web_servers_have_no_listing)
_names = itertools.count()
HUB_REPO = "conformance/data"
HUB_SHA = "c0ffee" + "0" * 34


@dataclass
class Backend:
    """How a test reaches one backend: its store and the server's own levers."""

    name: str
    url: str
    put: Callable[[str, bytes], None]  # make or replace an object (beside shardstream for read-only stores)
    proxy: FaultProxy | None = None
    hub: Any = None
    denied: Callable[[], Any] | None = None  # makes a store whose credentials the server refuses
    secret: str = ""  # what must never show in a message or a pickle
    set_page_size: Callable[[Any, int], None] | None = None
    on_retry_hook: list[Callable[[], None]] = field(default_factory=list)

    def store(self) -> Any:
        return open_store(self.url, s3=self.s3)

    s3: S3Config | None = None

    def cut(self, name: str, *, after_bytes: int, then: Callable[[], None] | None = None) -> None:
        """Cut the next GET of ``name`` after ``after_bytes``; ``then`` runs after the cut and
        before the client's next request."""
        if self.proxy is not None:
            self.proxy.cut_after_bytes = after_bytes
            self.proxy.on_fault = (lambda *_: then()) if then else None
            self._arm_proxy("cut", name)
        else:
            self.hub.set_faults(host="cdn", cut_body_after_bytes=after_bytes, path_glob=f"*/{name}", times=1)
            self.on_retry_hook[:] = [then] if then else []

    def throttle(self, name: str, *, status: int, retry_after_s: int) -> None:
        if self.proxy is not None:
            self.proxy.throttle_status, self.proxy.retry_after_s = status, retry_after_s
            self._arm_proxy("throttle", name)
        else:
            self.hub.set_faults(host="cdn", status=status, retry_after_s=retry_after_s, path_glob=f"*/{name}", times=1)

    def faults_injected(self) -> int:
        if self.proxy is not None:
            return sum(self.proxy.counts.values())
        return sum(1 for r in self.hub.requests() if r.get("fault"))

    def on_retry(self, exc: BaseException) -> None:
        for hook in self.on_retry_hook:
            hook()
        self.on_retry_hook.clear()

    def _arm_proxy(self, fault: str, name: str) -> None:
        assert self.proxy is not None
        self.proxy.counts.clear()
        self.proxy.max_faults = 1
        download = "/download/" if self.name == "gs" else "/"  # not the GCS metadata lookup before it
        self.proxy.match = lambda method, path: (
            method == "GET" and path.endswith("/" + name) and path.startswith(download)
        )
        self.proxy.rates = {fault: 1.0}

    def reset(self) -> None:
        if self.proxy is not None:
            self.proxy.rates, self.proxy.on_fault, self.proxy.max_faults = {}, None, None
            self.proxy.counts.clear()
        if self.hub is not None:
            self.hub.set_faults()
            self.hub.clear_log()
        self.on_retry_hook.clear()


@pytest.fixture(scope="session")
def proxies():
    """One fault proxy per server that needs one, started on first use."""
    started: dict[str, FaultProxy] = {}

    def proxy_for(name: str, target_url: str) -> FaultProxy:
        if name not in started:
            started[name] = FaultProxy(target_url, rates={}).start()
        return started[name]

    yield proxy_for
    for proxy in started.values():
        proxy.stop()


def _wait_for_mtime_change(path: Path) -> None:
    """nginx's ETag is mtime and size: a replacement of equal size needs a later second."""
    if path.exists():
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns + 2_000_000_000))


def _file_putter(root: Path) -> Callable[[str, bytes], None]:
    def put(name: str, data: bytes) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        old_mtime = path.stat().st_mtime_ns if path.exists() else None
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        if old_mtime is not None:
            os.utime(tmp, ns=(old_mtime + 2_000_000_000, old_mtime + 2_000_000_000))
        tmp.replace(path)

    return put


def _store_putter(url: str, s3: S3Config | None = None) -> Callable[[str, bytes], None]:
    """Writes through a store of its own, from a thread (a proxy's ``on_fault`` may call it)."""

    def put(name: str, data: bytes) -> None:
        store = open_store(url, s3=s3)
        errors: list[BaseException] = []

        def write() -> None:
            try:
                store.write_bytes(name, data)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                errors.append(exc)

        thread = threading.Thread(target=write)
        thread.start()
        thread.join(60)
        if errors:
            raise errors[0]

    return put


@pytest.fixture(params=ALL)
def backend(request, tmp_path, monkeypatch, proxies) -> Backend:
    name = request.param
    make = {
        "local": _local,
        "s3": _s3,
        "http": _http,
        "https": _https,
        "hf": _hf,
        "gs": _gs,
        "az": _az,
    }[name]
    made = make(request, tmp_path, monkeypatch, proxies)
    yield made
    made.reset()


def _local(request, tmp_path, monkeypatch, proxies) -> Backend:
    return Backend("local", str(tmp_path / "store"), put=_file_putter(tmp_path / "store"))


def _s3(request, tmp_path, monkeypatch, proxies) -> Backend:
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    info = server.info
    proxy = proxies("s3", info.endpoint_url)
    direct = S3Config(
        endpoint_url=info.endpoint_url,
        access_key_id=info.access_key_id,
        secret_access_key=info.secret_access_key,
        region_name=info.region_name,
    )
    via_proxy = S3Config(
        endpoint_url=proxy.endpoint_url,
        access_key_id=info.access_key_id,
        secret_access_key=info.secret_access_key,
        region_name=info.region_name,
        max_attempts=3,
    )
    denied = S3Config(
        endpoint_url=info.endpoint_url,
        access_key_id=info.access_key_id,
        secret_access_key="not-the-secret-" + "x" * 24,
        region_name=info.region_name,
    )
    url = f"s3://{bucket}/conf"

    def page(store: Any, size: int) -> None:
        store.list_page_size = size

    return Backend(
        "s3",
        url,
        put=_store_putter(url, direct),
        proxy=proxy,
        s3=via_proxy,
        denied=lambda: open_store(url, s3=denied),
        secret=info.secret_access_key,
        set_page_size=page,
    )


def _http(request, tmp_path, monkeypatch, proxies) -> Backend:
    server = request.getfixturevalue("nginx_server")
    root = request.getfixturevalue("web_root")
    proxy = proxies("http", server.url)
    folder = f"conf-{next(_names)}"

    def denied() -> Any:
        proxy.counts.clear()
        proxy.max_faults, proxy.throttle_status, proxy.retry_after_s = None, 403, 0
        proxy.match = lambda method, path: True
        proxy.rates = {"throttle": 1.0}
        return open_store(f"{proxy.endpoint_url}/{folder}")

    return Backend(
        "http", f"{proxy.endpoint_url}/{folder}", put=_file_putter(root / folder), proxy=proxy, denied=denied
    )


def _https(request, tmp_path, monkeypatch, proxies) -> Backend:
    server = request.getfixturevalue("nginx_tls_server")
    root = request.getfixturevalue("web_root")
    monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
    folder = f"conf-{next(_names)}"
    return Backend("https", f"{server.url}/{folder}", put=_file_putter(root / folder))


def _hf(request, tmp_path, monkeypatch, proxies) -> Backend:
    hub = request.getfixturevalue("fake_hub")
    folder = tmp_path / "commit"
    folder.mkdir()
    hub.add_repo(HUB_REPO, {HUB_SHA: folder})
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_conformance_token_0123456789")
    private = tmp_path / "private"
    private.mkdir()
    (private / "x.bin").write_bytes(b"x")
    hub.add_repo("conformance/private", {HUB_SHA: private}, private=True, token="hf_the_right_token_0123456789")

    def page(store: Any, size: int) -> None:
        hub.set_page_size(size)

    return Backend(
        "hf",
        f"hf://datasets/{HUB_REPO}@{HUB_SHA}/conf",
        put=_file_putter(folder / "conf"),
        hub=hub,
        denied=lambda: open_store("hf://datasets/conformance/private"),
        secret="hf_conformance_token_0123456789",
        set_page_size=page,
    )


def _gs(request, tmp_path, monkeypatch, proxies) -> Backend:
    server = request.getfixturevalue("gcs_emulator")
    proxy = proxies("gs", server.endpoint)
    bucket = f"conf-{os.getpid()}-{next(_names)}"
    server.create_bucket(bucket)
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint_url)
    url = f"gs://{bucket}/conf"

    def page(store: Any, size: int) -> None:
        store.list_page_size = size

    return Backend("gs", url, put=_store_putter(url), proxy=proxy, set_page_size=page)


def _az(request, tmp_path, monkeypatch, proxies) -> Backend:
    from servers.emulators import AZURITE_ACCOUNT, AZURITE_KEY

    server = request.getfixturevalue("azurite")
    proxy = proxies("az", server.endpoint)
    container = f"conf-{os.getpid()}-{next(_names)}"
    server.create_container(container)
    connection = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={proxy.endpoint_url}/{AZURITE_ACCOUNT};"
    )
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    url = f"az://{container}/conf"
    wrong_key = "d3Jvbmcta2V5LW9mLXRoZS1yaWdodC1sZW5ndGgtZm9yLWF6dXJpdGUtdGVzdHMtMDEyMzQ1Njc4OQ=="

    def denied() -> Any:
        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = connection.replace(AZURITE_KEY, wrong_key)
        return open_store(url)

    def page(store: Any, size: int) -> None:
        store.list_page_size = size

    return Backend(
        "az", url, put=_store_putter(url), proxy=proxy, denied=denied, secret=AZURITE_KEY, set_page_size=page
    )


def _only(*names: str):
    """Run a test on these backends only (the others are not collected, not skipped)."""
    return pytest.mark.parametrize("backend", list(names), indirect=True)


def _name(suffix: str = ".bin") -> str:
    return f"obj-{os.getpid()}-{next(_names)}{suffix}"


def _get(store: Any, name: str, start: int, end: int | None, **kwargs: Any) -> tuple[bytes, int, str]:
    pieces, total, version = loop.run(store.get_range(name, start, end, **kwargs), 60)
    return b"".join(pieces), total, version


# -- the protocol --------------------------------------------------------------------------------


def test_size_version_and_ranges_at_the_edges(backend):
    data = os.urandom(300_001)
    name = _name()
    backend.put(name, data)
    store = backend.store()
    size, version = loop.run(store.head(name), 60)
    assert size == len(data) and version
    for start, end in [(0, None), (0, 1), (len(data) - 1, len(data)), (1000, 2000), (299_000, 400_000)]:
        got, total, got_version = _get(store, name, start, end)
        assert got == data[start:end] and total == len(data) and got_version == version, (start, end)
    got, total, _ = _get(store, name, len(data), None)
    assert got == b"" and total == len(data)
    with pytest.raises(CorruptShardError, match=name):
        _get(store, name, len(data) + 10, len(data) + 20)
    assert store.read_bytes(name) == data and store.exists(name)


def test_empty_objects(backend):
    name = _name(".empty")
    backend.put(name, b"")
    store = backend.store()
    assert loop.run(store.head(name), 60)[0] == 0
    got, total, _ = _get(store, name, 0, None)
    assert (got, total) == (b"", 0)
    assert store.read_bytes(name) == b""


def test_a_missing_object_is_shard_not_found(backend):
    store = backend.store()
    name = _name(".missing")
    url = store.url_of(name)
    with pytest.raises(ShardNotFoundError, match=url.split("://")[-1][-40:]):
        loop.run(store.head(name), 60)
    with pytest.raises(ShardNotFoundError):
        _get(store, name, 0, 100)
    with pytest.raises(ShardNotFoundError):
        store.read_bytes(name)
    assert not store.exists(name)


@_only(*LISTING)
def test_listing_past_a_page(backend):
    names = [f"many/{i:03d}.bin" for i in range(23)]
    for name in names:
        backend.put(name, name.encode())
    backend.put("zz-top.bin", b"top")
    store = backend.store()
    if backend.set_page_size is not None:
        backend.set_page_size(store, 5)
    assert store.list_names("many/") == names
    assert store.list_names("many/01") == names[10:20]
    assert "zz-top.bin" in store.list_names()
    if hasattr(store, "list_dir"):
        entries = {name: (size, is_dir) for name, size, is_dir in store.list_dir("")}
        assert entries["many/"] == (0, True) and entries["zz-top.bin"] == (3, False)
        below = [(name, size) for name, size, is_dir in store.list_dir("many/")]
        assert below == [(name, len(name)) for name in names]
    if backend.hub is not None:
        backend.hub.set_page_size(50)


@_only("http", "https")
def test_web_servers_have_no_listing(backend):
    with pytest.raises(StorageError, match="has no listing; name the shards with a brace pattern"):
        backend.store().list_names()


def test_a_version_change_between_reads_shows(backend):
    """The second read of a replaced object reports another version (the fetcher compares the
    versions of a shard's parts and refuses the mix: tests/test_remote_datasets.py)."""
    name = _name()
    backend.put(name, b"a" * 10_000)
    store = backend.store()
    _, _, first = _get(store, name, 0, 5000)
    backend.put(name, b"b" * 10_001)
    got, total, second = _get(store, name, 5000, 10_000)
    assert got == b"b" * 5000 and total == 10_001 and second != first


@_only(*REMOTE_WITH_FAULTS)
def test_a_body_cut_mid_transfer_is_fetched_again(backend):
    data = os.urandom(600_000)
    name = _name()
    backend.put(name, data)
    store = backend.store()
    retries: list[BaseException] = []
    backend.cut(name, after_bytes=200_000)
    got, total, _ = _get(store, name, 0, None, on_retry=retries.append)
    assert got == data and total == len(data)
    assert backend.faults_injected() == 1
    if backend.name in ("s3", "http", "hf"):  # ours count each retry (gcsfs and adlfs retry inside)
        assert len(retries) == 1


@_only(*REMOTE_WITH_FAULTS)
def test_an_object_replaced_mid_read_is_an_error_never_a_mix(backend):
    data = os.urandom(600_000)
    name = _name()
    backend.put(name, data)
    store = backend.store()
    if backend.hub is not None:

        def replace() -> None:  # the CDN's copy changes under the pinned commit
            backend.hub.add_fault(host="cdn", change_etag=True, path_glob=f"*/{name}")
    else:

        def replace() -> None:
            backend.put(name, os.urandom(600_000))

    backend.cut(name, after_bytes=200_000, then=replace)
    with pytest.raises(CorruptShardError, match=f"{name}: changed while it was being read"):
        _get(store, name, 0, None, on_retry=backend.on_retry)


@_only(*REMOTE_WITH_FAULTS)
@pytest.mark.parametrize("status", [429, 503])
def test_throttling_with_retry_after_is_waited_out(backend, status):
    data = os.urandom(50_000)
    name = _name()
    backend.put(name, data)
    store = backend.store()
    backend.throttle(name, status=status, retry_after_s=1)
    started = time.monotonic()
    got, _, _ = _get(store, name, 0, None)
    assert got == data and backend.faults_injected() == 1
    if backend.name in ("http", "hf", "az"):  # these clients honour Retry-After
        assert time.monotonic() - started >= 0.9


@_only("s3", "http", "hf", "az")  # local: root reads anything; https: as http; gs: the emulator checks no credentials
def test_refused_credentials_are_an_access_error_that_hides_the_secret(backend):
    name = _name()
    backend.put(name, b"data")
    with pytest.raises(StorageAccessError) as caught:
        store = backend.denied()
        loop.run(store.head(name), 60)
    message = str(caught.value)
    assert "HF_TOKEN" in message if backend.name == "hf" else True
    assert backend.secret == "" or backend.secret not in message


@_only(*WRITABLE)
def test_a_writer_publishes_on_commit_only(backend):
    store = backend.store()
    store.check_writable()
    name = _name(".tar")
    data = os.urandom(3 << 20)
    sink = store.open_writer(name)
    for i in range(0, len(data), 1 << 20):
        sink.write(data[i : i + (1 << 20)])
    assert not store.exists(name)
    sink.commit()
    assert store.read_bytes(name) == data
    aborted = _name(".tar")
    sink = store.open_writer(aborted)
    sink.write(b"half a shard")
    sink.abort()
    sink.abort()  # idempotent
    assert not store.exists(aborted) and aborted not in store.list_names()
    store.write_bytes("small", b"x" * 10)
    assert store.read_bytes("small") == b"x" * 10
    store.delete("small")
    assert not store.exists("small")


@_only("local", "s3", "az")  # gs: the emulator ignores ifGenerationMatch (real GCS honours it)
def test_create_exclusive_writes_once(backend):
    store = backend.store()
    name = _name(".lock")
    assert store.create_exclusive(name, b"one") is True
    assert store.create_exclusive(name, b"two") is False
    assert store.read_bytes(name) == b"one"


@_only(*READ_ONLY)
def test_read_only_stores_refuse_writes_saying_so(backend):
    store = backend.store()
    for call in (
        store.check_writable,
        lambda: store.write_bytes("x", b"1"),
        lambda: store.open_writer("x.tar"),
        lambda: store.create_exclusive("x", b"1"),
        lambda: store.delete("x"),
    ):
        with pytest.raises(ReadOnlyStoreError, match="read-only in shardstream"):
            call()


def test_a_store_pickles_as_a_description(backend):
    """A store used in this process pickles without its clients: a DataLoader worker makes its own."""
    name = _name()
    backend.put(name, b"abc")
    store = backend.store()
    assert store.read_bytes(name) == b"abc"
    blob = pickle.dumps(store)
    assert len(blob) < 4096
    assert backend.secret == "" or backend.secret not in repr(store)
    again = pickle.loads(blob)
    assert again.read_bytes(name) == b"abc" and again.url == store.url


@pytest.mark.parametrize(("url", "library", "extra"), [("gs://b/x", "gcsfs", "gcs"), ("az://c/x", "adlfs", "azure")])
def test_a_missing_backend_names_the_extra_to_install(url, library, extra, monkeypatch):
    from shardstream.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, library, None)  # import fails as if not installed
    with pytest.raises(MissingDependencyError, match=rf"pip install 'shardstream\[{extra}\]'"):
        open_store(url)


@pytest.mark.parametrize("url", ["ftp://host/x", "hf://models/org/name", "hf://datasets/org", "s3:/b/x", "gs:///x"])
def test_malformed_or_unsupported_urls_say_how_to_write_them(url):
    with pytest.raises(ValueError, match=r"(unsupported URL scheme|write|names no)"):
        open_store(url)


# -- http(s) and the Hub: what plain HTTP servers and CDNs do ----------------------------------


@_only("hf")
@pytest.mark.parametrize(("status", "error"), [(404, ShardNotFoundError), (403, StorageAccessError)])
def test_a_redirect_target_that_refuses_is_named_not_retried(backend, status, error):
    name = _name()
    backend.put(name, b"x" * 100)
    store = backend.store()
    assert _get(store, name, 0, None)[0] == b"x" * 100  # the redirect target is now kept
    backend.hub.set_faults(host="cdn", status=status, path_glob=f"*/{name}", times=None)
    started = time.monotonic()
    with pytest.raises(error, match=name):
        _get(store, name, 0, None)
    assert time.monotonic() - started < 5  # asked the Hub again once, then said so


@pytest.mark.slow
def test_head_falls_back_to_a_one_byte_get_where_head_is_refused(tmp_path):
    from servers.faultserver import FaultServer

    (tmp_path / "obj.bin").write_bytes(b"y" * 1234)
    with FaultServer(tmp_path) as server:
        server.set_faults(status=405, methods=["HEAD"], times=None)
        size, version = loop.run(open_store(server.url).head("obj.bin"), 60)
    assert size == 1234 and version


def test_credentials_in_an_http_url_are_refused_without_echoing_them():
    with pytest.raises(ValueError, match="credentials in an http") as caught:
        open_store("https://alice:s3cret-pw@example.com/ds")
    assert "s3cret-pw" not in str(caught.value)


@pytest.mark.parametrize(
    ("header", "expected_s"), [("2", 2.0), ("soon", 0.5), ("nan", 0.5), ("inf", 0.5), ("99", 30.0)]
)
def test_retry_after_is_read_safely(header, expected_s):
    from shardstream.storage.requests import retry_after_s

    assert retry_after_s(header, 0.5, 30.0) == expected_s


def test_https_verifies_against_the_system_cas_unless_ssl_cert_file_names_others(
    nginx_tls_server, web_root, monkeypatch
):
    """Without SSL_CERT_FILE / SSL_CERT_DIR an https store verifies with aiohttp's own context
    of the system's CAs (made once at its import), so a self-signed certificate is refused and
    the error names the fix; with SSL_CERT_FILE naming its CA, the same object reads."""
    from shardstream.errors import StorageConnectionError
    from shardstream.storage import http

    folder = web_root / f"tls-{next(_names)}"
    folder.mkdir()
    (folder / "x.bin").write_bytes(b"payload")
    url = f"{nginx_tls_server.url}/{folder.name}"
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    assert http._ssl_context() is True
    with pytest.raises(StorageConnectionError, match=r"is not trusted .*point SSL_CERT_FILE at the CA bundle"):
        open_store(url).read_bytes("x.bin")
    monkeypatch.setenv("SSL_CERT_FILE", str(nginx_tls_server.ca_file))
    assert open_store(url).read_bytes("x.bin") == b"payload"


def test_a_body_waiting_in_the_socket_is_taken_up_to_receive_bytes_a_read(nginx_server, web_root):
    """Where more than 256 KiB of a body wait in the socket (a server that sends faster than the
    reader takes), reads grow past asyncio's 256 KiB, up to ``RECEIVE_BYTES`` (2 MiB): fewer
    turns of the event loop a GB. A client socket with an 8 MiB receive buffer and a pause
    before the body is read make sure that much waits; the bytes are the object's."""
    import aiohttp

    from shardstream.storage.requests import RECEIVE_BYTES, aiohttp_pieces

    folder = web_root / f"wide-{next(_names)}"
    folder.mkdir()
    payload = os.urandom(16 << 20)
    (folder / "big.bin").write_bytes(payload)

    granted = []

    def roomy_socket(addr_info: Any) -> socket.socket:
        family, kind, proto, _, _ = addr_info
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)  # the kernel caps it at net.core.rmem_max
        granted.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
        return sock

    async def read() -> list[bytes]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(socket_factory=roomy_socket)) as session:
            async with session.get(f"{nginx_server.url}/{folder.name}/big.bin") as response:
                await asyncio.sleep(0.5)
                return [piece async for piece in aiohttp_pieces(response)]

    pieces = loop.run(read(), 60)
    assert b"".join(pieces) == payload
    assert 256 << 10 < max(map(len, pieces)) <= RECEIVE_BYTES, f"receive buffers granted: {granted} bytes"


def test_a_body_read_as_pieces_keeps_the_socket_read(nginx_server, web_root):
    """aiohttp stops reading a socket whose body buffer passes its limit (512 KiB in aiohttp
    3.14) and starts again when it is taken: two ``epoll_ctl`` calls and their Python, at
    every read once reads grow to 2 MiB. Read by :func:`aiohttp_pieces`, the buffer holds two
    such reads first, and the pieces are taken as they come, so the reading hardly ever stops.
    As in the test above, a roomy socket and a pause before the body is read make the reads
    large."""
    import aiohttp

    from shardstream.storage.requests import RECEIVE_BYTES, aiohttp_pieces

    folder = web_root / f"kept-{next(_names)}"
    folder.mkdir()
    payload = os.urandom(64 << 20)
    (folder / "big.bin").write_bytes(payload)

    def roomy_socket(addr_info: Any) -> socket.socket:
        family, kind, proto, _, _ = addr_info
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        return sock

    async def read() -> tuple[list[bytes], int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(socket_factory=roomy_socket)) as session:
            async with session.get(f"{nginx_server.url}/{folder.name}/big.bin") as response:
                await asyncio.sleep(0.5)
                protocol, stops = response.connection.protocol, []
                pause = protocol.pause_reading
                protocol.pause_reading = lambda: (stops.append(1), pause())[1]
                return [piece async for piece in aiohttp_pieces(response)], len(stops)

    pieces, stops = loop.run(read(), 60)
    assert b"".join(pieces) == payload
    wide = sum(len(piece) > RECEIVE_BYTES // 2 for piece in pieces)
    assert wide >= 4, f"only {wide} of {len(pieces)} reads took more than 1 MiB"
    assert stops <= 2, f"socket reading stopped {stops} times in {len(pieces)} reads"


@pytest.mark.parametrize("already", [0, 1, 511, 512, 4000, 70_000])
def test_local_write_resumes_after_a_short_writev(tmp_path, already: int) -> None:
    """After a short ``writev`` (a signal, a full disk freed), the local sink writes exactly the
    rest, resuming mid-piece, across more pieces than one ``writev`` takes (IOV_MAX)."""
    import random

    from shardstream.storage.local import _IOV_MAX, _write_rest

    rng = random.Random(already)
    pieces = [rng.randbytes(rng.choice([0, 1, 37, 512, 3000])) for _ in range(_IOV_MAX + 300)]
    whole = b"".join(pieces)
    path = tmp_path / "out.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, whole[:already])  # what the short writev wrote
        _write_rest(fd, pieces, already)
    finally:
        os.close(fd)
    assert path.read_bytes() == whole
