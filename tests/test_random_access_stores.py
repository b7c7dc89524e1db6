"""Random access on every remote store, against the local servers: each sample by index and by
key compared byte for byte with the streaming read of the same dataset on local disk; request
counts at a proxy in front of the S3 server; a shard replaced on S3 after indexing."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
from servers.faultproxy import FaultProxy
from test_dataset import make_dataset
from test_remote_datasets import local_dataset, remote  # noqa: F401 - fixtures: the dataset in each store

from shardstream import ShardDataset, open_index, pack
from shardstream.errors import CorruptShardError
from shardstream.mapdataset import ShardMapDataset
from shardstream.reading.access import SampleAccess
from shardstream.storage import open_store

pytestmark = pytest.mark.timeout(300)


def raw(sample: dict) -> dict:
    return {
        k: (bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else v)
        for k, v in sample.items()
        if k != "__shard__"
    }


def test_every_index_and_key_on_each_store(remote):  # noqa: F811
    expected = [raw(s) for s in ShardDataset(remote.local, shuffle=False)]
    ds = ShardDataset(remote.url, shuffle=False)
    assert [raw(s) for s in ds.get_many(range(len(expected)))] == expected
    assert [raw(ds[i]) for i in range(0, len(expected), 7)] == expected[::7]
    assert [raw(ds.get(k)) for k in remote.keys[::5]] == expected[::5]
    streamed = list(ShardDataset(remote.url, shuffle=False))
    assert [ds[i]["__shard__"] for i in (3, 40)] == [streamed[i]["__shard__"] for i in (3, 40)]
    with pytest.raises(KeyError, match="absent"):
        ds.get("absent")


@pytest.fixture(scope="module")
def s3_dataset(tmp_path_factory, s3_server):
    """The same 60 samples on local disk and on the S3 server, 10 samples a shard."""
    local, keys = make_dataset(tmp_path_factory.mktemp("ra-s3"), num_samples=60, per_shard=10)
    bucket = "random-access"
    s3_server.create_bucket(bucket)
    config = s3_server.info.s3_config()
    pack(local.parent / "src", f"s3://{bucket}/ds", max_samples_per_shard=10, s3=config, progress=False)
    return local, keys, f"s3://{bucket}/ds"


@contextlib.contextmanager
def counted_requests(s3_config):
    """The S3 config of a proxy in front of the server, and the (method, path) of every
    request it forwards, in order (clear it to count from a point on)."""
    seen: list[tuple[str, str]] = []

    def match(method: str, path: str) -> bool:
        seen.append((method, path.split("?")[0]))
        return False

    with FaultProxy(s3_config.endpoint_url, rates={}, match=match) as proxy:
        yield dataclasses.replace(s3_config, endpoint_url=proxy.endpoint_url), seen


def _shard_gets(proxy_paths):
    return [p for m, p in proxy_paths if m == "GET" and p.endswith(".tar")]


def test_on_s3_one_get_per_cold_sample_and_merged_gets_for_a_batch(s3_dataset, s3_config):
    local, keys, url = s3_dataset
    expected = [raw(s) for s in ShardDataset(local, shuffle=False)]
    with counted_requests(s3_config) as (config, seen):
        access = SampleAccess(open_index(url, s3=config), s3=config)
        seen.clear()
        cold = [access.read([access.locate(i)])[0] for i in (0, 13, 27, 41, 59)]
        assert [raw(s) | {"__index__": None} for s in cold] == [
            expected[i] | {"__index__": None} for i in (0, 13, 27, 41, 59)
        ]
        assert len(_shard_gets(seen)) == 5  # one GET per cold sample
        stats = access.stats()
        payload = sum(len(v) for s in cold for k, v in s.items() if not k.startswith("__"))
        print(f"cold: {stats}, payload {payload} B")
        assert stats["requests"] == 5 and stats["bytes_read"] <= payload + 5 * 2048

        seen.clear()
        batch = access.read([access.locate(i) for i in [*range(20, 30), 31, 35]])  # 10 of shard 2, 2 of shard 3
        assert [s["__key__"] for s in batch] == [*keys[20:30], keys[31], keys[35]]
        assert len(_shard_gets(seen)) == 2  # one merged GET per shard
        ds = ShardMapDataset(url, s3=config)
        seen.clear()
        ds.__getitems__(list(range(0, 60, 2)))
        assert len(_shard_gets(seen)) == 6, seen  # a batch over 6 shards: 6 GETs
        print(f"batch of 30 over 6 shards: {ds.stats()}")


def test_on_s3_a_hot_shard_is_read_from_the_node_cache(s3_dataset, s3_config, tmp_path):
    local, keys, url = s3_dataset
    expected = [raw(s) for s in ShardDataset(local, shuffle=False)]
    with counted_requests(s3_config) as (config, seen):
        access = SampleAccess(
            open_index(url, s3=config),
            s3=config,
            cache_dir=tmp_path / "cache",
            cache_limit_bytes=1 << 30,
            hot_shard_reads=3,
        )
        got = [access.read([access.locate(i)])[0] for i in range(10)]
        assert [raw(s) | {"__index__": None} for s in got] == [e | {"__index__": None} for e in expected[:10]]
        assert access.stats()["hot_shards_cached"] == 1
        seen.clear()
        again = [access.read([access.locate(i)])[0] for i in range(10)]
        assert [s["__key__"] for s in again] == keys[:10]
        assert _shard_gets(seen) == []  # served from the node cache


def test_on_s3_a_replaced_shard_raises_naming_it(tmp_path, s3_server, s3_config):
    local, _ = make_dataset(tmp_path, num_samples=20, per_shard=10)
    s3_server.create_bucket("ra-replaced")
    url = "s3://ra-replaced/ds"
    pack(local.parent / "src", url, max_samples_per_shard=10, s3=s3_config, progress=False)
    index = open_index(url, s3=s3_config)
    store = open_store(url, s3=s3_config)
    name0, name1 = index.manifest.name(0), index.manifest.name(1)
    store.write_bytes(name1, store.read_bytes(name0))  # same size, other samples
    ds = ShardDataset(url, s3=s3_config, shuffle=False)
    with pytest.raises(CorruptShardError, match=rf"{name1}.*does not match the index"):
        ds[12]
    store.write_bytes(name1, store.read_bytes(name0) + bytes(512))
    ds = ShardDataset(url, s3=s3_config, shuffle=False)
    with pytest.raises(CorruptShardError, match=rf"{name1}: is \d+ bytes but was \d+ bytes when indexed"):
        ds[12]


def test_on_s3_bytes_moved_stay_within_1_2x_of_the_samples(tmp_path, s3_server, s3_config):
    """~100 KB samples in ~1 MB shards: random reads, one at a time and as a batch, move at
    most 1.2x the samples' bytes (tables not counted)."""
    import random

    rng = random.Random(5)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(60):
        (src / f"{i:03d}.bin").write_bytes(rng.randbytes(rng.randrange(80_000, 120_000)))
        (src / f"{i:03d}.cls").write_text(str(i % 5))
    s3_server.create_bucket("ra-bytes")
    url = "s3://ra-bytes/ds"
    pack(src, url, max_shard_bytes=1 << 20, s3=s3_config, progress=False)
    access = SampleAccess(open_index(url, s3=s3_config), s3=s3_config)
    picks = rng.sample(range(60), 12)
    singles = [access.read([access.locate(i)])[0] for i in picks]
    for i, sample in zip(picks, singles):
        assert sample["bin"] == (src / f"{i:03d}.bin").read_bytes()
    payload = sum(len(s["bin"]) + len(s["cls"]) for s in singles)
    stats = access.stats()
    print(f"12 random singles: {stats}, payload {payload} B, ratio {stats['bytes_read'] / payload:.4f}")
    assert stats["requests"] == 12 and stats["bytes_read"] <= 1.2 * payload
    batch_access = SampleAccess(open_index(url, s3=s3_config), s3=s3_config)
    batch = batch_access.read([batch_access.locate(i) for i in picks])
    assert [s["__key__"] for s in batch] == [f"{i:03d}" for i in picks]
    stats = batch_access.stats()
    print(f"12 random as a batch: {stats}, ratio {stats['bytes_read'] / payload:.4f}")
    assert stats["bytes_read"] <= 1.2 * payload and stats["requests"] <= 12
