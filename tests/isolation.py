"""Tests isolated from this machine, both ways (issue 38, points 2 and 3).

**Immune to the user's environment.** ``tests/conftest.py`` calls :func:`start` from
``pytest_configure`` (before any fixture, so before a session server starts and inherits the
environment) and :func:`stop` from ``pytest_unconfigure``. :func:`start` removes from
``os.environ`` every variable :func:`is_scrubbed` names and points ``HOME`` and
``XDG_CONFIG_HOME`` / ``XDG_CACHE_HOME`` / ``XDG_DATA_HOME`` / ``XDG_STATE_HOME`` at a fresh
directory of the session (a library's per-user state: ``~/.cache/huggingface/token``,
``~/.aws/config``, ``~/.ray``, ``~/.netrc``, fsspec's and accelerate's configuration); then
:func:`test_home` gives each test a ``HOME`` of its own (its processes inherit it, and so does a
session server a test starts from its body). A test sets what it needs (``monkeypatch.setenv``
or ``env=`` for its processes).

What is removed, and why (from what shardstream and the libraries it runs read, grepped in
``shardstream/`` and the venv's site-packages):

- the launcher's rank and rendezvous, which shardstream (``assign.py``, ``parts.py``,
  ``dali.py``), torch.distributed, torchrun (``PET_*`` are its options' defaults), Lightning,
  accelerate, webdataset and torchdata read: ``RANK``, ``WORLD_SIZE``, ``LOCAL_*``,
  ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``NODE_RANK``, ``ROLE_*``, ``MASTER_ADDR``,
  ``MASTER_PORT``, ``TORCHELASTIC_*``, ``PET_*``, ``SLURM_*`` (``parts.py``, Lightning), LSF's
  ``LSB_*`` / ``JSM_NAMESPACE_*`` (Lightning), MPI's ``OMPI_*``, ``PMI_*``, ``PMIX_*``,
  ``MV2_*``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS`` (accelerate), Lightning's ``PL_*`` /
  ``LT_*`` (Trainer defaults) and ``ACCELERATE_*`` / ``FSDP_*``;
- proxies, every ``*_proxy`` in either case (``http_proxy``, ``HTTPS_PROXY``, ``all_proxy``,
  ``no_proxy`` ...: aiohttp with ``trust_env``, urllib, requests), and the TLS trust and key
  log: ``SSL_CERT_FILE``, ``SSL_CERT_DIR`` (``storage/http.py``), ``REQUESTS_CA_BUNDLE``,
  ``CURL_CA_BUNDLE``, ``SSLKEYLOGFILE``, ``NETRC`` (aiohttp, requests, botocore, urllib3);
- the stores' endpoints and credentials: ``AWS_*``, ``BOTO_*``, ``BOTOCORE_*``
  (``config.py``, botocore); ``HF_*``, ``HUGGING_FACE_HUB_TOKEN``, ``HUGGINGFACE_*``,
  ``TRANSFORMERS_*`` (``storage/hf.py``, huggingface_hub, transformers, datasets);
  ``GOOGLE_*``, ``GCLOUD_*``, ``CLOUDSDK_*``, ``GCE_*``, ``GCSFS_*``, ``NO_GCE_CHECK``,
  ``STORAGE_EMULATOR_HOST`` (``storage/gcs.py``, gcsfs, google-auth); ``AZURE_*`` and the
  managed identity's ``MSI_*``, ``IDENTITY_*``, ``IMDS_ENDPOINT`` (``storage/azure.py``, adlfs,
  azure-identity); ``FSSPEC_*`` (fsspec turns ``FSSPEC_<PROTOCOL>_<ARG>`` into arguments of
  gcsfs and adlfs); ``WDS_*`` / ``GOPEN_*`` (webdataset's cache and shard opener);
- Ray's ``RAY_*`` (``RAY_ADDRESS`` in ``packing/ray_run.py``, the auth token variables);
- experiment trackers a trainer reports to when installed: ``WANDB_*``, ``MLFLOW_*``,
  ``COMET_*``, ``NEPTUNE_*``, ``CLEARML_*``;
- any other credential by its name's end: ``*_TOKEN``, ``*_SECRET``, ``*_SECRET_KEY``,
  ``*_PASSWORD``, ``*_API_KEY``, ``*_CREDENTIALS`` (nothing here reads one; none is sent);
- shardstream's own ``SHARDSTREAM_*`` (today only ``SHARDSTREAM_TEST_FLAG``, which tests set
  themselves), except the switches of a test run, kept: ``SHARDSTREAM_NO_DALI`` (the DALI test
  modules skip on it) and ``tools/bootstrap.sh``'s ``SHARDSTREAM_VENV``,
  ``SHARDSTREAM_EXTRAS``, ``SHARDSTREAM_TORCH_SPEC``.

Kept: ``PATH``, ``TMPDIR``, ``LANG`` / ``LC_*``, ``USER``, ``CUDA_*``, ``NVIDIA_*``,
``TORCH_*``, ``OMP_NUM_THREADS``, ``PYTHON*``, ``XDG_RUNTIME_DIR``, ``AZURITE_BIN`` (where the
test servers' programs are) and every variable not named above; ``PYTHONUSERBASE``, when unset,
is set to the user's, so packages installed with ``pip install --user`` stay importable.

**Harmless to others.** A SIGKILLed pack cannot unlink the multiprocessing semaphores its
spawned workers share (``/dev/shm/sem.mp-*``; with the fork start method they are unlinked as
soon as made). :class:`KilledSemaphores` removes exactly those of the processes a test kills:
called just before the kill, it stops them (SIGSTOP, so none makes another one meanwhile) and
records the semaphores mapped in their ``/proc/<pid>/maps`` (``sem_open`` maps the file; the
mapping names it by inode) by name and inode; the fixture unlinks those after the test, if the
name still holds the same file. Semaphores another process makes meanwhile are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import site
import tempfile
import time
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path

__all__ = [
    "HOME_VARIABLES",
    "KilledSemaphores",
    "is_scrubbed",
    "scrubbed",
    "start",
    "stop",
    "test_home",
]

SCRUBBED_NAMES = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "SSLKEYLOGFILE",
        "NETRC",
        "HUGGING_FACE_HUB_TOKEN",
        "NO_GCE_CHECK",
        "STORAGE_EMULATOR_HOST",
        "IMDS_ENDPOINT",
    }
)
SCRUBBED_PREFIXES = (
    # the launcher: torchrun / torch.distributed, SLURM, LSF, MPI, Lightning, accelerate
    "LOCAL_",
    "ROLE_",
    "TORCHELASTIC_",
    "PET_",
    "SLURM_",
    "LSB_",
    "JSM_NAMESPACE_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MV2_",
    "PL_",
    "LT_",
    "ACCELERATE_",
    "FSDP_",
    # stores, their libraries and credentials
    "AWS_",
    "BOTO_",
    "BOTOCORE_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "GOOGLE_",
    "GCLOUD_",
    "CLOUDSDK_",
    "GCE_",
    "GCSFS_",
    "AZURE_",
    "MSI_",
    "IDENTITY_",
    "FSSPEC_",
    "WDS_",
    "GOPEN_",
    "RAY_",
    "WANDB_",
    "MLFLOW_",
    "COMET_",
    "NEPTUNE_",
    "CLEARML_",
    "SHARDSTREAM_",
)
SCRUBBED_SUFFIXES = ("_TOKEN", "_SECRET", "_SECRET_KEY", "_PASSWORD", "_API_KEY", "_CREDENTIALS")
KEPT = frozenset({"SHARDSTREAM_NO_DALI", "SHARDSTREAM_VENV", "SHARDSTREAM_EXTRAS", "SHARDSTREAM_TORCH_SPEC"})
HOME_VARIABLES = {  # set to a directory of the session, then of each test: name -> path under it
    "HOME": "",
    "XDG_CONFIG_HOME": ".config",
    "XDG_CACHE_HOME": ".cache",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
}


def is_scrubbed(name: str) -> bool:
    """Whether the tests run without the variable ``name`` (module doc)."""
    if name in KEPT:
        return False
    return (
        name in SCRUBBED_NAMES
        or name.lower().endswith("_proxy")
        or name.startswith(SCRUBBED_PREFIXES)
        or name.endswith(SCRUBBED_SUFFIXES)
    )


def scrubbed(environ: Mapping[str, str]) -> list[str]:
    """The names in ``environ`` that :func:`is_scrubbed` removes, sorted."""
    return sorted(name for name in environ if is_scrubbed(name))


def _home_environment(home: Path) -> dict[str, str]:
    return {name: str(home / sub) if sub else str(home) for name, sub in HOME_VARIABLES.items()}


class _Session:
    def __init__(self, environ: MutableMapping[str, str]) -> None:
        self.environ = environ
        self.root = Path(tempfile.mkdtemp(prefix="shardstream-tests-home-"))
        self.saved = {name: environ.get(name) for name in [*scrubbed(environ), *HOME_VARIABLES, "PYTHONUSERBASE"]}
        self.tests = 0


_session: _Session | None = None


def start(environ: MutableMapping[str, str] = os.environ) -> Path:
    """Remove the scrubbed variables from ``environ`` and give it a ``HOME`` of the session;
    returns that directory. :func:`stop` undoes it."""
    global _session
    if _session is not None:
        raise RuntimeError("isolation.start() twice without stop()")
    session = _session = _Session(environ)
    if "PYTHONUSERBASE" not in environ:  # packages installed with pip --user stay importable
        environ["PYTHONUSERBASE"] = site.getuserbase()
    for name in scrubbed(environ):
        del environ[name]
    home = session.root / "session"
    home.mkdir()
    environ.update(_home_environment(home))
    return home


def stop() -> None:
    """Restore the variables :func:`start` removed or changed; delete the homes."""
    global _session
    session, _session = _session, None
    if session is None:
        return
    for name, value in session.saved.items():
        if value is None:
            session.environ.pop(name, None)
        else:
            session.environ[name] = value
    shutil.rmtree(session.root, ignore_errors=True)


def test_home() -> dict[str, str]:
    """A fresh ``HOME`` (and XDG directories under it) for one test, as variables to set.
    The directories stay until the session ends: a session server first started by a test's
    body runs in that test's ``HOME``."""
    if _session is None:
        raise RuntimeError("isolation.start() was not called (tests/conftest.py's pytest_configure)")
    _session.tests += 1
    home = _session.root / "tests" / str(_session.tests)
    home.mkdir(parents=True)
    return _home_environment(home)


test_home.__test__ = False  # not a test, whatever its name


# ------------------------------------------------------------------ killed processes' semaphores

_SHM = Path("/dev/shm")
# a mapping of a file in /dev/shm named sem.*: "start-end perms offset major:minor inode path"
_SEMAPHORE_MAPPING = re.compile(r"^\S+ \S+ \S+ ([0-9a-f]+):([0-9a-f]+) (\d+) +/dev/shm/sem\.")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time) of ``pid``, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return fields[0], int(fields[2]), int(fields[19])


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pgid:
                members.append(int(entry.name))
    return members


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def mapped_semaphores(pids: Iterable[int]) -> dict[Path, tuple[int, int]]:
    """The multiprocessing semaphores (``/dev/shm/sem.mp-*``) the processes ``pids`` map, each
    with its file's (device, inode). A mapping names the file by inode: glibc's ``sem_open``
    maps a temporary file and then links it to the semaphore's name, so ``maps`` shows the
    temporary name, deleted, for the semaphores a process made itself."""
    mapped = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for match in filter(None, map(_SEMAPHORE_MAPPING.match, lines)):
            major, minor, inode = match.groups()
            mapped.add((os.makedev(int(major, 16), int(minor, 16)), int(inode)))
    found = {path: _file_id(path) for path in _SHM.glob("sem.mp-*")} if mapped else {}
    return {path: file_id for path, file_id in found.items() if file_id in mapped}


class KilledSemaphores:
    """The ``reap_killed_semaphores`` fixture: call :meth:`before_killpg` (or :meth:`before_kill`)
    just before SIGKILLing a process group (or a process) the test started; :meth:`reap`, at
    the fixture's teardown, unlinks the semaphores they had mapped."""

    def __init__(self) -> None:
        self.recorded: dict[Path, tuple[int, int]] = {}  # semaphore -> its file's (device, inode)
        self._stopped: list[tuple[int, int]] = []  # (pid, start time): resumed if the test did not kill

    def before_killpg(self, pgid: int) -> None:
        """Stop every process of the group ``pgid`` and record their semaphores."""
        if pgid == os.getpgid(0):
            raise ValueError("before_killpg: that is the test run's own process group")
        try:
            os.killpg(pgid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        self._record(_group_members(pgid))

    def before_kill(self, pid: int) -> None:
        """Stop the process ``pid`` and record its semaphores."""
        if pid == os.getpid():
            raise ValueError("before_kill: that is the test run itself")
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        self._record([pid])

    def _record(self, pids: Iterable[int]) -> None:
        pids = list(pids)
        deadline = time.monotonic() + 5
        for pid in pids:
            while (stat := _stat(pid)) is not None and stat[0] not in "TtZX" and time.monotonic() < deadline:
                time.sleep(0.001)  # the signal is on its way: until it has stopped
            if stat is not None:
                self._stopped.append((pid, stat[2]))
        self.recorded.update(mapped_semaphores(pids))

    def reap(self) -> None:
        """Unlink the recorded semaphores; resume any stopped process the test did not kill (a
        test that failed before its kill), and leave its semaphores to it."""
        resumed = []
        for pid, started in self._stopped:
            stat = _stat(pid)
            if stat is not None and stat[2] == started and stat[0] in "Tt":
                os.kill(pid, signal.SIGCONT)
                resumed.append(pid)
        in_use = mapped_semaphores(resumed) if resumed else {}
        for path, file_id in self.recorded.items():
            if path not in in_use and _file_id(path) == file_id:  # the same file still: no name reused
                path.unlink(missing_ok=True)
