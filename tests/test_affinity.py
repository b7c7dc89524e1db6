"""Node affinity (``ShardDataset(shard_affinity="node")``): each node reads the same share of
the dataset in every epoch, shuffled within the node, so its node cache serves every epoch
after the first; exact epochs, equal counts per rank and resume hold.

The plan-level tests check every sample id of many random small layouts; the torchrun test
runs two real "nodes" (two torchrun launches joined by one rendezvous, each with its own node
cache) reading from the S3 server through a proxy that counts the store's bytes per epoch."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import numpy as np
import pytest
from resume_check import as_rank, check_resume, direct
from servers.faultproxy import FaultProxy
from test_torchrun import NUM_SAMPLES, check_epoch, finish, free_port, torchrun, uneven_dataset  # noqa: F401

from shardstream import NodeAffinity, ShardDataset, Source, open_index, pack, plan
from shardstream.reading.plan import EpochPlan, NodeLayout, ShardOrder, per_rank


def _layout_ids(counts, *, epoch, nodes, ranks_per_node, shuffle=True, drop_last=False, workers=2, seed=3):
    """Each rank's sample ids (its workers' pieces, concatenated) in ``epoch``."""
    world_size = nodes * ranks_per_node
    layout = NodeLayout(nodes, ranks_per_node, per_rank(int(np.sum(counts)), world_size, drop_last=drop_last))
    order = ShardOrder.make(counts, seed=seed, epoch=epoch, shuffle=shuffle, nodes=layout)
    plan = EpochPlan(counts, seed=seed, epoch=epoch, shuffle=shuffle, drop_last=drop_last, shard_order=order)
    ranks = []
    for rank in range(world_size):
        ids = []
        for worker in range(workers):
            for run in plan.piece_runs(
                None, world_size=world_size, rank=rank, num_workers=workers, worker_id=worker, batch_size=None
            ):
                assert 0 <= run.lo <= run.hi < counts[run.shard]
                ids += (order.starts[run.shard] + run.indices()).tolist()
        ranks.append(ids)
    return layout, ranks


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_node_reads_the_same_share_each_epoch_and_every_sample_once(shuffle, drop_last):
    rng = np.random.default_rng(11)
    for _ in range(60):
        counts = rng.integers(0, 25, int(rng.integers(1, 30)))
        counts[0] += 1
        total = int(counts.sum())
        nodes, ranks_per_node = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        world_size = nodes * ranks_per_node
        shares, orders = [], []
        for epoch in range(3):
            layout, ranks = _layout_ids(
                counts, epoch=epoch, nodes=nodes, ranks_per_node=ranks_per_node, shuffle=shuffle, drop_last=drop_last
            )
            assert [len(ids) for ids in ranks] == [layout.per_rank] * world_size  # equal counts per rank
            every = [i for ids in ranks for i in ids]
            if drop_last:
                assert len(set(every)) == len(every) == layout.per_rank * world_size
            else:
                assert set(every) == set(range(total))  # every sample; repeats only the pad
                assert len(every) - len(set(every)) == layout.per_rank * world_size - total
            per_node = [
                [i for ids in ranks[n * ranks_per_node : (n + 1) * ranks_per_node] for i in ids] for n in range(nodes)
            ]
            shares.append([set(ids) for ids in per_node])
            orders.append(per_node)
        if (nodes - 1) * layout.node_samples >= total:
            continue  # fewer samples than the last node's ranks start at: its pad repeats another node's
        for n in range(nodes):
            union = set().union(*(epoch_shares[n] for epoch_shares in shares))
            others = set().union(*(epoch_shares[m] for epoch_shares in shares for m in range(nodes) if m != n))
            assert not union & others  # a node's samples never go to another node, in any epoch
            if not drop_last:
                assert shares[0][n] == shares[1][n] == shares[2][n]
            else:  # drop_last leaves out the sequence's last few samples, at most world_size of them
                assert len(union) - len(shares[0][n]) < world_size
        if shuffle and total > 50:
            assert orders[0] != orders[1]  # reshuffled within the nodes


def test_only_the_shards_at_node_boundaries_are_read_by_two_nodes():
    counts = np.full(40, 25)  # 1,000 samples, 4 nodes of 250: the boundaries fall inside shards
    counts[::3] = 24
    layout = NodeLayout(4, 2, per_rank(int(counts.sum()), 8, drop_last=False))
    order = ShardOrder.make(counts, seed=0, epoch=5, shuffle=True, nodes=layout)
    node_of_piece = np.searchsorted(order.order_starts[1:], np.arange(1, 4) * layout.node_samples, side="left")
    shards_per_node = [set() for _ in range(4)]
    for k, shard in enumerate(order.order.tolist()):
        node = int(np.searchsorted(np.arange(1, 4) * layout.node_samples, order.order_starts[k], side="right"))
        shards_per_node[node].add(shard)
    shared = [s for s in range(40) if sum(s in node for node in shards_per_node) > 1]
    assert 1 <= len(shared) <= 3 and len(node_of_piece) == 3
    assert sum(len(node) for node in shards_per_node) == 40 + len(shared)


def test_affinity_at_a_million_shards_costs_what_a_plain_order_costs():
    counts = np.full(1_000_000, 10_000, dtype=np.int64)  # 10^10 samples
    layout = NodeLayout(128, 8, per_rank(int(counts.sum()), 1024, drop_last=False))
    started = time.process_time()
    order = ShardOrder.make(counts, seed=0, epoch=1, shuffle=True, nodes=layout)
    spent = time.process_time() - started
    assert int(order.order_starts[-1]) == 10**10 and len(order.order) <= 1_000_000 + 127
    assert spent < 30  # O(shards) numpy work (about 0.3 s here); a per-sample step would take hours


def test_node_affinity_arguments_are_checked(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"{i:03d}.txt").write_text(str(i))
    pack(src, tmp_path / "ds", max_samples_per_shard=3, progress=False)
    with pytest.raises(ValueError, match="shard_affinity='sometimes' must be None, 'node'"):
        ShardDataset(tmp_path / "ds", shard_affinity="sometimes")
    with pytest.raises(ValueError, match="ranks_per_node=0"):
        NodeAffinity(ranks_per_node=0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='two' must be an int"):
        ShardDataset(tmp_path / "ds", shard_affinity="node")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="a node must hold whole model-parallel groups"):
        ShardDataset(tmp_path / "ds", shard_affinity="node", replication=2)
    with pytest.raises(ValueError, match="not supported for a mixture"):
        ShardDataset([Source(tmp_path / "ds"), Source(tmp_path / "ds", weight=0.5)], shard_affinity="node")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")  # 4 ranks, 3 a node
    ds = ShardDataset(tmp_path / "ds", shard_affinity="node")
    with pytest.raises(ValueError, match="world_size=4 is not a multiple of 3 ranks per node"):
        next(iter(ds))


def test_affinity_resumes_mid_epoch_and_a_checkpoint_names_it(tmp_path, caplog):
    """Same shape: the rest of the epoch exactly; another world size: re-partitioned, and said;
    a dataset without affinity refuses the checkpoint, naming the setting."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(60):
        (src / f"{i:03d}.txt").write_text(str(i))
    pack(src, tmp_path / "ds", max_samples_per_shard=7, progress=False)

    def make():  # a rank's dataset: RANK / WORLD_SIZE are set by check_resume
        return ShardDataset(
            tmp_path / "ds", shard_affinity=NodeAffinity(ranks_per_node=1), decode=lambda s: s["__key__"]
        )

    keys = [f"{i:03d}" for i in range(60)]
    same = check_resume(make, direct(), stop_after=11, world_size=2, expected=keys)  # each rank takes 11
    state = same.states[0][0]
    assert state["shard_affinity"] == "node"
    for rank in range(2):
        with as_rank(rank, 2):
            whole = list(make())
        assert same.before[0][rank] + same.after[rank] == whole  # each rank: the rest of its epoch exactly
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        elastic = check_resume(
            make, direct(), stop_after=11, world_size=[2, 3], expected=keys, pads=3 * -(-(60 - 22) // 3) - (60 - 22)
        )
    assert "resumes with 3" in caplog.text and "new fixed share" in caplog.text
    assert len(elastic.rest) == 3 * -(-(60 - 22) // 3)  # equal counts on the new ranks, padded
    other = ShardDataset(tmp_path / "ds")
    with pytest.raises(ValueError, match="shard_affinity: checkpoint 'node', dataset None"):
        other.load_state_dict(state)


KINDS = {"index": "index.bin", "tables": ".tar.samples", "data": ".tar"}  # GETs by what they fetch


@pytest.mark.slow
@pytest.mark.parametrize("affinity", [True, False])
def test_two_nodes_epoch_two_reads_nothing_from_the_store_with_affinity(tmp_path, s3_server, uneven_dataset, affinity):  # noqa: F811
    """Two torchrun "nodes" of one rank and 2 workers, each with its own node cache big enough
    for the dataset. Bytes are counted at a proxy in front of the S3 server and split by when
    each GET came in, at the barrier between the epochs (each rank's epoch-2 start)."""
    info = s3_server.info
    index = open_index(uneven_dataset, s3=info.s3_config())
    dataset_bytes = int(index.manifest.shard_bytes.sum())
    log: list[tuple[float, str, str, int]] = []
    lock = threading.Lock()

    def record(method, path, headers, status, sent, received_at):
        # when the request came in, not when its answer was sent: the answer to a last epoch-1
        # GET can be logged after the ranks have used it and started epoch 2 (seen on a loaded
        # machine), while its request always comes before that
        with lock:
            log.append((received_at, method, path, sent))

    with FaultProxy(info.endpoint_url, rates={}, on_response=record) as proxy:
        env = {**os.environ, **info.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url, "OMP_NUM_THREADS": "1"}
        port = free_port()
        out = tmp_path / "out"
        out.mkdir()
        nodes = []
        for n in (0, 1):
            args = [uneven_dataset, str(out), "--workers=2", "--batch-size=4", "--epochs=2", "--persistent"]
            args += [f"--cache-dir={tmp_path / f'cache-{n}'}"] + (["--affinity"] if affinity else [])
            nodes.append(torchrun(1, *args, env=env, node=(n, 2, port), wait=False))
        for process in nodes:
            finish(process)
    epochs = json.loads((out / "epochs.json").read_text())
    for epoch in epochs:
        check_epoch(epoch, world_size=2)
    barrier = min(r["started"] for r in epochs[1]["ranks"])
    second = sum(sent for at, method, _, sent in log if at >= barrier and method == "GET")
    first = sum(sent for at, method, _, sent in log if at < barrier and method == "GET")
    predicted = plan(  # the same job: shardstream.plan predicts what the store sent, from the index
        uneven_dataset,
        nodes=2,
        gpus_per_node=1,
        workers=2,
        batch_size=4,
        cache_bytes=1 << 30,
        shuffle_buffer=8,
        seed=1,
        max_open_shards=2,
        persistent_workers=True,
        shard_affinity="node" if affinity else None,
        s3=info.s3_config(),
    ).to_dict()
    for e in (0, 1):
        in_epoch = [
            (path.split("?")[0], sent)
            for at, method, path, sent in log
            if (at >= barrier) == (e == 1) and method == "GET"
        ]
        shard_bytes = sum(sent for path, sent in in_epoch if path.endswith(".tar"))
        assert predicted["egress_detail"][e]["data"] == shard_bytes  # shards' bytes: exact
        gets = {kind: sum(path.endswith(suffix) for path, _ in in_epoch) for kind, suffix in KINDS.items()}
        want = predicted["requests_detail"][e]
        assert gets["index"] == want["index"], (e, gets, want)
        assert abs(gets["data"] - want["data"]) <= 2, (e, gets, want)  # a ranged GET split otherwise
        # every table the plan fetches, and at most once per worker of a node (two workers that
        # miss the node cache at once both fetch it)
        assert want["tables"] <= gets["tables"] <= 2 * want["tables"], (e, gets, want)
    fills = [sum(r["stats"]["cache_fills"] for r in e["ranks"]) for e in epochs]
    assert first >= dataset_bytes  # epoch 1 read every shard once (the boundary shard twice)
    if affinity:
        assert [set(r["keys"]) for r in epochs[0]["ranks"]] == [set(r["keys"]) for r in epochs[1]["ranks"]]
        assert second == 0, [entry for entry in log if entry[0] >= barrier]
        assert fills[1] == 0
        assert first <= dataset_bytes + int(index.manifest.shard_bytes.max()) + 64 * 1024  # + tables, index
    else:
        assert second > 0.3 * dataset_bytes  # shards the other node held in epoch 1
        assert fills[1] > 0


def test_a_rank_numbered_off_its_node_is_warned_about(tmp_path, monkeypatch, caplog):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"{i:03d}.txt").write_text(str(i))
    pack(src, tmp_path / "ds", max_samples_per_shard=3, progress=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("GROUP_RANK", "1")  # rank 1 of 2 a node is node 0
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        keys = [s["__key__"] for s in ShardDataset(tmp_path / "ds", shard_affinity="node")]
    assert len(keys) == 3
    assert "GROUP_RANK/NODE_RANK says node 1" in caplog.text
