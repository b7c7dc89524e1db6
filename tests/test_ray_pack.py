"""``pack --ray`` and ``index build --ray`` on a real local Ray cluster (two raylets, 1 CPU
each, started by the ``ray_cluster`` fixture): the same bytes as on one machine, a task whose
worker is SIGKILLed is retried and resumes, and a bad input fails as the CLI reports it. Every
driver runs with ``ray_cluster.env()``, and the worker killed is one of that cluster's processes,
never another Ray on this machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import all_files
from servers.faultproxy import FaultProxy
from test_listing import upload_tree
from test_pack_scale import dataset_files, make_tree, read_back

from shardstream import pack

SHARDSTREAM = str(Path(sys.executable).parent / "shardstream")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout_s: float = 240) -> subprocess.CompletedProcess:
    """``shardstream ARGS``; ``env``: ``ray_cluster.env()`` where it drives the cluster."""
    return subprocess.run([SHARDSTREAM, *args], capture_output=True, text=True, timeout=timeout_s, env=env)


def test_a_ray_pack_is_the_same_as_one_machines(tmp_path, ray_cluster):
    src = make_tree(tmp_path / "src", classes=4, per_class=60, size=900)
    pack(src, tmp_path / "local", workers=1, max_shard_bytes=20_000, progress=False)
    done = run_cli(
        "pack",
        str(src),
        str(tmp_path / "ray"),
        "--ray",
        ray_cluster.address,
        "--shard-size",
        "20000",
        env=ray_cluster.env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "packing on Ray" in done.stderr and "streams" in done.stderr  # the driver's one bar
    assert "index" in done.stdout
    assert dataset_files(tmp_path / "ray") == dataset_files(tmp_path / "local")
    assert read_back(tmp_path / "ray") == all_files(src)

    built = {}
    for how in ("local", "ray"):
        out = tmp_path / f"built-{how}"
        extra = ["--ray", ray_cluster.address] if how == "ray" else ["--workers", "1"]
        env = ray_cluster.env() if how == "ray" else None
        done = run_cli("index", "build", str(tmp_path / "local"), "--output", str(out), *extra, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        built[how] = (out / "index.bin").read_bytes()
    assert built["ray"] == built["local"]


def task_processes(cluster) -> list[int]:
    """The workers of ``cluster`` (a LocalRayCluster) running a pack stream task (Ray titles
    them ``ray::TASK_NAME``), found among its own processes only: whatever other Ray runs on
    this machine is never a candidate."""
    pids = []
    for pid in sorted(cluster.processes()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # exited meanwhile
            continue
        if cmdline.startswith(b"ray::shardstream-pack-stream"):
            pids.append(pid)
    return pids


DRIVER = """
import json, sys
from shardstream import S3Config, pack
args = json.loads(sys.argv[1])
report = pack(args["source"], args["dest"], ray=args["address"], workers=2, max_shard_bytes=12_000,
              s3=S3Config(**args["s3"]), progress=False)
print(report.summary())
"""


def test_a_killed_task_is_retried_and_resumes(tmp_path, ray_cluster, s3_server, s3_bucket, s3_config):
    src = make_tree(tmp_path / "src", classes=4, per_class=150, size=700)
    upload_tree(src, f"s3://{s3_bucket}/src", s3_config)
    source = f"s3://{s3_bucket}/src"
    pack(source, tmp_path / "local", workers=1, max_shard_bytes=12_000, s3=s3_config, progress=False)
    slow = {"delay": 1.0}  # every file GET waits 0.2 s: the streams take seconds

    def file_gets(method: str, path: str) -> bool:
        return method == "GET" and path.startswith(f"/{s3_bucket}/src/")

    dest = tmp_path / "ray"
    with FaultProxy(s3_server.info.endpoint_url, rates=slow, delay_s=0.2, match=file_gets) as proxy:
        s3 = {**s3_config.__dict__, "endpoint_url": proxy.endpoint_url}
        args = {"source": source, "dest": str(dest), "address": ray_cluster.address, "s3": s3}
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ray_cluster.env(),
        )
        try:
            deadline = time.monotonic() + 120
            state = dest / ".shardstream"
            while not all((state / f"s{s:05d}-0000000.json").exists() for s in (0, 1)):
                assert driver.poll() is None, driver.communicate()[1][-3000:]
                assert time.monotonic() < deadline, "the streams recorded no shard in 120 s"
                time.sleep(0.1)
            victims = task_processes(ray_cluster)
            assert victims, f"no worker of {ray_cluster} titled ray::shardstream-pack-stream-*"
            os.kill(victims[0], signal.SIGKILL)
            out, err = driver.communicate(timeout=240)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.communicate()
    assert driver.returncode == 0, err[-3000:]
    assert "(resumed)" in out  # the retried task continued after its journal's last record
    assert dataset_files(dest) == dataset_files(tmp_path / "local")


def test_a_bad_file_fails_on_ray_as_it_does_on_one_machine(tmp_path, ray_cluster):
    src = make_tree(tmp_path / "src", classes=2, per_class=20)
    (src / "class1" / "bad.bin").symlink_to("/proc/self/mem")  # listed fine, fails when read
    local = run_cli("pack", str(src), str(tmp_path / "local"), "--workers", "1", "--no-progress")
    on_ray = run_cli(
        "pack", str(src), str(tmp_path / "ray"), "--ray", ray_cluster.address, "--no-progress", env=ray_cluster.env()
    )
    assert local.returncode == on_ray.returncode == 1
    message = [line for line in on_ray.stderr.splitlines() if "bad.bin" in line]
    assert message and "--on-error skip" in message[-1], on_ray.stderr[-3000:]
    assert message[-1] in local.stderr  # the same words
    skipped = run_cli(
        "pack",
        str(src),
        str(tmp_path / "ray"),
        "--ray",
        ray_cluster.address,
        "--on-error",
        "skip",
        "--overwrite",
        env=ray_cluster.env(),
    )
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    report = (tmp_path / "ray" / "pack-report.jsonl").read_text()
    assert "bad.bin" in report
