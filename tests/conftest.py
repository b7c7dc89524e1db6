"""Shared fixtures: real local servers for the session (SeaweedFS for S3, nginx for http(s), a
fake Hugging Face Hub, the GCS emulator, Azurite), buckets, tiny datasets; and the tests'
isolation from this machine (``tests/isolation.py``): no variable of the user's environment
(rank, proxies, cloud credentials ...) and a ``HOME`` of each test's own, and a kill test
removes only the semaphores of the processes it killed."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import sys
import sysconfig
from pathlib import Path

import isolation
import pytest

from shardstream import S3Config
from shardstream.testing import SeaweedS3Server

_bucket_numbers = itertools.count()

# The test lanes (tests/lanes.py): a test that starts a server is marked slow, and one not marked
# slow fails if it starts a server, torchrun or Ray (tools/test --fast runs the others).
from lanes import pytest_collection_modifyitems, pytest_runtest_protocol  # noqa: E402, F401


def pytest_configure(config):
    """Before any fixture (a session server inherits os.environ when it starts): the user's
    environment scrubbed and a HOME of the session (isolation.start; undone at the end)."""
    isolation.start()


def pytest_unconfigure(config):
    isolation.stop()


@pytest.fixture(autouse=True)
def _own_home():
    """Each test, and the processes it starts, gets a fresh HOME (and XDG directories under it):
    no per-user state (a Hub token, AWS or Ray configuration) shared between tests."""
    for name in isolation.scrubbed(os.environ):  # left by an import (ray sets RAY_CLIENT_MODE) or a test
        del os.environ[name]
    saved = {name: os.environ.get(name) for name in isolation.HOME_VARIABLES}
    os.environ.update(isolation.test_home())
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server (SeaweedFS) on 127.0.0.1 with SigV4 auth, stopped after the session."""
    with SeaweedS3Server() as server:
        yield server


@pytest.fixture
def s3_config(s3_server) -> S3Config:
    info = s3_server.info
    return S3Config(
        endpoint_url=info.endpoint_url,
        access_key_id=info.access_key_id,
        secret_access_key=info.secret_access_key,
        region_name=info.region_name,
    )


@pytest.fixture
def s3_bucket(s3_server) -> str:
    """A fresh, empty bucket for one test."""
    name = f"test-{os.getpid()}-{next(_bucket_numbers)}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture(scope="session")
def web_root(tmp_path_factory) -> Path:
    """The directory the session's nginx servers serve."""
    return tmp_path_factory.mktemp("web")


@pytest.fixture(scope="session")
def nginx_server(web_root):
    """nginx serving ``web_root`` over http on 127.0.0.1."""
    from servers.nginx import NginxServer

    with NginxServer(web_root) as server:
        yield server


@pytest.fixture(scope="session")
def nginx_tls_server(web_root):
    """nginx serving ``web_root`` over https with a self-signed certificate (``ca_file``)."""
    from servers.nginx import NginxServer

    with NginxServer(web_root, https=True) as server:
        yield server


@pytest.fixture(scope="session")
def fake_hub():
    """A fake Hugging Face Hub (resolve redirects to a second host, tree pages, revisions)."""
    from servers.hub import FakeHub

    with FakeHub() as hub:
        yield hub


@pytest.fixture(scope="session")
def gcs_emulator():
    """Google's storage JSON API (gcp-storage-emulator, in memory) on 127.0.0.1."""
    from servers.emulators import GcsEmulator

    with GcsEmulator() as server:
        yield server


@pytest.fixture(scope="session")
def azurite():
    """Azurite's blob service on 127.0.0.1 (the development account devstoreaccount1)."""
    from servers.emulators import Azurite

    with Azurite() as server:
        yield server


@pytest.fixture(scope="session")
def stdlib_tree(tmp_path_factory) -> Path:
    """A real directory tree: a few packages of the installed Python standard library, plus
    names that test the key rule (no dot, leading dot, several dots, non-ASCII, a name longer
    than 100 bytes, an empty file)."""
    root = tmp_path_factory.mktemp("stdlib")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for package in ("json", "email", "asyncio", "importlib", "logging", "xml"):
        shutil.copytree(stdlib / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    extra = root / "extra"
    (extra / ("deep-" * 12) / ("long-name-" * 10)).mkdir(parents=True)
    (extra / ("deep-" * 12) / ("long-name-" * 10) / "sample.seg.png").write_bytes(b"\x89PNG fake" * 100)
    (extra / "README").write_bytes(b"no extension\n")
    (extra / ".hidden").write_bytes(b"dotfile\n")
    (extra / ".config.json").write_bytes(b'{"a": 1}')
    (extra / "caf\u00e9.txt").write_text("non-ascii name\n", encoding="utf-8")
    (extra / "empty.bin").write_bytes(b"")
    (extra / "multi.tar.gz").write_bytes(bytes(range(256)) * 40)
    (extra / "multi.txt").write_bytes(b"same key as multi.tar.gz\n")
    return root


def packed_files(root: Path) -> dict[str, bytes]:
    """The files a plain ``pack`` of ``root`` packs: every regular file but hidden ones (a file
    name starting with a dot, such as ``.DS_Store``), which it leaves out and reports."""
    return {name: data for name, data in all_files(root).items() if not name.rsplit("/", 1)[-1].startswith(".")}


def all_files(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` by its relative POSIX path."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture
def reap_killed_semaphores():
    """SIGKILLed packs cannot unlink their multiprocessing semaphores (/dev/shm/sem.mp-*): a
    kill test calls ``reap_killed_semaphores.before_killpg(pgid)`` (or ``.before_kill(pid)``)
    just before its SIGKILL, which stops those processes and records the semaphores they map;
    exactly those are unlinked after the test (isolation.KilledSemaphores), so repeated runs
    leave nothing and another process's semaphores are never touched."""
    killed = isolation.KilledSemaphores()
    yield killed
    killed.reap()


@pytest.fixture(scope="session")
def ray_cluster():
    """A real Ray cluster on this machine: a head and a second raylet, 1 CPU each
    (:class:`servers.ray_cluster.LocalRayCluster`), stopped after the session.
    Drivers run as subprocesses with ``cluster.env()`` (``RAY_ADDRESS`` set)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # the test extra installs it: a missing Ray is a failed set-up
        pytest.fail("Ray is not installed: pip install -e '.[test]' (or 'shardstream[ray]')")
    from servers.ray_cluster import LocalRayCluster

    with LocalRayCluster(num_nodes=2, cpus_per_node=1) as cluster:
        yield cluster


@pytest.fixture
def log_to_stderr():
    """The "shardstream" logger writing to stderr (captured by capfd, DataLoader workers too)."""

    class ToStderr(logging.Handler):  # the sys.stderr of the moment: pytest swaps it between phases
        def emit(self, record):
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()

    handler = ToStderr()
    logger = logging.getLogger("shardstream")
    logger.addHandler(handler)
    yield
    logger.removeHandler(handler)
