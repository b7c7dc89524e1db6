"""The process handling the local servers share (:mod:`.s3server`, and the test servers under ``tests/servers``).

A server runs as a child process in a session (so a process group) of its own, on 127.0.0.1, with
its output appended to a log file: :func:`spawn` starts it, :func:`wait_until` waits a bounded
time for it to answer, :func:`log_tail` quotes its log in error messages and
:func:`stop_process_group` stops it and whatever it started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

__all__ = [
    "HOST",
    "NO_PROXY_OPENER",
    "STOP_GRACE_S",
    "ServerContext",
    "exit_on_stop_signals",
    "find_program",
    "free_port",
    "free_ports",
    "log_tail",
    "sleep_until_interrupted",
    "spawn",
    "startup_timeout",
    "stop_process_group",
    "wait_until",
]

HOST = "127.0.0.1"
STOP_GRACE_S = 5.0
NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # ignore *_proxy

_C = TypeVar("_C", bound="ServerContext")


class ServerContext:
    """``with`` for a server class with ``_proc`` (None while stopped), :meth:`start` and :meth:`stop`:
    the ``with`` starts the server unless it runs already, and stops it at the end."""

    _proc: subprocess.Popen[bytes] | None

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def startup_timeout(value: float) -> float:
    """``value`` as a float; raises ValueError unless it is > 0 (the servers' ``startup_timeout_s``)."""
    if not value > 0:
        raise ValueError(f"startup_timeout_s must be > 0, got {value!r}")
    return float(value)


def free_ports(count: int) -> list[int]:
    """Returns ``count`` distinct free TCP ports on 127.0.0.1 (all sockets held until the end)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            ports.append(sock.getsockname()[1])
        return ports


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def find_program(name: str, given: str | None, error: type[Exception], *, what: str, missing: str, hint: str) -> str:
    """The path of the program ``name``: ``given`` when set (it must be executable), else the one
    beside this interpreter (a venv's scripts), else the one on ``PATH``.

    Raises:
        error: ``given`` is not executable (``"{what} not found or not executable at ...; {hint}"``),
            or no program was found (``"{missing}; {hint}"``).
    """
    if given is not None:
        if not os.access(given, os.X_OK):
            raise error(f"{what} not found or not executable at {given!r}; {hint}")
        return given
    sibling = Path(sys.executable).parent / name
    if os.access(sibling, os.X_OK):
        return str(sibling)
    found = shutil.which(name)
    if found is None:
        raise error(f"{missing}; {hint}")
    return found


def spawn(
    args: list[str],
    *,
    log_path: Path,
    cwd: Path,
    error: type[Exception],
    env: Mapping[str, str] | None = None,
    context: str = "",
) -> subprocess.Popen[bytes]:
    """Starts ``args`` in a session of its own, stdin from /dev/null, stdout and stderr appended to ``log_path``.

    Raises:
        error: ``could not run <args[0]><context>: <reason>`` when the program cannot be run.
    """
    try:
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=None if env is None else dict(env),
                start_new_session=True,
            )
    except OSError as e:
        raise error(f"could not run {args[0]}{context}: {e}") from e


def wait_until(
    ready: Callable[[], bool],
    *,
    proc: subprocess.Popen[bytes] | None,
    timeout_s: float,
    error: type[Exception],
    name: str,
    not_ready: str,
    log_tail: Callable[[], str],
    interval_s: float = 0.05,
) -> None:
    """Calls ``ready`` every ``interval_s`` seconds until it returns true.

    Raises:
        error: ``<name> exited with code <code> during startup; log: <tail>`` when ``proc`` exits
            first (code -1 when there is no ``proc``), ``<name> <not_ready> within <timeout_s> s;
            log: <tail>`` when ``timeout_s`` seconds pass first.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        code = proc.poll() if proc is not None else -1
        if code is not None:
            raise error(f"{name} exited with code {code} during startup; log: {log_tail()}")
        if ready():
            return
        if time.monotonic() > deadline:
            raise error(f"{name} {not_ready} within {timeout_s:g} s; log: {log_tail()}")
        time.sleep(interval_s)


def log_tail(path: Path | None, lines: int = 5, *, missing: str = "(no log)", empty: str = "(empty)") -> str:
    """The last ``lines`` lines of the log file ``path`` on one line, joined by `` | ``.

    ``missing`` when there is no path or the file cannot be read, ``empty`` when it holds nothing.
    """
    if path is None:
        return missing
    try:
        text = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return missing
    return " | ".join(line.strip() for line in text) or empty


def stop_process_group(
    proc: subprocess.Popen[bytes], first_signal: int = signal.SIGTERM, *, signal_group: bool = True
) -> None:
    """Stops ``proc`` (a session leader, see :func:`spawn`) and its process group, and reaps it.

    Sends ``first_signal`` to the group (to ``proc`` alone with ``signal_group=False``), waits up
    to :data:`STOP_GRACE_S` seconds for ``proc`` to exit, then SIGKILLs the whole group, which
    also reaps any stray group members (nginx workers, say).
    """
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if signal_group else os.kill)(proc.pid, first_signal)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def exit_on_stop_signals() -> None:
    """For a ``main()`` that runs a server: Ctrl-C raises KeyboardInterrupt (even if SIGINT was
    inherited as ignored) and SIGTERM exits with status 0, so the server's ``with`` stops it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def sleep_until_interrupted() -> None:
    """Sleeps until Ctrl-C (KeyboardInterrupt, swallowed) or a signal handler's exit."""
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)
