"""A real local Ray cluster for tests: a head and a second raylet on this machine, each started
with ``ray start`` (``pip install shardstream[ray]``).

Ray's ``ray stop`` stops every Ray process on the machine, a cluster someone else runs here
included, so :class:`LocalRayCluster` never calls it: each ``ray start`` runs in a session of
its own, every daemon it starts (GCS, raylet, agents, workers) stays in that session, and
:meth:`LocalRayCluster.stop` signals exactly the processes of those sessions, in the order
``ray stop`` uses (raylets, then the rest, then the GCS), SIGKILLing what outlives the grace;
:meth:`LocalRayCluster.processes` lists them, so a test that kills a Ray worker picks it there.
When the process that started the cluster dies without stopping it (SIGKILL, the OOM killer), a
lifeline (:class:`shardstream.testing.process.Lifeline`, started before the first ``ray start``
and told each session as it starts) stops those sessions' processes within seconds and removes
the cluster's temporary directory.

Nor does the cluster share Ray's per-user state with the user's own Ray. Ray 2.60 keeps a token
in ``$HOME/.ray/auth_token`` (written by any ``ray.init()`` that starts a cluster) and turns
token authentication on in ``ray start --head`` when that file, ``RAY_AUTH_TOKEN`` or
``RAY_AUTH_TOKEN_PATH`` holds a token and ``RAY_AUTH_MODE`` is unset, but never in
``ray start --address``, which the GCS then refuses (``AuthenticationError: InvalidAuthToken``).
So every process the cluster starts gets ``RAY_AUTH_MODE=disabled``, none of
``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH``/``RAY_ADDRESS`` from this environment, and a ``HOME``
of its own in the cluster's temporary directory (where Ray also looks for ``~/.ray/config.json``);
``PYTHONUSERBASE`` keeps packages installed with ``pip install --user`` importable there.
Linux only (processes are found in ``/proc``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shardstream.testing.lifeline import session_processes as _session_processes  # pid -> (comm, state)
from shardstream.testing.process import HOST, Lifeline, find_program, free_ports, log_tail, startup_timeout

__all__ = ["LocalRayCluster", "RayClusterError"]

STOP_GRACE_S = 5.0  # per step of the stop order (raylets, the rest, the GCS) before SIGKILL
# not passed on from this environment: Ray's token authentication, set by the cluster itself, and
# another cluster's address (env() sets this one's for drivers)
_NOT_INHERITED = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")
_OBJECT_STORE_BYTES = 256 << 20
_CHECK_NODES = """
import json, sys, time
import ray
address, want_nodes, want_cpus, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
deadline = time.monotonic() + timeout_s
while True:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    cpus = ray.cluster_resources().get("CPU", 0.0)
    if len(nodes) >= want_nodes and cpus >= want_cpus or time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(json.dumps({"nodes": len(nodes), "cpus": cpus}))
"""


class RayClusterError(RuntimeError):
    """The local Ray cluster could not be started, reached or stopped."""


def _find_ray(ray_path: str | None) -> str:
    return find_program(
        "ray",
        ray_path,
        RayClusterError,
        what="ray CLI",
        missing="the `ray` CLI was not found",
        hint="pip install 'shardstream[ray]'",
    )


class LocalRayCluster:
    """``with LocalRayCluster() as cluster:`` a Ray cluster of ``num_nodes`` raylets on this
    machine (a head, then ``ray start --address`` for each other node), reachable at
    :attr:`address`; stopped, with every process it started, when the ``with`` ends.

    Every node gets ``cpus_per_node`` CPUs and an object store of ``object_store_bytes``; every
    port is picked free (GCS, dashboard, client server) or left to the OS, so clusters of several
    users of one machine do not collide; the dashboard UI is off, usage stats are disabled
    (``RAY_USAGE_STATS_ENABLED=0`` in every process's environment) and so is token authentication
    (``RAY_AUTH_MODE=disabled``), whatever token the user's ``~/.ray/auth_token`` holds. Ray's
    files go to a fresh short temporary directory (its unix socket paths have a length limit),
    removed by :meth:`stop`, and so does the ``HOME`` of every process the cluster starts
    (``<temp_dir>/home``), drivers run with :meth:`env` included.

    Args:
        num_nodes: raylets to start (>= 1).
        cpus_per_node: ``--num-cpus`` of each.
        object_store_bytes: ``--object-store-memory`` of each, in bytes.
        startup_timeout_s: seconds each ``ray start`` may take, and, again, the nodes to
            register with the GCS.
        ray_path: the ``ray`` CLI; default next to ``sys.executable``, else ``PATH``.
    """

    def __init__(
        self,
        *,
        num_nodes: int = 2,
        cpus_per_node: int = 1,
        object_store_bytes: int = _OBJECT_STORE_BYTES,
        startup_timeout_s: float = 120.0,
        ray_path: str | None = None,
    ) -> None:
        if num_nodes < 1 or cpus_per_node < 1:
            raise ValueError(f"{num_nodes=} and {cpus_per_node=} must be >= 1")
        self.num_nodes = num_nodes
        self.cpus_per_node = cpus_per_node
        self.object_store_bytes = object_store_bytes
        self.startup_timeout_s = startup_timeout(startup_timeout_s)
        self._ray_path = ray_path
        self._sids: set[int] = set()  # one session per `ray start`: the pid of that command
        self._port: int | None = None
        self._temp_dir: Path | None = None
        self._lifeline: Lifeline | None = None  # stops the sessions if this process dies first
        self.startup_s: float | None = None  # seconds start() took, nodes registered included

    # ------------------------------------------------------------------------------ public

    @property
    def address(self) -> str:
        """``"127.0.0.1:PORT"``, the GCS address for ``ray.init(address=...)``."""
        if self._port is None:
            raise RayClusterError("LocalRayCluster is not running; call start() first")
        return f"{HOST}:{self._port}"

    @property
    def temp_dir(self) -> Path:
        """Ray's temporary directory (sessions, logs, sockets) while running."""
        if self._temp_dir is None:
            raise RayClusterError("LocalRayCluster is not running; call start() first")
        return self._temp_dir

    @property
    def home(self) -> Path:
        """The ``HOME`` of the cluster's processes and of drivers run with :meth:`env`:
        ``<temp_dir>/home``, so Ray's per-user files (``~/.ray``) are the cluster's own."""
        return self.temp_dir / "home"

    def env(self) -> dict[str, str]:
        """An environment for a driver process: this one's, with ``RAY_ADDRESS`` set to this
        cluster, usage stats and token authentication disabled, and :attr:`home` as ``HOME``."""
        return {**self._env(), "RAY_ADDRESS": self.address}

    def start(self) -> LocalRayCluster:
        """Start the nodes and wait until all are alive with their CPUs.

        Raises:
            RayClusterError: the ``ray`` CLI is missing, a ``ray start`` failed or took more
                than ``startup_timeout_s`` (names the node and quotes its log), or the nodes
                did not register in time. What was started is stopped again.
        """
        if self._port is not None:
            raise RayClusterError("LocalRayCluster already started")
        ray = _find_ray(self._ray_path)
        started = time.monotonic()
        atexit.register(self.stop)  # Ray's daemons outlive this process otherwise
        self._temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # /tmp/rayXXXXXXXX: short
        try:
            try:
                self._lifeline = Lifeline(remove=[self._temp_dir], grace_s=STOP_GRACE_S)
            except OSError as exc:
                raise RayClusterError(
                    f"could not start the Ray cluster's lifeline with {sys.executable}: {exc}"
                ) from exc
            self.home.mkdir()
            port, dashboard_port, client_port = free_ports(3)
            self._port = port
            common = [
                "--num-cpus",
                str(self.cpus_per_node),
                "--node-ip-address",
                HOST,
                "--temp-dir",
                str(self._temp_dir),
                "--disable-usage-stats",
                "--object-store-memory",
                str(self.object_store_bytes),
                "--min-worker-port",
                "0",  # the OS picks worker ports: two raylets here never hand out the same one
                "--max-worker-port",
                "0",
                "--dashboard-agent-listen-port",
                "0",
            ]
            head = [
                "--head",
                "--port",
                str(port),
                "--include-dashboard",
                "false",
                "--dashboard-port",
                str(dashboard_port),  # the minimal dashboard head still binds one (8265 by default)
                "--ray-client-server-port",
                str(client_port),
            ]
            self._ray_start(ray, "head node", [*head, *common])
            for i in range(1, self.num_nodes):
                extra = ["--address", self.address, "--include-log-monitor", "false"]
                self._ray_start(ray, f"node {i}", [*extra, *common])
            self.wait_for_nodes(self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def wait_for_nodes(self, timeout_s: float = 60.0) -> dict[str, float]:
        """Wait until the cluster reports ``num_nodes`` alive nodes and their CPUs, asking it
        from a short driver process (so this process never imports ray).

        Returns:
            ``{"nodes": alive nodes, "cpus": CPUs}`` as the cluster reported them.

        Raises:
            RayClusterError: not all nodes within ``timeout_s`` seconds, or the driver failed.
        """
        want_cpus = self.num_nodes * self.cpus_per_node
        args = [sys.executable, "-c", _CHECK_NODES, self.address, str(self.num_nodes), str(want_cpus), str(timeout_s)]
        try:
            done = subprocess.run(
                args, env=self._env(), capture_output=True, text=True, timeout=timeout_s + 60, cwd=self._temp_dir
            )
        except subprocess.TimeoutExpired as exc:
            raise RayClusterError(
                f"Ray cluster at {self.address}: a driver asking for its nodes did not finish in "
                f"{timeout_s + 60:g} s; {self._logs()}"
            ) from exc
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            tail = " | ".join(done.stderr.strip().splitlines()[-5:])
            raise RayClusterError(
                f"Ray cluster at {self.address}: a driver asking for its nodes exited with code "
                f"{done.returncode}: {tail}; {self._logs()}"
            )
        seen = json.loads(lines[-1])
        if seen["nodes"] < self.num_nodes or seen["cpus"] < want_cpus:
            raise RayClusterError(
                f"Ray cluster at {self.address}: {seen['nodes']} of {self.num_nodes} nodes alive, "
                f"{seen['cpus']:g} of {want_cpus} CPUs after {timeout_s:g} s; {self._logs()}"
            )
        return seen

    def processes(self) -> dict[int, str]:
        """``pid -> name`` (``/proc/PID/comm``: at most 15 characters) of the live processes this
        cluster started (GCS, raylets, agents, workers): the processes of its ``ray start``
        sessions, and no other Ray process on the machine. Empty when stopped."""
        return {pid: comm for pid, (comm, _) in _session_processes(self._sids).items()} if self._sids else {}

    def stop(self) -> None:
        """Stop every process the cluster started and remove its temporary directory.

        Raylets get SIGTERM first, then the other processes, then the GCS (``ray stop``'s order),
        each step SIGKILLing what is left after :data:`STOP_GRACE_S` seconds. Idempotent.

        Raises:
            RayClusterError: some process was still alive after SIGKILL (names them).
        """
        try:
            if self._sids:
                self._stop_sessions()
        finally:
            atexit.unregister(self.stop)
            self._port = None
            if self._temp_dir is not None:
                shutil.rmtree(self._temp_dir, ignore_errors=True)
                self._temp_dir = None
            if self._lifeline is not None:
                self._lifeline.stand_down()
                self._lifeline = None

    def __enter__(self) -> LocalRayCluster:  # noqa: PYI034 (typing.Self needs 3.11)
        return self.start() if self._port is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.address if self._port is not None else "stopped"
        return f"LocalRayCluster({where}, nodes={self.num_nodes}, cpus_per_node={self.cpus_per_node})"

    # ----------------------------------------------------------------------------- private

    def _env(self) -> dict[str, str]:
        """The environment of every process the cluster starts: this one's without
        :data:`_NOT_INHERITED`, with Ray's per-user state in :attr:`home` (module docstring)."""
        env = {name: value for name, value in os.environ.items() if name not in _NOT_INHERITED}
        env.setdefault("PYTHONUSERBASE", site.getuserbase())  # derived from HOME otherwise
        env.update(HOME=str(self.home), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
        return env

    def _ray_start(self, ray: str, what: str, args: list[str]) -> None:
        """Run one ``ray start`` in a session of its own (its daemons stay in it) and wait for it."""
        assert self._temp_dir is not None
        log_path = self._temp_dir / f"start-{len(self._sids)}.log"
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    [ray, "start", *args],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._temp_dir,
                    env=self._env(),
                    start_new_session=True,
                )
            except OSError as exc:
                raise RayClusterError(f"could not run {ray} start ({what}): {exc}") from exc
        self._sids.add(proc.pid)
        assert self._lifeline is not None
        try:
            self._lifeline.add_session(proc.pid)
        except OSError as exc:
            raise RayClusterError(
                f"the Ray cluster's lifeline (pid {self._lifeline.pid}) exited before the {what} started: {exc}"
            ) from exc
        try:
            code = proc.wait(timeout=self.startup_timeout_s)
        except subprocess.TimeoutExpired:
            raise RayClusterError(
                f"`ray start` of the {what} did not finish within {self.startup_timeout_s:g} s; "
                f"log: {log_tail(log_path, 10)}; {self._logs()}"
            ) from None
        if code != 0:
            raise RayClusterError(
                f"`ray start` of the {what} exited with code {code}; log: {log_tail(log_path, 10)}; {self._logs()}"
            )

    def _logs(self) -> str:
        """The tails of the GCS's and raylets' error logs, for error messages."""
        if self._temp_dir is None:
            return "no Ray logs"
        logs = sorted(self._temp_dir.glob("session_*/logs/gcs_server.err")) + sorted(
            self._temp_dir.glob("session_*/logs/raylet*.err")
        )
        parts = [f"{p.name}: {log_tail(p, 5)}" for p in logs if p.stat().st_size]
        return "Ray logs: " + ("; ".join(parts) if parts else f"no errors logged under {self._temp_dir}")

    def _stop_sessions(self) -> None:
        steps = (
            lambda comm: comm == "raylet",
            lambda comm: comm not in ("raylet", "gcs_server"),
            lambda comm: comm == "gcs_server",
        )
        for step in steps:
            targets = {pid for pid, (comm, _) in _session_processes(self._sids).items() if step(comm)}
            self._signal(targets, signal.SIGTERM)
            left = self._wait_gone(targets, STOP_GRACE_S)
            self._signal(left, signal.SIGKILL)
        self._signal(set(_session_processes(self._sids)), signal.SIGKILL)  # what started meanwhile
        left = self._wait_gone(set(_session_processes(self._sids)), STOP_GRACE_S)
        if left:
            raise RayClusterError(f"Ray processes still alive after SIGKILL: {sorted(left)}")
        self._sids.clear()

    @staticmethod
    def _signal(pids: set[int], signum: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _wait_gone(self, pids: set[int], timeout_s: float) -> set[int]:
        """The ``pids`` still alive after up to ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = pids & set(_session_processes(self._sids))
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.05)
