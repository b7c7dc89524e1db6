"""A file server whose faults are switched on and off at run time, for the http backend's tests.

:class:`FaultServer` runs an aiohttp file server in a subprocess on 127.0.0.1 (its faults: cut
bodies, error statuses with ``Retry-After``, ignored ranges, replaced ETags, stalls), with a log
of the requests it served; what it shares with the fake Hub is in :mod:`servers.httpapp`.

``python -m servers.faultserver ROOT`` (from ``tests/``, or with ``PYTHONPATH=tests``) runs one
for manual use and prints its URL.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servers import httpapp
from servers.httpapp import (
    WebServerError,
    _control_routes,
    _error_maker_text,
    _logging_middleware,
    _PythonServer,
    _safe_file,
    _serve_file,
    _State,
)
from shardstream.testing.process import HOST

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["FaultServer", "main"]


class FaultServer(_PythonServer):
    """An aiohttp file server with run-time switchable faults, in a subprocess on 127.0.0.1.

    Serves the files under ``root`` at ``/`` (no directory listings) for GET and HEAD with
    ``ETag`` (``"<mtime_ns hex>-<size hex>"``, then ``...-v<N>`` after a ``change_etag``),
    ``Last-Modified``, single ``Range`` (``206`` + ``Content-Range``; ``416`` past the end;
    multi-range answered ``200``), ``If-Match`` (``412``), ``If-None-Match`` (``304``) and
    ``If-Range``. Faults: :meth:`set_faults`, :meth:`add_fault`; the log of served requests:
    :meth:`requests`, :meth:`clear_log`.

    Args:
        root: Directory to serve (files are read at request time, so tests may change them).
        startup_timeout_s: Seconds to wait for the subprocess to answer.

    Attributes:
        url: ``http://127.0.0.1:<port>`` (no trailing slash).
        port: The TCP port.
    """

    _kind = "fault"
    _module = "servers.faultserver"
    _label = "fault server"

    def __init__(self, root: str | os.PathLike, *, startup_timeout_s: float = 20.0) -> None:
        super().__init__(startup_timeout_s)
        self.root = Path(root)

    @property
    def url(self) -> str:
        """Base URL without trailing slash; raises WebServerError if not running."""
        return f"http://{HOST}:{self.port}"

    def _child_args(self, tmp: Path) -> list[str]:
        root = self.root.resolve()
        if not root.is_dir():
            raise WebServerError(f"fault server root {str(root)!r} is not a directory")
        return [str(root)]

    def start(self) -> FaultServer:
        return super().start()


def _fault_app(root: Path) -> web.Application:
    from aiohttp import web

    state = _State(("origin",))
    app = web.Application(middlewares=[_logging_middleware(state, "origin", _error_maker_text)])
    _control_routes(app, state, {})

    async def files(request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, headers={"Allow": "GET, HEAD"}, text="Method Not Allowed\n")
        path = _safe_file(root, request.path)
        if path is None:
            return web.Response(status=404, text="Not Found\n")
        st = path.stat()
        etag = f"{st.st_mtime_ns:x}-{st.st_size:x}"
        epoch = state.etag_epoch(request.path)
        if epoch:
            etag += f"-v{epoch}"
        return await _serve_file(request, path, etag)

    app.router.add_route("*", "/{tail:.*}", files)
    return app


def _make_apps(
    args: argparse.Namespace, sock: socket.socket, ready: dict[str, Any]
) -> tuple[list[tuple[web.Application, socket.socket]], list[str]]:
    return [(_fault_app(Path(args.root).resolve()), sock)], []


def main(argv: list[str] | None = None) -> None:
    """Runs the fault server serving ROOT until Ctrl-C or SIGTERM, printing its URL (``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m servers.faultserver", description=__doc__.splitlines()[0])
    parser.add_argument("root")
    httpapp.main("fault", parser, _make_apps, argv)


if __name__ == "__main__":
    main()
