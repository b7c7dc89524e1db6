"""What the Python web servers (:mod:`servers.faultserver`, :mod:`servers.hub`) share, and nginx's base.

- the test process side: :class:`_ManagedProcess` (temp dir, log, bounded waits, stop, also
  used by :class:`servers.nginx.NginxServer`) and :class:`_PythonServer` (starts a server module
  as a child process and drives it through its control routes: fault rules, request log);
- the server side: :class:`_State` (fault rules, ETag changes, request log), single-range and
  ETag handling (:func:`_serve_file`), the logging middleware that applies the fault rules, the
  ``/__control__`` routes, and :func:`main`, which runs one server module until it is stopped.

The Python servers run as subprocesses (``python -m servers.faultserver|servers.hub``, with
``PYTHONPATH`` naming ``tests/``), never as threads of the test process, so DataLoader workers
forked from the tests do not inherit a running event loop; they exit by themselves (and remove
their temp dirs) when the process that started them dies, and so does nginx: the lifeline
:func:`~shardstream.testing.process.spawn` starts beside each stops it and removes its temp dir,
even when that process was SIGKILLed.

They honour ``Range`` (``206`` with ``Content-Range``; ``416`` with ``Content-Range: bytes
*/size`` when the first byte is past the end), ``ETag``, ``If-Match`` (``412`` when no listed
ETag matches, strong comparison), ``If-None-Match`` (``304``) and ``If-Range``; they answer
multi-range requests with ``200`` and the whole file, which RFC 9110 allows.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import contextlib
import email.utils
import fnmatch
import json
import logging
import mimetypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import shardstream
from shardstream.testing.process import (
    HOST,
    NO_PROXY_OPENER,
    ServerContext,
    log_tail,
    spawn,
    startup_timeout,
    stop_process_group,
    wait_until,
)

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["WebServerError", "main"]

_TESTS_DIR = Path(__file__).resolve().parents[1]  # on the servers' PYTHONPATH: `servers` imports from it
_PACKAGE_PARENT = Path(shardstream.__file__).resolve().parents[1]  # the servers import this shardstream
_CONTROL = "/__control__"
_CONTROL_TIMEOUT_S = 10.0  # one control request (set_faults, requests, ...)
_MAX_STALL_S = 600.0  # upper bound of a stall_s fault
_CHUNK = 256 * 1024  # bytes per write of a file body
_MAX_LOG = 100_000  # request log entries kept per server (oldest dropped)
_SHUTDOWN_S = 0.5  # seconds a stopping Python server gives the requests in flight

# Fault rule keys (FaultServer.set_faults); a rule needs at least one of the _RULE_EFFECTS.
_RULE_KEYS = (
    "path_glob",
    "times",
    "methods",
    "host",
    "cut_body_after_bytes",
    "status",
    "retry_after_s",
    "ignore_range",
    "change_etag",
    "stall_s",
)
_RULE_EFFECTS = ("cut_body_after_bytes", "status", "ignore_range", "change_etag", "stall_s")


class WebServerError(RuntimeError):
    """A local web server could not be started, reached or controlled."""


def _is_set(value: object) -> bool:
    """Whether a rule value is set: not None and not False (0 is set)."""
    return value is not None and value is not False


def _normalize_fault_rule(rule: Mapping[str, Any], *, hosts: tuple[str, ...] = ("origin",)) -> dict[str, Any]:
    """Checks one fault rule (see :meth:`FaultServer.set_faults`) and fills in its defaults.

    Args:
        rule: The rule's keys and values.
        hosts: The host names the rule's ``host`` may take; the first is the default.

    Raises:
        ValueError: An unknown key, a value of the wrong type or range, or no effect at all.
    """
    unknown = sorted(set(rule) - set(_RULE_KEYS))
    if unknown:
        raise ValueError(f"unknown fault rule key(s) {unknown}; known: {list(_RULE_KEYS)}")
    out: dict[str, Any] = {"path_glob": "*", "times": 1, "methods": None, "host": hosts[0]}
    out.update({k: v for k, v in rule.items() if v is not None or k == "times"})
    if not isinstance(out["path_glob"], str):
        raise ValueError(f"path_glob must be a str, got {out['path_glob']!r}")
    times = out["times"]
    if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 1):
        raise ValueError(f"times must be an int >= 1, or None for every matching request; got {times!r}")
    if out["methods"] is not None:
        if isinstance(out["methods"], str) or not all(isinstance(m, str) for m in out["methods"]):
            raise ValueError(f"methods must be a list of HTTP method names, got {out['methods']!r}")
        out["methods"] = [m.upper() for m in out["methods"]]
    if out["host"] not in hosts and out["host"] != "any":
        raise ValueError(f"host must be one of {[*hosts, 'any']}, got {out['host']!r}")
    effects = [k for k in _RULE_EFFECTS if _is_set(out.get(k))]
    if not effects:
        raise ValueError(f"a fault rule needs at least one of {list(_RULE_EFFECTS)}; got {dict(rule)!r}")
    cut = out.get("cut_body_after_bytes")
    if cut is not None and (isinstance(cut, bool) or not isinstance(cut, int) or cut < 0):
        raise ValueError(f"cut_body_after_bytes must be an int >= 0, got {cut!r}")
    status = out.get("status")
    if status is not None and (isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599):
        raise ValueError(f"status must be an HTTP error status 400..599, got {status!r}")
    retry = out.get("retry_after_s")
    if retry is not None:
        if status is None:
            raise ValueError("retry_after_s needs a status (429 or 503)")
        if isinstance(retry, bool) or not isinstance(retry, (int, float)) or retry < 0:
            raise ValueError(f"retry_after_s must be a number >= 0, got {retry!r}")
    stall = out.get("stall_s")
    if stall is not None and (
        isinstance(stall, bool) or not isinstance(stall, (int, float)) or not 0 <= stall <= _MAX_STALL_S
    ):
        raise ValueError(f"stall_s must be a number of seconds in [0, {_MAX_STALL_S:g}], got {stall!r}")
    for key in ("ignore_range", "change_etag"):
        if not isinstance(out.get(key, False), bool):
            raise ValueError(f"{key} must be a bool, got {out[key]!r}")
    if out.get("change_etag") and len(effects) > 1:
        raise ValueError("change_etag=True is permanent and cannot be combined with other effects in one rule")
    return out


class _ManagedProcess(ServerContext):
    """Start/stop machinery shared by the servers: temp dir, log, bounded waits, atexit."""

    _label = "server"

    def __init__(self, startup_timeout_s: float) -> None:
        self._startup_timeout_s = startup_timeout(startup_timeout_s)
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner_pid: int | None = None
        self._tmp_dir: Path | None = None
        self._log_path: Path | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The TCP port on 127.0.0.1; raises WebServerError if not running."""
        if self._port is None or self._proc is None:
            raise WebServerError(f"{type(self).__name__} is not running; call start() or use `with`")
        return self._port

    @property
    def pid(self) -> int:
        """Process id of the server process (nginx's master); raises WebServerError if not running."""
        if self._proc is None:
            raise WebServerError(f"{type(self).__name__} is not running; call start() or use `with`")
        return self._proc.pid

    @property
    def log_path(self) -> Path | None:
        """The server's log file (in its temporary directory, removed by :meth:`stop`)."""
        return self._log_path

    def _log_tail(self) -> str:
        return log_tail(self._log_path, 8, missing="(empty log)", empty="(empty log)")

    def _spawn(self, args: list[str], *, env: Mapping[str, str] | None = None) -> None:
        assert self._tmp_dir is not None and self._log_path is not None
        self._proc = spawn(
            args,
            log_path=self._log_path,
            cwd=self._tmp_dir,
            env=env,
            error=WebServerError,
            context=f" for the {self._label}",
            remove_on_parent_death=[self._tmp_dir],  # the lifeline's: when the test process dies first
        )
        self._owner_pid = os.getpid()

    def _wait_until(self, ready: Callable[[], bool], not_ready: str, *, name: str | None = None) -> None:
        wait_until(
            ready,
            proc=self._proc,
            timeout_s=self._startup_timeout_s,
            error=WebServerError,
            name=self._label if name is None else name,
            not_ready=not_ready,
            log_tail=self._log_tail,
            interval_s=0.02,
        )

    def _stop_signal(self) -> int:
        return signal.SIGTERM

    def stop(self) -> None:
        """Stops the server (its stop signal, up to 5 s grace, then SIGKILL) and removes its temp dir.

        Idempotent. In a process forked from the one that started the server (a DataLoader
        worker) it does nothing: the server belongs to the parent.
        """
        if self._owner_pid is not None and self._owner_pid != os.getpid():
            return
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:  # the first signal to the server alone (nginx's master passes it on)
            stop_process_group(proc, self._stop_signal(), signal_group=False)
        self._port = None
        self._owner_pid = None
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None


class _PythonServer(_ManagedProcess):
    """A server run as ``python -m <_module>`` (``servers.faultserver``, ``servers.hub``)."""

    _kind = ""
    _module = ""
    _hosts: tuple[str, ...] = ("origin",)

    def __init__(self, startup_timeout_s: float) -> None:
        super().__init__(startup_timeout_s)
        self._ready: dict[str, Any] = {}

    def _child_args(self, tmp: Path) -> list[str]:
        raise NotImplementedError

    def start(self) -> Any:
        """Starts the server subprocess and waits until it answers.

        Raises:
            WebServerError: Already started, the subprocess exited early, or did not answer within
                ``startup_timeout_s`` seconds.
        """
        if self._proc is not None:
            raise WebServerError(f"{type(self).__name__} already started")
        atexit.register(self.stop)
        try:
            self._tmp_dir = tmp = Path(tempfile.mkdtemp(prefix=f"shardstream-{self._kind}-"))
            self._log_path = tmp / "server.log"
            ready = tmp / "ready.json"
            args = [sys.executable, "-m", self._module, *self._child_args(tmp)]
            args += ["--ready-file", str(ready), "--parent-pid", str(os.getpid())]
            env = dict(os.environ)
            paths = (str(_TESTS_DIR), str(_PACKAGE_PARENT), env.get("PYTHONPATH"))
            env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
            env["PYTHONUNBUFFERED"] = "1"
            self._spawn(args, env=env)
            self._wait_ready(ready)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, ready: Path) -> None:
        deadline, proc = time.monotonic() + self._startup_timeout_s, self._proc
        assert proc is not None

        def ready_file_written() -> bool:
            with contextlib.suppress(OSError, ValueError):
                self._ready = json.loads(ready.read_text())
                self._port = int(self._ready["port"])
                return True
            return False

        self._wait_until(ready_file_written, "did not start")
        while True:  # the sockets listen before the ready file is written; check it answers
            try:
                self._control("GET", "ping", timeout_s=1.0)
                return
            except WebServerError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
            time.sleep(0.05)

    def _control(self, method: str, name: str, payload: Any = None, *, timeout_s: float = _CONTROL_TIMEOUT_S) -> Any:
        """Sends one control request to ``/__control__/<name>``; returns the decoded JSON answer."""
        url = f"http://{HOST}:{self.port}{_CONTROL}/{name}"
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with NO_PROXY_OPENER.open(req, timeout=timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            with e:
                body = e.read().decode(errors="replace")[:500]
            raise WebServerError(f"{self._label}: {method} {_CONTROL}/{name} answered {e.code}: {body}") from e
        except (OSError, ValueError) as e:
            raise WebServerError(
                f"{self._label}: {method} {_CONTROL}/{name} failed: {e}; log: {self._log_tail()}"
            ) from e

    def set_faults(self, **rule: Any) -> None:
        """Replaces all fault rules by ``rule``; ``set_faults()`` switches every fault off.

        Rule keys (all optional, at least one effect unless resetting):

        - ``path_glob`` (str, default ``"*"``): ``fnmatch`` pattern of the request path
          (``/dir/file``; ``*`` also matches ``/``);
        - ``times`` (int >= 1, default 1): how many matching requests get the fault before it
          switches off; ``None``: every matching request until reset;
        - ``methods`` (list of str, default all): only requests with these methods;
        - ``cut_body_after_bytes`` (int): send the status and headers with the full
          Content-Length, then this many body bytes, then close the connection;
        - ``status`` (int 400..599, e.g. 503, 429, 404, 403, 500): answer it instead, with
          ``Retry-After: <retry_after_s>`` when ``retry_after_s`` (seconds, written as given, so
          ``0.2`` is sent as ``0.2``) is set;
        - ``ignore_range`` (bool): answer 200 with the whole file and no ``Accept-Ranges``;
        - ``change_etag`` (bool): from now on until reset, files matching ``path_glob`` have a new
          ETag (as if replaced), and ``If-Match`` is checked against it; ``times`` does not apply;
        - ``stall_s`` (seconds, <= 600): wait that long before answering (combine with another
          effect, or alone to answer normally after the wait).

        Raises:
            ValueError: An invalid rule (checked here, before anything is sent).
            WebServerError: The server is not running or refused the rule.
        """
        rules = [_normalize_fault_rule(rule, hosts=self._hosts)] if rule else []
        self._control("POST", "faults", {"rules": rules, "append": False})

    def add_fault(self, **rule: Any) -> None:
        """Adds one fault rule (keys as in :meth:`set_faults`) after those already set.

        A request takes the first matching rule still active; a rule's ``times`` counts only the
        requests it took.
        """
        self._control("POST", "faults", {"rules": [_normalize_fault_rule(rule, hosts=self._hosts)], "append": True})

    def requests(self) -> list[dict[str, Any]]:
        """The requests served so far (control requests excluded), oldest first.

        Each is a dict: ``host`` (which server answered), ``method``, ``path`` (decoded),
        ``query`` (raw query string or ``None``), ``range`` (the ``Range`` header or ``None``),
        ``status`` (``None`` while the answer is still pending, e.g. during a stall),
        ``authorization`` (the ``Authorization`` header's value, ``None`` when absent), ``fault``
        (the effects applied, e.g. ``{"status": 503, "retry_after_s": 1}``, or ``None``),
        ``body_bytes`` (body bytes sent, for file bodies and small answers), ``headers`` (all
        request headers) and ``time`` (Unix seconds of arrival). At most the last 100,000 are kept.
        """
        return self._control("GET", "log")

    def clear_log(self) -> None:
        """Forgets the requests logged so far."""
        self._control("POST", "log/clear", {})


# --------------------------------------------------------------------------------------------
# Server side: runs in the subprocess (`python -m servers.faultserver|servers.hub`).
# --------------------------------------------------------------------------------------------


class _State:
    """Fault rules, ETag changes and the request log of one server process."""

    def __init__(self, hosts: tuple[str, ...]) -> None:
        self.hosts = hosts
        self.rules: list[dict[str, Any]] = []
        self.etag_changes: list[tuple[str, int]] = []  # (path_glob, epoch)
        self.epoch = 0
        self.log: collections.deque[dict[str, Any]] = collections.deque(maxlen=_MAX_LOG)

    def set_rules(self, rules: list[Mapping[str, Any]], *, append: bool) -> None:
        checked = [_normalize_fault_rule(r, hosts=self.hosts) for r in rules]  # all or nothing
        if not append:
            self.rules, self.etag_changes = [], []
        for rule in checked:
            if rule.get("change_etag"):
                self.epoch += 1
                self.etag_changes.append((rule["path_glob"], self.epoch))
            else:
                self.rules.append(rule)

    def take(self, host: str, method: str, path: str) -> dict[str, Any] | None:
        """The first active rule matching this request, consumed once; None if none matches."""
        for i, rule in enumerate(self.rules):
            if rule["host"] not in (host, "any"):
                continue
            if rule["methods"] is not None and method not in rule["methods"]:
                continue
            if not fnmatch.fnmatchcase(path, rule["path_glob"]):
                continue
            if rule["times"] is not None:
                rule["times"] -= 1
                if rule["times"] <= 0:
                    del self.rules[i]
            return rule
        return None

    def etag_epoch(self, key: str) -> int:
        """The latest ``change_etag`` epoch whose glob matches ``key``; 0 if none."""
        return max((epoch for glob, epoch in self.etag_changes if fnmatch.fnmatchcase(key, glob)), default=0)


def _fmt_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _etag_list_matches(header: str, etag: str, *, weak: bool) -> bool:
    """Whether an ``If-Match``/``If-None-Match`` header value lists ``etag`` (unquoted)."""
    header = header.strip()
    if header == "*":
        return True
    for item in re.findall(r'(W/)?"([^"]*)"', header):
        is_weak, value = item
        if value == etag and (weak or not is_weak):
            return True
    return False


def _parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """Parses a single ``bytes=`` range: ``(start, end_exclusive)``, ``"unsatisfiable"``, or None.

    None means: ignore the header and send the whole file (bad syntax, other unit, multi-range).
    """
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, sep, last = spec.strip().partition("-")
    if not sep:
        return None
    try:
        if first == "":  # suffix: the last N bytes
            n = int(last)
            if n <= 0 or size == 0:
                return "unsatisfiable"
            return max(0, size - n), size
        start = int(first)
        end = size - 1 if last == "" else int(last)
    except ValueError:
        return None
    if start < 0:
        return None
    if start >= size:
        return "unsatisfiable"
    if end < start:
        return None
    return start, min(end, size - 1) + 1


def _if_range_allows(request: web.Request, etag: str, mtime: float) -> bool:
    value = request.headers.get("If-Range")
    if value is None:
        return True
    value = value.strip()
    if value.startswith(('"', "W/")):
        return value == f'"{etag}"'
    parsed = email.utils.parsedate_to_datetime(value) if value else None
    return parsed is not None and int(mtime) <= parsed.timestamp()


async def _send_body(
    request: web.Request, status: int, headers: Mapping[str, str], chunks: Any, length: int, cut: int | None = None
) -> web.StreamResponse:
    """Sends ``status`` and ``headers`` with Content-Length ``length``, then the body ``chunks``
    (none for HEAD); with ``cut``, only that many body bytes, and then closes the connection."""
    from aiohttp import web

    resp = web.StreamResponse(status=status, headers=headers)
    resp.content_length = length
    if cut is not None:
        resp.force_close()
    await resp.prepare(request)
    sent = 0
    if request.method != "HEAD":
        async for chunk in chunks:
            piece = chunk if cut is None else chunk[: cut - sent]
            if piece:
                await resp.write(piece)
                sent += len(piece)
            if cut is not None and sent >= cut:
                break
    request["entry"]["body_bytes"] = sent
    if cut is not None and request.transport is not None:
        request.transport.close()  # flushes what was written, then FIN: the client sees a short body
    return resp


async def _file_chunks(path: Path, start: int, length: int):
    with open(path, "rb") as f:
        f.seek(start)
        while length > 0:
            chunk = f.read(min(_CHUNK, length))
            if not chunk:
                return
            length -= len(chunk)
            yield chunk


async def _serve_file(
    request: web.Request, path: Path, etag: str, extra_headers: Mapping[str, str] | None = None
) -> web.StreamResponse:
    """Answers GET/HEAD for one file with ETag, Range, If-Match, If-None-Match and If-Range.

    Applies the request's fault rule (``request["rule"]``): ``ignore_range`` and
    ``cut_body_after_bytes``.
    """
    from aiohttp import web

    rule = request.get("rule") or {}
    entry = request["entry"]
    st = path.stat()
    size = st.st_size
    headers = {"ETag": f'"{etag}"', "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True)}
    headers.update(extra_headers or {})
    ignore_range = bool(rule.get("ignore_range"))
    if not ignore_range:
        headers["Accept-Ranges"] = "bytes"
    if_match = request.headers.get("If-Match")
    if if_match is not None and not _etag_list_matches(if_match, etag, weak=False):
        entry["status"] = 412
        return web.json_response({"error": "Precondition Failed"}, status=412, headers=headers)
    if_none_match = request.headers.get("If-None-Match")
    if if_none_match is not None and _etag_list_matches(if_none_match, etag, weak=True):
        entry["status"] = 304
        return web.Response(status=304, headers=headers)
    start, end, status = 0, size, 200
    range_header = request.headers.get("Range")
    if range_header is not None and not ignore_range and _if_range_allows(request, etag, st.st_mtime):
        parsed = _parse_range(range_header, size)
        if parsed == "unsatisfiable":
            entry["status"] = 416
            headers["Content-Range"] = f"bytes */{size}"
            return web.Response(status=416, headers=headers, text="Range Not Satisfiable")
        if isinstance(parsed, tuple):
            start, end = parsed
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    headers["Content-Type"] = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    entry["status"] = status
    length = end - start
    chunks = _file_chunks(path, start, length)
    return await _send_body(request, status, headers, chunks, length, rule.get("cut_body_after_bytes"))


def _safe_file(root: Path, rel: str) -> Path | None:
    """``root/rel`` if it is a file and ``rel`` has no ``..`` parts; else None."""
    parts = [p for p in PurePosixPath(rel).parts if p not in ("/", ".")]
    if not parts or any(p == ".." or "\0" in p for p in parts):
        return None
    path = root.joinpath(*parts)
    try:
        return path if path.is_file() else None
    except (OSError, ValueError):
        return None


def _error_maker_json(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    from aiohttp import web

    return web.json_response({"error": message}, status=status, headers=headers)


def _error_maker_text(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    from aiohttp import web

    return web.Response(status=status, text=message + "\n", headers=headers)


def _logging_middleware(state: _State, host: str, make_error: Callable[..., web.Response]) -> Any:
    """Logs every non-control request and applies the fault rule it takes."""
    from aiohttp import web

    @web.middleware
    async def middleware(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        if request.path.startswith(_CONTROL + "/"):
            return await handler(request)
        entry: dict[str, Any] = {
            "host": host,
            "method": request.method,
            "path": request.path,
            "query": request.query_string or None,
            "range": request.headers.get("Range"),
            "status": None,
            "authorization": request.headers.get("Authorization"),
            "fault": None,
            "body_bytes": None,
            "headers": dict(request.headers),
            "time": time.time(),
        }
        state.log.append(entry)
        request["entry"] = entry
        rule = request["rule"] = state.take(host, request.method, request.path)
        if rule is not None:
            entry["fault"] = {k: rule[k] for k in (*_RULE_EFFECTS, "retry_after_s") if _is_set(rule.get(k))}
            if rule.get("stall_s"):
                await asyncio.sleep(rule["stall_s"])
            if rule.get("status"):
                headers = {}
                if rule.get("retry_after_s") is not None:
                    headers["Retry-After"] = _fmt_seconds(rule["retry_after_s"])
                entry["status"] = rule["status"]
                return make_error(rule["status"], f"injected fault: status {rule['status']}", headers)
        try:
            resp = await handler(request)
        except web.HTTPException as e:
            entry["status"] = e.status
            raise
        if entry["status"] is None:
            entry["status"] = resp.status
        if isinstance(resp, web.Response) and not resp.prepared and isinstance(resp.body, bytes):
            if entry["body_bytes"] is None:
                entry["body_bytes"] = len(resp.body)
            cut = (rule or {}).get("cut_body_after_bytes")
            if cut is not None and resp.status not in (204, 304):  # e.g. a JSON answer of the Hub
                body = resp.body

                async def one_chunk() -> Any:
                    yield body

                headers = {k: v for k, v in resp.headers.items() if k.lower() != "content-length"}
                return await _send_body(request, resp.status, headers, one_chunk(), len(body), cut)
        return resp

    return middleware


def _control_routes(app: web.Application, state: _State, extra: Mapping[str, Callable[[Any], Any]]) -> None:
    """Adds ``/__control__/{ping,faults,log,log/clear}`` and ``extra`` (name -> handler of the JSON body)."""
    from aiohttp import web

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "pid": os.getpid()})

    async def faults(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            state.set_rules(list(body.get("rules") or []), append=bool(body.get("append")))
        except (ValueError, TypeError, AttributeError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"rules": state.rules, "etag_changes": state.etag_changes})

    async def log(request: web.Request) -> web.Response:
        return web.json_response(list(state.log))

    async def clear(request: web.Request) -> web.Response:
        state.log.clear()
        return web.json_response({"ok": True})

    app.router.add_get(f"{_CONTROL}/ping", ping)
    app.router.add_post(f"{_CONTROL}/faults", faults)
    app.router.add_get(f"{_CONTROL}/log", log)
    app.router.add_post(f"{_CONTROL}/log/clear", clear)
    for name, func in extra.items():

        async def handler(request: web.Request, func: Callable[[Any], Any] = func) -> web.Response:
            try:
                result = func(await request.json())
            except (ValueError, KeyError, TypeError) as e:
                return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=400)
            return web.json_response(result)

        app.router.add_post(f"{_CONTROL}/{name}", handler)


def _listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError:
        sock.close()
        raise
    return sock


#: ``make_apps(args, sock, ready)``: the aiohttp apps of one server with the sockets they listen
#: on (``sock``, bound to ``--port``, and any it binds itself, whose ports it adds to ``ready``),
#: and the lines to print after the URL when run by hand.
MakeApps = Callable[
    [argparse.Namespace, socket.socket, dict[str, Any]], tuple[list[tuple[Any, socket.socket]], list[str]]
]


async def _serve(kind: str, args: argparse.Namespace, make_apps: MakeApps) -> None:
    """Runs a ``fault`` or ``hub`` server until SIGTERM/SIGINT or the death of ``--parent-pid``."""
    from aiohttp import web

    sock = _listen(args.port)
    port = sock.getsockname()[1]
    ready: dict[str, Any] = {"port": port, "pid": os.getpid()}
    apps, notes = make_apps(args, sock, ready)
    runners, orphaned = [], False
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        for app, s in apps:
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_S)
            await runner.setup()
            runners.append(runner)
            await web.SockSite(runner, s).start()
        if args.ready_file:
            tmp = Path(args.ready_file + ".tmp")
            tmp.write_text(json.dumps(ready))
            os.replace(tmp, args.ready_file)
        else:
            print(f"{kind} server: http://{HOST}:{port}", flush=True)
            for line in notes:
                print(line, flush=True)
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            if args.parent_pid and os.getppid() != args.parent_pid:
                orphaned = True  # the test process died without stopping us
                break
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
        if orphaned and args.ready_file:  # nobody else will remove our private temp dir
            shutil.rmtree(Path(args.ready_file).parent, ignore_errors=True)


def main(
    kind: str,
    parser: argparse.ArgumentParser,
    make_apps: MakeApps,
    argv: list[str] | None = None,
) -> None:
    """Runs one Python server (``parser`` holds its own arguments) until Ctrl-C or SIGTERM.

    Adds the options every Python server takes (``--port``, and, hidden, those :class:`_PythonServer`
    passes: ``--ready-file``, ``--parent-pid``), then serves; run by hand, it prints its URL.
    """
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)  # written once listening (FaultServer, FakeHub)
    parser.add_argument("--parent-pid", type=int, default=0, help=argparse.SUPPRESS)  # exit when it dies
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve(kind, args, make_apps))
