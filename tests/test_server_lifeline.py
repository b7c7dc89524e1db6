"""Servers go with their parent (issue 51, point 3): when the process that started a local server
dies by SIGKILL, where no ``finally`` or ``atexit`` runs, the server stops within seconds and its
temporary directory is removed (the lifeline of :mod:`shardstream.testing.process`); a SeaweedFS
temporary directory whose owners are all gone is removed at the next start; a ``--dir`` stays.

Real processes throughout: each parent is a subprocess in a session of its own that starts the
servers, prints where they are and sleeps until this test SIGKILLs it (that process alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_s3_server_command import Running, put_and_get

from shardstream.testing import SeaweedS3Server
from shardstream.testing.lifeline import process_is_alive, process_start_ticks
from shardstream.testing.process import free_port, spawn
from shardstream.testing.s3server import OWNER_RECORD

pytestmark = pytest.mark.slow

TESTS_DIR = Path(__file__).resolve().parent
SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))
STARTUP_S = 60.0  # seconds a parent may take to start its servers and print where they are
GONE_S = 15.0  # seconds from the parent's SIGKILL until its servers and their directories are gone
LINUX = Path("/proc/self/stat").exists()


def wait_for(condition: Callable[[], bool], *, timeout_s: float, what: str) -> float:
    """Seconds until ``condition()`` holds; fails the test naming ``what`` after ``timeout_s``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.05)
    return time.monotonic() - started


def accepts(port: int) -> bool:
    """Whether 127.0.0.1:``port`` accepts a TCP connection."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def listening_pids(port: int) -> set[int]:
    """The live processes holding a listening TCP socket on ``port`` (from /proc/net/tcp{,6} and
    each process's open descriptors).

    Whether the port *accepts* after a server died is no test that the server let go of it: under
    pytest-xdist another test's server may bind the same free port a moment later (CI saw it), so
    the tests compare who holds it before and after instead."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    holders = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd") if inodes else ():
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                holders.add(int(fd_dir.parent.name))
    return holders


def processes_naming(path: Path) -> list[int]:
    """The live processes whose command line names ``path`` or whose working directory is in it
    (the server using it, and its lifeline, which has it in its ``--remove``)."""
    found, needle = [], os.fsencode(path)
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cwd = os.readlink(proc / "cwd")
            if needle in (proc / "cmdline").read_bytes() or Path(cwd).is_relative_to(path):
                if process_is_alive(int(proc.name)):
                    found.append(int(proc.name))
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Parent(Running):
    """A parent process in a session of its own; its stdout lines come through a queue."""

    def __init__(self, args: list[str], **kwargs: Any) -> None:
        super().__init__(args, start_new_session=True, **kwargs)

    def read_until(self, done: Callable[[str], bool]) -> list[str]:
        """Its stdout lines up to the first for which ``done`` holds (within :data:`STARTUP_S`)."""
        lines, deadline = [], time.monotonic() + STARTUP_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"{self.proc.args[:3]}: not ready within {STARTUP_S:g} s; stdout so far: {lines}")
            if line is None:
                self.proc.wait(10)
                pytest.fail(
                    f"{self.proc.args[:3]} exited with {self.proc.returncode}: {lines} {self.proc.stderr.read()}"
                )
            lines.append(line)
            if done(line):
                return lines

    def sigkill(self) -> float:
        """SIGKILLs the parent alone and reaps it; returns the time.monotonic() of the kill."""
        os.kill(self.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        self.proc.wait(10)
        return killed

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def s3_server_command(*args: str) -> tuple[Parent, int, Path, dict[str, str]]:
    """Runs ``shardstream s3-server --bucket kept ARGS``; returns it, its port, its data directory
    and its exported variables once it printed them."""
    port = free_port()
    parent = Parent([SHARDSTREAM, "s3-server", "--bucket", "kept", "--port", str(port), *args])
    lines = parent.read_until(lambda line: line.startswith("export AWS_REGION="))
    data_dir = Path(lines[0].split(" data in ")[1].split(" (")[0])
    env = {}
    for line in lines:
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0]
    return parent, port, data_dir, env


def weed_pids(port: int) -> list[int]:
    """The live ``weed`` processes serving S3 on ``port``."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            if args[0].endswith(b"weed") and f"-s3.port={port}".encode() in args:
                if process_is_alive(int(cmdline.parent.name)):
                    pids.append(int(cmdline.parent.name))
    return pids


@pytest.mark.skipif(not LINUX, reason="finds the processes in /proc")
@pytest.mark.timeout(180)
def test_sigkill_of_s3_server_stops_weed_and_removes_its_temporary_directory():
    parent, port, data_dir, env = s3_server_command()
    try:
        assert data_dir.is_dir() and (data_dir / OWNER_RECORD).is_file()
        assert len(weed_pids(port)) == 1 and accepts(port)
        holders = listening_pids(port)
        assert set(weed_pids(port)) <= holders, holders
        weed_args = Path(f"/proc/{weed_pids(port)[0]}/cmdline").read_bytes().decode().split("\0")
        grpc_ports = [arg.partition("=")[2] for arg in weed_args if ".port.grpc=" in arg]
        killed = parent.sigkill()
        wait_for(lambda: not weed_pids(port), timeout_s=GONE_S, what=f"weed on port {port} after the parent's SIGKILL")
        weed_gone = time.monotonic() - killed
        assert not listening_pids(port) & holders  # nothing that held the port (nor a child of weed's) keeps it
        wait_for(lambda: not data_dir.exists(), timeout_s=GONE_S, what=f"removal of {data_dir}")
        dir_gone = time.monotonic() - killed
        wait_for(lambda: not processes_naming(data_dir), timeout_s=GONE_S, what=f"the processes naming {data_dir}")
        print(f"after the parent's SIGKILL: weed gone in {weed_gone:.2f} s, {data_dir} removed in {dir_gone:.2f} s")
        assert len(grpc_ports) == 5
        for grpc_port in grpc_ports:  # weed's sockets, left by a SIGKILL and some even by a SIGTERM
            assert not list(Path(tempfile.gettempdir()).glob(f"seaweedfs-*-grpc-{grpc_port}.sock"))
    finally:
        parent.close()
        kill_all(weed_pids(port) + processes_naming(data_dir))
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.skipif(not LINUX, reason="finds the processes in /proc")
@pytest.mark.timeout(240)
def test_sigkill_of_s3_server_with_dir_stops_weed_and_keeps_the_dir_and_its_data(tmp_path):
    data_dir = tmp_path / "s3-data"
    parent, port, printed_dir, env = s3_server_command("--dir", str(data_dir))
    try:
        assert printed_dir == data_dir and not (data_dir / OWNER_RECORD).exists()
        assert asyncio.run(put_and_get(env, "kept", "object", b"kept across a SIGKILL")) == b"kept across a SIGKILL"
        holders = listening_pids(port)
        assert set(weed_pids(port)) <= holders, holders
        parent.sigkill()
        wait_for(lambda: not weed_pids(port), timeout_s=GONE_S, what=f"weed on port {port} after the parent's SIGKILL")
        wait_for(lambda: not processes_naming(data_dir), timeout_s=GONE_S, what=f"the processes naming {data_dir}")
        assert not listening_pids(port) & holders and data_dir.is_dir() and (data_dir / "s3.json").is_file()
        with SeaweedS3Server(data_dir=data_dir) as server:  # the data is still there
            assert asyncio.run(put_and_get(server.info.env(), "kept", "object", None)) == b"kept across a SIGKILL"
        assert data_dir.is_dir()
    finally:
        parent.close()
        kill_all(weed_pids(port) + processes_naming(data_dir))


def _fake_data_dir(owners: list[tuple[int, int | None]] | None) -> Path:
    """A directory like a SeaweedS3Server's temporary one, with an owner record naming ``owners``
    (pid, start ticks), or none at all."""
    path = Path(tempfile.mkdtemp(prefix="shardstream-s3-"))
    (path / "weed.log").write_text("a leftover\n")
    if owners is not None:
        processes = [{"pid": pid, "start_ticks": ticks} for pid, ticks in owners]
        (path / OWNER_RECORD).write_text(json.dumps({"temporary": True, "processes": processes}))
    return path


@pytest.mark.skipif(not LINUX, reason="start times come from /proc")
@pytest.mark.timeout(120)
def test_a_start_removes_the_temporary_dirs_whose_owners_are_gone_and_keeps_the_others():
    gone = subprocess.Popen(["sleep", "60"])
    gone_ticks = process_start_ticks(gone.pid)
    gone.kill()
    gone.wait()
    me, my_ticks = os.getpid(), process_start_ticks(os.getpid())
    assert gone_ticks is not None and my_ticks is not None
    dead = _fake_data_dir([(gone.pid, gone_ticks)])
    reused = _fake_data_dir([(me, my_ticks + 1)])  # this pid, but another process: a reused pid
    live = _fake_data_dir([(gone.pid, gone_ticks), (me, my_ticks)])
    unrecorded = _fake_data_dir(None)  # being created, or not one of ours
    try:
        with SeaweedS3Server() as first:
            first_dir = first._tmp_dir
            assert first_dir is not None
            record = json.loads((first_dir / OWNER_RECORD).read_text())
            assert record == {
                "temporary": True,
                "processes": [
                    {"pid": me, "start_ticks": my_ticks},
                    {"pid": first.pid, "start_ticks": process_start_ticks(first.pid)},
                ],
            }
            assert not dead.exists() and not reused.exists()
            assert live.is_dir() and unrecorded.is_dir()
            with SeaweedS3Server():  # a second start leaves the first one's directory alone
                assert first_dir.is_dir()
        assert not first_dir.exists()
    finally:
        for path in (dead, reused, live, unrecorded):
            shutil.rmtree(path, ignore_errors=True)


_TEST_SERVERS = """
import json, sys, time
from servers.emulators import Azurite, GcsEmulator
from servers.faultserver import FaultServer
from servers.nginx import NginxServer

root, names = sys.argv[1], sys.argv[2:]
made = {"nginx": lambda: NginxServer(root), "fault": lambda: FaultServer(root), "gcs": GcsEmulator, "azurite": Azurite}
where = {}
for name in names:
    server = made[name]()
    server.start()
    where[name] = {"pid": server._proc.pid, "port": server._port, "dir": str(server._tmp_dir)}
print(json.dumps(where), flush=True)
time.sleep(600)
"""


def _azurite_found() -> bool:
    from servers.emulators import EmulatorError, _find_azurite

    try:
        _find_azurite(None)
    except EmulatorError:
        return False
    return shutil.which("node") is not None


@pytest.mark.skipif(not LINUX, reason="finds the processes in /proc")
@pytest.mark.timeout(180)
def test_sigkill_of_the_parent_stops_nginx_the_fault_server_and_the_emulators(tmp_path):
    (tmp_path / "file.bin").write_bytes(b"x" * 100)
    names = ["fault", "gcs"]
    if shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK):
        names.append("nginx")
    if _azurite_found():
        names.append("azurite")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    parent = Parent([sys.executable, "-c", _TEST_SERVERS, str(tmp_path), *names], env=env, cwd=tmp_path)
    where: dict[str, dict] = {}
    try:
        where = json.loads(parent.read_until(lambda line: line.startswith("{"))[-1])
        assert sorted(where) == sorted(names)
        for name, server in where.items():
            assert process_is_alive(server["pid"]) and accepts(server["port"]) and Path(server["dir"]).is_dir(), name
            server["holders"] = listening_pids(server["port"])
            assert server["holders"], name
        killed = parent.sigkill()
        for name, server in where.items():
            wait_for(lambda s=server: not process_is_alive(s["pid"]), timeout_s=GONE_S, what=f"{name} to exit")
            wait_for(lambda s=server: not Path(s["dir"]).exists(), timeout_s=GONE_S, what=f"{name}'s dir removed")
            assert not listening_pids(server["port"]) & server["holders"], name
        print(f"after the parent's SIGKILL: {', '.join(names)} gone, dirs removed in {time.monotonic() - killed:.2f} s")
        for name, server in where.items():
            wait_for(lambda s=server: not processes_naming(Path(s["dir"])), timeout_s=GONE_S, what=f"{name}'s lifeline")
    finally:
        parent.close()
        for server in where.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server["pid"], signal.SIGKILL)
            kill_all(processes_naming(Path(server["dir"])))
            shutil.rmtree(server["dir"], ignore_errors=True)


_RAY_CLUSTER = """
import json, time
from servers.ray_cluster import LocalRayCluster

cluster = LocalRayCluster(num_nodes=1)
cluster.start()
print(json.dumps({"pids": sorted(cluster.processes()), "sids": sorted(cluster._sids), "dir": str(cluster.temp_dir)}), flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not LINUX, reason="finds the processes in /proc")
@pytest.mark.timeout(300)
def test_sigkill_of_the_parent_stops_the_local_ray_cluster(tmp_path):
    pytest.importorskip("ray")
    from shardstream.testing.lifeline import session_processes

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    parent = Parent([sys.executable, "-c", _RAY_CLUSTER], env=env, cwd=tmp_path)
    sids: list[int] = []
    try:
        where = json.loads(parent.read_until(lambda line: line.startswith("{"))[-1])
        sids, ray_dir = where["sids"], Path(where["dir"])
        assert where["pids"] and ray_dir.is_dir()
        killed = parent.sigkill()
        wait_for(lambda: not session_processes(sids), timeout_s=GONE_S, what=f"the Ray processes of sessions {sids}")
        wait_for(lambda: not ray_dir.exists(), timeout_s=GONE_S, what=f"removal of {ray_dir}")
        print(f"after the parent's SIGKILL: Ray stopped and {ray_dir} removed in {time.monotonic() - killed:.2f} s")
    finally:
        parent.close()
        kill_all(sorted(session_processes(sids)))


@pytest.mark.timeout(60)
def test_spawn_still_reports_the_servers_own_exit_and_stands_its_lifeline_down(tmp_path):
    from shardstream.testing.process import stop_process_group

    class Refused(RuntimeError):
        pass

    proc = spawn(["sh", "-c", "exit 3"], log_path=tmp_path / "log", cwd=tmp_path, error=Refused)
    assert proc.wait(10) == 3 and proc.lifeline is not None and process_is_alive(proc.lifeline.pid)
    stop_process_group(proc)
    assert not process_is_alive(proc.lifeline.pid)
    with pytest.raises(Refused, match=r"could not run .*no-such-program"):
        spawn([str(tmp_path / "no-such-program")], log_path=tmp_path / "log", cwd=tmp_path, error=Refused)


@pytest.mark.skipif(not LINUX, reason="finds the processes in /proc")
@pytest.mark.timeout(60)
def test_a_spawned_process_and_its_directory_go_with_a_sigkilled_parent(tmp_path):
    keep, doomed = tmp_path / "kept", tmp_path / "doomed"
    keep.mkdir()
    doomed.mkdir()
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from shardstream.testing.process import spawn
        proc = spawn(["sleep", "600"], log_path=Path({str(keep / "log")!r}), cwd=Path({str(keep)!r}),
                     error=RuntimeError, remove_on_parent_death=[Path({str(doomed)!r})])
        print(proc.pid, proc.lifeline.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = Parent([sys.executable, "-c", script])
    pids: list[int] = []
    try:
        pids = [int(word) for word in parent.read_until(lambda line: True)[0].split()]
        server, lifeline = pids
        killed = parent.sigkill()
        wait_for(lambda: not process_is_alive(server), timeout_s=GONE_S, what="the spawned process to exit")
        wait_for(lambda: not doomed.exists(), timeout_s=GONE_S, what=f"removal of {doomed}")
        wait_for(lambda: not process_is_alive(lifeline), timeout_s=GONE_S, what="the lifeline to exit")
        print(f"after the parent's SIGKILL: the process and its directory gone in {time.monotonic() - killed:.2f} s")
        assert keep.is_dir()
    finally:
        parent.close()
        kill_all(pids)
