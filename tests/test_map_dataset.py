"""ShardMapDataset: a map-style dataset over random access, with RandomSampler,
DistributedSampler under a real torchrun, and DataLoader workers (fork and spawn); each sample
compared byte for byte with the streaming read."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from resume_check import check_resume, stateful
from test_dataset import make_dataset
from torch.utils.data import DataLoader, RandomSampler

from shardstream import ShardDataset
from shardstream.mapdataset import ShardMapDataset

pytestmark = pytest.mark.timeout(300)


def key_of(sample):
    return sample["__key__"]


def raw(sample: dict) -> dict:
    return {k: (bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else v) for k, v in sample.items()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("map"), num_samples=50, per_shard=8)


def test_every_index_matches_the_streaming_read(dataset):
    dest, keys = dataset
    expected = [raw(s) for s in ShardDataset(dest, shuffle=False)]
    ds = ShardMapDataset(dest)
    assert len(ds) == 50
    assert [raw(ds[i]) for i in range(len(ds))] == expected
    assert [raw(s) for s in ds.__getitems__([7, 3, 49, 0])] == [expected[i] for i in (7, 3, 49, 0)]
    assert raw(ds.get(keys[11])) == expected[11]
    assert ds[-1]["__key__"] == keys[-1]
    with pytest.raises(IndexError, match="50 samples"):
        ds[50]
    with pytest.raises(KeyError, match="nope"):
        ds.get("nope")


def test_a_batch_is_read_in_merged_requests(dataset):
    dest, _ = dataset
    ds = ShardMapDataset(dest)
    ds.__getitems__(list(range(16)))  # two shards, whole
    assert ds.stats()["requests"] == 2
    assert ds.stats()["samples_read"] == 16


def test_classes_as_on_shard_dataset(tmp_path):
    from shardstream import pack

    src = tmp_path / "src"
    for c in ("cat", "dog"):
        (src / c).mkdir(parents=True)
        for i in range(3):
            (src / c / f"{c}{i}.txt").write_text(c)
    pack(src, tmp_path / "ds", labels_from_dirs=True, progress=False)
    ds = ShardMapDataset(tmp_path / "ds")
    assert ds.classes == ShardDataset(tmp_path / "ds").classes == ["cat", "dog"]
    assert ds.class_to_idx == {"cat": 0, "dog": 1}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_random_sampler_with_persistent_workers(dataset, context):
    dest, keys = dataset
    ds = ShardMapDataset(dest, decode=key_of)
    loader = DataLoader(
        ds,
        batch_size=5,
        sampler=RandomSampler(ds),
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
        collate_fn=list,
        timeout=120,
    )
    epochs = [[k for batch in loader for k in batch] for _ in range(2)]
    for got in epochs:
        assert sorted(got) == keys
    assert epochs[0] != epochs[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_a_random_order_mid_epoch(dataset, num_workers):
    """StatefulDataLoader(shuffle=True) checkpoints its sampler: a fresh loader over a fresh
    dataset reads exactly the indices not yet taken."""
    dest, keys = dataset
    run = check_resume(
        lambda: ShardMapDataset(dest, decode=key_of),
        stateful(batch_size=5, num_workers=num_workers, shuffle=True, collate_fn=list),
        stop_after=4,
        expected=keys,
    )
    assert len(run.taken) == 20 and run.taken != keys[:20]  # shuffled
    assert run.lengths == [50]  # a map-style dataset's length is its size; the sampler holds the place


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_distributed_sampler_under_torchrun_reads_every_sample_once(dataset, tmp_path):
    dest, keys = dataset
    out = tmp_path / "seen.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={_free_port()}",
        str(Path(__file__).with_name("torchrun_map.py")),
        str(dest),
        str(out),
        "2",
        "2",
    ]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    epochs = json.loads(out.read_text())
    assert len(epochs) == 2
    for rank0, rank1 in epochs:
        assert len(rank0) == len(rank1) == 25
        assert not set(rank0) & set(rank1)
        assert sorted(rank0 + rank1) == keys
    assert epochs[0][0] != epochs[1][0]
