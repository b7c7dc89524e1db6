"""A store for a new URL scheme, registered once with ``shardstream.register_store``, is what
every reader opens for that scheme: a dataset packed by ``pack`` reads through it end to end
(exact epochs, random access, the map-style dataset) as from local disk. The store here is a
real one: objects of a local directory served by ranged reads, through the same retry loop
and stream machinery as S3 (``RangedStore``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardstream import ShardDataset, ShardMapDataset, pack, register_store
from shardstream.config import RequestConfig
from shardstream.errors import ShardNotFoundError
from shardstream.storage import open_store, remote_schemes
from shardstream.storage.ranged import Answer, RangedStore

pytestmark = pytest.mark.timeout(120)

ROOTS: dict[str, Path] = {}  # host -> directory: dirobj://HOST/path reads ROOTS[HOST]/path


class DirObjectStore(RangedStore):
    """Read-only objects under ``dirobj://HOST/prefix``: files of a local directory, served
    in ranges with the file's mtime as its version."""

    label = "dirobj"
    version_name = "mtime"

    def __init__(self, url, *, s3=None, requests=None, fetch=None):
        host, _, prefix = url[len("dirobj://") :].partition("/")
        self.url, self.endpoint = url.rstrip("/"), f"dirobj://{host}"
        self.root = ROOTS[host] / prefix
        self.requests = requests or RequestConfig(max_attempts=1)
        self.reads = 0

    def _path(self, name):
        return self.root / name

    def error_table(self, exc, *, url, not_found=ShardNotFoundError):
        if isinstance(exc, FileNotFoundError):
            return not_found(f"{url}: no such object")
        return exc

    async def head(self, name):
        try:
            stat = os.stat(self._path(name))
        except FileNotFoundError:
            raise ShardNotFoundError(f"{self.url_of(name)}: no such object") from None
        return stat.st_size, str(stat.st_mtime_ns)

    async def open_range(self, name, at, end, version):
        path = self._path(name)
        with open(path, "rb") as f:  # raises FileNotFoundError: the error table's
            total = os.fstat(f.fileno()).st_size
            f.seek(at)
            data = f.read((total if end is None else end) - at)
        self.reads += 1

        async def pieces():
            yield data

        return Answer(total, str(os.stat(path).st_mtime_ns), pieces(), lambda: None)

    def list_names(self, prefix=""):
        return sorted(p.name for p in self.root.iterdir() if p.name.startswith(prefix))

    def check_writable(self):
        raise PermissionError(f"{self.url} is read-only")


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """30 samples in shards of 7, packed to local disk and served as dirobj://data/ds."""
    root = tmp_path_factory.mktemp("dirobj")
    src = root / "src"
    src.mkdir()
    for i in range(30):
        (src / f"{i:03d}.txt").write_text(f"sample {i}")
    pack(src, root / "ds", max_samples_per_shard=7, progress=False)
    ROOTS["data"] = root
    if "dirobj" not in remote_schemes():
        register_store("dirobj", DirObjectStore)
    return root / "ds"


def test_a_registered_scheme_opens_its_store(packed):
    store = open_store("dirobj://data/ds")
    assert isinstance(store, DirObjectStore) and store.read_bytes("index.bin") == (packed / "index.bin").read_bytes()


def test_a_dataset_reads_through_a_registered_store_as_from_disk(packed):
    remote = ShardDataset("dirobj://data/ds", seed=7)
    local = ShardDataset(packed, seed=7)
    got = [(s["__key__"], s["txt"]) for s in remote]
    assert got == [(s["__key__"], s["txt"]) for s in local] and len(got) == len(remote) == 30
    assert all(url.startswith("dirobj://data/ds/") for url in remote.shard_urls)
    assert remote[12]["txt"] == b"sample 12" and remote.get("029")["txt"] == b"sample 29"
    assert ShardMapDataset("dirobj://data/ds")[3]["txt"] == b"sample 3"


def test_a_scheme_is_registered_once_unless_replaced(packed):
    with pytest.raises(ValueError, match=r"dirobj:// already has a store.*replace=True"):
        register_store("dirobj", DirObjectStore)
    with pytest.raises(ValueError, match="s3:// already has a store"):
        register_store("s3", DirObjectStore)
    with pytest.raises(ValueError, match="not a URL scheme"):
        register_store("no scheme", DirObjectStore)
    register_store("dirobj", DirObjectStore, replace=True)
    assert isinstance(open_store("dirobj://data/ds"), DirObjectStore)


def test_an_unregistered_scheme_is_refused_with_the_way_to_add_it():
    with pytest.raises(ValueError, match=r"unsupported URL scheme 'nowhere'.*register_store"):
        ShardDataset("nowhere://x/y")
