"""Faults between the reader and a real S3 server, injected by servers.faultproxy.FaultProxy:
each fault alone, then a mix over a whole epoch of 2 ranks x 2 workers, and a pack through
faults that verify accepts. Every run must deliver exactly the clean run's samples."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from servers.faultproxy import FaultProxy
from torch.utils.data import DataLoader

from shardstream import FetchConfig, ShardDataset, pack
from shardstream.errors import CorruptShardError, StorageConnectionError
from shardstream.packing.verify import verify

FETCH = FetchConfig(part_bytes=64 << 10, max_buffer_bytes=1 << 20, max_inflight_requests=4)


def shard_gets(method: str, path: str) -> bool:
    return method == "GET" and path.endswith(".tar")


def digest(sample: dict) -> tuple[str, str]:
    payload = b"".join(sample[k] for k in sorted(sample) if not k.startswith("__"))
    return sample["__key__"], hashlib.sha256(payload).hexdigest()


@pytest.fixture(scope="module")
def dataset_url(s3_server, tmp_path_factory) -> str:
    """~3 MB of the standard library's json, email, asyncio and logging packages in shards of 256 KiB."""
    import shutil
    import sysconfig
    from pathlib import Path

    src = tmp_path_factory.mktemp("faults")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for package in ("json", "email", "asyncio", "logging"):
        shutil.copytree(stdlib / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    s3_server.create_bucket("faults")
    info = s3_server.info
    s3 = info.s3_config()
    pack(src, "s3://faults/data", max_shard_bytes=256 << 10, s3=s3, progress=False)
    return "s3://faults/data"


def via(proxy: FaultProxy, s3_config):
    return dataclasses.replace(s3_config, endpoint_url=proxy.endpoint_url, read_timeout_s=5.0)


@pytest.mark.parametrize("fault", ["cut", "reset", "slowdown", "delay", "trickle"])
def test_each_fault_alone_loses_and_repeats_nothing(dataset_url, s3_server, s3_config, fault):
    clean = sorted(digest(s) for s in ShardDataset(dataset_url, s3=s3_config, fetch=FETCH, shuffle=False))
    with FaultProxy(
        s3_config.endpoint_url,
        rates={fault: 1.0},
        match=shard_gets,
        max_faults=4,
        cut_after_bytes=20_000,
        delay_s=0.3,
        trickle_s=0.002,
    ) as proxy:
        dataset = ShardDataset(dataset_url, s3=via(proxy, s3_config), fetch=FETCH, shuffle=False)
        got = sorted(digest(s) for s in dataset)
    assert proxy.counts[fault] == 4
    assert got == clean
    if fault == "cut":
        assert dataset.stats().retries == 4  # each cut body resumed once, from where it stopped


def test_a_mixed_epoch_over_two_ranks_and_two_workers_delivers_the_clean_epoch(dataset_url, s3_config, monkeypatch):
    rates = {"reset": 0.05, "slowdown": 0.05, "cut": 0.03, "delay": 0.02, "trickle": 0.02}

    def epoch(s3) -> list[list[tuple[str, str]]]:
        ranks = []
        for rank in range(2):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "2")
            dataset = ShardDataset(dataset_url, s3=s3, fetch=FETCH, decode=digest, seed=3)
            ranks.append(sorted(DataLoader(dataset, batch_size=None, num_workers=2)))
        return ranks

    clean = epoch(s3_config)
    with FaultProxy(s3_config.endpoint_url, rates=rates, seed=11, cut_after_bytes=30_000, delay_s=0.2) as proxy:
        faulty = epoch(via(proxy, s3_config))
    assert faulty == clean
    assert sum(proxy.counts.values()) >= 5 and len(proxy.counts) >= 3, proxy.counts


def test_pack_through_faults_gives_a_dataset_verify_accepts(tmp_path, s3_server, s3_config):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(60):
        (src / f"{i:03d}.bin").write_bytes(hashlib.sha256(str(i).encode()).digest() * 400)
    s3_server.create_bucket("faults-pack")
    with FaultProxy(s3_config.endpoint_url, rates={"slowdown": 0.1, "reset": 0.05}, seed=5) as proxy:
        report = pack(src, "s3://faults-pack/data", max_shard_bytes=64 << 10, s3=via(proxy, s3_config), progress=False)
    assert report.num_samples == 60 and sum(proxy.counts.values()) >= 2, proxy.counts
    checks = list(verify("s3://faults-pack/data", s3=s3_config))
    assert checks and all(c.ok for c in checks)


def test_a_shard_replaced_between_a_cut_and_its_resume_is_named(tmp_path, s3_server, s3_config):
    """The resume asks for the rest with IfMatch on the first response's ETag: a shard
    overwritten meanwhile (same size, other bytes) is an error naming it, never a mix."""
    from shardstream.storage import open_store

    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"{i:02d}.bin").write_bytes(bytes([i]) * 5000)
    s3_server.create_bucket("faults-etag")
    pack(src, "s3://faults-etag/data", s3=s3_config, progress=False)
    store = open_store("s3://faults-etag/data", s3=s3_config)
    shard = store.read_bytes("data-000000.tar")

    def overwrite(fault: str, method: str, path: str) -> None:
        store.write_bytes("data-000000.tar", shard.replace(bytes([7]) * 5000, bytes([8]) * 5000))

    with FaultProxy(
        s3_config.endpoint_url,
        rates={"cut": 1.0},
        match=shard_gets,
        max_faults=1,
        cut_after_bytes=30_000,
        on_fault=overwrite,
    ) as proxy:
        dataset = ShardDataset("s3://faults-etag/data", s3=via(proxy, s3_config), fetch=FetchConfig(part_bytes=1 << 20))
        with pytest.raises(
            CorruptShardError, match=r"s3://faults-etag/data/data-000000.tar: changed while it was being read"
        ):
            list(dataset)


def test_pack_from_an_s3_prefix_lists_and_reads_through_faults(s3_server, s3_config):
    from shardstream.storage import open_store

    s3_server.create_bucket("faults-list")
    raw = open_store("s3://faults-list/raw", s3=s3_config)
    files = {f"d{i % 3}/{i:03d}.txt": hashlib.sha256(str(i).encode()).hexdigest().encode() * 30 for i in range(120)}
    for name, data in files.items():
        raw.write_bytes(name, data)
    with FaultProxy(s3_config.endpoint_url, rates={"slowdown": 0.1, "reset": 0.05, "cut": 0.05}, seed=9) as proxy:
        # 8 attempts: at a 20% fault rate 5 (the default) give up on ~1 of 3,000 requests, a flaky
        # test over the few hundred this pack makes; 8 on ~1 of 4,000,000
        faulty = dataclasses.replace(via(proxy, s3_config), max_attempts=8)
        report = pack(
            "s3://faults-list/raw",
            "s3://faults-list/packed",
            max_samples_per_shard=25,
            s3=faulty,
            fetch=FETCH,
            progress=False,
        )
    assert report.num_samples == 120 and sum(proxy.counts.values()) >= 5, proxy.counts
    assert proxy.counts["slowdown"] + proxy.counts["reset"] >= 1
    got = {s["__key__"] + "." + "txt": s["txt"] for s in ShardDataset("s3://faults-list/packed", s3=s3_config)}
    assert got == files


def fast_failing(config, endpoint_url: str):
    """One attempt, 0.5 s timeouts: a stall is called after 1 s."""
    return dataclasses.replace(
        config, endpoint_url=endpoint_url, max_attempts=1, connect_timeout_s=0.5, read_timeout_s=0.5
    )


def test_a_stalled_server_is_named_as_such(dataset_url, s3_config):
    # the read timeout (0.5 s) must fire before the attempt's bound (connect + read): 2 s of slack
    # for a loaded machine to send the request in, not 0.5
    with FaultProxy(s3_config.endpoint_url, rates={"delay": 1.0}, match=shard_gets, delay_s=4.0) as proxy:
        config = dataclasses.replace(fast_failing(s3_config, proxy.endpoint_url), connect_timeout_s=2.0)
        dataset = ShardDataset(dataset_url, s3=config, shuffle=False)
        with pytest.raises(
            StorageConnectionError,
            match=(
                rf"data-000000\.tar: the connection to {proxy.endpoint_url} failed during the transfer \(ReadTimeoutError"
            ),
        ):
            list(dataset)


def test_requests_queued_for_a_pooled_connection_are_named(dataset_url, s3_config):
    """One pooled connection, held by a GET whose body trickles in (so it never times out),
    and a second GET at once: the second waits for the connection, and its error says so
    rather than blaming the server."""
    import asyncio

    from shardstream.storage import loop as io_loop
    from shardstream.storage import open_store

    with FaultProxy(s3_config.endpoint_url, rates={"trickle": 1.0}, match=shard_gets, trickle_s=0.2) as proxy:
        config = dataclasses.replace(fast_failing(s3_config, proxy.endpoint_url), max_pool_connections=1)
        store = open_store(dataset_url, s3=config)

        async def both():
            return await asyncio.gather(
                store.get_range("data-000000.tar", 0, 200_000),
                store.get_range("data-000001.tar", 0, 200_000),
                return_exceptions=True,
            )

        first, second = io_loop.run(both(), timeout_s=60)
    assert not isinstance(first, BaseException)  # the holder got its bytes, slowly
    assert isinstance(second, StorageConnectionError)
    assert "data-000001.tar: no answer from" in str(second)
    assert "2 S3 requests open for 1 pooled connections (S3Config.max_pool_connections)" in str(second)
