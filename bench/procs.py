"""The machine's processes as Linux's ``/proc`` shows them, for the benchmarks' CPU and memory
figures."""

from __future__ import annotations

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
