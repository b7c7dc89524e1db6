"""The machine's processes as Linux's ``/proc`` shows them, for the benchmarks' CPU and memory
figures."""

from __future__ import annotations

import contextlib
import os
import resource
from typing import NamedTuple

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class Proc(NamedTuple):
    ppid: int
    cpu_s: float  # user + system CPU seconds so far
    rss_bytes: int


def _stat(pid: int | str) -> Proc:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return Proc(int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S, int(fields[21]) * PAGE_BYTES)


def rusage_cpu_s(who: int = resource.RUSAGE_SELF) -> float:
    """User + system CPU seconds of this process, all its threads (``RUSAGE_SELF``), or of its
    children waited for, with the children they waited for (``RUSAGE_CHILDREN``)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid``."""
    return _stat(pid).cpu_s


def processes() -> dict[int, Proc]:
    """Every process now running, by pid (one that ends while it is read is left out)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            table[int(entry)] = _stat(entry)
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(pid: int, table: dict[int, Proc] | None = None) -> list[int]:
    """``pid`` and every process below it, by ``table`` (:func:`processes` unless given)."""
    table = processes() if table is None else table
    children: dict[int, list[int]] = {}
    for child, proc in table.items():
        children.setdefault(proc.ppid, []).append(child)
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` and of its descendants onto ``cpus`` (Linux pins threads, not
    processes; a thread started later takes its starter's CPUs)."""
    for p in descendants(pid):
        with contextlib.suppress(FileNotFoundError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(int(tid), cpus)
