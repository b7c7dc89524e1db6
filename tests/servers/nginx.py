"""nginx serving a directory on 127.0.0.1 for the http(s) backend's tests and benchmarks.

:class:`NginxServer` runs the system ``nginx`` serving a directory read-only, over http or https
(a throwaway CA; point clients at it with ``SSL_CERT_FILE``), started with a bounded wait and
stopped on exit (``with``, :meth:`~NginxServer.stop`, or an ``atexit`` fallback in the process
that started it). When that process dies without stopping it (SIGKILL), the lifeline
:func:`~shardstream.testing.process.spawn` starts beside nginx stops nginx and removes its
temporary directory within seconds.

nginx honours ``Range`` (``206`` with ``Content-Range``; ``416`` with ``Content-Range: bytes
*/size`` when the first byte is past the end), multi-range requests (``multipart/byteranges``),
``ETag``, ``If-Match``, ``If-None-Match`` (``304``) and ``If-Range``. Its conditional handling was
checked against nginx 1.22.1 (Debian): a static file requested with an ``If-Match`` naming a
different ETag gets ``412 Precondition Failed``, with the current ETag or ``*`` it gets
``200``/``206``.

``python -m servers.nginx ROOT [--https]`` (from ``tests/``, or with ``PYTHONPATH=tests``) runs
one for manual use and prints its URL.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import grp
import ipaddress
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from servers.httpapp import WebServerError, _ManagedProcess
from shardstream.testing.process import (
    HOST,
    exit_on_stop_signals,
    free_port,
    sleep_until_interrupted,
    stop_process_group,
)

__all__ = ["NginxServer", "main"]

_PORT_TRIES = 3  # nginx binds a port picked beforehand; another process may take it first


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
            stop_process_group(proc)  # reaps it, stands its lifeline down
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


def main(argv: list[str] | None = None) -> None:
    """Runs nginx serving ROOT until Ctrl-C or SIGTERM, printing its URL (``--help`` for the options)."""
    parser = argparse.ArgumentParser(prog="python -m servers.nginx", description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--https", action="store_true", help="serve TLS with a throwaway CA (its path is printed)")
    args = parser.parse_args(argv)
    exit_on_stop_signals()
    with NginxServer(args.root, https=args.https) as server:
        print(f"nginx: {server.url}", flush=True)
        for key, value in server.env().items():
            print(f"export {key}={value}", flush=True)
        sleep_until_interrupted()


if __name__ == "__main__":
    main()
