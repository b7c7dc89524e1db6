"""Two ranks under a real torchrun (gloo), two DataLoader workers each, reading from S3."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from shardstream import pack


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_ranks_two_workers_read_disjoint_shards_covering_every_sample(tmp_path, s3_server, s3_bucket, s3_config):
    src = tmp_path / "src"
    for i in range(96):
        (src / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 4}" / f"{i:04d}.txt").write_text(str(i))
    url = f"s3://{s3_bucket}/ranks"
    pack(src, url, max_samples_per_shard=6, s3=s3_config, progress=False)  # 16 shards of 6
    out = tmp_path / "seen.json"
    env = {**os.environ, **s3_server.info.env(), "OMP_NUM_THREADS": "1"}
    script = Path(__file__).with_name("torchrun_read.py")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
        f"--master-port={free_port()}", str(script), url, str(out), "2", "2",
    ]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]

    all_keys = sorted(f"c{i % 4}/{i:04d}" for i in range(96))
    assignments = []
    for epoch in json.loads(out.read_text()):
        assert len(epoch) == 2  # ranks
        keys = [key for rank in epoch for key, _, _ in rank]
        assert sorted(keys) == all_keys  # every sample once: none lost, none twice
        slots = {}
        for rank, seen in enumerate(epoch):
            for _, shard, worker in seen:
                slots.setdefault((rank, worker), set()).add(shard)
        assert sorted(slots) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        shard_sets = list(slots.values())
        assert sum(len(s) for s in shard_sets) == len(set().union(*shard_sets)) == 16  # disjoint
        assert all(len(s) == 4 for s in shard_sets)
        assert all(len(rank) == 48 for rank in epoch)
        assignments.append(slots)
    assert assignments[0] != assignments[1]  # shards move between readers across epochs


def test_spawned_workers_keep_the_rank_of_their_process(tmp_path):
    """Spawned DataLoader workers do not inherit torch.distributed; without the rank recorded
    in the main process every rank would read the whole dataset."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"{i:03d}.txt").write_text(str(i))
    pack(src, tmp_path / "ds", max_samples_per_shard=5, progress=False)
    out = tmp_path / "seen.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    script = Path(__file__).with_name("spawn_read.py")
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "ds"), str(out), str(free_port())],
                         env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    rank0, rank1 = json.loads(out.read_text())
    assert len(rank0) == len(rank1) == 20 and not set(rank0) & set(rank1)
    assert sorted(rank0 + rank1) == sorted(f"{i:03d}" for i in range(40))
