"""One RequestConfig (timeouts, attempts, waits, connections) for every remote store.

The public entry points that open a store take it (``open_index``, ``resolve_source``,
``build_index``, ``shard_urls_of``, ``verify``, the CLI's flags), and it takes effect on each
store, against the real local servers: S3 (SeaweedFS behind the fault proxy), http (the fault
server), the Hub (the fake Hub), GCS (the emulator behind the fault proxy) and Azure (Azurite
behind the fault proxy). ``max_attempts=1`` makes a failing request fail at its first attempt,
naming the URL and the knob; more attempts wait out ``Retry-After``; timeouts cut a stalled
answer; ``max_pool_connections`` bounds the requests in flight. Every test runs under a timeout,
and every fault is bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

import pytest
from servers.faultproxy import FaultProxy

import shardstream
from shardstream import HttpConfig, RequestConfig, S3Config, build_index, open_index, pack
from shardstream.cli import build_parser, main
from shardstream.errors import StorageConnectionError
from shardstream.index import resolve_source
from shardstream.packing.build import shard_urls_of
from shardstream.packing.verify import verify
from shardstream.storage import loop, open_store

pytestmark = pytest.mark.timeout(120)

ONE = RequestConfig(max_attempts=1, max_retry_after_s=0.5)
SHA = "feed" + "0" * 36
ONE_ATTEMPT = r"gave up after 1 attempt \(RequestConfig\.max_attempts\)"


def _small_dataset(root: Path) -> Path:
    """A packed dataset of 12 samples in 3 shards at ``root``."""
    src = root.parent / f"{root.name}-src"
    src.mkdir(parents=True)
    for i in range(12):
        (src / f"{i:03d}.bin").write_bytes(os.urandom(2000))
    pack(src, root, max_samples_per_shard=4, progress=False)
    return root


# -- the config itself -----------------------------------------------------------------------------


def test_request_config_is_public_validated_and_http_config_is_its_old_name():
    assert "RequestConfig" in shardstream.__all__ and shardstream.RequestConfig is RequestConfig
    assert HttpConfig is RequestConfig  # code written for HttpConfig keeps working
    old = HttpConfig(max_attempts=2, max_pool_connections=4)
    assert isinstance(old, RequestConfig) and old.max_attempts == 2
    cfg = RequestConfig(max_attempts=3, connect_timeout_s=1, read_timeout_s=2, max_retry_after_s=4)
    assert cfg.attempt_limit_s == 3 and cfg.request_limit_s == 3 * 3 + 2 * 4
    for bad in ({"max_attempts": 0}, {"max_pool_connections": True}, {"read_timeout_s": 0}, {"connect_timeout_s": -1}):
        with pytest.raises(ValueError, match=rf"RequestConfig\.{next(iter(bad))}="):
            RequestConfig(**bad)


@pytest.mark.parametrize(
    "url", ["https://example.com/ds", f"hf://datasets/org/name@{SHA}/ds", "gs://bucket/ds", "az://container/ds"]
)
def test_every_store_takes_the_config(url):
    cfg = RequestConfig(max_attempts=2, connect_timeout_s=1, read_timeout_s=2, max_pool_connections=3)
    store = open_store(url, requests=cfg)
    assert store.requests is cfg and store.request_limit_s == cfg.request_limit_s
    assert "of 3 pooled connections" in store.pool_state()
    assert open_store(url).requests == RequestConfig()


def test_s3_takes_a_request_config_over_its_own_fields():
    s3 = S3Config(endpoint_url="http://127.0.0.1:9", max_attempts=2, read_timeout_s=7.0, max_pool_connections=5)
    own = open_store("s3://bucket/ds", s3=s3)
    assert (own.requests.max_attempts, own.requests.read_timeout_s, own.requests.max_pool_connections) == (2, 7.0, 5)
    assert "S3Config.max_pool_connections" in own.pool_state() or "of 5 pooled connections" in own.pool_state()
    cfg = RequestConfig(max_attempts=4, max_pool_connections=6)
    given = open_store("s3://bucket/ds", s3=s3, requests=cfg)
    assert given.requests is cfg and given.knob == "RequestConfig" and "of 6 pooled connections" in given.pool_state()


def test_the_cli_flags_build_one_request_config():
    from shardstream.cli import _request_config

    parser = build_parser()
    for argv in (
        ["info", "x"],
        ["verify", "x"],
        ["index", "build", "x"],
        ["index", "merge", "x"],
        ["index", "upgrade", "x"],
        ["pack", "a", "b"],
    ):
        assert _request_config(parser.parse_args(argv)) is None  # no flag: each store's default
        args = parser.parse_args(
            [*argv, "--connect-timeout", "1.5", "--read-timeout", "2", "--max-attempts", "3", "--max-connections", "4"]
        )
        assert _request_config(args) == RequestConfig(
            connect_timeout_s=1.5, read_timeout_s=2.0, max_attempts=3, max_pool_connections=4
        )
    for bad in (["--max-attempts", "0"], ["--read-timeout", "0"], ["--connect-timeout", "nan"]):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["info", "x", *bad])
        assert exited.value.code == 2


# -- http(s): the fault server ---------------------------------------------------------------------


@pytest.fixture
def web(tmp_path):
    from servers.faultserver import FaultServer

    _small_dataset(tmp_path / "www" / "ds")
    with FaultServer(tmp_path / "www") as server:
        yield server


def _gets(server, suffix: str) -> int:
    return sum(1 for r in server.requests() if r["method"] == "GET" and r["path"].endswith(suffix))


@pytest.mark.slow
def test_http_attempts_and_retry_after_follow_the_config(web):
    web.set_faults(status=503, retry_after_s=0.2, path_glob="*/data-000000.tar", times=None)
    url = f"{web.url}/ds/data-000000.tar"
    with pytest.raises(StorageConnectionError, match=rf"{url}: HTTP 503.*{ONE_ATTEMPT}"):
        open_store(f"{web.url}/ds", requests=ONE).read_bytes("data-000000.tar")
    assert _gets(web, "/data-000000.tar") == 1
    web.clear_log()
    started = time.monotonic()
    with pytest.raises(StorageConnectionError, match=r"gave up after 3 attempts \(RequestConfig\.max_attempts\)"):
        open_store(f"{web.url}/ds", requests=RequestConfig(max_attempts=3)).read_bytes("data-000000.tar")
    assert _gets(web, "/data-000000.tar") == 3
    assert time.monotonic() - started >= 0.35  # two waits of the answers' Retry-After (0.2 s)
    web.set_faults(status=503, retry_after_s=0.2, path_glob="*/data-000000.tar", times=2)
    assert open_store(f"{web.url}/ds", requests=RequestConfig(max_attempts=3)).read_bytes("data-000000.tar")


@pytest.mark.slow
def test_http_a_stalled_answer_is_cut_at_the_timeouts(web):
    web.set_faults(stall_s=30, path_glob="*/data-000000.tar", methods=["GET"], times=None)
    cfg = RequestConfig(connect_timeout_s=0.3, read_timeout_s=0.3, max_attempts=1)
    store = open_store(f"{web.url}/ds", requests=cfg)
    started = time.monotonic()
    timed_out = rf"(no answer from {web.url} to a ranged GET within 1 s|SocketTimeoutError)"
    with pytest.raises(StorageConnectionError, match=rf"ds/data-000000\.tar: .*{timed_out}.*{ONE_ATTEMPT}"):
        loop.run(store.get_range("data-000000.tar", 0, 100), 60)
    assert time.monotonic() - started < 3  # the read timeout (0.3 s), not the server's 30 s


@pytest.mark.slow
def test_http_entry_points_and_cli_take_the_config(web, capsys):
    web.set_faults(status=503, path_glob="*/index.bin", times=None)
    dataset = f"{web.url}/ds"
    calls = [
        lambda: open_index(dataset, requests=ONE),
        lambda: resolve_source(dataset, requests=ONE),
        lambda: list(verify(dataset, requests=ONE)),
    ]
    for n, call in enumerate(calls, 1):
        with pytest.raises(StorageConnectionError, match=rf"{dataset}/index\.bin: HTTP 503.*{ONE_ATTEMPT}"):
            call()
        assert _gets(web, "/index.bin") == n
    for command in ("info", "verify"):
        assert main([command, dataset, "--max-attempts", "1"]) == 1
        assert "index.bin: HTTP 503" in capsys.readouterr().err
    assert _gets(web, "/index.bin") == len(calls) + 2
    web.set_faults()
    assert open_index(dataset, requests=ONE).num_samples == 12


# -- the Hub: the fake Hub --------------------------------------------------------------------------


def test_hub_pinning_listing_and_reads_take_the_config(fake_hub, tmp_path, monkeypatch):
    _small_dataset(tmp_path / "commit" / "ds")
    fake_hub.add_repo("org/reqs", {SHA: tmp_path / "commit"})
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.endpoint)
    monkeypatch.delenv("HF_TOKEN", raising=False)

    def api_requests() -> int:
        return sum(1 for r in fake_hub.requests() if r["host"] == "hub" and r["path"].startswith("/api/"))

    fake_hub.clear_log()
    fake_hub.set_faults(host="hub", status=503, retry_after_s=0.1, path_glob="/api/*", times=None)
    try:
        calls = [
            lambda: resolve_source(["hf://datasets/org/reqs/ds/data-000000.tar"], requests=ONE),
            lambda: shard_urls_of(["hf://datasets/org/reqs/ds"], requests=ONE),
            lambda: build_index(["hf://datasets/org/reqs/ds"], output=str(tmp_path / "index"), requests=ONE),
        ]
        for n, call in enumerate(calls, 1):
            with pytest.raises(StorageConnectionError, match=rf"hf://datasets/org/reqs@main: HTTP 503.*{ONE_ATTEMPT}"):
                call()
            assert api_requests() == n
        with pytest.raises(StorageConnectionError, match="gave up after 2 attempts"):
            resolve_source(["hf://datasets/org/reqs/ds/data-000000.tar"], requests=RequestConfig(max_attempts=2))
        assert api_requests() == len(calls) + 2

        fake_hub.set_faults(host="cdn", status=503, path_glob="*/data-000000.tar", times=None)
        store = open_store(f"hf://datasets/org/reqs@{SHA}/ds", requests=ONE)
        with pytest.raises(StorageConnectionError, match=rf"data-000000\.tar: HTTP 503.*{ONE_ATTEMPT}"):
            store.read_bytes("data-000000.tar")
        cdn = [r for r in fake_hub.requests() if r["host"] == "cdn" and r["path"].endswith("/data-000000.tar")]
        assert len(cdn) == 1
    finally:
        fake_hub.set_faults()
    urls, index = resolve_source("hf://datasets/org/reqs/ds", requests=ONE)
    assert index is not None and index.requests is ONE and len(urls) == 3


# -- S3: SeaweedFS behind the fault proxy ----------------------------------------------------------


@pytest.fixture
def s3_dataset(tmp_path, s3_bucket, s3_config) -> str:
    url = f"s3://{s3_bucket}/ds"
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"{i:03d}.bin").write_bytes(os.urandom(2000))
    pack(src, url, max_samples_per_shard=4, s3=s3_config, progress=False)
    return url


def _shard_gets(method: str, path: str) -> bool:
    return method == "GET" and path.endswith("/data-000000.tar")


def test_s3_a_request_config_wins_over_the_s3_config(s3_dataset, s3_config):
    with FaultProxy(s3_config.endpoint_url, rates={"slowdown": 1.0}, match=_shard_gets) as proxy:
        via = dataclasses.replace(s3_config, endpoint_url=proxy.endpoint_url, max_attempts=1)
        shard = f"{s3_dataset}/data-000000.tar"
        with pytest.raises(StorageConnectionError, match=r"gave up after 1 attempt \(S3Config\.max_attempts\)"):
            open_store(s3_dataset, s3=via).read_bytes("data-000000.tar")
        assert proxy.counts["slowdown"] == 1
        many = dataclasses.replace(via, max_attempts=5)
        with pytest.raises(StorageConnectionError, match=rf"{shard}: S3 error SlowDown .*{ONE_ATTEMPT}"):
            open_store(s3_dataset, s3=many, requests=ONE).read_bytes("data-000000.tar")
        assert proxy.counts["slowdown"] == 2
        proxy.max_faults = 4  # two more, then the answers pass
        three = RequestConfig(max_attempts=3, max_retry_after_s=0.5)
        assert open_store(s3_dataset, s3=via, requests=three).read_bytes("data-000000.tar")
        assert proxy.counts["slowdown"] == 4


def test_s3_entry_points_and_cli_take_the_config(s3_dataset, s3_config, s3_server, monkeypatch, capsys):
    with FaultProxy(s3_config.endpoint_url, rates={"slowdown": 1.0}) as proxy:
        via = dataclasses.replace(s3_config, endpoint_url=proxy.endpoint_url)  # max_attempts=5 of its own
        calls = [
            lambda: open_index(s3_dataset, s3=via, requests=ONE),
            lambda: resolve_source(s3_dataset, s3=via, requests=ONE),
            lambda: list(verify(s3_dataset, s3=via, requests=ONE)),
            lambda: shard_urls_of([s3_dataset], s3=via, requests=ONE),
            lambda: build_index([s3_dataset], s3=via, requests=ONE, workers=1, overwrite=True),
        ]
        for n, call in enumerate(calls, 1):
            with pytest.raises(StorageConnectionError, match=rf"{s3_dataset}.*S3 error SlowDown .*{ONE_ATTEMPT}"):
                call()
            assert proxy.counts["slowdown"] == n
        for key, value in s3_server.info.env().items():
            monkeypatch.setenv(key, value)
        for argv in (["info", s3_dataset], ["index", "build", s3_dataset, "--overwrite", "--no-progress"]):
            assert main([*argv, "--endpoint-url", proxy.endpoint_url, "--max-attempts", "1"]) == 1
            assert "SlowDown" in capsys.readouterr().err
        assert proxy.counts["slowdown"] == len(calls) + 2


def test_s3_timeouts_and_pool_follow_the_config(s3_dataset, s3_config):
    with FaultProxy(s3_config.endpoint_url, rates={"delay": 1.0}, match=_shard_gets, delay_s=10.0) as proxy:
        via = dataclasses.replace(s3_config, endpoint_url=proxy.endpoint_url)  # read_timeout_s=60 of its own
        cfg = RequestConfig(connect_timeout_s=0.5, read_timeout_s=0.5, max_attempts=1, max_pool_connections=2)
        store = open_store(s3_dataset, s3=via, requests=cfg)
        assert "of 2 pooled connections" in store.pool_state()
        started = time.monotonic()
        with pytest.raises(StorageConnectionError, match=r"data-000000\.tar: .*(ReadTimeoutError|no answer)"):
            loop.run(store.get_range("data-000000.tar", 0, 100), 60)
        assert time.monotonic() - started < 5 and proxy.counts["delay"] == 1


# -- GCS: the emulator behind the fault proxy ------------------------------------------------------


@pytest.fixture
def gcs_proxy(gcs_emulator, monkeypatch):
    for key, value in gcs_emulator.env().items():
        monkeypatch.setenv(key, value)
    with FaultProxy(gcs_emulator.endpoint, rates={}) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint_url)
        yield proxy


def _arm(proxy: FaultProxy, fault: str, name: str, *, method: str = "GET", prefix: str = "/", **settings) -> None:
    proxy.counts.clear()
    proxy.max_faults = None
    for key, value in settings.items():
        setattr(proxy, key, value)
    proxy.match = lambda m, path: m == method and path.startswith(prefix) and path.endswith("/" + name)
    proxy.rates = {fault: 1.0}


def test_gcs_reads_and_entry_points_take_the_config(gcs_emulator, gcs_proxy):
    bucket = f"reqs-{os.getpid()}"
    gcs_emulator.create_bucket(bucket)
    url = f"gs://{bucket}/ds"
    data = os.urandom(50_000)
    open_store(url).write_bytes("obj.bin", data)
    open_store(url).write_bytes("index.bin", b"not read: its download fails")
    _arm(gcs_proxy, "throttle", "obj.bin", prefix="/download/", throttle_status=503, retry_after_s=0.1)
    with pytest.raises(StorageConnectionError, match=rf"{url}/obj\.bin: HTTP 503.*{ONE_ATTEMPT}"):
        open_store(url, requests=ONE).read_bytes("obj.bin")
    assert gcs_proxy.counts["throttle"] == 1
    gcs_proxy.max_faults = 3  # two more, then the downloads pass
    assert open_store(url, requests=RequestConfig(max_attempts=3)).read_bytes("obj.bin") == data
    assert gcs_proxy.counts["throttle"] == 3
    _arm(gcs_proxy, "throttle", "index.bin", prefix="/download/", throttle_status=503, retry_after_s=0.1)
    for n, call in enumerate([lambda: open_index(url, requests=ONE), lambda: resolve_source(url, requests=ONE)], 1):
        with pytest.raises(StorageConnectionError, match=rf"{url}/index\.bin: HTTP 503.*{ONE_ATTEMPT}"):
            call()
        assert gcs_proxy.counts["throttle"] == n


def test_gcs_ranged_reads_take_no_more_connections_than_the_config_allows(gcs_emulator, gcs_proxy):
    bucket = f"reqs-pool-{os.getpid()}"
    gcs_emulator.create_bucket(bucket)
    url = f"gs://{bucket}/ds"
    open_store(url).write_bytes("obj.bin", os.urandom(10_000))
    _arm(gcs_proxy, "delay", "obj.bin", prefix="/download/", delay_s=1.0)  # a second each: slack for a loaded machine

    async def four(store) -> float:
        started = time.monotonic()
        await asyncio.gather(*(store.get_range("obj.bin", i * 100, i * 100 + 100) for i in range(4)))
        return time.monotonic() - started

    assert loop.run(four(open_store(url, requests=RequestConfig(max_pool_connections=1))), 60) >= 3.9  # one at a time
    assert loop.run(four(open_store(url, requests=RequestConfig(max_pool_connections=4))), 60) < 2.5  # all at once


# -- Azure: Azurite behind the fault proxy ---------------------------------------------------------


@pytest.fixture
def azure_proxy(azurite, monkeypatch):
    from servers.emulators import AZURITE_ACCOUNT, AZURITE_KEY

    with FaultProxy(azurite.endpoint, rates={}) as proxy:
        monkeypatch.setenv(
            "AZURE_STORAGE_CONNECTION_STRING",
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={proxy.endpoint_url}/{AZURITE_ACCOUNT};",
        )
        yield proxy


def test_azure_reads_requests_and_entry_points_take_the_config(azurite, azure_proxy):
    container = f"reqs-{os.getpid()}"
    azurite.create_container(container)
    url = f"az://{container}/ds"
    data = os.urandom(50_000)
    open_store(url).write_bytes("obj.bin", data)
    open_store(url).write_bytes("index.bin", b"not read: its download fails")
    _arm(azure_proxy, "throttle", "obj.bin", throttle_status=503, retry_after_s=0.1)
    with pytest.raises(StorageConnectionError, match=rf"{url}/obj\.bin: .*HTTP 503.*{ONE_ATTEMPT}"):
        open_store(url, requests=ONE).read_bytes("obj.bin")
    assert azure_proxy.counts["throttle"] == 1
    azure_proxy.max_faults = 3  # two more, then the downloads pass
    assert open_store(url, requests=RequestConfig(max_attempts=3)).read_bytes("obj.bin") == data
    assert azure_proxy.counts["throttle"] == 3
    # the SDK's own requests (here a HEAD: the blob's properties) take max_attempts too
    _arm(azure_proxy, "throttle", "obj.bin", method="HEAD", throttle_status=503, retry_after_s=0.1)
    with pytest.raises(StorageConnectionError, match=r"obj\.bin: .*HTTP 503"):
        loop.run(open_store(url, requests=ONE).head("obj.bin"), 60)
    assert azure_proxy.counts["throttle"] == 1
    _arm(azure_proxy, "throttle", "index.bin", throttle_status=503, retry_after_s=0.1)
    for n, call in enumerate([lambda: open_index(url, requests=ONE), lambda: resolve_source(url, requests=ONE)], 1):
        with pytest.raises(StorageConnectionError, match=rf"{url}/index\.bin: .*HTTP 503.*{ONE_ATTEMPT}"):
            call()
        assert azure_proxy.counts["throttle"] == n


# -- the readers and writers: ShardDataset, verify, build_index, pack, ShardWriter, pack_samples ---


@pytest.mark.slow
def test_verify_and_build_index_read_shards_under_the_config(web, tmp_path):
    dataset = f"{web.url}/ds"
    assert all(check.ok for check in verify(dataset, requests=ONE))
    web.set_faults(status=503, path_glob="*/data-000001.tar", times=None)
    checks = list(verify(dataset, requests=ONE))
    bad = [c for c in checks if not c.ok]
    assert len(checks) == 3 and len(bad) == 1 and bad[0].url.endswith("data-000001.tar")
    assert "gave up after 1 attempt (RequestConfig.max_attempts)" in bad[0].problems[0]
    assert _gets(web, "/data-000001.tar") == 1
    web.clear_log()
    with pytest.raises(StorageConnectionError, match=rf"data-000001\.tar: HTTP 503.*{ONE_ATTEMPT}"):
        build_index([f"{dataset}/data-{{000000..000002}}.tar"], output=str(tmp_path / "idx"), requests=ONE, workers=1)
    assert _asks(web, "/data-000001.tar") == 1  # its first request, whatever the method
    web.clear_log()
    with pytest.raises(StorageConnectionError, match="gave up after 2 attempts"):
        build_index(
            [f"{dataset}/data-{{000000..000002}}.tar"],
            output=str(tmp_path / "idx2"),
            requests=RequestConfig(max_attempts=2),
            workers=1,
        )
    assert _asks(web, "/data-000001.tar") == 2


def _asks(server, suffix: str) -> int:
    return sum(1 for r in server.requests() if r["path"].endswith(suffix))


@pytest.mark.slow
def test_shard_dataset_reads_shards_under_the_config(web):
    dataset = f"{web.url}/ds"
    web.set_faults(status=503, path_glob="*/data-000001.tar", times=None)
    with pytest.raises(StorageConnectionError, match=rf"data-000001\.tar: HTTP 503.*{ONE_ATTEMPT}"):
        list(shardstream.ShardDataset(dataset, shuffle=False, requests=ONE))
    assert _gets(web, "/data-000001.tar") == 1
    web.clear_log()
    web.set_faults(status=503, path_glob="*/data-000001.tar", times=2)  # two failures, then the answers pass
    three = RequestConfig(max_attempts=3, max_retry_after_s=0.5)
    keys = [s["__key__"] for s in shardstream.ShardDataset(dataset, shuffle=False, requests=three)]
    assert keys == [f"{i:03d}" for i in range(12)]
    assert _gets(web, "/data-000001.tar") == 3


def test_the_writers_publish_under_the_config(tmp_path, s3_bucket, s3_config):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"{i:03d}.bin").write_bytes(os.urandom(1000))
    writers = [
        lambda url, s3, requests: pack(src, url, s3=s3, requests=requests, progress=False),
        lambda url, s3, requests: _write_four(shardstream.ShardWriter(url, s3=s3, requests=requests)),
        lambda url, s3, requests: shardstream.pack_samples(
            lambda i: {"__key__": f"{i:03d}", "bin": b"x"}, range(4), url, s3=s3, requests=requests, progress=False
        ),
    ]
    with FaultProxy(s3_config.endpoint_url, rates={"slowdown": 1.0}) as proxy:
        via = dataclasses.replace(s3_config, endpoint_url=proxy.endpoint_url)  # max_attempts=5 of its own
        for n, write in enumerate(writers, 1):
            with pytest.raises(StorageConnectionError, match=rf"s3://{s3_bucket}/w{n}.*(SlowDown|503).*{ONE_ATTEMPT}"):
                write(f"s3://{s3_bucket}/w{n}", via, ONE)
            assert proxy.counts["slowdown"] == n  # one attempt each, not S3Config's five
    for n, write in enumerate(writers, 1):  # and without faults they write
        write(f"s3://{s3_bucket}/ok{n}", s3_config, RequestConfig(max_attempts=2))
        assert open_index(f"s3://{s3_bucket}/ok{n}", s3=s3_config).num_samples == 4


def _write_four(writer) -> None:
    with writer:
        for i in range(4):
            writer.write({"__key__": f"{i:03d}", "bin": b"x"})
