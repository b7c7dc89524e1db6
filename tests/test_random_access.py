"""Random access by index and by key (shardstream.reading.access, ShardDataset[i], .get,
.get_many), on local datasets, each read compared byte for byte with the streaming read or
Python's tarfile."""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
import tarfile
from pathlib import Path

import pytest
from test_dataset import make_dataset

from shardstream import ShardDataset, Source, open_index
from shardstream.errors import CorruptShardError
from shardstream.index import Manifest, ShardTable
from shardstream.reading.access import SampleAccess
from shardstream.storage import write_pieces
from shardstream.storage.local import LocalStore

pytestmark = pytest.mark.timeout(300)


def streamed(location) -> list[dict]:
    return [dict(s) for s in ShardDataset(location, shuffle=False)]


def raw(sample: dict) -> dict:
    return {k: (bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else v) for k, v in sample.items()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("ra"), num_samples=45, per_shard=8)  # 6 shards, the last of 5


def test_every_index_and_key_matches_the_streaming_read(dataset):
    dest, keys = dataset
    expected = streamed(dest)
    ds = ShardDataset(dest, shuffle=False)
    assert [raw(ds[i]) for i in range(len(expected))] == [raw(s) for s in expected]
    assert [raw(ds.get(k)) for k in keys] == [raw(s) for s in expected]
    assert [raw(s) for s in ds.get_many(list(range(len(expected))))] == [raw(s) for s in expected]


def test_raw_samples_carry_their_global_index_and_one_request_per_cold_sample(dataset):
    dest, _ = dataset
    access = SampleAccess(open_index(dest))
    samples = access.read([access.locate(i) for i in (0, 9, 44)])
    assert [s["__index__"] for s in samples] == [0, 9, 44]
    stats = access.stats()
    assert stats["requests"] == 3 and stats["tables_fetched"] == 3
    payload = sum(len(v) for s in samples for k, v in s.items() if not k.startswith("__"))
    assert payload <= stats["bytes_read"] <= payload + 3 * 2 * 1024  # headers and padding only


def test_a_batch_of_one_shard_is_one_merged_request(dataset):
    dest, keys = dataset
    access = SampleAccess(open_index(dest))
    samples = access.read([access.locate(i) for i in (5, 0, 3, 7)])
    assert [s["__key__"] for s in samples] == [keys[5], keys[0], keys[3], keys[7]]
    assert access.stats()["requests"] == 1
    apart = SampleAccess(open_index(dest), merge_gap_bytes=0)
    apart.read([apart.locate(i) for i in (0, 3, 7)])
    assert apart.stats()["requests"] == 3


def test_negative_indices_slices_and_errors(dataset):
    dest, keys = dataset
    ds = ShardDataset(dest, shuffle=False)
    assert ds[-1]["__key__"] == keys[-1]
    assert ds[-45]["__key__"] == keys[0]
    assert [s["__key__"] for s in ds[3:20:4]] == keys[3:20:4]
    assert [s["__key__"] for s in ds[::-7]] == keys[::-7]
    with pytest.raises(IndexError, match=r"45 is out of range.*45 samples"):
        ds[45]
    with pytest.raises(IndexError, match="-46"):
        ds[-46]
    with pytest.raises(KeyError, match=r"'class0/nope'.*dataset at"):
        ds.get("class0/nope")
    mixed = ds.get_many([keys[4], 2, -1])
    assert [s["__key__"] for s in mixed] == [keys[4], keys[2], keys[-1]]


def test_decode_and_fields_apply_as_when_streaming(dataset):
    dest, keys = dataset
    ds = ShardDataset(dest, shuffle=False, fields=("txt", "cls"))
    assert ds[7] == list(ShardDataset(dest, shuffle=False, fields=("txt", "cls")))[7]
    ds = ShardDataset(dest, shuffle=False, decode=lambda s: s["__key__"].upper())
    assert ds.get(keys[2]) == keys[2].upper()


def test_mixtures_refuse_random_access(dataset):
    dest, _ = dataset
    ds = ShardDataset([Source(dest, weight=1, name="a"), Source(dest, weight=1, name="b")], epoch_samples=10)
    with pytest.raises(TypeError, match="not a mixture"):
        ds[0]


def test_pickles_without_connections_and_reads_in_the_copy(dataset):
    dest, keys = dataset
    access = SampleAccess(open_index(dest))
    access.read([access.locate(0)])
    copy = pickle.loads(pickle.dumps(access))
    assert copy.stats()["requests"] == 0
    assert copy.read([copy.locate(10)])[0]["__key__"] == keys[10]


def test_a_replaced_shard_raises_naming_it(tmp_path):
    dest, _ = make_dataset(tmp_path, num_samples=16, per_shard=8)
    index = open_index(dest)
    name = index.manifest.name(1)
    # same size, other bytes: shard 0's samples written over shard 1 (a shard rewritten in place)
    data = (dest / index.manifest.name(0)).read_bytes()
    assert len(data) == (dest / name).stat().st_size
    other = tmp_path / "other.tar"
    other.write_bytes(data)
    os.replace(other, dest / name)
    ds = ShardDataset(dest, shuffle=False)
    with pytest.raises(CorruptShardError, match=rf"{name}.*does not match the index"):
        ds[8]
    # another size
    with open(dest / name, "ab") as f:
        f.write(bytes(1024))
    ds = ShardDataset(dest, shuffle=False)
    with pytest.raises(CorruptShardError, match=rf"{name}: is \d+ bytes but was \d+ bytes when indexed"):
        ds[9]


def test_long_member_names_and_pax_headers(tmp_path):
    """A foreign shard of long (GNU) and PAX names, indexed in place with index build --output."""
    from shardstream import build_index

    shards = tmp_path / "shards"
    shards.mkdir()
    expected = {}
    for n, fmt in enumerate((tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)):
        with tarfile.open(shards / f"part-{n}.tar", "w", format=fmt) as tar:
            for i in range(5):
                key = f"{'d' * 120}/s{n}-{i}" if i % 2 else f"k{n}-{i}-é"
                for ext, body in (("txt", f"text {n} {i}".encode()), ("bin", bytes(range(i * 50 % 256)) * 3)):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(body)
                    tar.addfile(info, __import__("io").BytesIO(body))
                    expected.setdefault(key, {})[ext] = body
    out = tmp_path / "index"
    build_index([str(shards)], output=str(out), workers=1)
    index = open_index(out)
    assert index.manifest.foreign
    access = SampleAccess(index)
    got = access.read([access.locate(i) for i in range(access.num_samples)])
    assert {s["__key__"]: {"txt": s["txt"], "bin": s["bin"]} for s in got} == expected
    by_stream = {s["__key__"]: raw(s) for s in streamed(out)}
    ds = ShardDataset(out, shuffle=False)
    for key in expected:
        assert raw(ds.get(key)) == by_stream[key]


def _compressed_copy(src: Path, dest: Path, compress) -> Path:
    """``src`` with every shard compressed, and an index whose tables address the tar inside."""
    index = open_index(src)
    m = index.manifest
    dest.mkdir()
    names, sizes = [], []
    store = LocalStore(dest)
    for i in range(m.num_shards):
        name = m.name(i) + (".gz" if compress is gzip.compress else ".zst")
        data = compress((src / m.name(i)).read_bytes())
        (dest / name).write_bytes(data)
        names.append(name)
        sizes.append(len(data))
        table = index.table(i)
        write_pieces(
            store,
            name + ".samples",
            ShardTable.from_samples(name, ((k, list(members)) for k, members in table.samples())).pieces(),
        )
    import zlib

    crcs = [zlib.crc32((dest / n).read_bytes()) for n in names]
    manifest = Manifest.from_columns(
        names=names,
        shard_bytes=sizes,
        shard_samples=m.shard_samples.tolist(),
        shard_members=m.shard_members.tolist(),
        crc32=crcs,
        url=str(dest / "index.bin"),
    )
    write_pieces(store, "index.bin", manifest.pieces())
    return dest


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_compressed_shards_are_read_whole(dataset, tmp_path, kind):
    dest, keys = dataset
    if kind == "gz":
        compress = gzip.compress
    else:
        zstandard = pytest.importorskip("zstandard")
        compress = zstandard.ZstdCompressor().compress
    packed = _compressed_copy(dest, tmp_path / "c", compress)
    expected = [raw(s) for s in streamed(dest)]
    access = SampleAccess(open_index(packed))
    for i in (0, 9, 44, 17):
        got = raw(access.read([access.locate(i)])[0])
        del got["__index__"]
        assert got["__key__"] == keys[i]
        assert {k: v for k, v in got.items() if k != "__shard__"} == {
            k: v for k, v in expected[i].items() if k != "__shard__"
        }
    batch = access.read([access.locate(i) for i in range(8, 16)])
    assert [s["__key__"] for s in batch] == keys[8:16]


def test_the_table_lru_is_bounded(dataset):
    dest, _ = dataset
    access = SampleAccess(open_index(dest), max_tables=2)
    access.read([access.locate(i) for i in range(0, 45, 8)])
    assert len(access._tables) == 2
    with pytest.raises(ValueError, match="max_tables"):
        SampleAccess(open_index(dest), max_tables=0)


def test_keys_of_an_unsorted_dataset_ask_for_a_key_index(tmp_path):
    dest, keys = make_dataset(tmp_path, num_samples=24, per_shard=8)
    # swap two shards in the manifest order: their keys no longer ascend across shards
    index = open_index(dest)
    m = index.manifest
    order = [2, 1, 0]
    manifest = Manifest.from_columns(
        names=[m.name(i) for i in order],
        shard_bytes=[int(m.shard_bytes[i]) for i in order],
        shard_samples=[int(m.shard_samples[i]) for i in order],
        shard_members=[int(m.shard_members[i]) for i in order],
        crc32=[int(m.crc32[i]) for i in order],
        url=str(dest / "index.bin"),
    )
    write_pieces(LocalStore(dest), "index.bin", manifest.pieces())
    shutil.rmtree(dest / "keys", ignore_errors=True)  # a key index pack wrote is stale now
    ds = ShardDataset(dest, shuffle=False)
    assert ds[0]["__key__"] == keys[16]
    keys_module = pytest.importorskip("shardstream.index.keys")
    if keys_module.KeyIndex.open(open_index(dest)) is None:
        with pytest.raises(ValueError, match="shardstream index keys"):
            ds.get(keys[0])
    keys_module.build_key_index(dest)
    expected = {s["__key__"]: raw(s) for s in streamed(dest)}
    ds = ShardDataset(dest, shuffle=False)
    for key in keys:
        assert raw(ds.get(key)) == expected[key]
    with pytest.raises(KeyError, match="absent"):
        ds.get("absent")


def test_a_shuffled_dataset_by_key_through_its_key_index(tmp_path):
    keys_module = pytest.importorskip("shardstream.index.keys")
    from shardstream import pack

    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"{i:03d}.txt").write_text(f"text {i}")
        (src / f"{i:03d}.json").write_text(f'{{"i": {i}}}')
    pack(src, tmp_path / "ds", max_samples_per_shard=6, shuffle=True, seed=3, progress=False)
    dest = tmp_path / "ds"
    if keys_module.KeyIndex.open(open_index(dest)) is None:
        keys_module.build_key_index(dest)
    expected = {s["__key__"]: raw(s) for s in streamed(dest)}
    assert [k for k in expected] != sorted(expected)  # shuffled over shards
    access = SampleAccess(open_index(dest))
    ds = ShardDataset(dest, shuffle=False)
    for key in sorted(expected):
        assert raw(ds.get(key)) == expected[key]
        shard, row = access.find(key)
        assert access.read([(shard, row)])[0]["__key__"] == key
    assert access.find("999") is None


def test_keys_without_a_key_index_by_binary_search_over_sorted_shards(tmp_path):
    dest, keys = make_dataset(tmp_path, num_samples=64, per_shard=4)  # 16 shards, keys sorted
    shutil.rmtree(dest / "keys", ignore_errors=True)
    expected = {s["__key__"]: raw(s) for s in streamed(dest)}
    for key in (keys[0], keys[29], keys[-1]):
        access = SampleAccess(open_index(dest))
        access.index.manifest.set_key_ranges(None)  # as an index written before key ranges were recorded
        found = access.find(key)
        assert found is not None and access.stats()["tables_fetched"] <= 5  # log2(16) + 1
        got = raw(access.read([found])[0])
        del got["__index__"]
        assert got == expected[key]
    access = SampleAccess(open_index(dest))
    access.index.manifest.set_key_ranges(None)
    assert access.find("class0/00001x") is None
