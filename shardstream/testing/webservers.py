"""Real local web servers for tests and benchmarks of the http(s) and Hugging Face Hub backends.

Three context managers, each listening on 127.0.0.1 only, each started with bounded waits and
stopped on exit (``with``, :meth:`stop`, or an ``atexit`` fallback in the process that started it):

- :class:`NginxServer`: the system ``nginx`` serving a directory read-only, over http or https
  (a throwaway CA; point clients at it with ``SSL_CERT_FILE``);
- :class:`FaultServer`: an aiohttp file server in a subprocess whose faults (cut bodies, error
  statuses with ``Retry-After``, ignored ranges, replaced ETags, stalls) are switched on and off at
  run time, with a log of the requests it served;
- :class:`FakeHub`: a small fake of the Hugging Face Hub (revision info, paginated tree, paths-info,
  refs, ``resolve`` redirects to a "CDN" on a second port and host name), in a subprocess.

The Python servers run as subprocesses (``python -m shardstream.testing.webservers fault|hub``),
never as threads of the test process, so DataLoader workers forked from the tests do not inherit a
running event loop; they exit by themselves (and remove their temp dirs) when the process that
started them dies. nginx does not: a test process killed with SIGKILL leaves it running.

All servers honour ``Range`` (``206`` with ``Content-Range``; ``416`` with ``Content-Range: bytes
*/size`` when the first byte is past the end), ``ETag``, ``If-Match`` (``412`` when no listed
ETag matches, strong comparison), ``If-None-Match`` (``304``) and ``If-Range``. nginx also serves
multi-range requests (``multipart/byteranges``); the Python servers answer those with ``200`` and
the whole file, which RFC 9110 allows. nginx's own conditional handling was checked against nginx
1.22.1 (Debian): a static file requested with an ``If-Match`` naming a different ETag gets
``412 Precondition Failed``, with the current ETag or ``*`` it gets ``200``/``206``.

``python -m shardstream.testing.webservers nginx|fault|hub ...`` runs one for manual use and prints
its URL (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import collections
import contextlib
import datetime
import email.utils
import fnmatch
import grp
import hashlib
import hmac
import ipaddress
import json
import logging
import mimetypes
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from .process import (
    HOST,
    NO_PROXY_OPENER,
    ServerContext,
    exit_on_stop_signals,
    free_port,
    log_tail,
    sleep_until_interrupted,
    spawn,
    startup_timeout,
    stop_process_group,
    wait_until,
)

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["FakeHub", "FaultServer", "NginxServer", "WebServerError", "main"]

_CDN_HOST = "localhost"  # same machine, other name and port: a different origin for clients
_MODULE = "shardstream.testing.webservers"
_CONTROL = "/__control__"
_CONTROL_TIMEOUT_S = 10.0  # one control request (set_faults, requests, ...)
_MAX_STALL_S = 600.0  # upper bound of a stall_s fault
_PORT_TRIES = 3  # nginx binds a port picked beforehand; another process may take it first
_CHUNK = 256 * 1024  # bytes per write of a file body
_MAX_LOG = 100_000  # request log entries kept per server (oldest dropped)
_SHUTDOWN_S = 0.5  # seconds a stopping Python server gives the requests in flight
_SHA_RE = re.compile(r"[0-9a-f]{40}")
_LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"

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


# --------------------------------------------------------------------------------------------
# Helpers shared by the servers' owners (the test process).
# --------------------------------------------------------------------------------------------


def _port_accepts(port: int, timeout_s: float = 0.5) -> bool:
    """Whether a TCP connection to 127.0.0.1:``port`` succeeds within ``timeout_s`` seconds."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _find_nginx() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found is None:
        raise WebServerError("nginx binary not found (PATH, /usr/sbin/nginx); apt-get install nginx-light")
    return found


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


# --------------------------------------------------------------------------------------------
# nginx
# --------------------------------------------------------------------------------------------


def _write_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """Writes a throwaway CA and a server certificate for IP 127.0.0.1 and DNS localhost.

    Uses the ``cryptography`` package when importable, else the ``openssl`` command line.

    Returns:
        ``(ca_pem, server_cert_pem, server_key_pem)``, all inside ``directory``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _certificates_with_openssl(directory)
    return _certificates_with_cryptography(directory)


def _certificates_with_cryptography(directory: Path) -> tuple[Path, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shardstream test CA")])

    def usage(*, sign: bool, cert_sign: bool) -> x509.KeyUsage:
        return x509.KeyUsage(
            digital_signature=sign,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=cert_sign,
            crl_sign=cert_sign,
            encipher_only=False,
            decipher_only=False,
        )

    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage(sign=False, cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST)), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage(sign=True, cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem, cert_pem, key_pem = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.touch(mode=0o600)
    key_pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_pem, cert_pem, key_pem


def _certificates_with_openssl(directory: Path) -> tuple[Path, Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise WebServerError("https needs the `cryptography` package or the `openssl` command; neither was found")
    conf = directory / "openssl.cnf"
    conf.write_text(
        "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = shardstream test CA\n"
        "[ca_ext]\nbasicConstraints = critical, CA:TRUE, pathlen:0\nkeyUsage = critical, keyCertSign, cRLSign\n"
        "subjectKeyIdentifier = hash\n"
        "[leaf_ext]\nbasicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\n"
        f"extendedKeyUsage = serverAuth\nsubjectAltName = IP:{HOST}, DNS:localhost\n"
        "subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n"
    )
    ca_pem, ca_key = directory / "ca.pem", directory / "ca.key"
    cert_pem, key_pem, csr = directory / "server.pem", directory / "server.key", directory / "server.csr"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    serial = "0x" + secrets.token_hex(16)
    ca_args = ["-x509", "-new", "-config", str(conf), "-extensions", "ca_ext", *ec, "-sha256", "-days", "30"]
    ca_args += ["-keyout", str(ca_key), "-out", str(ca_pem), "-subj", "/CN=shardstream test CA"]
    csr_args = ["-new", "-config", str(conf), *ec, "-keyout", str(key_pem), "-out", str(csr), "-subj", "/CN=localhost"]
    sign_args = ["-req", "-in", str(csr), "-CA", str(ca_pem), "-CAkey", str(ca_key), "-sha256", "-days", "30"]
    sign_args += ["-set_serial", serial, "-extfile", str(conf), "-extensions", "leaf_ext", "-out", str(cert_pem)]
    commands = [[openssl, "req", *ca_args], [openssl, "req", *csr_args], [openssl, "x509", *sign_args]]
    for args in commands:
        try:
            done = subprocess.run(args, capture_output=True, timeout=30, cwd=directory, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise WebServerError(f"`openssl {args[1]}` for the test certificate failed: {e}") from e
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()[-800:]
            raise WebServerError(f"`openssl {args[1]}` for the test certificate exited {done.returncode}: {err}")
    return ca_pem, cert_pem, key_pem


def _nginx_quote(value: object) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class NginxServer(_ManagedProcess):
    """The system nginx serving ``root`` read-only at ``/`` on 127.0.0.1, over http or https.

    Everything nginx writes (config, pid file, logs, temp paths, certificates) lives in a private
    temporary directory removed by :meth:`stop`. One worker process, ``autoindex off``, ``etag on``,
    single and multi ``Range`` requests, conditional requests (``If-Match`` answered ``412`` when
    the ETag differs); methods other than GET and HEAD get 403, directories 403.

    Args:
        root: Directory to serve.
        https: Serve TLS with a fresh throwaway CA (see :attr:`ca_file`).
        startup_timeout_s: Seconds to wait for nginx to accept connections.

    Attributes:
        url: ``http://127.0.0.1:<port>`` or ``https://127.0.0.1:<port>`` (no trailing slash).
        port: The TCP port.
        ca_file: With ``https=True``, path of the CA certificate (PEM) that signed the server's
            certificate (for IP 127.0.0.1 and DNS ``localhost``); ``None`` for http. Clients trust
            it through ``SSL_CERT_FILE`` (see :meth:`env`) or
            ``ssl.create_default_context(cafile=ca_file)``.
    """

    _label = "nginx server"

    def __init__(self, root: str | os.PathLike, *, https: bool = False, startup_timeout_s: float = 10.0) -> None:
        super().__init__(startup_timeout_s)
        self.root = Path(root)
        self.https = bool(https)
        self.ca_file: str | None = None

    @property
    def url(self) -> str:
        """Base URL without trailing slash; raises WebServerError if not running."""
        return f"{'https' if self.https else 'http'}://{HOST}:{self.port}"

    @property
    def access_log(self) -> Path | None:
        """nginx's access log (one JSON object per request); see :meth:`requests`."""
        return None if self._tmp_dir is None else self._tmp_dir / "access.log"

    def _running_access_log(self) -> Path:
        path = self.access_log
        if path is None:
            raise WebServerError("NginxServer is not running")
        return path

    def env(self) -> dict[str, str]:
        """``{"SSL_CERT_FILE": ca_file}`` for https (the standard OpenSSL variable), else ``{}``."""
        return {} if self.ca_file is None else {"SSL_CERT_FILE": self.ca_file}

    def start(self) -> NginxServer:
        """Writes the config, starts nginx and waits until its port accepts connections.

        Raises:
            WebServerError: nginx is missing, already started, exited early, or did not accept
                connections within ``startup_timeout_s`` seconds.
        """
        if self._proc is not None:
            raise WebServerError("NginxServer already started")
        root = self.root.resolve()
        if not root.is_dir():
            raise WebServerError(f"nginx root {str(root)!r} is not a directory")
        nginx = _find_nginx()
        atexit.register(self.stop)
        try:
            self._tmp_dir = tmp = Path(tempfile.mkdtemp(prefix="shardstream-nginx-"))
            self._log_path = tmp / "error.log"
            (tmp / "temp").mkdir()
            cert = key = None
            if self.https:
                ca, cert, key = _write_certificates(tmp / "tls")
                self.ca_file = str(ca)
            for attempt in range(_PORT_TRIES):
                port = free_port()
                conf = tmp / "nginx.conf"
                conf.write_text(self._config(tmp, root, port, cert, key))
                args = [nginx, "-p", f"{tmp}/", "-c", str(conf), "-e", str(self._log_path), "-g", "daemon off;"]
                self._spawn(args)
                if self._wait_ready(port, may_retry=attempt + 1 < _PORT_TRIES):
                    self._port = port
                    break
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _config(tmp: Path, root: Path, port: int, cert: Path | None, key: Path | None) -> str:
        q = _nginx_quote
        user = ""
        if os.geteuid() == 0:  # workers would switch to `nobody`, who may not read root's files
            user = f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};\n"
        tls = ""
        if cert is not None:
            tls = f"        ssl_certificate {q(cert)};\n        ssl_certificate_key {q(key)};\n"
            tls += "        ssl_protocols TLSv1.2 TLSv1.3;\n"
        temps = "".join(f"    {name}_temp_path {q(tmp / 'temp' / name)};\n" for name in _NGINX_TEMPS)
        log_format = (
            '{"method":"$request_method","path":"$uri","query":"$args","range":"$http_range",'
            '"status":$status,"authorization":"$http_authorization","body_bytes":$body_bytes_sent}'
        )
        return (
            f"{user}worker_processes 1;\npid {q(tmp / 'nginx.pid')};\nlock_file {q(tmp / 'nginx.lock')};\n"
            f"error_log {q(tmp / 'error.log')} notice;\n"
            "events { worker_connections 1024; }\n"
            "http {\n"
            "    default_type application/octet-stream;\n"
            f"    log_format shardstream escape=json '{log_format}';\n"
            f"    access_log {q(tmp / 'access.log')} shardstream;\n"
            f"{temps}"
            "    sendfile on;\n    tcp_nopush on;\n    keepalive_requests 100000;\n    server_tokens off;\n"
            "    server {\n"
            f"        listen {HOST}:{port}{' ssl' if cert is not None else ''};\n"
            "        server_name localhost;\n"
            f"{tls}"
            f"        root {q(root)};\n"
            "        location / {\n            autoindex off;\n            etag on;\n"
            "            limit_except GET { deny all; }\n        }\n"
            "    }\n"
            "}\n"
        )

    def _wait_ready(self, port: int, *, may_retry: bool) -> bool:
        """Waits until nginx accepts on ``port``; False if it lost the port to another process."""
        proc = self._proc
        assert proc is not None and self._tmp_dir is not None
        pid_file = self._tmp_dir / "nginx.pid"

        def accepts() -> bool:
            with contextlib.suppress(OSError, ValueError):
                return int(pid_file.read_text().strip()) == proc.pid and _port_accepts(port)
            return False

        try:
            self._wait_until(accepts, f"did not accept connections on {HOST}:{port}", name="nginx")
        except WebServerError:
            if proc.returncode is None:  # timed out, nginx still running
                raise
            self._proc = None  # nginx exited
            if may_retry and "Address already in use" in self._log_tail():
                return False
            raise
        return True

    def _stop_signal(self) -> int:
        return signal.SIGQUIT  # graceful: finish the requests in flight

    def requests(self) -> list[dict[str, Any]]:
        """The requests nginx served so far, from its access log, oldest first.

        Each is ``{"method", "path", "query", "range", "status", "authorization", "body_bytes"}``
        (``range``, ``query`` and ``authorization`` are ``None`` when absent). nginx writes a line
        when it has sent the response, so a request whose response was just read may lag a moment.
        """
        path = self._running_access_log()
        out = []
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line being written
                for key in ("range", "query", "authorization"):
                    entry[key] = entry.get(key) or None
                out.append(entry)
        return out

    def clear_log(self) -> None:
        """Empties the access log."""
        with contextlib.suppress(FileNotFoundError), open(self._running_access_log(), "r+b") as f:
            f.truncate(0)


_NGINX_TEMPS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


# --------------------------------------------------------------------------------------------
# The Python servers' owners (the test process side).
# --------------------------------------------------------------------------------------------


class _PythonServer(_ManagedProcess):
    """A server of this module run as ``python -m shardstream.testing.webservers <kind>``."""

    _kind = ""
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
            args = [sys.executable, "-m", _MODULE, self._kind, *self._child_args(tmp)]
            args += ["--ready-file", str(ready), "--parent-pid", str(os.getpid())]
            env = dict(os.environ)
            package_parent = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
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


class FakeHub(_PythonServer):
    """A small fake of the Hugging Face Hub for datasets, in a subprocess, on two origins.

    The Hub host is ``http://127.0.0.1:<port>`` (:attr:`endpoint`, for ``HF_ENDPOINT``); files
    are served by a "CDN" at ``http://localhost:<cdn_port>`` (:attr:`cdn_url`), a different
    origin, so clients following a redirect there must drop ``Authorization``. A dataset repo
    ``ORG/NAME`` maps commit shas (40 lowercase hex digits) to directories whose files are the
    commit's files (read at request time); branches (``main``, ``refs/convert/parquet``, ...)
    map to shas and can be moved at run time.

    Hub host endpoints (REV: a branch or full sha, possibly URL-encoded as
    ``refs%2Fconvert%2Fparquet``; private repos answer 401 without ``Authorization: Bearer
    <token>``; errors are JSON ``{"error": ...}`` with ``X-Error-Code`` ``RepoNotFound``,
    ``RevisionNotFound`` or ``EntryNotFound``, as the real Hub sends):

    - ``GET /api/datasets/ORG/NAME[/revision/REV]``: ``{"id", "sha", "private", "siblings",
      "lastModified", ...}`` (without REV: ``main``);
    - ``GET /api/datasets/ORG/NAME/tree/REV[/PATH]?recursive=true|false``: entries ``{"type":
      "file"|"directory", "path", "size", "oid"}``, files larger than ``lfs_threshold_bytes``
      also ``"lfs": {"oid": <sha256>, "size", "pointerSize"}``; sorted by path; pages of
      ``page_size`` entries linked by ``Link: <...&cursor=...>; rel="next"``; PATH may be
      URL-encoded as one segment (``data%2Ftrain``), as huggingface_hub sends it;
    - ``POST /api/datasets/ORG/NAME/paths-info/REV`` (form or JSON ``paths``): entries as in
      tree for the paths that exist;
    - ``GET /api/datasets/ORG/NAME/refs``: ``{"branches": [...], "converts": [...], "tags": []}``;
    - ``GET|HEAD /datasets/ORG/NAME/resolve/REV/PATH``: ``302`` to
      ``<cdn_url>/cdn/ORG/NAME/SHA/PATH?expires=...&signature=...`` with ``X-Repo-Commit``,
      ``X-Linked-Size``, ``X-Linked-Etag: "<etag the CDN serves>"`` (the sha256 for LFS files,
      the git blob sha1 otherwise) and ``ETag: "<git blob sha1>"`` (of the LFS pointer for LFS
      files); ``404`` with ``X-Error-Code: EntryNotFound`` for a missing file. With
      ``direct_small_files=True`` files not above ``lfs_threshold_bytes`` are served by the Hub
      host itself (200/206), as the real Hub does for files kept in git.

    The CDN checks only the URL's signature and expiry (``403`` otherwise), never
    ``Authorization``, and serves the bytes like :class:`FaultServer` (Range, ETag, If-Match).
    :meth:`requests` logs both hosts (``host`` is ``"hub"`` or ``"cdn"``); fault rules take a
    ``host`` key (``"hub"`` by default, ``"cdn"`` or ``"any"``); ``path_glob`` matches the
    request path on that host, except for ``change_etag`` where it matches ``/ORG/NAME/PATH``.

    Args:
        repos: ``{"ORG/NAME": {sha: directory}}``; ``main`` points to each repo's last sha.
        page_size: Tree entries per page.
        lfs_threshold_bytes: Files larger than this are LFS files (real Hub: 10 MiB).
        cdn_url_ttl_s: Seconds a CDN URL stays valid.
        direct_small_files: Serve non-LFS files from the Hub host instead of redirecting.
        startup_timeout_s: Seconds to wait for the subprocess to answer.

    Attributes:
        endpoint: The Hub host URL, ``http://127.0.0.1:<port>``.
        cdn_url: The CDN host URL, ``http://localhost:<cdn_port>``.
        port, cdn_port: The two TCP ports (both on 127.0.0.1).
    """

    _kind = "hub"
    _label = "fake Hub"
    _hosts = ("hub", "cdn")

    def __init__(
        self,
        repos: Mapping[str, Mapping[str, str | os.PathLike]] | None = None,
        *,
        page_size: int = 50,
        lfs_threshold_bytes: int = 10 * 1024 * 1024,
        cdn_url_ttl_s: float = 3600.0,
        direct_small_files: bool = False,
        startup_timeout_s: float = 20.0,
    ) -> None:
        super().__init__(startup_timeout_s)
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size!r}")
        self._config = {
            "repos": {repo_id: _repo_spec(repo_id, commits) for repo_id, commits in (repos or {}).items()},
            "page_size": int(page_size),
            "lfs_threshold_bytes": int(lfs_threshold_bytes),
            "cdn_url_ttl_s": float(cdn_url_ttl_s),
            "direct_small_files": bool(direct_small_files),
        }

    @property
    def endpoint(self) -> str:
        """The Hub host URL (for ``HF_ENDPOINT``); raises WebServerError if not running."""
        return f"http://{HOST}:{self.port}"

    @property
    def cdn_port(self) -> int:
        """The CDN host's TCP port; raises WebServerError if not running."""
        self.port  # noqa: B018 - raises when not running
        return int(self._ready["cdn_port"])

    @property
    def cdn_url(self) -> str:
        """The CDN host URL, ``http://localhost:<cdn_port>``; raises WebServerError if not running."""
        return f"http://{_CDN_HOST}:{self.cdn_port}"

    def env(self) -> dict[str, str]:
        """``{"HF_ENDPOINT": endpoint}``."""
        return {"HF_ENDPOINT": self.endpoint}

    @staticmethod
    def commit_sha(seed: str) -> str:
        """A made-up commit sha (40 hex digits) derived from ``seed``."""
        return hashlib.sha1(seed.encode()).hexdigest()

    def resolve_url(self, repo_id: str, revision: str, path: str) -> str:
        """The Hub URL of one file, as ``huggingface_hub.hf_hub_url`` builds it."""
        rev = urllib.parse.quote(revision, safe="")
        return f"{self.endpoint}/datasets/{repo_id}/resolve/{rev}/{urllib.parse.quote(path)}"

    def _child_args(self, tmp: Path) -> list[str]:
        config = tmp / "hub.json"
        config.write_text(json.dumps(self._config))
        return ["--config", str(config)]

    def start(self) -> FakeHub:
        return super().start()

    def add_repo(
        self,
        repo_id: str,
        commits: Mapping[str, str | os.PathLike] | None = None,
        *,
        branches: Mapping[str, str] | None = None,
        private: bool = False,
        token: str | None = None,
    ) -> None:
        """Adds (or replaces) a dataset repo.

        Args:
            repo_id: ``ORG/NAME``.
            commits: ``{sha: directory}``.
            branches: ``{branch: sha}``; default ``{"main": <last sha>}`` when there are commits.
            private: Answer 401 on the Hub host unless ``Authorization: Bearer <token>`` comes.
            token: The repo's token (required when private), e.g. ``"hf_..."``.
        """
        if private and not token:
            raise ValueError("a private repo needs a token")
        spec = _repo_spec(repo_id, commits or {}, branches=branches)
        spec.update(private=bool(private), token=token)
        self._control("POST", "repo", {"repo_id": repo_id, **spec})

    def add_commit(self, repo_id: str, sha: str, directory: str | os.PathLike, *, branch: str | None = None) -> None:
        """Adds commit ``sha`` (files: those under ``directory``) to a repo; moves ``branch`` to it if given."""
        _check_sha(sha)
        payload = {"repo_id": repo_id, "sha": sha, "directory": _dir(directory), "branch": branch}
        self._control("POST", "commit", payload)

    def set_branch(self, repo_id: str, branch: str, sha: str) -> None:
        """Points ``branch`` (e.g. ``"main"``, ``"refs/convert/parquet"``) of a repo at commit ``sha``."""
        _check_sha(sha)
        self._control("POST", "branch", {"repo_id": repo_id, "branch": branch, "sha": sha})

    def set_page_size(self, page_size: int) -> None:
        """Sets the number of tree entries per page."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size!r}")
        self._control("POST", "settings", {"page_size": int(page_size)})


def _check_sha(sha: str) -> None:
    if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
        raise ValueError(f"a commit sha must be 40 lowercase hex digits, got {sha!r}")


def _dir(directory: str | os.PathLike) -> str:
    path = Path(directory).resolve()
    if not path.is_dir():
        raise ValueError(f"commit directory {str(path)!r} is not a directory")
    return str(path)


def _repo_spec(
    repo_id: str, commits: Mapping[str, str | os.PathLike], *, branches: Mapping[str, str] | None = None
) -> dict[str, Any]:
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"repo_id must be 'ORG/NAME', got {repo_id!r}")
    for sha in commits:
        _check_sha(sha)
    shas = list(commits)
    if branches is None:
        branches = {"main": shas[-1]} if shas else {}
    for branch, sha in branches.items():
        if sha not in commits:
            raise ValueError(f"branch {branch!r} of {repo_id} points to {sha!r}, which is not one of its commits")
    return {
        "commits": {sha: _dir(d) for sha, d in commits.items()},
        "branches": dict(branches),
        "private": False,
        "token": None,
    }


# --------------------------------------------------------------------------------------------
# Server side: runs in the subprocess (`python -m shardstream.testing.webservers fault|hub`).
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


class _Refused(Exception):
    """An error answer of the fake Hub, raised where a lookup fails and sent by :meth:`_Hub.handle_hub`."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


class _Hub:
    """The fake Hub's repos and answers (server side)."""

    def __init__(self, config: Mapping[str, Any], state: _State, cdn_base: str) -> None:
        self.repos: dict[str, dict[str, Any]] = {k: dict(v) for k, v in config.get("repos", {}).items()}
        self.page_size = int(config.get("page_size", 50))
        self.lfs_threshold = int(config.get("lfs_threshold_bytes", 10 * 1024 * 1024))
        self.ttl_s = float(config.get("cdn_url_ttl_s", 3600.0))
        self.direct_small_files = bool(config.get("direct_small_files", False))
        self.state = state
        self.cdn_base = cdn_base
        self.secret = secrets.token_bytes(32)
        self._hashes: dict[str, tuple[int, int, tuple[str, str | None, int | None]]] = {}

    # -- control --------------------------------------------------------------------------

    def control_repo(self, body: Mapping[str, Any]) -> dict[str, Any]:
        repo_id = body["repo_id"]
        self.repos[repo_id] = {k: body[k] for k in ("commits", "branches", "private", "token")}
        return {"ok": True}

    def control_commit(self, body: Mapping[str, Any]) -> dict[str, Any]:
        repo = self.repos[body["repo_id"]]
        repo["commits"][body["sha"]] = body["directory"]
        if body.get("branch"):
            repo["branches"][body["branch"]] = body["sha"]
        return {"ok": True}

    def control_branch(self, body: Mapping[str, Any]) -> dict[str, Any]:
        repo = self.repos[body["repo_id"]]
        if body["sha"] not in repo["commits"]:
            raise ValueError(f"{body['sha']} is not a commit of {body['repo_id']}")
        repo["branches"][body["branch"]] = body["sha"]
        return {"ok": True}

    def control_settings(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if "page_size" in body:
            self.page_size = max(1, int(body["page_size"]))
        return {"page_size": self.page_size}

    # -- helpers ----------------------------------------------------------------------------

    @staticmethod
    def error(status: int, code: str | None, message: str, extra: Mapping[str, str] | None = None) -> web.Response:
        headers = {"X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        return _error_maker_json(status, message, headers)

    def repo(self, request: web.Request, repo_id: str) -> dict[str, Any]:
        """The repo ``repo_id``; raises _Refused (404, or 401 for a private repo without its token)."""
        repo = self.repos.get(repo_id)
        if repo is None:
            raise _Refused(self.error(404, "RepoNotFound", "Repository not found"))
        if repo.get("private") and request.headers.get("Authorization") != f"Bearer {repo.get('token')}":
            raise _Refused(self.error(401, "RepoNotFound", "Invalid username or password."))
        return repo

    def commit(self, request: web.Request, repo_id: str, rev: str | None) -> tuple[dict[str, Any], str]:
        """The repo and the sha of the commit ``rev`` (a branch or a sha) names; raises _Refused."""
        repo = self.repo(request, repo_id)
        if rev is None or rev == "":
            raise _Refused(self.error(404, "RevisionNotFound", "Invalid rev id: "))
        sha = repo["branches"].get(rev)
        if sha is None and rev in repo["commits"]:
            sha = rev
        if sha is None:
            raise _Refused(self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}"))
        return repo, sha

    def _file_ids_sync(self, path: Path) -> tuple[str, str | None, int | None]:
        """``(git blob oid, sha256 if LFS, LFS pointer size)`` of a file, cached by mtime and size."""
        st = path.stat()
        cached = self._hashes.get(str(path))
        if cached is not None and cached[:2] == (st.st_mtime_ns, st.st_size):
            return cached[2]
        lfs = st.st_size > self.lfs_threshold
        digest = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % st.st_size)
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        if lfs:
            pointer = _LFS_POINTER.format(oid=digest.hexdigest(), size=st.st_size).encode()
            oid = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()
            ids = (oid, digest.hexdigest(), len(pointer))
        else:
            ids = (digest.hexdigest(), None, None)
        self._hashes[str(path)] = (st.st_mtime_ns, st.st_size, ids)
        return ids

    async def file_info(self, repo_id: str, rel: str, path: Path) -> dict[str, Any]:
        """The tree entry of a file, with its etag (``etag``: what the CDN serves)."""
        oid, sha256, pointer_size = await asyncio.get_running_loop().run_in_executor(None, self._file_ids_sync, path)
        epoch = self.state.etag_epoch(f"/{repo_id}/{rel}")
        if epoch:  # as if the file was replaced
            oid = hashlib.sha1(f"{oid}:{epoch}".encode()).hexdigest()
            sha256 = None if sha256 is None else hashlib.sha256(f"{sha256}:{epoch}".encode()).hexdigest()
        entry: dict[str, Any] = {"type": "file", "oid": oid, "size": path.stat().st_size, "path": rel}
        if sha256 is not None:
            entry["lfs"] = {"oid": sha256, "size": entry["size"], "pointerSize": pointer_size}
        return entry

    @staticmethod
    def dir_info(sha: str, rel: str) -> dict[str, Any]:
        return {
            "type": "directory",
            "oid": hashlib.sha1(f"tree:{sha}:{rel}".encode()).hexdigest(),
            "size": 0,
            "path": rel,
        }

    @staticmethod
    def walk(base: Path, recursive: bool) -> list[tuple[str, bool]]:
        """``(relative posix path under base, is_dir)`` of the entries under ``base``."""
        out = []
        if recursive:
            for dirpath, dirnames, filenames in os.walk(base):
                rel_dir = Path(dirpath).relative_to(base)
                out += [((rel_dir / d).as_posix(), True) for d in dirnames]
                out += [((rel_dir / f).as_posix(), False) for f in filenames]
        else:
            out = [(p.name, p.is_dir()) for p in base.iterdir()]
        return out

    @staticmethod
    def rel_path(segments: list[str]) -> str | None:
        """Decoded repo path from raw URL segments; None if it has ``..``."""
        parts = [p for s in segments if s for p in urllib.parse.unquote(s).split("/") if p and p != "."]
        if any(p == ".." or "\0" in p for p in parts):
            return None
        return "/".join(parts)

    def sign(self, repo_id: str, sha: str, rel: str, expires: int) -> str:
        msg = f"{repo_id}\n{sha}\n{rel}\n{expires}".encode()
        return hmac.new(self.secret, msg, hashlib.sha256).hexdigest()[:40]

    # -- Hub host ---------------------------------------------------------------------------

    async def handle_hub(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self.route_hub(request)
        except _Refused as refused:
            return refused.response

    async def route_hub(self, request: web.Request) -> web.StreamResponse:
        segs = request.rel_url.raw_path.split("/")[1:]
        if len(segs) >= 4 and segs[:2] == ["api", "datasets"]:
            repo_id = f"{urllib.parse.unquote(segs[2])}/{urllib.parse.unquote(segs[3])}"
            rest = segs[4:]
            op = rest[0] if rest else ""
            if op in ("", "revision") and request.method in ("GET", "HEAD"):
                rev, tail = _split_revision(rest[1:]) if op else ("main", [])
                if any(tail):
                    return self.error(404, None, "Not Found")
                return await self.info(request, repo_id, rev)
            if op == "tree" and request.method in ("GET", "HEAD"):
                rev, tail = _split_revision(rest[1:])
                return await self.tree(request, repo_id, rev, tail)
            if op == "paths-info" and request.method == "POST":
                rev, tail = _split_revision(rest[1:])
                return await self.paths_info(request, repo_id, rev)
            if op == "refs" and request.method in ("GET", "HEAD"):
                return self.refs(request, repo_id)
        if len(segs) >= 6 and segs[0] == "datasets" and segs[3] == "resolve" and request.method in ("GET", "HEAD"):
            repo_id = f"{urllib.parse.unquote(segs[1])}/{urllib.parse.unquote(segs[2])}"
            rev, tail = _split_revision(segs[4:])
            return await self.resolve(request, repo_id, rev, tail)
        return self.error(404, None, "Not Found")

    async def info(self, request: web.Request, repo_id: str, rev: str | None) -> web.Response:
        from aiohttp import web

        repo, sha = self.commit(request, repo_id, rev)
        base = Path(repo["commits"][sha])
        files = sorted(rel for rel, is_dir in self.walk(base, True) if not is_dir)
        stamp = datetime.datetime.fromtimestamp(base.stat().st_mtime, tz=datetime.timezone.utc)
        iso = stamp.strftime("%Y-%m-%dT%H:%M:%S.000Z")
        org, name = repo_id.split("/")
        body = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "author": org,
            "sha": sha,
            "lastModified": iso,
            "createdAt": iso,
            "private": bool(repo.get("private")),
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "description": f"Fake dataset {name}",
            "siblings": [{"rfilename": rel} for rel in files],
            "usedStorage": sum((base / rel).stat().st_size for rel in files),
        }
        return web.json_response(body)

    async def tree(self, request: web.Request, repo_id: str, rev: str | None, tail: list[str]) -> web.Response:
        from aiohttp import web

        repo, sha = self.commit(request, repo_id, rev)
        rel = self.rel_path(tail)
        base = Path(repo["commits"][sha])
        target = base / rel if rel else base
        if rel is None or not target.is_dir():
            return self.error(404, "EntryNotFound", f"Entry not found: {rel}", {"X-Repo-Commit": sha})
        recursive = request.query.get("recursive", "false").lower() in ("1", "true")
        names = sorted((f"{rel}/{p}" if rel else p, is_dir) for p, is_dir in self.walk(target, recursive))
        offset = 0
        cursor = request.query.get("cursor")
        if cursor:
            try:
                offset = int(json.loads(base64.urlsafe_b64decode(cursor.encode()))["offset"])
            except (ValueError, KeyError, TypeError):
                return self.error(400, None, "Invalid cursor")
        page = names[offset : offset + self.page_size]
        entries = []
        for path, is_dir in page:
            entries.append(self.dir_info(sha, path) if is_dir else await self.file_info(repo_id, path, base / path))
        headers = {}
        if offset + self.page_size < len(names):
            token = base64.urlsafe_b64encode(json.dumps({"offset": offset + self.page_size}).encode()).decode()
            headers["Link"] = f'<{request.url.update_query(cursor=token)}>; rel="next"'
        return web.json_response(entries, headers=headers)

    async def paths_info(self, request: web.Request, repo_id: str, rev: str | None) -> web.Response:
        from aiohttp import web

        repo, sha = self.commit(request, repo_id, rev)
        if request.content_type == "application/json":
            body = await request.json()
            paths = body.get("paths") or []
            paths = [paths] if isinstance(paths, str) else list(paths)
        else:
            paths = (await request.post()).getall("paths", [])
        base, out = Path(repo["commits"][sha]), []
        for raw in paths:
            rel = self.rel_path([str(raw)])
            if rel is None:
                continue
            target = base / rel if rel else base
            if rel and target.is_dir():
                out.append(self.dir_info(sha, rel))
            elif rel and target.is_file():
                out.append(await self.file_info(repo_id, rel, target))
        return web.json_response(out)

    def refs(self, request: web.Request, repo_id: str) -> web.Response:
        from aiohttp import web

        repo = self.repo(request, repo_id)
        body: dict[str, list[dict[str, str]]] = {"branches": [], "converts": [], "tags": []}
        for name, sha in sorted(repo["branches"].items()):
            if name.startswith("refs/convert/"):
                body["converts"].append({"name": name.split("/", 2)[2], "ref": name, "targetCommit": sha})
            elif not name.startswith("refs/"):
                body["branches"].append({"name": name, "ref": f"refs/heads/{name}", "targetCommit": sha})
        return web.json_response(body)

    async def resolve(self, request: web.Request, repo_id: str, rev: str | None, tail: list[str]) -> web.StreamResponse:
        from aiohttp import web

        repo, sha = self.commit(request, repo_id, rev)
        rel = self.rel_path(tail)
        path = None if not rel else _safe_file(Path(repo["commits"][sha]), rel)
        if path is None:
            return self.error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
        info = await self.file_info(repo_id, rel, path)
        linked_etag = info["lfs"]["oid"] if "lfs" in info else info["oid"]
        if self.direct_small_files and "lfs" not in info:
            return await _serve_file(request, path, info["oid"], {"X-Repo-Commit": sha})
        expires = int(time.time() + self.ttl_s)
        location = (
            f"{self.cdn_base}/cdn/{urllib.parse.quote(repo_id)}/{sha}/{urllib.parse.quote(rel)}"
            f"?expires={expires}&signature={self.sign(repo_id, sha, rel, expires)}"
        )
        headers = {
            "Location": location,
            "X-Repo-Commit": sha,
            "X-Linked-Size": str(info["size"]),
            "X-Linked-Etag": f'"{linked_etag}"',
            "ETag": f'"{info["oid"]}"',
        }
        return web.Response(status=302, headers=headers, text=f"Found. Redirecting to {location}")

    # -- CDN host ---------------------------------------------------------------------------

    async def handle_cdn(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, headers={"Allow": "GET, HEAD"}, text="Method Not Allowed\n")
        segs = request.rel_url.raw_path.split("/")[1:]
        if len(segs) < 5 or segs[0] != "cdn":
            return web.Response(status=404, text="Not Found\n")
        repo_id = f"{urllib.parse.unquote(segs[1])}/{urllib.parse.unquote(segs[2])}"
        sha, rel = segs[3], self.rel_path(segs[4:])
        try:
            expires = int(request.query.get("expires", ""))
        except ValueError:
            expires = -1
        signature = request.query.get("signature", "")
        if rel is None or not hmac.compare_digest(signature, self.sign(repo_id, sha, rel, expires)):
            return web.Response(status=403, text="AccessDenied: bad signature\n")
        if expires < time.time():
            return web.Response(status=403, text="AccessDenied: request has expired\n")
        directory = self.repos.get(repo_id, {}).get("commits", {}).get(sha)
        path = None if directory is None or not rel else _safe_file(Path(directory), rel)
        if path is None:
            return web.Response(status=404, text="NoSuchKey\n")
        info = await self.file_info(repo_id, rel, path)
        etag = info["lfs"]["oid"] if "lfs" in info else info["oid"]
        return await _serve_file(request, path, etag)


def _split_revision(segments: list[str]) -> tuple[str | None, list[str]]:
    """Splits raw URL segments into (decoded revision, rest); ``refs/x/y`` may come unencoded."""
    if not segments or not segments[0]:
        return None, []
    if segments[0] == "refs" and len(segments) >= 3:
        rev = "refs/" + urllib.parse.unquote(segments[1]) + "/" + urllib.parse.unquote(segments[2])
        return rev, segments[3:]
    return urllib.parse.unquote(segments[0]), segments[1:]


def _hub_apps(config: Mapping[str, Any], cdn_port: int) -> tuple[web.Application, web.Application]:
    from aiohttp import web

    state = _State(("hub", "cdn"))
    hub = _Hub(config, state, f"http://{_CDN_HOST}:{cdn_port}")
    hub_app = web.Application(middlewares=[_logging_middleware(state, "hub", _error_maker_json)])
    controls = {
        "repo": hub.control_repo,
        "commit": hub.control_commit,
        "branch": hub.control_branch,
        "settings": hub.control_settings,
    }
    _control_routes(hub_app, state, controls)
    hub_app.router.add_route("*", "/{tail:.*}", hub.handle_hub)
    cdn_app = web.Application(middlewares=[_logging_middleware(state, "cdn", _error_maker_text)])
    cdn_app.router.add_route("*", "/{tail:.*}", hub.handle_cdn)
    return hub_app, cdn_app


def _listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError:
        sock.close()
        raise
    return sock


async def _serve(kind: str, args: argparse.Namespace) -> None:
    """Runs a ``fault`` or ``hub`` server until SIGTERM/SIGINT or the death of ``--parent-pid``."""
    from aiohttp import web

    sock = _listen(args.port)
    port = sock.getsockname()[1]
    ready: dict[str, Any] = {"port": port, "pid": os.getpid()}
    if kind == "fault":
        apps = [(_fault_app(Path(args.root).resolve()), sock)]
    else:
        config: dict[str, Any] = {}
        if args.config:
            config = json.loads(Path(args.config).read_text())
        else:
            config = {"page_size": args.page_size, "repos": {}}
            for spec in args.repo:
                repo_id, _, directory = spec.partition("=")
                sha = FakeHub.commit_sha(str(Path(directory).resolve()))
                config["repos"][repo_id] = _repo_spec(repo_id, {sha: directory})
        cdn_sock = _listen(args.cdn_port)
        ready["cdn_port"] = cdn_sock.getsockname()[1]
        hub_app, cdn_app = _hub_apps(config, ready["cdn_port"])
        apps = [(hub_app, sock), (cdn_app, cdn_sock)]
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
            if "cdn_port" in ready:
                print(f"HF_ENDPOINT=http://{HOST}:{port} (CDN: http://{_CDN_HOST}:{ready['cdn_port']})", flush=True)
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


def main(argv: list[str] | None = None) -> None:
    """Runs one server until Ctrl-C or SIGTERM, printing its URL (``--help`` for the options)."""
    parser = argparse.ArgumentParser(prog=f"python -m {_MODULE}", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("nginx", help="the system nginx serving ROOT")
    p.add_argument("root")
    p.add_argument("--https", action="store_true", help="serve TLS with a throwaway CA (its path is printed)")
    p = sub.add_parser("fault", help="the fault-injecting file server serving ROOT")
    p.add_argument("root")
    p = sub.add_parser("hub", help="the fake Hugging Face Hub")
    p.add_argument("--repo", action="append", default=[], metavar="ORG/NAME=DIR", help="a dataset (one commit)")
    p.add_argument("--page-size", type=int, default=50)
    p.add_argument("--config", help=argparse.SUPPRESS)  # JSON written by FakeHub
    p.add_argument("--cdn-port", type=int, default=0)
    for name in ("fault", "hub"):
        p = sub.choices[name]
        p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: a free one)")
        p.add_argument("--ready-file", help=argparse.SUPPRESS)  # written once listening (FaultServer, FakeHub)
        p.add_argument("--parent-pid", type=int, default=0, help=argparse.SUPPRESS)  # exit when it dies
    args = parser.parse_args(argv)
    if args.kind == "nginx":
        exit_on_stop_signals()
        with NginxServer(args.root, https=args.https) as server:
            print(f"nginx: {server.url}", flush=True)
            for key, value in server.env().items():
                print(f"export {key}={value}", flush=True)
            sleep_until_interrupted()
        return
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve(args.kind, args))


if __name__ == "__main__":
    main()
