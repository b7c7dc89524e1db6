"""The node-local shard cache: hits, staleness, LRU eviction under a byte limit, pins, foreign
files, dead fillers' partial files, lock timeouts, and one download per shard across real
processes and threads."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time

import pytest

from shardstream.errors import CorruptShardError, StorageError
from shardstream.storage.cache import CacheFill, ShardCache

KIB = 1024


def payload(name: str, size_bytes: int) -> bytes:
    """Deterministic bytes that differ per name and per position."""
    block = hashlib.sha256(name.encode()).digest()
    return (block * (size_bytes // len(block) + 1))[:size_bytes]


def url_of(i: int) -> str:
    return f"s3://bucket/train/shard-{i:06d}.tar"


def put(cache: ShardCache, url: str, data: bytes, *, size_bytes: int | None = -1) -> CacheFill:
    """Fill ``url`` with ``data`` in a few writes; ``size_bytes`` defaults to the true size."""
    fill = cache.fill(url, size_bytes=len(data) if size_bytes == -1 else size_bytes)
    assert fill is not None
    step = max(1, len(data) // 4)
    for start in range(0, len(data), step):
        fill.write(memoryview(data)[start : start + step])
    fill.commit()
    return fill


def read_all(cache: ShardCache, url: str, *, size_bytes: int | None = None) -> bytes | None:
    shard = cache.open(url, size_bytes=size_bytes)
    if shard is None:
        return None
    with shard:
        return shard.read()


def partials(cache: ShardCache) -> list[str]:
    return sorted(p.name for p in cache.root.glob("*.partial"))


def test_miss_then_fill_then_hit_returns_the_same_bytes(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=1 << 20)
    url, data = url_of(0), payload("a", 300 * KIB + 7)
    assert cache.open(url, size_bytes=len(data)) is None
    put(cache, url, data)

    path = cache.entry_path(url)
    assert path.parent == tmp_path / "shardstream-cache-v1"
    assert path.name == hashlib.sha256(url.encode()).hexdigest()[:40] + ".shard"
    assert partials(cache) == []

    with cache.open(url, size_bytes=len(data)) as shard:
        assert shard.size_bytes == len(data) and shard.path == path
        pieces = []
        while chunk := shard.read(10_000):
            assert len(chunk) == 10_000 or len(b"".join(pieces)) + len(chunk) == len(data)
            pieces.append(chunk)
    assert b"".join(pieces) == data
    assert read_all(cache, url) == data  # size unknown: any size is a hit
    assert cache.used_bytes() == len(data)
    assert cache.stats() == {"hits": 2, "misses": 1, "fills": 1, "evictions": 0, "evicted_bytes": 0, "bypassed": 0}


def test_fill_of_unknown_size_is_cached_at_commit(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=1 << 20)
    data = payload("u", 50 * KIB)
    fill = put(cache, url_of(1), data, size_bytes=None)
    assert fill.caching
    assert read_all(cache, url_of(1), size_bytes=len(data)) == data


def test_fill_of_unknown_size_over_the_limit_is_dropped_while_written(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=100 * KIB)
    fill = put(cache, url_of(1), payload("big", 150 * KIB), size_bytes=None)
    assert not fill.caching
    assert cache.open(url_of(1)) is None
    assert partials(cache) == [] and cache.used_bytes() == 0
    assert cache.stats()["bypassed"] == 1


def test_a_stale_size_is_a_miss_and_the_entry_is_replaced(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=1 << 20)
    url, old, new = url_of(0), payload("old", 1000), payload("new", 1200)
    put(cache, url, old)
    assert cache.open(url, size_bytes=len(new)) is None
    assert not cache.entry_path(url).exists()  # nobody had it open: removed

    put(cache, url, old)
    reader = cache.open(url, size_bytes=len(old))
    assert reader is not None
    assert cache.open(url, size_bytes=len(new)) is None
    assert cache.entry_path(url).exists()  # pinned by the reader: kept
    put(cache, url, new)  # the fill replaces the name; the reader keeps the old file
    assert reader.read() == old
    reader.close()
    assert read_all(cache, url, size_bytes=len(new)) == new


def test_commit_with_the_wrong_byte_count_raises_and_caches_nothing(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=1 << 20)
    fill = cache.fill(url_of(0), size_bytes=100)
    assert fill is not None
    fill.write(b"x" * 99)
    with pytest.raises(CorruptShardError, match="shard-000000"):
        fill.commit()
    fill.abort()  # harmless after a failed commit
    assert cache.open(url_of(0)) is None and partials(cache) == []
    assert cache.fill(url_of(0), size_bytes=100) is not None  # the lock was released


def test_the_context_manager_aborts_unless_committed(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=1 << 20)
    with pytest.raises(RuntimeError), cache.fill(url_of(0), size_bytes=4) as fill:
        fill.write(b"ab")
        raise RuntimeError("download failed")
    assert partials(cache) == []
    with cache.fill(url_of(0), size_bytes=4) as fill:
        fill.write(b"ab")  # clean exit without commit: discarded too
    assert partials(cache) == [] and cache.open(url_of(0)) is None
    with cache.fill(url_of(0), size_bytes=4) as fill:
        fill.write(b"abcd")
        fill.commit()
    assert read_all(cache, url_of(0)) == b"abcd"


def test_eviction_keeps_the_most_recently_used_under_the_limit(tmp_path):
    limit = 250 * KIB
    cache = ShardCache(tmp_path, cache_limit_bytes=limit)
    data = {i: payload(str(i), 100 * KIB) for i in range(5)}
    put(cache, url_of(0), data[0])
    time.sleep(0.02)
    put(cache, url_of(1), data[1])
    time.sleep(0.02)
    assert read_all(cache, url_of(0)) == data[0]  # 0 is now more recent than 1
    time.sleep(0.02)
    put(cache, url_of(2), data[2])
    assert cache.used_bytes() <= limit
    present = {i for i in range(5) if cache.entry_path(url_of(i)).exists()}
    assert present == {0, 2}
    for i in (3, 4):
        time.sleep(0.02)
        put(cache, url_of(i), data[i])
        assert cache.used_bytes() <= limit
    assert {i for i in range(5) if cache.entry_path(url_of(i)).exists()} == {3, 4}
    for i in (3, 4):
        assert read_all(cache, url_of(i), size_bytes=len(data[i])) == data[i]
    stats = cache.stats()
    assert stats["fills"] == 5 and stats["evictions"] == 3 and stats["evicted_bytes"] == 300 * KIB


def test_a_pinned_entry_is_never_evicted(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=250 * KIB)
    data = {i: payload(str(i), 100 * KIB) for i in range(4)}
    put(cache, url_of(0), data[0])
    time.sleep(0.02)
    put(cache, url_of(1), data[1])
    pinned = cache.open(url_of(0))  # 0 is the least recently used... and open
    assert pinned is not None
    os.utime(cache.entry_path(url_of(0)), ns=(0, 0))  # ...so make it the oldest by far
    put(cache, url_of(2), data[2])
    assert cache.entry_path(url_of(0)).exists() and not cache.entry_path(url_of(1)).exists()

    also_pinned = cache.open(url_of(2))
    assert also_pinned is not None
    fill = put(cache, url_of(3), data[3])  # 200 KiB pinned: no room for 100 more
    assert not fill.caching
    assert cache.entry_path(url_of(0)).exists() and cache.entry_path(url_of(2)).exists()
    assert cache.open(url_of(3)) is None and partials(cache) == []
    assert pinned.read() == data[0] and also_pinned.read() == data[2]
    pinned.close()
    also_pinned.close()
    assert put(cache, url_of(3), data[3]).caching  # unpinned now: 0 goes
    assert not cache.entry_path(url_of(0)).exists() and cache.used_bytes() == 200 * KIB
    assert cache.stats()["bypassed"] == 1


def test_a_fill_larger_than_the_limit_bypasses_without_evicting(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=100 * KIB)
    put(cache, url_of(0), payload("0", 60 * KIB))
    big = payload("big", 101 * KIB)
    fill = put(cache, url_of(1), big)
    assert not fill.caching and fill.bytes_written == len(big)
    assert cache.entry_path(url_of(0)).exists()
    with pytest.raises(CorruptShardError):  # the size is still checked when bypassing
        bad = cache.fill(url_of(1), size_bytes=len(big))
        assert bad is not None
        bad.write(b"short")
        bad.commit()


def test_foreign_files_survive_eviction(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=150 * KIB)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"o" * 10)
    foreign = {
        tmp_path / "notes.txt": b"mine",
        cache.root / "notes.txt": b"mine too",
        cache.root / "x.shard": b"not the entry pattern",
        cache.root / ("ab" * 20 + ".shard.bak"): b"near miss",
        cache.root / ("AB" * 20 + ".shard"): b"upper case",
        cache.root / ("ab" * 20 + ".12.x.partial"): b"not the partial pattern",
        cache.root / "locks" / "keep.txt": b"lock dir",
    }
    for path, content in foreign.items():
        path.write_bytes(content)
    link = cache.root / ("cd" * 20 + ".shard")
    link.symlink_to(outside)  # entry-shaped name, but a symlink: never ours
    os.utime(link, ns=(0, 0), follow_symlinks=False)

    for i in range(6):
        put(cache, url_of(i), payload(str(i), 60 * KIB))
        assert cache.used_bytes() <= 150 * KIB
    assert cache.stats()["evictions"] == 4
    for path, content in foreign.items():
        assert path.read_bytes() == content, path
    assert link.is_symlink() and outside.read_bytes() == b"o" * 10


def test_an_entry_name_that_is_a_symlink_is_neither_read_nor_replaced(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=1 << 20)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    cache.entry_path(url_of(0)).symlink_to(outside)
    assert cache.open(url_of(0)) is None
    fill = put(cache, url_of(0), b"data!!")
    assert not fill.caching
    assert cache.entry_path(url_of(0)).is_symlink() and outside.read_bytes() == b"secret"


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_fillers_partial_is_removed_and_not_counted(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=250 * KIB)
    digest = hashlib.sha256(b"s3://bucket/gone.tar").hexdigest()[:40]
    stale = cache.root / f"{digest}.{200 * KIB}.{dead_pid()}.partial"
    stale.write_bytes(b"half a download")
    fill = cache.fill(url_of(0), size_bytes=100 * KIB)  # would not fit were the 200 KiB reserved
    assert fill is not None and fill.caching
    assert not stale.exists()
    fill.abort()


def test_a_live_fill_reserves_its_bytes(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=250 * KIB)
    first = cache.fill(url_of(0), size_bytes=200 * KIB)
    assert first is not None and first.caching
    assert len(partials(cache)) == 1 and partials(cache)[0].endswith(f".{200 * KIB}.{os.getpid()}.partial")
    second = cache.fill(url_of(1), size_bytes=100 * KIB)
    assert second is not None and not second.caching
    first.abort()
    assert partials(cache) == []
    third = cache.fill(url_of(1), size_bytes=100 * KIB)
    assert third is not None and third.caching
    third.abort()


def test_a_waiting_filler_gets_none_once_the_entry_exists(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=1 << 20)
    data = payload("w", 10 * KIB)
    first = cache.fill(url_of(0), size_bytes=len(data))
    assert first is not None
    results: list[CacheFill | None] = []
    waiter = threading.Thread(target=lambda: results.append(cache.fill(url_of(0), size_bytes=len(data))))
    waiter.start()
    time.sleep(0.1)
    assert waiter.is_alive()  # blocked on the URL lock
    first.write(data)
    first.commit()
    waiter.join(5)
    assert results == [None]
    assert read_all(cache, url_of(0)) == data


def test_the_lock_timeout_raises_a_storage_error_naming_the_url(tmp_path):
    cache = ShardCache(tmp_path, cache_limit_bytes=1 << 20, lock_timeout_s=0.2)
    holder = cache.fill(url_of(0), size_bytes=10)
    assert holder is not None
    other = ShardCache(tmp_path, cache_limit_bytes=1 << 20, lock_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"s3://bucket/train/shard-000000\.tar.*timed out") as info:
        other.fill(url_of(0), size_bytes=10)
    assert 0.2 <= time.monotonic() - started < 2
    assert str(cache.root) in str(info.value)
    holder.abort()
    assert other.fill(url_of(0), size_bytes=10) is not None


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="cache_limit_bytes"):
        ShardCache(tmp_path, cache_limit_bytes=0)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageError, match="cannot create"):
        ShardCache(tmp_path / "file", cache_limit_bytes=1)


# Run in spawned processes: all want the same shards from one cache directory.

N_SHARDS = 8
SHARD_BYTES = 64 * KIB
N_PROCESSES = 4
THREADS_PER_PROCESS = 2


def fetch_through_cache(cache: ShardCache, url: str) -> bytes:
    """What the fetcher does: open, else fill (a slow download in pieces), then open again."""
    for _ in range(100):
        shard = cache.open(url, size_bytes=SHARD_BYTES)
        if shard is not None:
            with shard:
                return shard.read()
        fill = cache.fill(url, size_bytes=SHARD_BYTES)
        if fill is None:
            continue
        with fill:
            data = payload(url, SHARD_BYTES)
            for start in range(0, SHARD_BYTES, SHARD_BYTES // 8):
                fill.write(data[start : start + SHARD_BYTES // 8])
                time.sleep(0.002)
            fill.commit()
    raise AssertionError(f"{url}: never became a hit")


def concurrent_worker(cache_dir: str, seed: int, barrier, results) -> None:
    cache = ShardCache(cache_dir, cache_limit_bytes=N_SHARDS * SHARD_BYTES, lock_timeout_s=30)
    digests: dict[str, str] = {}
    errors: list[str] = []

    def run(order: list[int]) -> None:
        try:
            for i in order:
                digest = hashlib.sha256(fetch_through_cache(cache, url_of(i))).hexdigest()
                assert digests.setdefault(url_of(i), digest) == digest
        except BaseException as exc:  # noqa: BLE001 (reported to the parent)
            errors.append(repr(exc))

    orders = [[(seed + t * 3 + k) % N_SHARDS for k in range(N_SHARDS)] for t in range(THREADS_PER_PROCESS)]
    threads = [threading.Thread(target=run, args=(order,)) for order in orders]
    barrier.wait(timeout=60)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put({"pid": os.getpid(), "stats": cache.stats(), "digests": digests, "errors": errors})


def test_processes_and_threads_download_each_shard_once(tmp_path):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(N_PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=concurrent_worker, args=(str(tmp_path), seed, barrier, results))
        for seed in range(N_PROCESSES)
    ]
    for proc in procs:
        proc.start()
    reports = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(10)
        assert proc.exitcode == 0

    expected = {url_of(i): hashlib.sha256(payload(url_of(i), SHARD_BYTES)).hexdigest() for i in range(N_SHARDS)}
    for report in reports:
        assert report["errors"] == []
        assert report["digests"] == expected
    assert sum(r["stats"]["fills"] for r in reports) == N_SHARDS
    assert sum(r["stats"]["bypassed"] for r in reports) == 0
    assert sum(r["stats"]["evictions"] for r in reports) == 0
    assert sum(r["stats"]["hits"] for r in reports) == N_PROCESSES * THREADS_PER_PROCESS * N_SHARDS
    cache = ShardCache(tmp_path, cache_limit_bytes=N_SHARDS * SHARD_BYTES)
    assert cache.used_bytes() == N_SHARDS * SHARD_BYTES and partials(cache) == []
    assert sorted(p.name for p in cache.root.glob("*.shard")) == sorted(cache.entry_path(u).name for u in expected)
