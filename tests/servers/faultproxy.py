"""A fault-injecting reverse proxy for S3, for tests and benchmarks.

:class:`FaultProxy` listens on 127.0.0.1 and forwards every request to a real S3 server
(the local SeaweedFS) with its headers unchanged, so SigV4 signatures stay valid. For each
request matching ``match`` it may inject one fault, drawn with a seeded RNG:

- ``"slowdown"``: answer ``503 SlowDown`` (S3's throttling reply) without forwarding;
- ``"throttle"``: answer ``throttle_status`` (429 or 503) with ``Retry-After:
  retry_after_s`` without forwarding (how GCS, Azure, the Hub and CDNs throttle);
- ``"reset"``: drop the connection before any response;
- ``"cut"``: forward, then drop the connection after ``cut_after_bytes`` of the body (or half
  of a shorter body; the client sees a body shorter than its Content-Length: aiohttp's
  ``ClientPayloadError``);
- ``"delay"``: wait ``delay_s`` before forwarding;
- ``"trickle"``: send the body in 16 KiB pieces ``trickle_s`` apart.

``counts`` says how many of each were injected; ``max_faults`` bounds the total.

For benchmarks, two settings that apply to every forwarded request (no fault drawn):
``bandwidth_bytes_per_s`` caps the response bytes sent to all clients together (one link shared
by every connection, paced in 16 KiB pieces), and ``on_response`` is told of each forwarded
request once its answer is sent (method, path with query, request headers, status, body bytes
sent, and the ``time.time()`` at which the request came in), so a caller can count requests and
bytes by kind, and tell which requests were made before a moment. A fixed added latency per request is
``rates={"delay": 1.0}`` with ``delay_s``: it applies to each request, kept-alive connections
included.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FAULTS", "FaultProxy"]

FAULTS = ("slowdown", "throttle", "reset", "cut", "delay", "trickle")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "expect",
    "content-length",
    "proxy-connection",
}
_BURST_BYTES = 256 << 10  # what an idle capped link may send at once (FaultProxy._pace)
_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class FaultProxy:
    """A reverse proxy in front of ``target_url`` injecting faults (module doc).

    Args:
        target_url: the real server, e.g. ``http://127.0.0.1:8333``.
        rates: probability of each fault per matching request, e.g.
            ``{"reset": 0.05, "slowdown": 0.05, "cut": 0.03}`` (at most one fault per request).
        seed: seed of the fault draws.
        match: which requests may get a fault: ``match(method, path)``; default all.
        max_faults: stop injecting after this many faults (None: no bound).
        cut_after_bytes: body bytes sent before a ``cut``.
        delay_s, trickle_s: the ``delay`` and the pause between ``trickle`` pieces (seconds).
        throttle_status, retry_after_s: the status and ``Retry-After`` (seconds) of a ``throttle``.
        on_fault: called as ``on_fault(fault, method, path)`` after a fault was injected (in
            the proxy's thread; a test can change the object there).
        bandwidth_bytes_per_s: cap on the response body bytes sent to all clients together
            (None: no cap).
        on_response: called as ``on_response(method, path_qs, request_headers, status,
            body_bytes_sent, received_at)`` after each forwarded request's answer (in the
            proxy's thread; not for the faults answered without forwarding, nor for a ``cut``).
            ``received_at`` is the ``time.time()`` at which the request came in: unlike the
            time of the call, it precedes everything the client did with the answer.

    Use as a context manager; ``endpoint_url`` is where clients connect.
    """

    def __init__(
        self,
        target_url: str,
        *,
        rates: dict[str, float],
        seed: int = 0,
        match: Callable[[str, str], bool] | None = None,
        max_faults: int | None = None,
        cut_after_bytes: int = 100_000,
        delay_s: float = 0.5,
        trickle_s: float = 0.01,
        throttle_status: int = 429,
        retry_after_s: float = 1.0,
        on_fault: Callable[[str, str, str], None] | None = None,
        bandwidth_bytes_per_s: float | None = None,
        on_response: Callable[[str, str, Mapping[str, str], int, int, float], None] | None = None,
    ) -> None:
        unknown = set(rates) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
        if sum(rates.values()) > 1:
            raise ValueError(f"fault rates {rates} add up to more than 1")
        self.target_url = target_url.rstrip("/")
        self.rates = dict(rates)
        self.match = match or (lambda method, path: True)
        self.max_faults = max_faults
        self.cut_after_bytes = cut_after_bytes
        self.delay_s, self.trickle_s = delay_s, trickle_s
        self.throttle_status, self.retry_after_s = throttle_status, retry_after_s
        self.on_fault = on_fault
        if bandwidth_bytes_per_s is not None and not bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth_bytes_per_s={bandwidth_bytes_per_s!r} must be > 0 or None")
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.on_response = on_response
        self._link_free_at = 0.0  # loop time at which the shared link has sent what it was given
        self.counts: Counter[str] = Counter()
        self.requests = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._port = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def _draw(self, method: str, path: str) -> str | None:
        with self._lock:
            self.requests += 1
            if not self.match(method, path):
                return None
            if self.max_faults is not None and sum(self.counts.values()) >= self.max_faults:
                return None
            x = self._rng.random()
            for fault, rate in self.rates.items():
                if x < rate:
                    self.counts[fault] += 1
                    return fault
                x -= rate
            return None

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        received_at = time.time()
        fault = self._draw(request.method, request.path)
        body = await request.read()
        if fault == "slowdown":
            return web.Response(status=503, body=_SLOWDOWN, content_type="application/xml")
        if fault == "throttle":
            return web.Response(
                status=self.throttle_status,
                headers={"Retry-After": f"{self.retry_after_s:g}"},
                body=_SLOWDOWN if self.throttle_status == 503 else b"Too Many Requests",
                content_type="application/xml" if self.throttle_status == 503 else "text/plain",
            )
        if fault == "reset":
            request.transport.abort()
            return web.Response(status=500)  # never sent: the connection is gone
        if fault == "delay":
            await asyncio.sleep(self.delay_s)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(
            request.method,
            self.target_url + request.path_qs,
            headers=headers,
            data=body or None,  # an empty body adds no headers (Azure signs them)
            allow_redirects=False,
            auto_decompress=False,
        ) as upstream:
            out_headers = {
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP - {"content-length"}
            }
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            await response.prepare(request)
            sent = 0
            # A body shorter than cut_after_bytes is cut in its middle: every drawn cut happens.
            cut_at = min(self.cut_after_bytes, int(upstream.headers.get("Content-Length", 0)) // 2)
            async for chunk in upstream.content.iter_chunked(16 << 10):
                if fault == "cut" and sent + len(chunk) >= cut_at:
                    await response.write(chunk[: max(0, cut_at - sent)])
                    await asyncio.sleep(0.01)  # let the partial body reach the client first
                    if self.on_fault is not None:  # before the cut: the client's retry comes after it
                        await asyncio.to_thread(self.on_fault, fault, request.method, request.path)
                    request.transport.abort()
                    return response
                if fault == "trickle":
                    await asyncio.sleep(self.trickle_s)
                if self.bandwidth_bytes_per_s is not None:
                    await self._pace(len(chunk))
                await response.write(chunk)
                sent += len(chunk)
            await response.write_eof()
            if self.on_response is not None:
                self.on_response(request.method, request.path_qs, request.headers, upstream.status, sent, received_at)
            return response

    async def _pace(self, nbytes: int) -> None:
        """Wait until the shared link has sent ``nbytes`` more at ``bandwidth_bytes_per_s``
        (first come, first served: concurrent answers share the link). A link idle for a while
        may send up to ``_BURST_BYTES`` at once, so the proxy's own time per piece does not
        slow a lone answer below the cap."""
        now = asyncio.get_running_loop().time()
        idle_from = now - _BURST_BYTES / self.bandwidth_bytes_per_s
        self._link_free_at = max(idle_from, self._link_free_at) + nbytes / self.bandwidth_bytes_per_s
        if self._link_free_at > now:
            await asyncio.sleep(self._link_free_at - now)

    async def _serve(self) -> None:
        import aiohttp
        from aiohttp import web

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64), skip_auto_headers=("User-Agent",)
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)  # delayed answers are cut
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        site = web.SockSite(runner, sock)
        await site.start()
        self._stopping = asyncio.Event()
        self._ready.set()
        await self._stopping.wait()
        await runner.cleanup()
        await self._session.close()

    def start(self) -> FaultProxy:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._serve(),), name="shardstream-fault-proxy", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start within 10 s")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(10)
            if self._thread.is_alive():
                raise RuntimeError("the fault proxy did not stop within 10 s")
        if self._loop is not None:
            self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:  # noqa: PYI034 (typing.Self needs 3.11)
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
