"""Packing on Ray: ShardDatasink writes a Ray Dataset as shards plus an index, on a real local
cluster of two raylets (the session's ``ray_cluster``). Drivers run in subprocesses (as users
run them, and so this process never imports ray); what they wrote is read back with
ShardDataset (every sample once, and once per epoch over two ranks), tarfile and webdataset,
and checked against the index with verify. And LocalRayCluster itself: it stops every process
it started, and a stale ``~/.ray/auth_token`` of the user's own Ray does not break it."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from servers.ray_cluster import LocalRayCluster, RayClusterError

from shardstream import S3Config, ShardDataset, ShardWriter, open_index
from shardstream.packing.verify import verify

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DRIVER_TIMEOUT_S = 180
PRELUDE = """
import json, os, pickle, sys
import ray
ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, logging_level="ERROR")
ray.data.DataContext.get_current().enable_progress_bars = False
from shardstream import S3Config
from shardstream.packing.ray_sink import ShardDatasink

def result(**fields):
    print("RESULT " + json.dumps(fields), flush=True)
"""

# a list of samples (pickled by the test) -> a Ray Dataset of 4 blocks -> ShardDatasink(dest)
WRITE_ITEMS = """
items = pickle.loads(open(sys.argv[1], "rb").read())
s3 = S3Config(**json.loads(sys.argv[3])) if len(sys.argv) > 3 else None
sink = ShardDatasink(sys.argv[2], max_shard_bytes=20_000, s3=s3)
ray.data.from_items(items, override_num_blocks=4).write_datasink(sink)
result(totals=sink.totals)
"""

# the pipeline users run: Parquet files of image paths -> read_parquet -> map_batches that
# reads each file -> ShardDatasink
WRITE_PIPELINE = """
import numpy as np

root = sys.argv[2]  # the UDF runs in worker processes: it takes this value along, not their sys.argv

def read_files(batch):
    node = ray.get_runtime_context().get_node_id()
    keys, images = [], []
    for path in batch["path"]:
        keys.append(os.path.relpath(path, root).removesuffix(".jpg"))
        with open(path, "rb") as f:
            images.append(f.read())
    return {
        "__key__": np.array(keys, dtype=object),
        "jpg": np.array(images, dtype=object),
        "cls": batch["label"],
        "node.txt": np.array([node] * len(keys), dtype=object),
    }

sink = ShardDatasink(sys.argv[3], max_shard_bytes=8_000)
# a table of paths is small: Ray reads it as one block; repartition spreads the file reads over tasks
paths = ray.data.read_parquet(sys.argv[1]).repartition(8)
paths.map_batches(read_files, batch_size=4).write_datasink(sink)
result(totals=sink.totals)
"""

# what is refused, and what replaces
WRITE_ERRORS = """
def outcome(dest, rows, **options):
    try:
        sink = ShardDatasink(dest, **options)
        ray.data.from_items(rows, override_num_blocks=2).filter(lambda row: row["__key__"] != "drop").write_datasink(sink)
    except Exception as exc:
        return {"error": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    return {"totals": sink.totals}

rows = [{"__key__": f"{i:04d}", "bin": b"new %d" % i} for i in range(20)]
held = sys.argv[1]
result(
    refused=outcome(held, rows),
    replaced=outcome(held, rows, overwrite=True),
    empty=outcome(sys.argv[2], [{"__key__": "drop", "bin": b"x"}]),
    bad=outcome(sys.argv[3], rows[:5] + [{"__key__": "0005", "cls": True}] + rows[6:], max_samples_per_shard=2),
    left_by_bad=sorted(os.listdir(sys.argv[3])),
    after_bad=outcome(sys.argv[3], rows),
    after_bad_overwrite=outcome(sys.argv[3], rows, overwrite=True),
    dotted=outcome(sys.argv[4], [{"__key__": "a.b", "bin": b"x"}]),
    foreign=outcome(sys.argv[5], rows),
    clobbered=outcome(sys.argv[5], rows, clobber=True),
)
"""


def run_driver(cluster, code: str, *args: str) -> dict:
    """Run ``code`` as a Ray driver of ``cluster``; the fields it passed to ``result``."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + code, *args],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (
        f"driver exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len("RESULT ") :])


def jpeg(seed: int, size=(32, 24)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return out.getvalue()


def make_items(n: int) -> list[dict]:
    return [
        {"__key__": f"{i:05d}", "jpg": jpeg(i), "cls": i % 10, "json": {"i": i, "caption": f"picture {i}"}}
        for i in range(n)
    ]


def expected_members(items: list[dict]) -> dict[str, dict[str, bytes]]:
    return {
        s["__key__"]: {"jpg": s["jpg"], "cls": str(s["cls"]).encode(), "json": json.dumps(s["json"]).encode()}
        for s in items
    }


def read_back(dest, **kwargs) -> dict[str, dict[str, bytes]]:
    """key -> members, as ShardDataset reads them; fails on a key read twice."""
    got: dict[str, dict[str, bytes]] = {}
    for sample in ShardDataset(dest, shuffle=False, **kwargs):
        key = sample["__key__"]
        assert key not in got, f"{key} read twice"
        got[key] = {ext: v for ext, v in sample.items() if not ext.startswith("__")}
    return got


def shard_names(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.glob("*.tar"))


def test_round_trip_of_a_dataset_written_by_tasks_on_two_nodes(ray_cluster, tmp_path, monkeypatch):
    items = make_items(200)
    (tmp_path / "items.pkl").write_bytes(pickle.dumps(items))
    dest = tmp_path / "ds"
    totals = run_driver(ray_cluster, WRITE_ITEMS, str(tmp_path / "items.pkl"), str(dest))["totals"]
    expected = expected_members(items)

    index = open_index(dest)
    names = [index.manifest.name(i) for i in range(index.num_shards)]
    assert names == shard_names(dest)  # every shard listed, by task then sequence number
    tasks = {name.split("-")[1] for name in names}
    assert len(tasks) >= 2 and len(names) >= 2 * len(tasks)  # several tasks, several shards each
    assert totals == {
        "num_shards": len(names),
        "num_samples": 200,
        "num_members": 600,
        "bytes": sum((dest / n).stat().st_size for n in names),
    }
    assert all(check.ok for check in verify(str(dest))), [c for c in verify(str(dest)) if not c.ok]
    assert not [p for p in dest.iterdir() if "partial" in p.name]

    assert read_back(dest) == expected
    # reference readers: Python's tarfile and webdataset
    from_tar: dict[str, dict[str, bytes]] = {}
    for name in names:
        with tarfile.open(dest / name) as tar:
            members = tar.getmembers()
            assert [m.name for m in members] == sorted(m.name for m in members)
            for member in members:
                key, _, ext = member.name.partition(".")
                from_tar.setdefault(key, {})[ext] = tar.extractfile(member).read()
    assert from_tar == expected
    import webdataset as wds

    from_wds = {
        s["__key__"]: {ext: s[ext] for ext in ("jpg", "cls", "json")}
        for s in wds.WebDataset([str(dest / n) for n in names], shardshuffle=False)
    }
    assert from_wds == expected

    # exact epochs over two ranks: every sample once per epoch, equal counts
    for epoch in (0, 1):
        per_rank = []
        for rank in range(2):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "2")
            dataset = ShardDataset(dest, decode=lambda s: s["__key__"], shuffle_buffer=16, seed=5)
            dataset.set_epoch(epoch)
            keys = list(dataset)
            assert len(keys) == len(dataset) == 100
            per_rank.append(keys)
        assert sorted(per_rank[0] + per_rank[1]) == sorted(expected)


def test_parquet_of_paths_read_by_map_batches_into_shards(ray_cluster, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = tmp_path / "images"
    files: dict[str, tuple[bytes, int]] = {}
    for i in range(64):
        label = i % 4
        path = images / f"class_{label}" / f"{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg(1000 + i, size=(40, 30)))
        files[f"class_{label}/{i:04d}"] = (path.read_bytes(), label)
    table_dir = tmp_path / "paths"
    table_dir.mkdir()
    paths = sorted(str(images / f"{key}.jpg") for key in files)
    for part in range(4):
        chunk = paths[part::4]
        labels = [files[str(Path(p).relative_to(images).with_suffix(""))][1] for p in chunk]
        pq.write_table(pa.table({"path": chunk, "label": labels}), table_dir / f"part-{part}.parquet")
    dest = tmp_path / "ds"

    totals = run_driver(ray_cluster, WRITE_PIPELINE, str(table_dir), str(images), str(dest))["totals"]

    assert totals["num_samples"] == 64 and totals["num_members"] == 64 * 3 and totals["num_shards"] > 4
    got = read_back(dest)
    assert {key: (m["jpg"], int(m["cls"])) for key, m in got.items()} == files
    assert len({m["node.txt"] for m in got.values()}) == 2  # tasks ran on both raylets
    assert len({name.split("-")[1] for name in shard_names(dest)}) >= 2  # ... several write tasks
    assert all(check.ok for check in verify(str(dest)))


def test_to_s3(ray_cluster, s3_config: S3Config, s3_bucket, tmp_path):
    items = make_items(60)
    (tmp_path / "items.pkl").write_bytes(pickle.dumps(items))
    url = f"s3://{s3_bucket}/ray/ds"

    totals = run_driver(ray_cluster, WRITE_ITEMS, str(tmp_path / "items.pkl"), url, json.dumps(asdict(s3_config)))[
        "totals"
    ]

    assert totals["num_samples"] == 60 and totals["num_shards"] >= 4
    assert open_index(url, s3=s3_config).num_shards == totals["num_shards"]
    assert read_back(url, s3=s3_config) == expected_members(items)
    assert all(check.ok for check in verify(url, s3=s3_config))


def test_a_dataset_is_refused_without_overwrite_and_bad_rows_name_key_and_field(ray_cluster, tmp_path):
    held = tmp_path / "held"
    with ShardWriter(held, max_samples_per_shard=4) as writer:
        for i in range(10):
            writer.write({"__key__": f"old{i:03d}", "bin": b"old"})
    before = {p.name: p.read_bytes() for p in held.iterdir() if p.is_file()}
    dests = [str(tmp_path / name) for name in ("empty", "bad", "dotted", "users")]
    users = {"data-000000-000000.tar": b"a user's own tar", "notes.txt": b"mine"}
    Path(dests[3]).mkdir()
    for name, data in users.items():
        (Path(dests[3]) / name).write_bytes(data)

    out = run_driver(ray_cluster, WRITE_ERRORS, str(held), *dests)

    refused = out["refused"]
    assert "DestinationError" in refused["error"], refused
    assert f"{held} already holds a dataset" in refused["message"] and "overwrite=True" in refused["message"]
    replaced = out["replaced"]["totals"]
    assert replaced["num_samples"] == replaced["num_members"] == 20, out["replaced"]
    assert replaced["bytes"] == sum((held / n).stat().st_size for n in shard_names(held))
    assert sorted(p.name for p in held.iterdir() if not p.name.endswith((".tar", ".samples"))) == ["index.bin", "keys"]
    assert not set(before) & {p.name for p in held.iterdir()} - {"index.bin"}  # nothing of the old dataset left
    assert sorted(read_back(held)) == [f"{i:04d}" for i in range(20)]

    empty = out["empty"]
    assert "SourceError" in empty["error"] and "has no rows" in empty["message"], empty
    assert not (Path(dests[0]) / "index.bin").exists()

    bad = out["bad"]
    assert "TypeError" in bad["error"], bad
    assert f"{dests[1]}, write task" in bad["message"], bad
    assert "sample '0005', extension 'cls': a bool is ambiguous" in bad["message"], bad
    left = out["left_by_bad"]
    assert "index.bin" not in left and not [n for n in left if "partial" in n]  # the shard in progress dropped
    assert len([n for n in left if n.endswith(".tar")]) >= 2  # the failed task's first two shards (rows 0-3)
    refused = out["after_bad"]
    assert (
        "DestinationError" in refused["error"] and "shards of a ShardDatasink write that failed" in refused["message"]
    )
    assert out["after_bad_overwrite"]["totals"]["num_samples"] == 20
    assert sorted(read_back(dests[1])) == [f"{i:04d}" for i in range(20)]
    assert len(shard_names(Path(dests[1]))) == out["after_bad_overwrite"]["totals"]["num_shards"]  # none left over
    dotted = out["dotted"]
    assert "ValueError" in dotted["error"] and "sample key 'a.b'" in dotted["message"], dotted
    foreign = out["foreign"]  # a user's file with a name the sink writes: refused, naming it
    assert "DestinationError" in foreign["error"], foreign
    assert "records: data-000000-000000.tar; move it away" in foreign["message"], foreign
    assert "ShardDatasink(..., clobber=True)" in foreign["message"], foreign
    assert out["clobbered"]["totals"]["num_samples"] == 20  # clobber=True writes over it, and over nothing else
    assert (Path(dests[3]) / "notes.txt").read_bytes() == users["notes.txt"]


def require_ray() -> None:
    """Fail, as the ``ray_cluster`` fixture does, where Ray is missing: the test extra installs it."""
    if importlib.util.find_spec("ray") is None:
        pytest.fail("Ray is not installed: pip install -e '.[test]' (or 'shardstream[ray]')")


def alive(pids) -> list[int]:
    """Those of ``pids`` that are live processes (not zombies)."""
    found = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(pid)
    return found


def test_local_cluster_stops_every_process_it_started(tmp_path):
    require_ray()
    with pytest.raises(RayClusterError, match="not found or not executable"):
        LocalRayCluster(ray_path=str(tmp_path / "no-ray")).start()
    cluster = LocalRayCluster(num_nodes=1)
    with cluster:
        assert cluster.wait_for_nodes(30) == {"nodes": 1, "cpus": 1.0}
        started = cluster.processes()
        temp_dir = cluster.temp_dir
        assert {"gcs_server", "raylet"} <= set(started.values()), started
    assert cluster.processes() == {} and not temp_dir.exists()
    assert not alive(started)


# a task on each node reports where it ran and the HOME it ran with
RUN_TASKS = """
import json, os, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")

@ray.remote(num_cpus=1)
def where():
    return ray.get_runtime_context().get_node_id(), os.environ.get("HOME")

nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
ran = ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes])
print("RESULT " + json.dumps({"nodes": sorted({n for n, _ in ran}), "homes": sorted({h for _, h in ran})}))
"""


def run_tasks(address: str, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", RUN_TASKS, address], env=env, capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (
        f"driver exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len("RESULT ") :])


def test_a_stale_auth_token_in_the_users_home_does_not_break_the_cluster(tmp_path, monkeypatch):
    """Ray 2.60's ray.init() leaves ~/.ray/auth_token behind; with it, the head's ``ray start``
    turned token authentication on and the GCS refused the second node (InvalidAuthToken)."""
    require_ray()
    home = tmp_path / "user-home"
    (home / ".ray").mkdir(parents=True)
    stale = "stale-token-of-an-earlier-ray-init-0123456789abcdef\n"
    (home / ".ray" / "auth_token").write_text(stale)
    monkeypatch.setenv("HOME", str(home))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)

    with LocalRayCluster(num_nodes=2, cpus_per_node=1) as cluster:
        assert cluster.wait_for_nodes(30) == {"nodes": 2, "cpus": 2.0}
        assert cluster.env()["HOME"] == str(cluster.home) and cluster.home.parent == cluster.temp_dir
        # a driver run with cluster.env(): its tasks ran on both nodes, with the cluster's HOME
        ran = run_tasks(cluster.address, cluster.env())
        assert len(ran["nodes"]) == 2 and ran["homes"] == [str(cluster.home)], ran  # one task pinned to each
        # ... and one run with the user's own environment, the stale token in its HOME
        assert run_tasks(cluster.address, dict(os.environ))["homes"] == [str(cluster.home)]
        started = cluster.processes()
    assert not alive(started)
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == [".ray", ".ray/auth_token"]
    assert (home / ".ray" / "auth_token").read_text() == stale  # the user's token, left as it was
