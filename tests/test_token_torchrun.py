"""TokenBlocks under a real torchrun (gloo, CPU, 127.0.0.1; tests/torchrun_tokens.py): a job
reads part of an epoch through DataLoader workers and checkpoints it (``loader_state_dict``,
the same on every rank), a job at another world size resumes it and reads the rest; what the
two read is exactly the epoch's blocks, as the numpy oracle says (tests/token_fixtures.py).
Three torchrun jobs make two such chains: 2 ranks -> 3 ranks (pads), 3 ranks -> 2 ranks
(drop_last)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_torchrun import free_port, kill_tree
from token_fixtures import TokenData, make_docs, write_tokens

pytestmark = pytest.mark.slow

BATCH = 4
STOP = 3  # batches each rank reads before the checkpoint


def torchrun(nproc: int, workers: int, data: TokenData, out: Path, seq_len: int, tasks: list[dict]) -> None:
    """One job of tests/torchrun_tokens.py (``workers`` DataLoader workers a rank)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(Path(__file__).with_name("torchrun_tokens.py")),
        str(data.path),
        str(out),
        f"--seq-len={seq_len}",
        f"--batch-size={BATCH}",
        f"--workers={workers}",
        f"--tasks={json.dumps(tasks)}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        process.communicate(timeout=30)
        raise
    assert process.returncode == 0, err[-3000:]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> tuple[TokenData, int, dict[str, list[dict]]]:
    """About 9,000 tokens in ~20 shards of at most 500, a seq_len whose block count divides by
    neither 2 nor 3, and the three jobs: 2 ranks x 2 workers checkpoint epoch 1 ("pad");
    3 ranks x 1 worker read its rest ("pad-rest"), then checkpoint epoch 2 with drop_last
    ("drop"); 2 ranks x 2 workers read that one's rest ("drop-rest"). Each task's per-rank results."""
    root = tmp_path_factory.mktemp("torchrun-tokens")
    data = write_tokens(root / "ds", make_docs(50, vocab_size=1000, seed=31), vocab_size=1000, max_shard_tokens=500)
    assert 10 <= data.num_shards <= 40
    seq_len = next(n for n in range(40, 80) if data.num_blocks(n) % 6 in (1, 5))
    out = root / "out"
    out.mkdir()
    pad, drop = {"drop_last": False}, {"drop_last": True}
    torchrun(2, 2, data, out, seq_len, [{"name": "pad", "epoch": 1, "stop": STOP, **pad}])
    torchrun(
        3,
        1,
        data,
        out,
        seq_len,
        [
            {"name": "pad-rest", "resume": str(out / "pad-state.json"), **pad},
            {"name": "drop", "epoch": 2, "stop": STOP, **drop},
        ],
    )
    torchrun(2, 2, data, out, seq_len, [{"name": "drop-rest", "resume": str(out / "drop-state.json"), **drop}])
    results = {
        name: json.loads((out / f"{name}.json").read_text()) for name in ("pad", "pad-rest", "drop", "drop-rest")
    }
    for name, ranks in results.items():
        assert [r["rank"] for r in ranks] == list(range(len(ranks))), name
    return data, seq_len, results


def check_blocks(data: TokenData, seq_len: int, ranks: list[dict]) -> list[int]:
    """Every block read is the one its number names, by the oracle; returns the numbers."""
    keys = []
    for rank in ranks:
        for block in rank["blocks"]:
            k = block["key"]
            assert 0 <= k < data.num_blocks(seq_len)
            np.testing.assert_array_equal(block["input_ids"], data.input_ids(k, seq_len), err_msg=f"block {k}")
            np.testing.assert_array_equal(block["labels"], data.labels(k, seq_len), err_msg=f"block {k}")
            np.testing.assert_array_equal(block["position_ids"], data.positions(k, seq_len), err_msg=f"block {k}")
            np.testing.assert_array_equal(block["doc_lens"], data.doc_pieces(k, seq_len), err_msg=f"block {k}")
            keys.append(k)
    return keys


@pytest.mark.parametrize(
    ("first", "rest", "epoch", "drop_last"),
    [("pad", "pad-rest", 1, False), ("drop", "drop-rest", 2, True)],
    ids=["2-to-3-ranks-pad", "3-to-2-ranks-drop-last"],
)
def test_a_job_checkpoints_and_another_world_size_reads_the_rest(jobs, first, rest, epoch, drop_last):
    data, seq_len, results = jobs
    num_blocks = data.num_blocks(seq_len)
    before, after = results[first], results[rest]
    w1, w2 = len(before), len(after)
    assert w1 != w2
    per_rank = num_blocks // w1 if drop_last else -(-num_blocks // w1)
    assert [r["len"] for r in before] == [per_rank] * w1  # before reading: the whole epoch's share
    assert [len(r["blocks"]) for r in before] == [STOP * BATCH] * w1
    states = [r["state"] for r in before]
    assert all(s == states[0] for s in states), "the ranks saved different checkpoints"
    assert states[0]["epoch"] == epoch and states[0]["unit"] == f"token_block:{seq_len}"
    assert states[0]["drop_last"] is drop_last

    counts = [len(r["blocks"]) for r in after]
    assert len(set(counts)) == 1 and counts == [r["len"] for r in after]  # equal counts, as len() said
    assert all(r["epoch"] == epoch for r in after) and all(r["state"] is None for r in after)

    both = collections.Counter(check_blocks(data, seq_len, before) + check_blocks(data, seq_len, after))
    slack = (w1 - 1) + (w2 - 1)  # at most one rounding to equal rank counts per job
    if drop_last:
        assert max(both.values()) == 1  # nothing twice
        assert num_blocks - slack <= len(both) < num_blocks
    else:
        assert set(both) == set(range(num_blocks))  # nothing lost
        assert sum(both.values()) - num_blocks <= slack  # repeats only as pads
