"""The process handling the local servers share (:mod:`.s3server`, and the test servers under ``tests/servers``).

A server runs as a child process in a session (so a process group) of its own, on 127.0.0.1, with
its output appended to a log file: :func:`spawn` starts it, :func:`wait_until` waits a bounded
time for it to answer, :func:`log_tail` quotes its log in error messages and
:func:`stop_process_group` stops it and whatever it started.

A server goes with its parent: beside every server :func:`spawn` starts a :class:`Lifeline`, a
small watcher process (:mod:`.lifeline`) that stops the server's session and removes the paths
it was given (``remove_on_parent_death``: the server's temporary directory) when the process
that started the server dies by any signal, SIGKILL included, where ``atexit`` and ``finally``
never run. :func:`stop_process_group` stands the watcher down once the server is stopped.
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from .lifeline import process_is_alive, process_start_ticks

__all__ = [
    "HOST",
    "LIFELINE_SCRIPT",
    "NO_PROXY_OPENER",
    "STOP_GRACE_S",
    "Lifeline",
    "ServerContext",
    "ServerProcess",
    "exit_on_stop_signals",
    "find_program",
    "free_port",
    "free_ports",
    "log_tail",
    "process_is_alive",
    "process_start_ticks",
    "sleep_until_interrupted",
    "spawn",
    "startup_timeout",
    "stop_process_group",
    "wait_until",
]

HOST = "127.0.0.1"
STOP_GRACE_S = 5.0  # seconds a server has to exit after its first stop signal, before SIGKILL
LIFELINE_SCRIPT = Path(__file__).with_name("lifeline.py")  # run by path: it imports no shardstream
_STAND_DOWN_S = 5.0  # seconds a lifeline has to exit after a stand-down, before SIGKILL
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


class Lifeline:
    """The parent's handle on a lifeline (:mod:`.lifeline`): a watcher process, child of this
    process and in a session of its own, that stops ``sessions`` (SIGTERM, ``grace_s`` seconds,
    SIGKILL) and removes ``remove`` (directories with their contents, or files) when this
    process dies, however it dies; :meth:`stand_down` lets it go once this process has stopped
    them itself.

    The watcher runs ``sys.executable -I`` :data:`LIFELINE_SCRIPT`, so it starts in tens of
    milliseconds and imports the standard library only; it checks its parent every 0.2 s, so a
    SIGKILLed parent's servers get their SIGTERM within about 0.2 s. Why a watcher beside the
    server and not a supervisor between this process and the server: see :mod:`.lifeline`. Only
    the process that made it talks to it: in a process forked from that one (a DataLoader
    worker), :meth:`add_session` and :meth:`stand_down` do nothing.

    Args:
        sessions: Session ids to stop (a session leader's pid, e.g. ``Popen.pid`` of a process
            started with ``start_new_session=True``); more with :meth:`add_session`.
        remove: Paths to remove once the sessions are gone.
        log_path: File the watcher appends its few lines to (what it did, when it acts);
            default none.
        grace_s: Seconds between the SIGTERM and the SIGKILL.

    Raises:
        OSError: The interpreter cannot be run.
    """

    def __init__(
        self,
        *,
        sessions: Iterable[int] = (),
        remove: Iterable[str | os.PathLike[str]] = (),
        log_path: Path | None = None,
        grace_s: float = STOP_GRACE_S,
    ) -> None:
        args = [sys.executable, "-I", str(LIFELINE_SCRIPT), "--parent-pid", str(os.getpid()), "--grace-s", str(grace_s)]
        for sid in sessions:
            args += ["--session", str(sid)]
        for path in remove:
            args += ["--remove", os.fspath(path)]
        self._owner_pid = os.getpid()
        with contextlib.ExitStack() as stack:
            log = stack.enter_context(open(log_path, "ab")) if log_path is not None else subprocess.DEVNULL
            self._proc = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, cwd="/", start_new_session=True
            )

    @property
    def pid(self) -> int:
        """Process id of the watcher."""
        return self._proc.pid

    def add_session(self, sid: int) -> None:
        """Watches session ``sid`` too.

        Raises:
            BrokenPipeError: The watcher is gone (stood down, or killed).
        """
        self._send(f"session {sid}")

    def stand_down(self) -> None:
        """Lets the watcher exit without touching anything, and reaps it (SIGKILL if it has not
        exited within 5 s). Idempotent."""
        if os.getpid() != self._owner_pid:
            return
        if self._proc.returncode is None:
            with contextlib.suppress(OSError, ValueError):
                self._send("stand-down")
        with contextlib.suppress(OSError, ValueError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=_STAND_DOWN_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _send(self, line: str) -> None:
        if os.getpid() != self._owner_pid:
            return
        assert self._proc.stdin is not None
        self._proc.stdin.write(line.encode() + b"\n")
        self._proc.stdin.flush()


class ServerProcess(subprocess.Popen[bytes]):
    """A server started by :func:`spawn`: the ``Popen`` of the server itself (its pid, its exit
    status), and :attr:`lifeline`, the watcher that stops it if this process dies first."""

    lifeline: Lifeline | None = None


def spawn(
    args: list[str],
    *,
    log_path: Path,
    cwd: Path,
    error: type[Exception],
    env: Mapping[str, str] | None = None,
    context: str = "",
    remove_on_parent_death: Sequence[str | os.PathLike[str]] = (),
) -> ServerProcess:
    """Starts ``args`` in a session of its own, stdin from /dev/null, stdout and stderr appended to
    ``log_path``, with a :class:`Lifeline` beside it: when this process dies before
    :func:`stop_process_group` stopped the server (SIGKILL, the OOM killer), the lifeline stops
    the server's session and removes ``remove_on_parent_death`` (its temporary directory, say).

    Returns:
        The server's own :class:`ServerProcess` (a ``Popen``: ``poll()`` reports the server's
        exit), its lifeline in ``.lifeline``.

    Raises:
        error: ``could not run <args[0]><context>: <reason>`` when the program cannot be run, or
            the lifeline cannot (the server is stopped again).
    """
    try:
        with open(log_path, "ab") as log:
            proc = ServerProcess(
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
    try:
        proc.lifeline = Lifeline(sessions=[proc.pid], remove=remove_on_parent_death, log_path=log_path)
    except OSError as e:
        stop_process_group(proc)
        raise error(f"could not run {args[0]}{context}: its lifeline ({sys.executable} {LIFELINE_SCRIPT}): {e}") from e
    return proc


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
    also reaps any stray group members (nginx workers, say). Then stands down the lifeline of a
    :class:`ServerProcess`: it is no longer needed.
    """
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if signal_group else os.kill)(proc.pid, first_signal)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if isinstance(proc, ServerProcess) and proc.lifeline is not None:
        proc.lifeline.stand_down()


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
