"""Datasets read from every store as from S3, against real local servers: nginx (http, and https
with a self-signed certificate trusted through SSL_CERT_FILE), a fake
Hugging Face Hub (hf://), gcp-storage-emulator (gs://) and Azurite (az://).

Each ``remote`` parameter holds the same packed dataset in one store; the tests read it the way
training does (DataLoader workers that persist across epochs, ranks, resume, the node cache)
and compare with reading the local copy. Store-specific behaviour (a revision pinned on the
Hub, its token kept to the Hub's host, a server that ignores Range, writes to gs:// and az://)
follows.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_dataset import make_dataset
from torch.utils.data import DataLoader

from shardstream import FetchConfig, ShardDataset, open_index
from shardstream.dataset import loader_state_dict
from shardstream.errors import CorruptShardError, StorageError

pytestmark = pytest.mark.timeout(300)

REMOTES = ["http", "https", "hf", "gs", "az"]
_numbers = itertools.count()


@dataclass
class Remote:
    name: str
    url: str  # the dataset's location in the store
    local: Path  # the same dataset on local disk
    keys: list[str]


def key_of(sample):
    return sample["__key__"]


def flat(batches) -> list[str]:
    return [k for b in batches for k in b]


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("remote-src"), num_samples=90, per_shard=8)  # 12 shards


def _copy_files(local: Path, put) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            put(path.relative_to(local).as_posix(), path.read_bytes())


@pytest.fixture(params=REMOTES)
def remote(request, local_dataset, monkeypatch, tmp_path) -> Remote:
    local, keys = local_dataset
    name = request.param
    n = next(_numbers)
    if name == "http":
        server, root = request.getfixturevalue("nginx_server"), request.getfixturevalue("web_root")
        shutil.copytree(local, root / f"ds-{n}")
        url = f"{server.url}/ds-{n}"
    elif name == "https":
        server, root = request.getfixturevalue("nginx_tls_server"), request.getfixturevalue("web_root")
        shutil.copytree(local, root / f"ds-{n}")
        monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))  # the standard CA setting
        url = f"{server.url}/ds-{n}"
    elif name == "hf":
        hub = request.getfixturevalue("fake_hub")
        commit = tmp_path / "commit"
        shutil.copytree(local, commit / "data" / "train")
        repo = f"org/remote-{n}"
        hub.add_repo(repo, {hub.commit_sha(repo): commit})
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        url = f"hf://datasets/{repo}/data/train"
    else:  # gs, az: a bucket or container of its own, filled through the store
        server = request.getfixturevalue("gcs_emulator" if name == "gs" else "azurite")
        bucket = f"remote-{os.getpid()}-{n}"
        (server.create_bucket if name == "gs" else server.create_container)(bucket)
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        url = f"{name}://{bucket}/ds"
        _upload(url, local)
    return Remote(name, url, local, keys)


def _upload(url: str, local: Path) -> None:
    from shardstream.storage import open_store

    store = open_store(url)
    _copy_files(local, store.write_bytes)


def _payloads(dataset) -> list[tuple[str, bytes, bytes]]:
    return [(s["__key__"], bytes(s["txt"]), bytes(s["cls"])) for s in dataset]


def test_read_from_the_store_as_from_disk_by_index_and_by_shard_urls(remote):
    expected = _payloads(ShardDataset(remote.local, shuffle=False))
    dataset = ShardDataset(remote.url, shuffle=False)
    assert _payloads(dataset) == expected
    assert len(pickle.dumps(dataset)) < 4096  # a description: workers make their own clients
    num_shards = open_index(remote.local).num_shards
    pattern = f"{remote.url}/data-{{000000..{num_shards - 1:06d}}}.tar"
    assert _payloads(ShardDataset(pattern, shuffle=False)) == expected


def test_exact_epochs_with_persistent_workers(remote):
    dataset = ShardDataset(remote.url, decode=key_of, shuffle_buffer=20, seed=3, batch_size=4)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True)
    epochs = [flat(loader) for _ in range(2)]
    for got in epochs:
        assert sorted(got) == sorted(remote.keys)
    assert epochs[0] != epochs[1]  # the epoch advanced in the workers


def test_ranks_split_the_epoch_and_resume_mid_epoch(remote, monkeypatch):
    seen: list[str] = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        mine = list(ShardDataset(remote.url, decode=key_of, seed=5))
        assert len(mine) == 30
        seen += mine
    assert sorted(seen) == sorted(remote.keys)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    dataset = ShardDataset(remote.url, decode=key_of, shuffle_buffer=10, seed=4)
    loader = DataLoader(dataset, batch_size=4, num_workers=2)
    it = iter(loader)
    before = flat(next(it) for _ in range(5))
    state = json.loads(json.dumps(loader_state_dict(loader, samples_consumed=len(before))))
    del it
    fresh = ShardDataset(remote.url, decode=key_of, shuffle_buffer=10, seed=4)
    fresh.load_state_dict(state)
    after = flat(DataLoader(fresh, batch_size=4, num_workers=2))
    assert sorted(before + after) == sorted(remote.keys)


def test_the_node_cache_serves_the_second_epoch(remote, tmp_path):
    dataset = ShardDataset(remote.url, decode=key_of, cache_dir=tmp_path / "cache", cache_limit_bytes=1 << 30)
    num_shards = open_index(remote.local).num_shards
    first = list(dataset)
    assert dataset.stats().cache_misses == num_shards and dataset.stats().cache_hits == 0
    dataset.set_epoch(1)
    second = list(dataset)
    assert dataset.stats().cache_hits == num_shards and dataset.stats().cache_misses == 0
    assert sorted(first) == sorted(second) == sorted(remote.keys)


def test_info_and_verify_from_the_command_line(remote):
    env = dict(os.environ)
    info = subprocess.run([sys.executable, "-m", "shardstream.cli", "info", remote.url], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert info.returncode == 0, info.stderr
    assert "12 shards, 90 samples" in info.stdout
    verify = subprocess.run([sys.executable, "-m", "shardstream.cli", "verify", remote.url, "--no-progress"], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert verify.returncode == 0, verify.stderr
    assert "12 of 12 shards match the index" in verify.stdout


# -- http(s) ------------------------------------------------------------------------------------


def test_a_shard_replaced_while_it_is_read_is_an_error_never_a_mix(nginx_server, web_root, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"{i:04d}.bin").write_bytes(os.urandom(50_000))
    from shardstream import pack

    pack(src, web_root / "replaced", progress=False)
    shard = web_root / "replaced" / "data-000000.tar"
    fetch = FetchConfig(part_bytes=256 << 10, max_buffer_bytes=256 << 10, max_inflight_requests=1)
    dataset = ShardDataset(f"{nginx_server.url}/replaced", shuffle=False, fetch=fetch)
    it = iter(dataset)
    next(it)
    data = shard.read_bytes()
    replacement = shard.with_name("new.tar")
    replacement.write_bytes(data[:512] + bytes(len(data) - 512))
    os.utime(replacement, ns=(shard.stat().st_mtime_ns + 2_000_000_000,) * 2)
    replacement.replace(shard)
    with pytest.raises(CorruptShardError, match="data-000000.tar: changed while it was being read"):
        list(it)


@pytest.mark.slow
def test_a_server_that_ignores_range_is_named(tmp_path, local_dataset):
    from servers.faultserver import FaultServer

    local, _ = local_dataset
    shutil.copytree(local, tmp_path / "www" / "ds")
    with FaultServer(tmp_path / "www") as server:
        server.set_faults(ignore_range=True, path_glob="*.tar", times=None)
        with pytest.raises(StorageError, match=r"data-0000\d\d\.tar: .* ignored the Range header"):
            list(ShardDataset(f"{server.url}/ds", shuffle=False, fetch=FetchConfig(part_bytes=4096)))
        # a range that covers the whole object may come back whole (RFC 9110 allows it): no harm done
        assert len(list(ShardDataset(f"{server.url}/ds", shuffle=False))) == 90


# -- the Hub ----------------------------------------------------------------------------------------


def test_a_hub_revision_is_pinned_when_the_dataset_is_made(fake_hub, local_dataset, tmp_path, monkeypatch):
    local, keys = local_dataset
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.endpoint)
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(local, old / "ds")
    other, _ = make_dataset(tmp_path / "other", num_samples=20, per_shard=8)
    shutil.copytree(other, new / "ds")
    repo = "org/moving"
    first = fake_hub.commit_sha("moving-1")
    fake_hub.add_repo(repo, {first: old})
    dataset = ShardDataset(f"hf://datasets/{repo}/ds", decode=key_of, shuffle=False)
    fake_hub.add_commit(repo, fake_hub.commit_sha("moving-2"), new, branch="main")  # main moves on
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    assert sorted(loader) == sorted(keys)  # workers read the commit the dataset was made from
    assert sorted(ShardDataset(f"hf://datasets/{repo}/ds", decode=key_of)) != sorted(keys)


def test_the_token_goes_to_the_hub_host_only(fake_hub, local_dataset, tmp_path, monkeypatch):
    local, keys = local_dataset
    shutil.copytree(local, tmp_path / "c" / "ds")
    sha = fake_hub.commit_sha("private-ds")
    token = "hf_private_token_0123456789abcdef"
    fake_hub.add_repo("org/private-ds", {sha: tmp_path / "c"}, private=True, token=token)
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.endpoint)
    monkeypatch.setenv("HF_TOKEN", token)
    fake_hub.clear_log()
    assert sorted(ShardDataset("hf://datasets/org/private-ds/ds", decode=key_of)) == sorted(keys)
    log = fake_hub.requests()
    hub = [r for r in log if r["host"] == "hub"]
    cdn = [r for r in log if r["host"] == "cdn"]
    assert hub and cdn
    assert all(r["authorization"] == f"Bearer {token}" for r in hub)
    assert all(r["authorization"] is None for r in cdn)


def _webdataset_shards(folder: Path, num_shards: int, per_shard: int) -> list[str]:
    """Shards as webdataset's TarWriter writes them (no shardstream index)."""
    import webdataset as wds

    folder.mkdir(parents=True)
    keys = []
    for s in range(num_shards):
        with wds.TarWriter(str(folder / f"train-{s:04d}.tar")) as sink:
            for i in range(per_shard):
                key = f"s{s:02d}_{i:03d}"
                sink.write({"__key__": key, "txt": f"caption {key}", "cls": s})
                keys.append(key)
    return keys


def test_index_build_of_a_hub_webdataset_into_a_local_directory(fake_hub, tmp_path, monkeypatch):
    keys = _webdataset_shards(tmp_path / "hubrepo" / "shards", num_shards=5, per_shard=13)
    fake_hub.add_repo("org/public-wds", {fake_hub.commit_sha("public-wds"): tmp_path / "hubrepo"})
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.endpoint)
    out = tmp_path / "index"
    built = subprocess.run(
        [sys.executable, "-m", "shardstream.cli", "index", "build", "hf://datasets/org/public-wds/shards",
         "--output", str(out), "--no-progress"],
        env=dict(os.environ), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    dataset = ShardDataset(out, decode=key_of, batch_size=4)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True)
    for _ in range(2):
        assert sorted(flat(loader)) == sorted(keys)
    reference = []
    for shard in sorted((tmp_path / "hubrepo" / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            reference += [m.name for m in tar.getmembers()]
    got = [f"{s['__key__']}.{ext}" for s in ShardDataset(out, shuffle=False) for ext in ("cls", "txt")]
    assert sorted(got) == sorted(reference)


# -- gs:// and az:// as destinations --------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_pack_to_reshard_within_and_pack_files_from_gs_and_az(scheme, request, stdlib_tree, monkeypatch, tmp_path):
    server = request.getfixturevalue("gcs_emulator" if scheme == "gs" else "azurite")
    bucket = f"pack-{os.getpid()}-{next(_numbers)}"
    (server.create_bucket if scheme == "gs" else server.create_container)(bucket)
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    env = dict(os.environ)

    def cli(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "shardstream.cli", *args], env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done

    src = stdlib_tree / "json"
    cli("pack", str(src), f"{scheme}://{bucket}/ds", "--shard-size", "64KiB", "--no-progress")
    cli("verify", f"{scheme}://{bucket}/ds", "--no-progress")
    local = tmp_path / "local"
    cli("pack", str(src), str(local), "--shard-size", "64KiB", "--no-progress")
    assert _payload_set(f"{scheme}://{bucket}/ds") == _payload_set(local)
    cli("pack", f"{scheme}://{bucket}/ds", f"{scheme}://{bucket}/re", "--from-shards", "--shard-size", "32KiB", "--no-progress")  # fmt: skip
    assert _payload_set(f"{scheme}://{bucket}/re") == _payload_set(local)
    from shardstream.storage import open_store

    files = open_store(f"{scheme}://{bucket}/files")
    for path in sorted(src.rglob("*")):
        if path.is_file():
            files.write_bytes(path.relative_to(src).as_posix(), path.read_bytes())
    cli("pack", f"{scheme}://{bucket}/files", str(tmp_path / "from-store"), "--no-progress")
    assert _payload_set(tmp_path / "from-store") == _payload_set(local)


def _payload_set(location) -> set[tuple[str, bytes]]:
    return {
        (f"{s['__key__']}.{ext}", bytes(v))
        for s in ShardDataset(location, shuffle=False)
        for ext, v in s.items()
        if not ext.startswith("__")
    }
