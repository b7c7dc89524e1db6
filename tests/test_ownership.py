"""No writer deletes or replaces what it did not write (issue 51, point 2): a destination holding
a user's ``data-000000.tar``, a user's ``data-000007.tar`` beside a dataset under
``--overwrite``, and unrelated files, compared byte for byte before and after; for ``pack``,
``ShardWriter``, ``pack_samples``, ``index build --output``; on local disk and S3."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_pack_scale import make_tree

from shardstream import DestinationError, ShardWriter, open_index, pack, pack_samples
from shardstream.storage import open_store

SHARDSTREAM = str(Path(sys.executable).parent / "shardstream")
USERS = {"data-000000.tar": b"a user's own tar, not a shard of ours", "notes.txt": b"mine", "keep/x.bin": b"x" * 10}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHARDSTREAM, *args], capture_output=True, text=True, env=env, timeout=300)


def put(dest: str, files: dict[str, bytes], s3=None) -> None:
    """A user's files, written as a user's tools write them (no shardstream store locally)."""
    for name, data in files.items():
        if dest.startswith("s3://"):
            open_store(dest, s3=s3).write_bytes(name, data)
        else:
            Path(dest, name).parent.mkdir(parents=True, exist_ok=True)
            Path(dest, name).write_bytes(data)


def everything(dest: str, s3=None) -> dict[str, bytes]:
    """Every object under ``dest`` (every file, at any depth, locally), by name."""
    if dest.startswith("s3://"):
        store = open_store(dest, s3=s3)
        return {name: store.read_bytes(name) for name in store.list_names()}
    root = Path(dest)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def user_files_untouched(dest: str, files: dict[str, bytes], s3=None) -> None:
    there = everything(dest, s3)
    assert {name: there.get(name) for name in files} == files


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """``(dest, s3 config or None, environment for the CLI)`` on local disk and on S3."""
    if request.param == "local":
        return str(tmp_path / "dest"), None, None
    server = request.getfixturevalue("s3_server")
    bucket, config = request.getfixturevalue("s3_bucket"), request.getfixturevalue("s3_config")
    return f"s3://{bucket}/dest", config, {**os.environ, **server.info.env()}


def test_a_destination_holding_a_users_files_with_our_names_is_refused(tmp_path, where):
    dest, s3, env = where
    src = make_tree(tmp_path / "src", classes=2, per_class=10)
    put(dest, USERS, s3)
    before = everything(dest, s3)
    done = cli("pack", str(src), dest, "--max-samples-per-shard", "5", "--no-progress", env=env)
    url = open_store(dest, s3=s3).url
    assert done.returncode == 1 and done.stderr == (
        f"shardstream: error: {url} holds 1 file with names this pack writes that no index or pack state there "
        "records: data-000000.tar; move it away or pick another DEST or shard name, or pass --clobber to let this "
        "pack write over it (nothing else there is touched)\n"
    )
    with pytest.raises(DestinationError, match="data-000000.tar; .* pass clobber=True to let this ShardWriter"):
        ShardWriter(dest, s3=s3)
    with pytest.raises(DestinationError, match="data-000000.tar; .* pass clobber=True to let pack_samples"):
        pack_samples(dict, [], dest, s3=s3, progress=False)
    assert everything(dest, s3) == before  # byte for byte, nothing added
    # --clobber writes over the names it writes, and nothing else
    done = cli("pack", str(src), dest, "--max-samples-per-shard", "5", "--clobber", "--no-progress", env=env)
    assert done.returncode == 0, done.stderr
    after = everything(dest, s3)
    assert after["data-000000.tar"] != USERS["data-000000.tar"]
    user_files_untouched(dest, {k: v for k, v in USERS.items() if k != "data-000000.tar"}, s3)
    assert open_index(dest, s3=s3).num_samples == 20


def test_overwrite_deletes_only_what_the_old_dataset_recorded(tmp_path, where):
    dest, s3, env = where
    src = make_tree(tmp_path / "src", classes=2, per_class=15)
    pack(src, dest, max_samples_per_shard=5, s3=s3, progress=False)  # data-000000 ... data-000005
    mine = {"data-000007.tar": b"a user's tar beside the dataset", "notes.txt": b"mine", "keep/x.bin": b"x"}
    put(dest, mine, s3)
    before = everything(dest, s3)
    refused = cli("pack", str(src), dest, "--max-samples-per-shard", "3", "--overwrite", "--no-progress", env=env)
    assert refused.returncode == 1 and "records: data-000007.tar; move it away" in refused.stderr
    assert everything(dest, s3) == before  # refused before anything was deleted
    # with --clobber too, the old dataset goes, the user's files stay, and the summary lists them
    done = cli("pack", str(src), dest, "--max-samples-per-shard", "6", "--overwrite", "--clobber", "--no-progress", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "; kept what the earlier dataset did not record: data-000007.tar, keep/, notes.txt\n" in done.stdout
    user_files_untouched(dest, mine, s3)
    shards = sorted(n for n in everything(dest, s3) if n.endswith(".tar"))
    assert shards == [f"data-{i:06d}.tar" for i in range(5)] + ["data-000007.tar"]
    assert open_index(dest, s3=s3).num_samples == 30
    # ShardWriter(overwrite=True) too: the dataset goes, the rest stays
    with ShardWriter(dest, overwrite=True, s3=s3, name="w") as writer:
        writer.write({"__key__": "a", "txt": "x"})
    user_files_untouched(dest, mine, s3)
    assert not any(n.startswith("data-00000") and n != "data-000007.tar" for n in everything(dest, s3))


def test_a_reshard_refuses_a_users_file_too(tmp_path):
    src = make_tree(tmp_path / "src", classes=2, per_class=10)
    pack(src, tmp_path / "ds", max_samples_per_shard=5, progress=False)
    dest = tmp_path / "re"
    put(str(dest), USERS)
    with pytest.raises(DestinationError, match="records: data-000000.tar; move it away .* pass --clobber"):
        pack(tmp_path / "ds", dest, from_shards=True, progress=False)
    assert everything(str(dest)) == USERS


def test_index_build_output_refuses_tables_and_keys_it_did_not_write(tmp_path):
    src = make_tree(tmp_path / "src", classes=2, per_class=10)
    pack(src, tmp_path / "ds", max_samples_per_shard=5, progress=False)
    shards = tmp_path / "shards"
    shards.mkdir()
    for shard in sorted((tmp_path / "ds").glob("*.tar")):
        (shards / shard.name).write_bytes(shard.read_bytes())
    out = tmp_path / "out"
    out.mkdir()
    (out / "data-000001.tar.samples").write_bytes(b"someone's")
    (out / "other.txt").write_bytes(b"mine")
    refused = cli("index", "build", str(shards), "--output", str(out), "--no-progress")
    assert refused.returncode == 1 and "records: data-000001.tar.samples; move it away" in refused.stderr
    assert "pass --overwrite to let index build write over it" in refused.stderr
    assert sorted(p.name for p in out.iterdir()) == ["data-000001.tar.samples", "other.txt"]
    assert cli("index", "build", str(shards), "--output", str(out), "--overwrite", "--no-progress").returncode == 0
    assert open_index(out).num_samples == 20 and (out / "other.txt").read_bytes() == b"mine"
