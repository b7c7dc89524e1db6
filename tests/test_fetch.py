"""The S3 fetcher on real shards in a real S3 server: ranged parts of any size, in order,
bounded memory, first sample before the shard has arrived, and shards that disagree with
their index."""

from __future__ import annotations

import os
import random
import time

import pytest

from shardstream import FetchConfig, ShardDataset, pack
from shardstream.errors import CorruptShardError
from shardstream.storage import open_store
from shardstream.storage.fetch import iter_shard_streams
from shardstream.tarstream import iter_members


def odd_members(src, *, huge: bool):
    """Members of awkward sizes: empty, 1 byte, 511/512/513 bytes, many small (and 3 MiB)."""
    rng = random.Random(7)
    sizes = [0, 1, 511, 512, 513, 100, 1023, 1024, 1025] + [rng.randrange(0, 5000) for _ in range(60)]
    if huge:
        sizes.insert(5, 3 << 20)
    files = {}
    for i, size in enumerate(sizes):
        data = rng.randbytes(size)
        (src / f"{i:03d}.bin").write_bytes(data)
        (src / f"{i:03d}.txt").write_bytes(f"sample {i}".encode())
        files[f"{i:03d}.bin"] = data
        files[f"{i:03d}.txt"] = f"sample {i}".encode()
    return files


@pytest.mark.parametrize(
    ("part_bytes", "huge"),
    [(511, False), (512, False), (513, False), (700, False), (64 << 10, True), ((1 << 20) + 100, True)],
)
def test_any_part_size_gives_the_same_members(tmp_path, s3_bucket, s3_config, part_bytes, huge):
    """Part boundaries land inside headers, inside payloads, on block edges and inside the
    end-of-archive blocks; the members read back are the files, byte for byte."""
    src = tmp_path / "odd"
    src.mkdir()
    files = odd_members(src, huge=huge)
    url = f"s3://{s3_bucket}/odd"
    pack(src, url, s3=s3_config, progress=False)
    fetch = FetchConfig(part_bytes=part_bytes, max_buffer_bytes=max(part_bytes, 64 << 10), max_inflight_requests=4)
    got = {}
    for sample in ShardDataset(url, s3=s3_config, fetch=fetch, shuffle=False):
        got[f"{sample['__key__']}.bin"] = sample["bin"]
        got[f"{sample['__key__']}.txt"] = sample["txt"]
    assert got == files


def test_first_sample_arrives_before_the_shard_and_memory_stays_under_the_budget(tmp_path, s3_bucket, s3_config):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(64):
        (src / f"{i:03d}.bin").write_bytes(os.urandom(64 << 10))
    url = f"s3://{s3_bucket}/big"
    pack(src, url, s3=s3_config, progress=False)  # one shard of 4 MiB
    budget = 256 << 10
    dataset = ShardDataset(
        url, s3=s3_config, shuffle=False, fetch=FetchConfig(part_bytes=64 << 10, max_buffer_bytes=budget)
    )
    assert dataset.num_shards == 1
    iterator = iter(dataset)
    first = next(iterator)
    assert first["__key__"] == "000"
    assert 0 < dataset.stats().bytes_in_flight <= budget  # not the whole 4 MiB shard
    rest = list(iterator)
    assert len(rest) == 63
    stats = dataset.stats()
    assert stats.samples == 64 and stats.bytes == 64 * (64 << 10) and stats.first_sample_s is not None


def test_a_ranks_workers_share_its_read_ahead_budget(tmp_path, s3_bucket, s3_config):
    """max_buffer_bytes bounds a rank: two DataLoader workers hold at most that much between
    them (each half of it), not twice it."""
    from torch.utils.data import DataLoader

    src = tmp_path / "src"
    src.mkdir()
    for i in range(128):
        (src / f"{i:03d}.bin").write_bytes(os.urandom(64 << 10))
    url = f"s3://{s3_bucket}/shared-budget"
    pack(src, url, s3=s3_config, max_samples_per_shard=32, progress=False)  # 4 shards of 2 MiB
    budget = 1 << 20
    dataset = ShardDataset(
        url, s3=s3_config, shuffle=False, batch_size=4, fetch=FetchConfig(part_bytes=128 << 10, max_buffer_bytes=budget)
    )
    held = []
    for batch in DataLoader(dataset, batch_size=4, num_workers=2, timeout=60):
        time.sleep(0.02)  # a slow consumer: the workers' read-ahead fills up meanwhile
        held.append(dataset.stats().bytes_in_flight)
        assert len(batch["bin"]) == 4
    assert len(held) == 32
    assert max(held) <= budget
    assert max(held) > budget // 4  # the workers did read ahead


def test_a_shard_shorter_or_longer_than_its_index_is_named(tmp_path, s3_bucket, s3_config, stdlib_tree):
    url = f"s3://{s3_bucket}/short"
    pack(stdlib_tree / "json", url, s3=s3_config, progress=False)
    store = open_store(url, s3=s3_config)
    dataset = ShardDataset(url, s3=s3_config, shuffle=False)
    name = dataset.index.manifest.name(0)
    whole = store.read_bytes(name)
    store.write_bytes(name, whole[: len(whole) // 2])
    with pytest.raises(
        CorruptShardError, match=rf"{url}/{name}: is {len(whole) // 2} bytes but the index says {len(whole)}"
    ):
        list(ShardDataset(url, s3=s3_config, shuffle=False))
    store.write_bytes(name, whole + bytes(1024))
    with pytest.raises(CorruptShardError, match=rf"{url}/{name}: is {len(whole) + 1024} bytes but the index says"):
        list(ShardDataset(url, s3=s3_config, shuffle=False))


def test_streams_without_sizes_ask_the_server_and_mix_with_local_shards(tmp_path, s3_bucket, s3_config, stdlib_tree):
    local = tmp_path / "local"
    pack(stdlib_tree / "json", local, max_shard_bytes=64 << 10, progress=False)
    url = f"s3://{s3_bucket}/mixed"
    pack(stdlib_tree / "json", url, max_shard_bytes=64 << 10, s3=s3_config, progress=False)
    names = sorted(p.name for p in local.glob("*.tar"))
    urls = [str(local / n) if i % 2 else f"{url}/{n}" for i, n in enumerate(names)]
    seen = []
    for shard_url, stream in iter_shard_streams(urls, s3=s3_config, fetch=FetchConfig(part_bytes=10_000)):
        seen.append((shard_url, [name for name, _ in iter_members(stream, url=shard_url)]))
    expected = [(u, [name for name, _ in iter_members(open(local / n, "rb"), url=u)]) for u, n in zip(urls, names)]
    assert seen == expected


def test_the_node_cache_serves_epoch_two_and_stays_under_its_limit(tmp_path, s3_bucket, s3_config, stdlib_tree):
    url = f"s3://{s3_bucket}/cached"
    report = pack(stdlib_tree / "json", url, max_samples_per_shard=1, s3=s3_config, progress=False)
    assert report.num_shards >= 4
    cache_dir = tmp_path / "cache"
    (cache_dir).mkdir()
    (cache_dir / "mine.txt").write_text("not the cache's")
    dataset = ShardDataset(url, s3=s3_config, shuffle=False, cache_dir=cache_dir, cache_limit_bytes=10 << 30)
    first = [s["__key__"] for s in dataset]
    stats = dataset.stats()
    assert stats.cache_misses == report.num_shards and stats.cache_hits == 0
    second = [s["__key__"] for s in dataset]
    assert second == first
    stats = dataset.stats()
    assert stats.cache_hits == report.num_shards and stats.cache_misses == 0 and stats.cache_hit_rate == 1.0

    # A limit smaller than the epoch: every shard still arrives, the cache never exceeds it.
    from shardstream.storage.cache import ShardCache

    small_dir = tmp_path / "small"
    limit = 2 * int(dataset.index.manifest.shard_bytes.max())
    small = ShardDataset(url, s3=s3_config, shuffle=False, cache_dir=small_dir, cache_limit_bytes=limit)
    for _ in range(2):
        assert [s["__key__"] for s in small] == first
        assert ShardCache(small_dir, cache_limit_bytes=limit).used_bytes() <= limit
    assert (cache_dir / "mine.txt").read_text() == "not the cache's"


def test_dataloader_workers_share_one_cache_and_report_stats(tmp_path, s3_bucket, s3_config, stdlib_tree):
    """Two DataLoader workers and a second dataset (another rank of the node) share one cache
    directory: each shard is downloaded once; stats() sums the workers' counters."""
    import torch

    url = f"s3://{s3_bucket}/shared"
    report = pack(stdlib_tree / "json", url, max_samples_per_shard=1, s3=s3_config, progress=False)
    cache_dir = tmp_path / "cache"
    kwargs = dict(s3=s3_config, shuffle=False, cache_dir=cache_dir, cache_limit_bytes=1 << 30)
    dataset = ShardDataset(url, **kwargs)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    keys = sorted(s["__key__"] for s in loader)
    assert len(keys) == dataset.num_samples
    stats = dataset.stats()
    assert stats.readers == 2 and stats.samples == dataset.num_samples
    assert stats.cache_misses == report.num_shards and stats.cache_hits == 0
    other = ShardDataset(url, **kwargs)
    assert sorted(s["__key__"] for s in other) == keys
    assert other.stats().cache_hits == report.num_shards and other.stats().cache_misses == 0


def test_a_range_read_fills_the_whole_shard_for_the_other_range(tmp_path, s3_bucket, s3_config, stdlib_tree):
    """A shard cut at a rank boundary: the reader of its second half downloads the whole shard
    into the node cache (its half first), so the reader of the first half finds a hit."""
    import numpy as np

    from shardstream.reading.stats import FIELDS, ReaderStats
    from shardstream.storage.cache import ShardCache

    url = f"s3://{s3_bucket}/ranged"
    pack(stdlib_tree / "email", url, s3=s3_config, progress=False)
    shard_url = f"{url}/data-000000.tar"
    whole = open_store(url, s3=s3_config).read_bytes("data-000000.tar")
    size, cut = len(whole), len(whole) // 2
    cache = ShardCache(tmp_path, cache_limit_bytes=10 * size)
    fetch = FetchConfig(part_bytes=16 << 10)
    second = ReaderStats(np.zeros(len(FIELDS)))
    for _, stream in iter_shard_streams(
        [shard_url], sizes_bytes=[size], byte_ranges=[(cut, size)], s3=s3_config, fetch=fetch, cache=cache, stats=second
    ):
        assert stream.read(size) == whole[cut:]
    for _ in range(500):  # the fill goes on to its commit by itself
        if cache.entry_path(shard_url).exists():
            break
        time.sleep(0.01)
    first = ReaderStats(np.zeros(len(FIELDS)))
    for _, stream in iter_shard_streams(
        [shard_url], sizes_bytes=[size], byte_ranges=[(0, cut)], s3=s3_config, fetch=fetch, cache=cache, stats=first
    ):
        assert stream.read(size) == whole[:cut]
    column = {name: i for i, name in enumerate(FIELDS)}
    assert second._row[column["cache_fills"]] == 1 and first._row[column["cache_hits"]] == 1
    with cache.open(shard_url, size_bytes=size) as entry:
        assert entry.read() == whole
