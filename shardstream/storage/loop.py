"""One asyncio event loop per process, on its own daemon thread.

Sync code (the pack writer, DataLoader workers) submits coroutines with :func:`submit` or
:func:`run`. After a fork (DataLoader workers), the child starts a loop of its own; objects
bound to the parent's loop (S3 clients) are recreated per process.

The fork needs care: the child inherits the parent's epoll instance, so a child that closed
the parent's loop or its connections would unregister the *parent's* sockets from it and
stall the parent's reads. The child therefore swaps the inherited loop's selector for a
fresh one and keeps the inherited objects alive (:func:`keep_forked`), never touching them.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import selectors
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ..errors import StorageConnectionError

__all__ = ["get_loop", "on_shutdown", "result_within", "run", "submit"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid: int | None = None
_shutdown_hooks: list[Callable[[], Awaitable[None]]] = []
_inherited: list[object] = []  # objects of the parent's loop, kept alive and untouched


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


def keep_forked(obj: object) -> None:
    """Keep ``obj`` (bound to a parent's loop) alive in a forked child, so it is never closed."""
    _inherited.append(obj)


def _after_fork_in_child() -> None:
    global _loop, _pid
    if _loop is not None:
        _loop._selector = selectors.DefaultSelector()  # type: ignore[attr-defined]
        _inherited.append(_loop)
    _loop, _pid = None, None
    _shutdown_hooks.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Schedule ``coro`` on the background loop; returns a thread-safe future."""
    return asyncio.run_coroutine_threadsafe(coro, get_loop())


def run(coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
    """Run ``coro`` on the background loop and wait for its result (re-raising its error)."""
    return submit(coro).result(timeout_s)


def result_within(future: concurrent.futures.Future[T], store: Any, url: str) -> T:
    """``future``'s result, waited for at most ``store.request_limit_s`` (a request to ``store``
    for ``url`` on the background loop); past that the request is cancelled.

    Raises:
        StorageConnectionError: no answer in time; names the URL, the store's endpoint and the
            state of its connection pool. Whatever the request raised, as it raised it.
    """
    try:
        return future.result(store.request_limit_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise StorageConnectionError(
            f"{url}: no answer in {store.request_limit_s:.0f} s from {store.label} ({store.endpoint}); "
            f"{store.pool_state()}"
        ) from None


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
            except Exception:  # noqa: BLE001 - closing is best effort at exit
                pass

    try:
        asyncio.run_coroutine_threadsafe(close_all(), _loop).result(10)
    except Exception:  # noqa: BLE001 - closing is best effort at exit
        pass
    _loop.call_soon_threadsafe(_loop.stop)
