"""The key index (``keys/``): every key of small datasets written by each writer found at its
(shard, row), checked against the per-shard tables; absent keys; forced hash collisions;
damaged files named; one ranged GET per lookup on S3; the per-shard key ranges of sorted packs."""

from __future__ import annotations

import bisect
import hashlib
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shardstream import ShardWriter, open_index, pack
from shardstream.errors import IndexFormatError
from shardstream.index import KeyIndex, build_key_index, keys
from shardstream.index.manifest import MANIFEST_NAME, Manifest
from shardstream.packing.build import build_index
from shardstream.packing.from_code import pack_samples


def table_locations(index) -> dict[str, tuple[int, int]]:
    """The reference: every key's (shard, row), read from the tables."""
    where = {}
    for shard in range(index.num_shards):
        for row, key in enumerate(index.table(shard).keys()):
            assert key not in where
            where[key] = (shard, row)
    return where


def check_every_key(dest, *, s3=None, collisions=None) -> KeyIndex:
    index = open_index(dest, s3=s3)
    found = KeyIndex.open(index)
    assert found is not None
    reference = table_locations(index)
    assert found.num_keys == len(reference) == index.num_samples
    for key, location in reference.items():
        candidates = found.lookup(key)
        assert location in candidates
        assert [c for c in candidates if index.table(c[0]).key(c[1]) == key] == [location]
    absent = found.lookup("no-such-key")
    assert not [c for c in absent if index.table(c[0]).key(c[1]) == "no-such-key"]
    if collisions is None:
        assert absent == []
    return found


def source_tree(root: Path, n: int = 60) -> Path:
    for i in range(n):
        (root / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 3}" / f"s{i:03d}.txt").write_text(f"text {i}")
        (root / f"d{i % 3}" / f"s{i:03d}.json").write_text(f'{{"i": {i}}}')
    return root


def make_sample(i: int) -> dict:
    return {"__key__": f"k{i:04d}", "txt": f"sample {i}"}


def test_shuffled_pack_finds_every_key(tmp_path):
    pack(source_tree(tmp_path / "src"), tmp_path / "ds", shuffle=True, max_samples_per_shard=7, progress=False)
    check_every_key(tmp_path / "ds")
    assert Manifest.open_file(tmp_path / "ds" / MANIFEST_NAME).key_ranges() is None


def test_shard_writer_finds_every_key(tmp_path):
    with ShardWriter(tmp_path / "ds", max_samples_per_shard=9) as writer:
        for i in [5, 3, 40, 1, 22, 7, 30, 2, 11, 0, 17, 8, 33, 19, 4, 6, 9, 10, 12, 13]:
            writer.write(make_sample(i))
    check_every_key(tmp_path / "ds")


def test_pack_samples_finds_every_key(tmp_path):
    pack_samples(make_sample, range(50), tmp_path / "ds", max_samples_per_shard=6, progress=False)
    check_every_key(tmp_path / "ds")


def test_foreign_dataset_indexed_elsewhere_finds_every_key(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for s in range(3):
        with tarfile.open(shards / f"f-{s}.tar", "w") as tar:
            for i in range(10):
                path = tmp_path / "payload"
                path.write_bytes(os.urandom(50 + i))
                tar.add(path, arcname=f"z{(7 * i + s) % 10}-{s}/{i}.bin")
    build_index([str(p) for p in sorted(shards.iterdir())], output=str(tmp_path / "index"), workers=1)
    check_every_key(tmp_path / "index")


def test_sorted_pack_records_key_ranges_a_reader_can_bisect(tmp_path):
    pack(source_tree(tmp_path / "src"), tmp_path / "ds", max_samples_per_shard=7, progress=False)
    index = open_index(tmp_path / "ds")
    ranges = index.manifest.key_ranges()
    assert ranges is not None
    first, last = ranges
    reference = table_locations(index)
    assert len(first) == index.num_shards
    for key, (shard, row) in reference.items():
        s = bisect.bisect_right(first, key) - 1
        assert s == shard and key <= last[s]
        assert bisect.bisect_left(index.table(s).keys(), key) == row


def test_index_keys_adds_an_index_to_a_dataset_without_one(tmp_path):
    pack(source_tree(tmp_path / "src"), tmp_path / "ds", shuffle=True, max_samples_per_shard=5, progress=False)
    shutil.rmtree(tmp_path / "ds" / "keys")
    assert KeyIndex.open(open_index(tmp_path / "ds")) is None
    report = build_key_index(tmp_path / "ds")
    assert report.num_keys == 60 and report.bytes > 0
    check_every_key(tmp_path / "ds")


def test_many_partitions_and_spills_keep_every_key(tmp_path, monkeypatch):
    monkeypatch.setattr(keys, "_PARTITION_KEYS", 16)
    monkeypatch.setattr(keys, "_BUCKET_KEYS", 4)
    monkeypatch.setattr(keys, "_BUFFER_KEYS", 10)
    pack_samples(make_sample, range(200), tmp_path / "ds", max_samples_per_shard=13, progress=False)
    found = check_every_key(tmp_path / "ds")
    assert found.num_partitions >= 8
    assert len(os.listdir(tmp_path / "ds" / "keys")) == found.num_partitions + 1


def tiny_hash(values: list[bytes]) -> np.ndarray:
    """A test-only hash with 4 values: most keys collide."""
    return np.array([(hashlib.md5(v).digest()[0] % 4) << 62 for v in values], dtype=np.uint64)


def test_hash_collisions_give_every_candidate(tmp_path, monkeypatch):
    monkeypatch.setattr(keys, "hash_keys", tiny_hash)
    pack_samples(make_sample, range(80), tmp_path / "ds", max_samples_per_shard=9, progress=False)
    found = check_every_key(tmp_path / "ds", collisions=True)
    assert len(found.lookup("k0001")) > 1


def test_bucket_boundaries_hold_equal_high_bits(tmp_path, monkeypatch):
    """Many buckets, and hashes that differ only in their low bits: all in one bucket."""
    monkeypatch.setattr(keys, "_BUCKET_KEYS", 2)
    monkeypatch.setattr(
        keys,
        "hash_keys",
        lambda vs: np.array([len(v) + (hashlib.md5(v).digest()[0] % 2 << 63) for v in vs], dtype=np.uint64),
    )
    pack_samples(make_sample, range(40), tmp_path / "ds", max_samples_per_shard=9, progress=False)
    check_every_key(tmp_path / "ds", collisions=True)


@pytest.fixture
def written(tmp_path) -> Path:
    pack_samples(make_sample, range(300), tmp_path / "ds", max_samples_per_shard=50, progress=False)
    return tmp_path / "ds"


def test_truncated_partition_is_named(written):
    part = written / "keys" / "part-000000.bin"
    part.write_bytes(part.read_bytes()[:-100])
    found = KeyIndex.open(open_index(written))
    with pytest.raises(IndexFormatError, match="part-000000.bin"):
        for i in range(300):
            found.lookup(f"k{i:04d}")


def test_damaged_partition_is_named(written):
    part = written / "keys" / "part-000000.bin"
    data = bytearray(part.read_bytes())
    offset = KeyIndex.open(open_index(written))._offset[0]
    data[offset:] = os.urandom(len(data) - offset)
    part.write_bytes(bytes(data))
    found = KeyIndex.open(open_index(written))
    with pytest.raises(IndexFormatError, match="part-000000.bin"):
        for i in range(300):
            found.lookup(f"k{i:04d}")


@pytest.mark.parametrize("cut", [4, 40, -8])
def test_damaged_header_is_named(written, cut):
    header = written / "keys" / "header.bin"
    header.write_bytes(header.read_bytes()[:cut])
    with pytest.raises(IndexFormatError, match="header.bin"):
        KeyIndex.open(open_index(written))


def test_stale_key_index_is_refused(written, tmp_path):
    other = tmp_path / "other"
    pack_samples(make_sample, range(301), other, max_samples_per_shard=50, progress=False)
    shutil.rmtree(written / "keys")
    shutil.copytree(other / "keys", written / "keys")
    with pytest.raises(IndexFormatError, match="stale"):
        KeyIndex.open(open_index(written))


def test_layout_at_ten_billion_keys():
    pbits, bbits = keys.layout_bits(10**10)
    assert 10**10 / 2**pbits <= 2**21  # a partition sorts in memory
    assert 128 < 10**10 / 2 ** (pbits + bbits) <= 256  # a bucket: a few KB


def test_one_ranged_get_per_lookup_on_s3(s3_config, s3_bucket):
    url = f"s3://{s3_bucket}/ds"
    with ShardWriter(url, s3=s3_config, max_samples_per_shard=40) as writer:
        for i in range(120):
            writer.write(make_sample(i))
    index = open_index(url, s3=s3_config)
    found = KeyIndex.open(index)
    assert found is not None
    store = found._get_store()
    calls = []
    real = store.get_range

    async def counted(name, start, end, **kwargs):
        calls.append((name, start, end))
        return await real(name, start, end, **kwargs)

    store.get_range = counted
    reference = table_locations(index)
    for n, (key, location) in enumerate(sorted(reference.items())[:30], start=1):
        assert location in found.lookup(key)
        assert len(calls) == n
        assert calls[-1][2] - calls[-1][1] <= 8192
    assert all(name.startswith("keys/part-") for name, _, _ in calls)
    store.delete("keys/header.bin")
    assert KeyIndex.open(open_index(url, s3=s3_config)) is None


def test_a_smaller_rebuild_drops_the_old_partitions(tmp_path, monkeypatch):
    monkeypatch.setattr(keys, "_PARTITION_KEYS", 16)
    monkeypatch.setattr(keys, "_BUCKET_KEYS", 4)
    pack_samples(make_sample, range(100), tmp_path / "ds", max_samples_per_shard=13, progress=False)
    assert len(list((tmp_path / "ds" / "keys").iterdir())) > 2
    monkeypatch.undo()
    assert build_key_index(tmp_path / "ds").num_partitions == 1
    assert sorted(p.name for p in (tmp_path / "ds" / "keys").iterdir()) == ["header.bin", "part-000000.bin"]
    check_every_key(tmp_path / "ds")


def test_overwrite_replaces_the_key_index(tmp_path):
    pack_samples(make_sample, range(100), tmp_path / "ds", max_samples_per_shard=13, progress=False)
    pack_samples(make_sample, range(10, 30), tmp_path / "ds", overwrite=True, progress=False)
    found = check_every_key(tmp_path / "ds")
    assert found.lookup("k0005") == []


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_ray_pack_finds_every_key(tmp_path, ray_cluster):
    import subprocess
    import sys

    src = source_tree(tmp_path / "src", 80)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "shardstream"), "pack", str(src), str(tmp_path / "ray"), "--shuffle"]
        + ["--ray", ray_cluster.address, "--shard-size", "4000"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ray_cluster.env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pack(src, tmp_path / "local", shuffle=True, max_shard_bytes=4000, progress=False)
    check_every_key(tmp_path / "ray")
    for name in ("header.bin", "part-000000.bin"):  # the same bytes as on one machine
        assert (tmp_path / "ray" / "keys" / name).read_bytes() == (tmp_path / "local" / "keys" / name).read_bytes()


def test_the_index_keys_command_adds_a_key_index_that_finds_every_key(tmp_path):
    """`shardstream index keys DEST` on a shuffled pack whose key index was removed: its report
    line, then every key found through it at its (shard, row), checked against the tables."""
    import shutil

    from shardstream import open_index, pack
    from shardstream.cli import main as cli_main
    from shardstream.index import KeyIndex

    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"{i:03d}.txt").write_text(str(i))
    pack(src, tmp_path / "ds", shuffle=True, max_samples_per_shard=7, progress=False)
    shutil.rmtree(tmp_path / "ds" / "keys")
    index = open_index(tmp_path / "ds")
    assert KeyIndex.open(index) is None
    assert cli_main(["index", "keys", str(tmp_path / "ds"), "--no-progress"]) == 0
    index = open_index(tmp_path / "ds")
    keys = KeyIndex.open(index)
    assert keys is not None and keys.num_keys == 40
    for shard in range(index.num_shards):
        for row, key in enumerate(index.table(shard).keys()):
            assert (shard, row) in keys.lookup(key)
    assert keys.lookup("absent") == []
