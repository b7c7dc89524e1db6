"""Real local servers for the GCS and Azure backends' tests: :class:`GcsEmulator` and :class:`Azurite`.

Both are context managers in the style of :class:`~shardstream.testing.s3server.SeaweedS3Server`:
a free port on 127.0.0.1, a bounded wait for the server to answer, a clear error with the tail
of its log when it does not, and a clean stop (SIGTERM, a grace period, then SIGKILL of its
process group). Nothing is left behind: the GCS emulator keeps its data in memory, Azurite in
a temporary directory removed at the stop; when the process that started them dies without
stopping them (SIGKILL), the lifeline :func:`~shardstream.testing.process.spawn` starts beside
each stops it and removes that directory within seconds.

- :class:`GcsEmulator` runs ``gcp_storage_emulator start --in-memory`` (PyPI
  ``gcp-storage-emulator``, pure Python) through ``gcs_emulator_main.py``, which mends its
  reading of one-request uploads (it dropped a CR ending an object). It speaks the JSON API only, is single-threaded,
  checks no credentials, ignores ``maxResults``/``pageToken`` (one page holds everything),
  ``generation=`` pins and ``ifGenerationMatch`` preconditions, and sends no
  ``x-goog-generation`` header; a range starting past the end comes back as an empty ``206``.
- :class:`Azurite` runs ``azurite-blob`` (npm ``azurite``; 3.35.0 is the last release that
  runs on Node 20) with the well-known development account ``devstoreaccount1``. It checks the
  account key (SharedKey signatures), ETags and conditional requests, and pages listings; it
  has no hierarchical namespace (ADLS Gen2 ``abfs`` directory features).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from shardstream.testing.process import (
    HOST,
    NO_PROXY_OPENER,
    ServerContext,
    free_port,
    log_tail,
    spawn,
    startup_timeout,
    stop_process_group,
    wait_until,
)

__all__ = ["AZURITE_ACCOUNT", "AZURITE_KEY", "Azurite", "EmulatorError", "GcsEmulator"]

#: Azurite's well-known development account and key (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class EmulatorError(RuntimeError):
    """A local storage emulator could not be started or used."""


class _Server(ServerContext):
    """A server process on 127.0.0.1 with a log file, a bounded start and a clean stop."""

    name = "server"

    def __init__(self, *, startup_timeout_s: float, log_path: str | os.PathLike | None) -> None:
        self._startup_timeout_s = startup_timeout(startup_timeout_s)
        self._log_path_arg = None if log_path is None else Path(log_path)
        self._log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp_dir: Path | None = None
        self._port: int | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``; raises EmulatorError if not started."""
        if self._proc is None or self._port is None:
            raise EmulatorError(f"{type(self).__name__} is not running; call start() or use it in a with block")
        return f"http://{HOST}:{self._port}"

    def _command(self, port: int, data_dir: Path) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        """Starts the server on a free port and waits until it answers.

        Raises:
            EmulatorError: already started, the program is missing, it exited early, or it did
                not answer within ``startup_timeout_s`` (the message holds its log's tail).
        """
        if self._proc is not None:
            raise EmulatorError(f"{type(self).__name__} already started")
        atexit.register(self.stop)
        try:
            self._tmp_dir = Path(tempfile.mkdtemp(prefix=f"shardstream-{self.name}-"))
            self._port = free_port()
            command = self._command(self._port, self._tmp_dir)
            self._log_path = self._log_path_arg or self._tmp_dir / f"{self.name}.log"
            self._proc = spawn(
                command,
                log_path=self._log_path,
                cwd=self._tmp_dir,
                error=EmulatorError,
                remove_on_parent_death=[self._tmp_dir],
            )
            wait_until(
                self._ready,
                proc=self._proc,
                timeout_s=self._startup_timeout_s,
                error=EmulatorError,
                name=self.name,
                not_ready=f"did not answer on {self.endpoint}",
                log_tail=lambda: log_tail(self._log_path),
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stops the server (SIGTERM, up to 5 s grace, then SIGKILL of its process group) and
        removes its temporary directory. Idempotent."""
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process_group(proc)
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None
        self._port = None

    def _request(
        self, method: str, path: str, *, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Any:
        request = urllib.request.Request(self.endpoint + path, data=body, method=method, headers=headers or {})
        return NO_PROXY_OPENER.open(request, timeout=10.0)


class GcsEmulator(_Server):
    """Context manager running ``gcp-storage-emulator`` in memory on 127.0.0.1 (module doc for
    what it does not check).

    Args:
        startup_timeout_s: seconds to wait for it to answer.
        python: the interpreter that has ``gcp_storage_emulator`` installed; default this one.
        log_path: file for its output; default a file in its temporary directory.

    Example::

        with GcsEmulator() as gcs:
            gcs.create_bucket("data")
            os.environ.update(gcs.env())  # before the first gs:// request of the process
    """

    name = "gcs-emulator"

    def __init__(
        self,
        *,
        startup_timeout_s: float = 30.0,
        python: str | None = None,
        log_path: str | os.PathLike | None = None,
    ) -> None:
        super().__init__(startup_timeout_s=startup_timeout_s, log_path=log_path)
        self._python = python or sys.executable

    def _command(self, port: int, data_dir: Path) -> list[str]:
        return [
            self._python,
            str(Path(__file__).with_name("gcs_emulator_main.py")),  # the emulator, its multipart reading mended
            "start",
            "--host",
            HOST,
            "--port",
            str(port),
            "--in-memory",
        ]

    def _ready(self) -> bool:
        try:
            with self._request("GET", "/") as response:
                return response.status == 200
        except (OSError, ValueError):
            return False

    def env(self) -> dict[str, str]:
        """The environment a GCS client needs to use this emulator: ``STORAGE_EMULATOR_HOST``
        (gcsfs and google-cloud-storage read it; shardstream then sends no credentials),
        ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (else gcsfs probes the bucket type, which
        the emulator does not answer) and ``NO_GCE_CHECK=true`` (no metadata-server probe)."""
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "NO_GCE_CHECK": "true",
        }

    def create_bucket(self, name: str) -> None:
        """Creates bucket ``name``.

        Raises:
            EmulatorError: not running, or the emulator refused (e.g. the bucket exists).
        """
        body = json.dumps({"name": name}).encode()
        try:
            with self._request(
                "POST", "/storage/v1/b?project=test", body=body, headers={"Content-Type": "application/json"}
            ):
                pass
        except urllib.error.HTTPError as exc:
            exc.close()
            raise EmulatorError(f"the GCS emulator refused to create bucket {name!r} (HTTP {exc.code})") from None
        except OSError as exc:
            raise EmulatorError(f"the GCS emulator at {self.endpoint} did not answer: {exc}") from exc


def _find_azurite(azurite_bin: str | os.PathLike | None) -> str:
    """The ``azurite-blob`` program: the argument, else ``AZURITE_BIN``, else the project's local
    npm install (``.cache/azurite``), else ``PATH``."""
    hint = "install it with: npm install --prefix .cache/azurite azurite@3.35.0 (or set AZURITE_BIN)"
    if azurite_bin is not None or os.environ.get("AZURITE_BIN"):
        path = os.fspath(azurite_bin if azurite_bin is not None else os.environ["AZURITE_BIN"])
        if not os.access(path, os.X_OK):
            raise EmulatorError(f"azurite-blob not found or not executable at {path!r}; {hint}")
        return path
    local = Path(__file__).resolve().parents[2] / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("azurite-blob")
    if found is None:
        raise EmulatorError(f"azurite-blob not found (not in AZURITE_BIN, .cache/azurite or PATH); {hint}")
    return found


class Azurite(_Server):
    """Context manager running Azurite's blob service on 127.0.0.1 with the development account
    ``devstoreaccount1`` (module doc for what it covers).

    Args:
        startup_timeout_s: seconds to wait for it to answer.
        azurite_bin: path of ``azurite-blob``; default ``AZURITE_BIN``, the project's
            ``.cache/azurite`` npm install, else ``PATH``.
        log_path: file for its output; default a file in its temporary directory.

    Example::

        with Azurite() as azure:
            azure.create_container("data")
            os.environ.update(azure.env())
    """

    name = "azurite"

    def __init__(
        self,
        *,
        startup_timeout_s: float = 30.0,
        azurite_bin: str | os.PathLike | None = None,
        log_path: str | os.PathLike | None = None,
    ) -> None:
        super().__init__(startup_timeout_s=startup_timeout_s, log_path=log_path)
        self._azurite_bin = azurite_bin

    def _command(self, port: int, data_dir: Path) -> list[str]:
        program = _find_azurite(self._azurite_bin)
        (data_dir / "data").mkdir()
        return [
            program,
            "--blobHost",
            HOST,
            "--blobPort",
            str(port),
            "--location",
            str(data_dir / "data"),
            "--skipApiVersionCheck",
            "--silent",
        ]

    def _ready(self) -> bool:
        try:
            with self._request("GET", f"/{AZURITE_ACCOUNT}?comp=list"):
                return True
        except urllib.error.HTTPError as exc:
            exc.close()
            return True  # an unsigned request refused: the blob service is up
        except (OSError, ValueError):
            return False

    @property
    def blob_endpoint(self) -> str:
        """``http://127.0.0.1:<port>/devstoreaccount1``."""
        return f"{self.endpoint}/{AZURITE_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        """A connection string for the development account (its key is public)."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={self.blob_endpoint};"
        )

    def env(self) -> dict[str, str]:
        """``AZURE_STORAGE_CONNECTION_STRING`` for this server (what adlfs and the Azure SDK read)."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def create_container(self, name: str) -> None:
        """Creates container ``name``.

        Raises:
            EmulatorError: not running, or Azurite refused (e.g. the container exists).
        """
        from azure.core.exceptions import AzureError
        from azure.storage.blob import BlobServiceClient

        try:
            with BlobServiceClient.from_connection_string(self.connection_string) as client:
                client.create_container(name)
        except AzureError as exc:
            code = getattr(exc, "error_code", None) or type(exc).__name__
            code = getattr(code, "value", code)  # a StorageErrorCode enum member
            raise EmulatorError(f"Azurite refused to create container {name!r} ({code})") from exc
