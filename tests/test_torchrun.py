"""Exact epochs under a real torchrun (gloo, CPU, 127.0.0.1) reading from the S3 server: one
node of 2 ranks x 2 workers, two "nodes" of 2 ranks each, and a job killed mid-epoch that
resumes at other world sizes (4 -> 2 -> 3)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardstream import S3Config, open_index, pack

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


NUM_SAMPLES = 103  # prime: divides by no world size


@pytest.fixture(scope="module")
def uneven_dataset(tmp_path_factory, s3_server) -> str:
    """103 samples (a .txt and a .cls each, 10 B to 3 KB) in shards of at most 16 KiB, so
    shards hold unequal sample counts; on the S3 server."""
    src = tmp_path_factory.mktemp("uneven")
    rng = random.Random(7)
    for i in range(NUM_SAMPLES):
        (src / f"c{i % 4}").mkdir(exist_ok=True)
        (src / f"c{i % 4}" / f"{i:04d}.txt").write_bytes(
            bytes(rng.randrange(256) for _ in range(rng.randrange(10, 3000)))
        )
        (src / f"c{i % 4}" / f"{i:04d}.cls").write_text(str(i % 4))
    # one bucket per module that uses the fixture (test_affinity imports it): two such modules
    # in one xdist worker share the session's server
    bucket = f"torchrun-{os.getpid()}-{src.name}"  # src: uneven0, uneven1, ... (mktemp numbers them)
    s3_server.create_bucket(bucket)
    info = s3_server.info
    s3 = info.s3_config()
    report = pack(src, f"s3://{bucket}/uneven", max_shard_bytes=16 << 10, s3=s3, progress=False)
    counts = set(open_index(f"s3://{bucket}/uneven", s3=s3).manifest.shard_samples.tolist())
    assert report.num_samples == NUM_SAMPLES and len(counts) > 2  # unequal shards
    return f"s3://{bucket}/uneven"


def s3_read(s3: S3Config, bucket: str, key: str) -> bytes:
    from shardstream.storage import open_store

    return open_store(f"s3://{bucket}", s3=s3).read_bytes(key)


ALL_KEYS = sorted(f"c{i % 4}/{i:04d}" for i in range(NUM_SAMPLES))


def torchrun(
    nproc: int, *args: str, env: dict[str, str], node: tuple[int, int, int] | None = None, wait: bool = True
) -> subprocess.Popen:
    """torchrun of tests/torchrun_epochs.py; ``node`` = (node_rank, nnodes, port) for one
    "node" of a multi-node job whose rendezvous is 127.0.0.1:port."""
    script = Path(__file__).with_name("torchrun_epochs.py")
    rendezvous = (
        [f"--nnodes={node[1]}", f"--node-rank={node[0]}", f"--rdzv-endpoint=127.0.0.1:{node[2]}"]
        if node
        else ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        *rendezvous,
        str(script),
        *args,
    ]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    if wait:
        finish(process)
    return process


def finish(process: subprocess.Popen) -> None:
    try:
        _, err = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        raise
    assert process.returncode == 0, err[-3000:]


def kill_when_ready(process: subprocess.Popen, out: Path, world_size: int) -> None:
    """Wait until every rank has checkpointed, then SIGKILL the whole job, as a node loss."""
    deadline = time.monotonic() + 300
    while not all((out / f"ready-{r}").exists() for r in range(world_size)):
        if process.poll() is not None:
            raise AssertionError(f"torchrun exited early: {process.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, "ranks did not reach their checkpoint"
        time.sleep(0.2)
    kill_tree(process.pid)
    process.wait()


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def running_with(text: str, *, wait_s: float = 10.0) -> list[str]:
    """Live (not zombie) processes whose command line holds ``text``, after giving killed ones
    ``wait_s`` to finish dying (a SIGKILLed process with much memory takes a moment to go)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z" and text.encode() in _cmdline(pid):
                found.append(pid)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants: torchrun starts each rank in a session of
    its own, so killing torchrun's process group would leave the ranks running."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    doomed, todo = [], [pid]
    while todo:
        current = todo.pop()
        doomed.append(current)
        todo += parents.get(current, [])
    for victim in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def check_epoch(epoch: dict, *, world_size: int, drop_last: bool = False) -> list[list[str]]:
    """Every rank the same count (len(dataset)) and the same number of batches; the union is
    the dataset, nothing twice beyond the pad (or nothing missing beyond drop_last)."""
    ranks = epoch["ranks"]
    assert len(ranks) == world_size
    assert [r["epoch"] for r in ranks] == [epoch["epoch"]] * world_size  # what each rank read
    per_rank = NUM_SAMPLES // world_size if drop_last else -(-NUM_SAMPLES // world_size)
    assert [len(r["keys"]) for r in ranks] == [per_rank] * world_size
    assert [r["len"] for r in ranks] == [per_rank] * world_size
    assert len({r["batches"] for r in ranks}) == 1
    keys = [k for r in ranks for k in r["keys"]]
    if drop_last:
        assert len(set(keys)) == len(keys) == per_rank * world_size
        assert set(keys) <= set(ALL_KEYS)
    else:
        assert sorted(set(keys)) == ALL_KEYS
        assert len(keys) - len(set(keys)) == per_rank * world_size - NUM_SAMPLES  # the pad, counted
    return [r["keys"] for r in ranks]


def test_one_node_two_ranks_two_workers_exact_epochs_from_s3(tmp_path, s3_server, uneven_dataset):
    env = {**os.environ, **s3_server.info.env(), "OMP_NUM_THREADS": "1"}
    torchrun(
        2,
        uneven_dataset,
        str(tmp_path),
        "--workers=2",
        "--batch-size=4",
        "--epochs=2",
        "--slow-rank=1",
        "--slow-s=60",
        env=env,
    )
    epochs = json.loads((tmp_path / "epochs.json").read_text())
    assigned = [check_epoch(e, world_size=2) for e in epochs]
    assert set(assigned[0][0]) != set(assigned[1][0])  # rank 0 reads other samples in epoch 1
    # Nothing in iteration waits for other ranks: rank 0 read its whole first epoch before
    # the slow rank 1 even started, rank 1 waiting for that up to 60 s (they meet only at the
    # test's own all_gather).
    fast, slow = epochs[0]["ranks"]
    assert fast["ended"] < slow["started"]


def test_two_nodes_of_two_ranks_drop_last(tmp_path, s3_server, uneven_dataset):
    """Also: one DataLoader with persistent workers for both epochs."""
    env = {**os.environ, **s3_server.info.env(), "OMP_NUM_THREADS": "1"}
    port = free_port()
    args = (uneven_dataset, str(tmp_path), "--workers=1", "--batch-size=5", "--epochs=2", "--drop-last", "--persistent")
    nodes = [torchrun(2, *args, env=env, node=(n, 2, port), wait=False) for n in (0, 1)]
    for process in nodes:
        finish(process)
    for epoch in json.loads((tmp_path / "epochs.json").read_text()):
        check_epoch(epoch, world_size=4, drop_last=True)


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
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ds"), str(out), str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rank0, rank1 = json.loads(out.read_text())
    assert len(rank0) == len(rank1) == 20 and not set(rank0) & set(rank1)
    assert sorted(rank0 + rank1) == sorted(f"{i:03d}" for i in range(40))


@pytest.fixture(scope="module")
def mixture_spec(tmp_path_factory, uneven_dataset) -> Path:
    """A mixture over two stores: the uneven dataset on S3 by weight (110 of its 103: once
    and 7 more), a local one of 40 samples read 1.5 times (60) and a local one of 200 read 30
    at a time (sub-sampled): 200 samples an epoch."""
    root = tmp_path_factory.mktemp("mixture")
    for name, count in (("small", 40), ("big", 200)):
        src = root / f"src-{name}" / name
        src.mkdir(parents=True)
        for i in range(count):
            (src / f"{i:04d}.txt").write_text(f"{name} {i}")
        pack(src.parent, root / name, max_samples_per_shard=9, progress=False)
    spec = [
        {"location": uneven_dataset, "weight": 1.0, "name": "web"},
        {"location": str(root / "small"), "repeat": 1.5, "name": "small"},
        {"location": str(root / "big"), "samples": 30, "name": "big"},
    ]
    path = root / "mixture.json"
    path.write_text(json.dumps(spec))
    return path


def mixture_epoch(spec: Path, s3: S3Config, epoch: int) -> list[str]:
    """One epoch of the mixture as a single reader reads it (the reference)."""
    from shardstream import ShardDataset, Source

    dataset = ShardDataset(
        [Source(**x) for x in json.loads(spec.read_text())],
        epoch_samples=200,
        decode=lambda s: f"{s['__source__']}|{s['__key__']}",
        shuffle_buffer=8,
        seed=1,
        max_open_shards=2,
        batch_size=3,
        s3=s3,
    )
    dataset.set_epoch(epoch)
    return list(dataset)


# The jobs killed mid-epoch 0: (world size, batches each rank reads before the kill, mode).
KILLED_JOBS = [(4, 2, ()), (2, 3, ("--persistent",))]


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, s3_server, uneven_dataset, mixture_spec) -> dict[str, tuple[list, list]]:
    """The torchrun jobs of the two tests below, each job reading the uneven dataset and then
    the mixture, with the same options (2 workers, batches of 3): world size 4 is killed
    mid-epoch 0 once each rank has read 2 batches of both; 2 ranks resume both (persistent
    workers) and are killed after 3 batches; 3 ranks finish both epochs (persistent workers,
    no set_epoch: the pass after the resumed one reads epoch 1 by itself). Per dataset: the
    keys each rank of each killed job consumed, and the last job's two epochs."""
    root = tmp_path_factory.mktemp("killed")
    env = {**os.environ, **s3_server.info.env(), "OMP_NUM_THREADS": "1"}
    sources = {"uneven": uneven_dataset, "mixture": str(mixture_spec)}
    options = ["--workers=2", "--batch-size=3", "--epoch-samples=200"]  # epoch_samples: the mixture's

    def job(name: str) -> tuple[dict[str, Path], list[str]]:
        outs = {source: root / name / source for source in sources}
        for out in outs.values():
            out.mkdir(parents=True)
        uneven, mixture = ([sources[s], str(outs[s])] for s in ("uneven", "mixture"))
        return outs, [*uneven, "--also", *mixture, *options]

    consumed: dict[str, list[list[list[str]]]] = {source: [] for source in sources}
    resume: list[str] = []
    for step, (world_size, stop_at, mode) in enumerate(KILLED_JOBS):
        outs, args = job(f"run{step}")
        process = torchrun(world_size, *args, f"--stop-at-batch={stop_at}", *resume, *mode, env=env, wait=False)
        kill_when_ready(process, outs["uneven"], world_size)
        killed = running_with(str(root / f"run{step}"))
        assert not killed, f"ranks of the killed job still run: {killed}"
        for source, out in outs.items():
            consumed[source].append([json.loads((out / f"consumed-{r}.json").read_text()) for r in range(world_size)])
        resume = [f"--resume={out / 'state.json'}" for out in outs.values()]
    outs, args = job("final")
    torchrun(3, *args, "--epochs=2", *resume, "--persistent", "--no-set-epoch", env=env)
    return {source: (consumed[source], json.loads((out / "epochs.json").read_text())) for source, out in outs.items()}


def test_killed_mid_epoch_resumes_exactly_at_other_world_sizes(killed_and_resumed):
    """World size 4 is killed mid-epoch; 2 ranks resume it (persistent workers) and are killed
    too; 3 ranks finish it (persistent workers, no set_epoch: the pass after the resumed one
    reads epoch 1 by itself): every sample of the epoch is delivered (pads aside, counted), and
    the next epoch is whole again (the jobs: killed_and_resumed)."""
    killed, (rest, next_epoch) = killed_and_resumed["uneven"]
    for (world_size, stop_at, _), ranks in zip(KILLED_JOBS, killed, strict=True):
        assert [len(keys) for keys in ranks] == [3 * stop_at] * world_size
    consumed = [k for ranks in killed for keys in ranks for k in keys]
    assert len(consumed) == 4 * 6 + 2 * 9
    assert rest["epoch"] == 0 and next_epoch["epoch"] == 1
    counts = [len(r["keys"]) for r in rest["ranks"]]
    assert len(set(counts)) == 1 and counts[0] == rest["ranks"][0]["len"]
    epoch0 = consumed + [k for r in rest["ranks"] for k in r["keys"]]
    assert sorted(set(epoch0)) == ALL_KEYS  # none lost
    assert len(epoch0) - len(set(epoch0)) <= (4 - 1) + (2 - 1) + (3 - 1)  # repeats only as pads
    check_epoch(next_epoch, world_size=3)


def test_mixture_killed_mid_epoch_resumes_exactly_at_other_world_sizes(s3_server, mixture_spec, killed_and_resumed):
    """A mixture of an S3 and two local datasets, killed at world size 4, resumed by 2 (killed
    too) and finished by 3: each source's samples of the epoch all delivered, repeats only as
    pads; every rank the same count, each source's share per rank within one; the next epoch
    whole, with the sub-sampled source's next part (the jobs: killed_and_resumed)."""
    killed, (rest, next_epoch) = killed_and_resumed["mixture"]
    for (world_size, stop_at, _), ranks in zip(KILLED_JOBS, killed, strict=True):
        assert [len(keys) for keys in ranks] == [3 * stop_at] * world_size
    consumed = [k for ranks in killed for keys in ranks for k in keys]
    assert rest["epoch"] == 0 and next_epoch["epoch"] == 1
    assert (
        len({len(r["keys"]) for r in rest["ranks"]}) == 1 and len(rest["ranks"][0]["keys"]) == rest["ranks"][0]["len"]
    )
    s3 = s3_server.info.s3_config()
    expected = collections.Counter(mixture_epoch(mixture_spec, s3, 0))
    got = collections.Counter(consumed + [k for r in rest["ranks"] for k in r["keys"]])
    assert not expected - got  # none lost
    assert sum((got - expected).values()) <= (4 - 1) + (2 - 1) + (3 - 1)  # repeats only as pads
    ranks = [r["keys"] for r in next_epoch["ranks"]]
    assert [len(k) for k in ranks] == [67, 67, 67]
    shares = {"web": 110, "small": 60, "big": 30}
    for keys in ranks:
        per_source = collections.Counter(k.split("|")[0] for k in keys)
        assert all(abs(per_source[name] - 67 * n / 200) < 1 for name, n in shares.items()), per_source
    epoch1 = collections.Counter(k for keys in ranks for k in keys)
    assert not collections.Counter(mixture_epoch(mixture_spec, s3, 1)) - epoch1
    big0 = {k for k in expected if k.startswith("big|")}
    big1 = {k for k in epoch1 if k.startswith("big|")}
    assert len(big0) == len(big1) == 30 and not big0 & big1  # the next part of its permutation


def test_replication_groups_read_identical_samples_under_torchrun(tmp_path, s3_server, mixture_spec):
    env = {**os.environ, **s3_server.info.env(), "OMP_NUM_THREADS": "1"}
    torchrun(
        4, str(mixture_spec), str(tmp_path), "--epoch-samples=200", "--workers=2", "--batch-size=3", "--epochs=1",
        "--replication=2", env=env,
    )  # fmt: skip
    (epoch,) = json.loads((tmp_path / "epochs.json").read_text())
    ranks = [r["keys"] for r in epoch["ranks"]]
    assert ranks[0] == ranks[1] and ranks[2] == ranks[3] and ranks[0] != ranks[2]
    expected = collections.Counter(mixture_epoch(mixture_spec, s3_server.info.s3_config(), 0))
    assert collections.Counter(ranks[0] + ranks[2]) == expected  # the two data-parallel groups: the epoch


@pytest.mark.parametrize("store", ["hf", "az"])
def test_three_ranks_exact_epochs_from_the_hub_and_azure(
    tmp_path, s3_server, uneven_dataset, request, store, monkeypatch
):
    """The same dataset copied to a fake Hub (hf://) or Azurite (az://), read by 3 ranks x 2
    persistent workers for 2 epochs: each store's clients are made in the process that uses them."""
    from shardstream.storage import open_store

    s3 = s3_server.info.s3_config()
    source = open_store(uneven_dataset, s3=s3)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if store == "hf":
        hub = request.getfixturevalue("fake_hub")
        for name in source.list_names():
            (tmp_path / "repo" / "ds" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "repo" / "ds" / name).write_bytes(source.read_bytes(name))
        hub.add_repo("org/torchrun", {hub.commit_sha("torchrun"): tmp_path / "repo"})
        env.update(hub.env())
        url = "hf://datasets/org/torchrun/ds"
    else:
        azurite = request.getfixturevalue("azurite")
        container = f"torchrun-{os.getpid()}"
        azurite.create_container(container)
        env.update(azurite.env())
        for key, value in azurite.env().items():
            monkeypatch.setenv(key, value)
        target = open_store(f"az://{container}/ds")
        for name in source.list_names():
            target.write_bytes(name, source.read_bytes(name))
        url = f"az://{container}/ds"
    out = tmp_path / "out"
    out.mkdir()
    torchrun(3, url, str(out), "--workers=2", "--batch-size=4", "--epochs=2", "--persistent", env=env)
    epochs = json.loads((out / "epochs.json").read_text())
    assigned = [check_epoch(e, world_size=3) for e in epochs]
    assert assigned[0] != assigned[1]
