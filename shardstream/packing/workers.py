"""The worker processes of a pack (and of ``pack-text``): started at once, each dies with its
parent, keeps freed heap, and starts without OpenBLAS's idle threads; their progress, results
and errors reach the parent (:func:`run_in_processes`)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..config import child_env
from ..errors import ShardstreamError

__all__ = ["Workers", "die_with_parent", "keep_freed_heap", "run_in_processes"]


def die_with_parent() -> None:
    """A worker process (of a pack or of pack_samples) must not outlive a killed parent (a
    rerun would race with it)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_KEPT_FREE_HEAP_BYTES = 128 << 20  # twice a stream's read-ahead budget (stream._read_ahead)
_HEAP_ALLOCATION_BYTES = 32 << 20  # the largest mmap threshold glibc takes (64-bit)


def keep_freed_heap() -> None:
    """Let a worker process's ``malloc`` (glibc) keep up to 128 MiB of freed heap instead of
    handing it back to the kernel at once (``M_TRIM_THRESHOLD``), and serve blocks up to 32 MiB
    from the heap (``M_MMAP_THRESHOLD``; setting the first fixes the second at 128 KiB, which
    would map and unmap every larger file). A pack reads each file into a fresh buffer that is
    freed a moment later; returning those pages and faulting them in again took a tenth of a
    pack's CPU (perf: ``exc_page_fault`` under the read threads' ``read``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
        if mallopt is not None:
            mallopt(-1, _KEPT_FREE_HEAP_BYTES)  # M_TRIM_THRESHOLD
            mallopt(-3, _HEAP_ALLOCATION_BYTES)  # M_MMAP_THRESHOLD


def run_in_processes(
    jobs: Sequence[Any],
    run: Callable[[Any, Callable[[int, int], None]], Any],
    advance: Callable[[int, int], None],
    *,
    name: str,
    error: Callable[[BaseException, int], BaseException],
) -> list[Any]:
    """``run(job, advance)`` for every job (each with its ``stream`` number) in a spawned worker
    process of its own (``pack-text``): the workers' progress reaches ``advance`` here
    (batched every 0.2 s); the results in ``jobs`` order. ``run``, ``error`` and the jobs are
    pickled into the workers (module-level functions).

    Raises:
        the first error a worker met, as ``error(exc, stream)`` made it there;
        ShardstreamError: a worker died (``{name} worker for stream N died``). Either way, or
            when this process is interrupted, every worker is killed.
    """
    return Workers(jobs, run, error=error).run(advance, name=name)


_WORKER_ENV = {"OPENBLAS_NUM_THREADS": "1"}  # numpy's idle BLAS threads would spin at import (config.ENVIRONMENT)


class Workers:
    """The worker processes of :func:`run_in_processes`, started at once: each imports what it
    needs, then waits for :meth:`run` (so a pack's workers start while its listing is made).
    :meth:`kill` them where :meth:`run` is not reached.

    They are spawned (a fresh interpreter each, importing shardstream again: about 0.35 CPU-s
    apiece), or with ``fork_if_alone`` forked where :func:`can_fork` says so (nothing to import
    again; a pack's worker imports competed with its listing for the cores)."""

    def __init__(
        self,
        jobs: Sequence[Any],
        run: Callable[[Any, Callable[[int, int], None]], Any],
        *,
        error: Callable[[BaseException, int], BaseException],
        fork_if_alone: bool = False,
    ) -> None:
        context = multiprocessing.get_context("fork" if fork_if_alone and can_fork() else "spawn")
        self.jobs = jobs
        self.messages = context.Queue()
        self.go = context.Event()
        self.processes = [
            context.Process(
                target=_worker_process, args=(job, self.messages, os.getpid(), run, error, self.go), daemon=True
            )
            for job in jobs
        ]
        try:
            with child_env(_WORKER_ENV):
                for process in self.processes:
                    process.start()
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        for process in self.processes:
            if process.pid is not None:
                process.kill()

    def run(self, advance: Callable[[int, int], None], *, name: str) -> list[Any]:
        """Let the workers run their jobs; see :func:`run_in_processes`."""
        jobs, processes, messages = self.jobs, self.processes, self.messages
        self.go.set()
        results: dict[int, Any] = {}
        failure: BaseException | None = None
        try:
            while len(results) < len(jobs) and failure is None:
                try:
                    kind, stream, value = messages.get(timeout=0.5)
                except queue.Empty:
                    dead = [
                        j.stream
                        for j, p in zip(jobs, processes)
                        if p.exitcode not in (None, 0) and j.stream not in results
                    ]
                    if dead:
                        failure = ShardstreamError(
                            f"{name} worker for stream {dead[0]} died; run the same command again to resume"
                        )
                    continue
                if kind == "progress":
                    advance(*value)
                elif kind == "done":
                    results[stream] = value
                else:
                    failure = value
        finally:
            if failure is not None or len(results) < len(jobs):
                self.kill()
        if failure is not None:
            raise failure
        for process in processes:
            process.join()
        return [results[job.stream] for job in jobs]


def can_fork() -> bool:
    """Whether worker processes may be forked from this one: on Linux, where no other Python
    thread runs here (one could hold a lock, such as logging's, that the child would wait on for
    ever; CPython 3.12+ warns of such a fork). Native thread pools that run no code of the
    child's may stay: numpy's OpenBLAS shuts its pool down around a fork (``pthread_atfork``),
    and CPython counts no thread of it then (checked with 3.13)."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


def _worker_process(
    job: Any,
    messages: Any,
    parent: int,
    run: Callable[[Any, Callable[[int, int], None]], Any],
    error: Callable[[BaseException, int], BaseException],
    go: Any,
) -> None:
    """A worker of :func:`run_in_processes`: its progress, then its result or error, to ``messages``."""
    die_with_parent()
    if os.getppid() != parent:  # the parent died before this process asked to die with it
        os._exit(1)
    keep_freed_heap()
    gc.freeze()  # the modules just imported live as long as the worker: full collections skip them
    go.wait()
    pending = [0, 0, time.monotonic()]

    def advance(a: int, b: int) -> None:
        pending[0] += a
        pending[1] += b
        if time.monotonic() - pending[2] > 0.2:
            messages.put(("progress", job.stream, (pending[0], pending[1])))
            pending[:] = [0, 0, time.monotonic()]

    try:
        result = run(job, advance)
        messages.put(("progress", job.stream, (pending[0], pending[1])))
        messages.put(("done", job.stream, result))
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, raised there
        messages.put(("error", job.stream, error(exc, job.stream)))
