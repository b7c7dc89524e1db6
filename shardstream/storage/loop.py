"""One asyncio event loop per process, on its own daemon thread.

Sync code (the pack writer, DataLoader workers) submits coroutines with :func:`submit` or
:func:`run`. After a fork (DataLoader workers), the child sees a different pid and starts a
loop of its own; objects bound to the parent's loop (S3 clients) are recreated per process.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["get_loop", "on_shutdown", "run", "submit"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid: int | None = None
_shutdown_hooks: list[Callable[[], Awaitable[None]]] = []


def get_loop() -> asyncio.AbstractEventLoop:
    """This process's background loop, started on first use (and again after a fork)."""
    global _loop, _pid
    with _lock:
        if _loop is None or _pid != os.getpid():
            _shutdown_hooks.clear()
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="shardstream-io", daemon=True)
            thread.start()
            _loop, _pid = loop, os.getpid()
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Schedule ``coro`` on the background loop; returns a thread-safe future."""
    return asyncio.run_coroutine_threadsafe(coro, get_loop())


def run(coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
    """Run ``coro`` on the background loop and wait for its result (re-raising its error)."""
    return submit(coro).result(timeout_s)


def on_shutdown(hook: Callable[[], Awaitable[None]]) -> None:
    """Await ``hook()`` on the loop when the process exits (closing clients cleanly)."""
    _shutdown_hooks.append(hook)


@atexit.register
def _shutdown() -> None:
    if _loop is None or _pid != os.getpid() or not _loop.is_running():
        return

    async def close_all() -> None:
        for hook in reversed(_shutdown_hooks):
            try:
                await hook()
            except Exception:  # closing is best effort at exit
                pass

    try:
        asyncio.run_coroutine_threadsafe(close_all(), _loop).result(10)
    except Exception:
        pass
    _loop.call_soon_threadsafe(_loop.stop)
