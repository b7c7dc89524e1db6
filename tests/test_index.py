"""The version 2 index: a manifest read alone at open (tables only where needed), version 1
datasets still open and upgrade in place, damage is named, and the manifest is shared with
DataLoader workers rather than copied."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys

import pytest
from test_dataset import make_dataset
from torch.utils.data import DataLoader

from shardstream import Manifest, ShardDataset, open_index
from shardstream.cli import main as cli_main
from shardstream.errors import IndexFormatError, ShardNotFoundError


def keys_of(dataset) -> list[str]:
    return [s["__key__"] for s in dataset]


def collate_keys(batch) -> list[str]:
    return [s["__key__"] for s in batch]


@pytest.fixture
def dataset_dir(tmp_path):
    return make_dataset(tmp_path, num_samples=95, per_shard=10)  # 10 shards, the last of 5


def test_pack_writes_a_manifest_and_a_table_beside_each_shard(dataset_dir):
    dest, keys = dataset_dir
    shards = sorted(p.name for p in dest.glob("*.tar"))
    assert sorted(p.name for p in dest.glob("*.samples")) == [s + ".samples" for s in shards]
    assert (dest / "index.bin").exists() and not (dest / "index.json").exists()
    index = open_index(dest)
    assert list(index.manifest.names()) == shards
    assert index.manifest.shard_samples.tolist() == [10] * 9 + [5]
    assert [k for i in range(index.num_shards) for k in index.table(i).keys()] == keys


def test_opening_and_whole_shard_reads_need_no_table(dataset_dir, monkeypatch):
    dest, keys = dataset_dir
    for table in dest.glob("*.samples"):
        table.unlink()
    assert keys_of(ShardDataset(dest, shuffle=False)) == keys  # one reader: whole shards only
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # rank 0 reads samples 0-47: it ends inside shard 4
    with pytest.raises(ShardNotFoundError, match=r"data-000004\.tar\.samples: the sample table of shard data-000004"):
        keys_of(ShardDataset(dest, shuffle=False))


def test_a_version_1_dataset_opens_and_upgrades_in_place(dataset_dir, tmp_path):
    dest, keys = dataset_dir
    legacy = tmp_path / "legacy"
    shutil.copytree(dest, legacy)
    index_json = open_index(dest).as_v1().to_json()
    for path in [legacy / "index.bin", *legacy.glob("*.samples")]:
        path.unlink()
    (legacy / "index.json").write_bytes(index_json)
    shards = {p.name: p.read_bytes() for p in legacy.glob("*.tar")}
    dataset = ShardDataset(legacy, shuffle_buffer=10, seed=2)
    reference = ShardDataset(dest, shuffle_buffer=10, seed=2)
    assert keys_of(dataset) == keys_of(reference)  # the same epoch order from either version
    assert cli_main(["index", "upgrade", str(legacy)]) == 0
    assert not (legacy / "index.json").exists()
    assert (legacy / "index.bin").read_bytes() == (dest / "index.bin").read_bytes()  # as pack writes it
    assert {p.name: p.read_bytes() for p in legacy.glob("*.samples")} == {
        p.name: p.read_bytes() for p in dest.glob("*.samples")
    }
    assert {p.name: p.read_bytes() for p in legacy.glob("*.tar")} == shards  # untouched


@pytest.mark.parametrize("damage", ["truncate", "magic", "totals"])
def test_a_damaged_manifest_is_named(dataset_dir, damage):
    dest, _ = dataset_dir
    path = dest / "index.bin"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) - 40]
    elif damage == "magic":
        data[:8] = b"NOTINDEX"
    else:  # a shard's sample count changed: the totals in the header disagree
        index = open_index(dest)
        count_at = data.index(index.manifest.shard_samples.tobytes())
        data[count_at] += 1
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match=rf"{path}: "):
        ShardDataset(dest)


def test_a_table_that_disagrees_with_the_manifest_is_named(dataset_dir, tmp_path):
    dest, _ = dataset_dir
    other, _ = make_dataset(tmp_path / "other", num_samples=95, per_shard=7)
    shutil.copy(other / "data-000000.tar.samples", dest / "data-000000.tar.samples")
    with pytest.raises(
        IndexFormatError, match=r"data-000000\.tar\.samples: 7 samples and 14 members, but the index says 10"
    ):
        open_index(dest).table(0)


def test_the_manifest_is_mapped_not_copied_into_workers(dataset_dir):
    dest, keys = dataset_dir
    manifest = open_index(dest).manifest
    state = pickle.dumps(manifest)
    assert len(state) < 1000  # the file's path, not its columns
    again = pickle.loads(state)
    assert again.shard_bytes.tolist() == manifest.shard_bytes.tolist() and again.name(3) == manifest.name(3)
    loader = DataLoader(
        ShardDataset(dest, shuffle=False, batch_size=5),
        batch_size=5,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=collate_keys,
    )
    assert sorted(k for batch in loader for k in batch) == sorted(keys)


def test_built_from_columns_and_parsed_back(tmp_path):
    manifest = Manifest.from_columns(
        names=["a.tar", "b.tar"],
        shard_bytes=[10240, 20480],
        shard_samples=[1, 2],
        shard_members=[2, 4],
        crc32=[0xDEADBEEF, 7],
    )
    parsed = Manifest.parse(b"".join(manifest.pieces()), url="mem")
    assert list(parsed.names()) == ["a.tar", "b.tar"] and parsed.crc32_hex(0) == "deadbeef"
    assert parsed.totals() == {"num_shards": 2, "num_samples": 3, "num_members": 6, "bytes": 30720}
    with pytest.raises(IndexFormatError, match="plain file names"):
        Manifest.from_columns(names=["x/y.tar"], shard_bytes=[1], shard_samples=[1], shard_members=[1], crc32=[0])


def test_info_reads_the_manifest_without_torch(dataset_dir):
    dest, _ = dataset_dir
    code = (
        "import sys; from shardstream.cli import main; code = main(['info', sys.argv[1]]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)"
    )
    run = subprocess.run([sys.executable, "-c", code, str(dest)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "10 shards, 95 samples, 190 members" in run.stdout
    assert "samples per shard: min 5, median 10, max 10" in run.stdout
