"""The lifeline: a small watcher process that stops servers, and removes their files, when the
process that started them dies, SIGKILL included.

``python -I lifeline.py --parent-pid PID [--session SID]... [--remove PATH]... [--grace-s S]``

Started by :class:`shardstream.testing.process.Lifeline` (for every server :func:`~shardstream.
testing.process.spawn` starts, and for a local Ray cluster's ``ray start`` sessions), as a child
of the process that starts the servers (the *parent*) and in a session of its own, so that
signals meant for the parent's process group (a terminal's Ctrl-C, a ``kill -- -PGID``) do not
reach it. It checks ``os.getppid()`` every :data:`POLL_S` seconds; once that is no longer the
parent's pid (the parent died however it died, and this process was reparented), it

1. sends SIGTERM to every process of the watched sessions,
2. waits up to ``--grace-s`` seconds for them to exit, then SIGKILLs what is left (and what
   they started meanwhile) and waits up to :data:`KILL_WAIT_S` seconds for them to go,
3. removes each ``--remove`` path (a directory with what it holds, or a file), and exits 0.

While the parent lives, it reads its stdin for one line commands: ``session SID`` watches one
more session (a ``ray start`` started later), ``stand-down`` exits at once touching nothing
(the parent stopped the servers itself). End of input is not a stand-down (it also comes when
the parent dies); only the parent's pid says that. Every :data:`SCAN_S` seconds it forgets the
sessions that have no process left, so a session id (the pid of its first process) reused
later by an unrelated program is never signalled. SIGTERM, SIGINT and SIGHUP are ignored: this
process must outlive the parent to clean up after it; it exits by stand-down or after its
clean-up.

Why a watcher beside the server rather than a supervisor between the parent and the server:
the server stays the parent's own child, so its ``Popen`` (pid, ``poll()``, exit status,
signals sent to it alone, nginx's pid file, a Python server's ``--parent-pid`` check) means
what it meant before; one script serves ``ray start`` too, whose daemons outlive the command;
and ``getppid()`` follows the parent *process* (all its threads), where Linux's
``prctl(PR_SET_PDEATHSIG)`` follows the thread that forked and removes no files. The cost: a
server is watched from the moment its watcher forks, a fraction of a millisecond after the
server forks; a parent killed in between leaves it running (a SeaweedFS data directory is
still removed at the next start of a SeaweedFS server, see :mod:`.s3server`).

Run by file path with ``-I``, this module imports the standard library only, never the
``shardstream`` package. Processes are found in ``/proc`` (Linux); elsewhere a session is
signalled as the process group of the same id, which holds the processes :func:`spawn` starts.
The ``/proc`` readers here are also used by :mod:`.process` and the tests' Ray cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import sys
import time
from collections.abc import Iterable

__all__ = [
    "KILL_WAIT_S",
    "POLL_S",
    "SCAN_S",
    "clean_up",
    "main",
    "process_is_alive",
    "process_start_ticks",
    "session_processes",
]

POLL_S = 0.2  # seconds between two checks of the parent's pid
SCAN_S = 1.0  # seconds between two scans that forget the sessions with no process left
KILL_WAIT_S = 5.0  # seconds to wait for SIGKILLed processes to go
_PROC = "/proc"


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after ``pid (comm)``, the first being the state; None
    when there is no such process or no ``/proc``."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (``/proc/PID/stat`` field 22;
    Linux), which with the pid names one process even after the pid is reused; None when there
    is no such process or no ``/proc``."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19])


def process_is_alive(pid: int, start_ticks: int | None = None) -> bool:
    """Whether process ``pid`` runs (a zombie does not) and, when ``start_ticks`` is given and
    ``/proc`` can tell, started at ``start_ticks`` (see :func:`process_start_ticks`)."""
    if os.path.isdir(_PROC):
        fields = _stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X"):
            return False
        return start_ticks is None or (len(fields) >= 20 and int(fields[19]) == start_ticks)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def session_processes(sids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """``pid -> (comm, state)`` of the live processes (not zombies) whose session id is in
    ``sids``, from ``/proc`` (Linux)."""
    return {pid: (comm, state) for pid, (comm, state, _) in _session_members(set(sids)).items()}


def _session_members(sids: set[int]) -> dict[int, tuple[str, str, int]]:
    """``pid -> (comm, state, session id)`` of the live processes of the sessions ``sids``."""
    found: dict[int, tuple[str, str, int]] = {}
    if not sids:
        return found
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{_PROC}/{entry.name}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:  # exited meanwhile
            continue
        head, _, rest = stat.rpartition(")")
        fields = rest.split()
        # after "pid (comm)": state ppid pgrp session ...
        if len(fields) >= 4 and int(fields[3]) in sids and fields[0] not in ("Z", "X"):
            found[int(entry.name)] = (head.partition("(")[2], fields[0], int(fields[3]))
    return found


def _live_sessions(sids: set[int]) -> set[int]:
    """The session ids of ``sids`` that still have a live process."""
    if os.path.isdir(_PROC):
        return {sid for _, _, sid in _session_members(sids).values()}
    live = set()
    for sid in sids:  # no /proc: the process group of the same id (spawn's servers)
        try:
            os.killpg(sid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        live.add(sid)
    return live


def _signal_sessions(sids: set[int], signum: int) -> None:
    """Sends ``signum`` to every process of the sessions ``sids``."""
    if os.path.isdir(_PROC):
        for pid in _session_members(sids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        return
    for sid in sids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signum)


def _wait_gone(sids: set[int], timeout_s: float) -> set[int]:
    """Waits up to ``timeout_s`` seconds for the sessions ``sids`` to have no live process;
    returns those that still have one."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = _live_sessions(sids)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _remove(path: str) -> None:
    """Removes ``path``: a directory with everything in it, else a file; gone already is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            os.unlink(path)


def clean_up(sids: set[int], paths: list[str], *, grace_s: float) -> None:
    """Stops the sessions ``sids`` (SIGTERM, up to ``grace_s`` seconds, SIGKILL of what is
    left, up to :data:`KILL_WAIT_S` seconds) and removes ``paths``."""
    left = set(sids)
    if left:
        _signal_sessions(left, signal.SIGTERM)
        left = _wait_gone(left, grace_s)
    deadline = time.monotonic() + KILL_WAIT_S
    while left and time.monotonic() < deadline:  # SIGKILL again what was started meanwhile
        _signal_sessions(left, signal.SIGKILL)
        left = _wait_gone(left, 0.5)
    if left:
        print(f"lifeline: session(s) {sorted(left)} still have processes after SIGKILL", file=sys.stderr, flush=True)
    for path in paths:
        _remove(path)


def _own_sessions_excluded(sids: set[int]) -> set[int]:
    """``sids`` without the ids no server's session can have: init's, the kernel's (0, 1) and
    this process's own session; a mistake there would stop the wrong processes."""
    return {sid for sid in sids if sid > 1 and sid != os.getsid(0)}


def _watch(parent_pid: int, sids: set[int], paths: list[str], *, grace_s: float) -> int:
    """The loop of :func:`main`: returns 0 after a stand-down or after the clean-up."""
    stdin_open, pending = True, b""
    next_scan = time.monotonic() + SCAN_S
    while True:
        if os.getppid() != parent_pid:
            print(
                f"lifeline: parent {parent_pid} is gone; stopping session(s) {sorted(sids)}, removing {paths}",
                file=sys.stderr,
                flush=True,
            )
            clean_up(sids, paths, grace_s=grace_s)
            return 0
        if stdin_open:
            readable, _, _ = select.select([sys.stdin.fileno()], [], [], POLL_S)
            if readable:
                chunk = os.read(sys.stdin.fileno(), 4096)
                stdin_open = bool(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    command, _, value = line.decode("utf-8", "replace").strip().partition(" ")
                    if command == "stand-down":
                        return 0
                    if command == "session" and value.strip().isdigit():
                        sids |= _own_sessions_excluded({int(value)})
                    elif command:
                        print(f"lifeline: unknown command {line!r} ignored", file=sys.stderr, flush=True)
        else:
            time.sleep(POLL_S)
        if time.monotonic() >= next_scan:
            sids &= _live_sessions(sids)  # a session id reused later is not ours
            next_scan = time.monotonic() + SCAN_S


def main(argv: list[str] | None = None) -> int:
    """Runs the lifeline (module docstring) until a stand-down or the parent's death."""
    parser = argparse.ArgumentParser(prog="lifeline.py", description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, required=True, help="the process whose death stops the sessions")
    parser.add_argument("--session", type=int, action="append", default=[], metavar="SID", help="session to stop")
    parser.add_argument("--remove", action="append", default=[], metavar="PATH", help="directory or file to remove")
    parser.add_argument("--grace-s", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    args = parser.parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    return _watch(args.parent_pid, _own_sessions_excluded(set(args.session)), list(args.remove), grace_s=args.grace_s)


if __name__ == "__main__":
    sys.exit(main())
