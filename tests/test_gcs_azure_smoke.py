"""GcsStore and AzureStore against real local servers: gcp-storage-emulator and Azurite.

What these servers cannot show is not tested here: a body cut mid-transfer (neither can be made
to cut one), paging of GCS listings (the emulator returns every listing in one page),
``ifGenerationMatch=0`` refusing an existing object and wrong GCS credentials (the emulator
checks neither preconditions nor credentials; the translation of 401/403 is checked on
gcsfs's own errors instead).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle

import pytest

from shardstream.config import FetchConfig
from shardstream.errors import (
    BucketNotFoundError,
    CorruptShardError,
    ShardNotFoundError,
    StorageAccessError,
)
from shardstream.storage import loop
from shardstream.storage.azure import AzureStore
from shardstream.storage.base import RemoteStore
from shardstream.storage.gcs import GcsStore
from shardstream.testing.emulators import AZURITE_KEY, Azurite, GcsEmulator

PART = 5 << 20  # the smallest upload part FetchConfig allows
_numbers = itertools.count()


@pytest.fixture(scope="module")
def gcs_server():
    with GcsEmulator() as server:
        yield server


@pytest.fixture(scope="module")
def azurite():
    with Azurite() as server:
        yield server


class Backend:
    """Makes stores of one kind against its server, each in a fresh bucket or container."""

    def __init__(self, kind: str, server, monkeypatch) -> None:
        self.kind, self.server = kind, server
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)

    def new_bucket(self) -> str:
        name = f"t{os.getpid()}-{next(_numbers)}"
        if self.kind == "gcs":
            self.server.create_bucket(name)
        else:
            self.server.create_container(name)
        return name

    def store(self, bucket: str | None = None, prefix: str = "ds"):
        bucket = bucket or self.new_bucket()
        fetch = FetchConfig(upload_part_bytes=PART, max_inflight_upload_parts=2)
        if self.kind == "gcs":
            return GcsStore(f"gs://{bucket}/{prefix}", fetch=fetch)
        return AzureStore(f"az://{bucket}/{prefix}", fetch=fetch)


@pytest.fixture(params=["gcs", "azure"])
def backend(request, monkeypatch) -> Backend:
    server = request.getfixturevalue("gcs_server" if request.param == "gcs" else "azurite")
    return Backend(request.param, server, monkeypatch)


def get_range(store, name, start, end, **kwargs):
    return loop.run(store.get_range(name, start, end, **kwargs))


def test_protocol_and_pickle(backend):
    store = backend.store()
    assert isinstance(store, RemoteStore)
    assert store.label == ("GCS" if backend.kind == "gcs" else "Azure")
    assert store.endpoint.startswith(backend.server.endpoint)
    assert store.request_limit_s > 0 and store.pool_state()
    store.write_bytes("a", b"x")  # the process now holds a client
    blob = pickle.dumps(store)
    assert len(blob) < 1000
    copy = pickle.loads(blob)
    assert copy.url == store.url and copy.read_bytes("a") == b"x"


def _read_in_fork(store, name):
    return store.read_bytes(name)


def test_forked_worker_reads_with_its_own_client(backend):
    store = backend.store()
    store.write_bytes("w", b"worker")
    assert store.read_bytes("w") == b"worker"  # the parent's client exists before the fork
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_read_in_fork, (store, "w")) == b"worker"
    assert store.read_bytes("w") == b"worker"  # and still works in the parent


def test_writer_parts_abort_and_atomic_commit(backend):
    store = backend.store()
    data = os.urandom(2 * PART + 12345)  # three parts
    store.write_bytes("shard.tar", b"old")
    sink = store.open_writer("shard.tar")
    for at in range(0, len(data), 1 << 20):
        sink.write(memoryview(data)[at : at + (1 << 20)])
    assert store.read_bytes("shard.tar") == b"old"  # nothing new is visible before commit
    assert store.list_names() == ["shard.tar"]
    sink.commit()
    sink.abort()  # a no-op after commit
    assert loop.run(store.head("shard.tar"))[0] == len(data)
    assert store.read_bytes("shard.tar") == data

    sink = store.open_writer("dropped.tar")
    sink.write(data)  # parts went up
    assert not store.exists("dropped.tar")
    sink.abort()
    sink.abort()
    assert not store.exists("dropped.tar")
    assert store.list_names() == ["shard.tar"]
    assert [name for name, _, _ in store.list_dir("")] == ["shard.tar"]
    assert store.remove_partials(lambda name: True) == 0

    sink = store.open_writer("empty.tar")
    sink.commit()
    assert store.read_bytes("empty.tar") == b""


def test_small_objects(backend):
    store = backend.store()
    assert not store.exists("index.bin")
    store.write_bytes("index.bin", b"\x00" * 100)
    assert store.exists("index.bin") and store.read_bytes("index.bin") == b"\x00" * 100
    assert store.create_exclusive("lock", b"me") is True
    if backend.kind == "azure":  # the GCS emulator ignores ifGenerationMatch (module doc)
        assert store.create_exclusive("lock", b"other") is False
        assert store.read_bytes("lock") == b"me"
    store.delete("index.bin")
    store.delete("index.bin")  # a missing object is no error
    assert not store.exists("index.bin")
    store.check_writable()


def test_list_names_past_a_page_and_list_dir(backend):
    store = backend.store()
    store.list_page_size = 3
    names = [f"data-{i:06d}.tar" for i in range(8)] + ["sub/c", "sub/deeper/d", "zz"]
    for name in reversed(names):
        store.write_bytes(name, name.encode())
    pages = []
    list_page = store._list_page

    async def counting(*args, **kwargs):
        pages.append(1)
        return await list_page(*args, **kwargs)

    store._list_page = counting
    assert store.list_names() == sorted(names)
    if backend.kind == "azure":  # the GCS emulator answers every listing in one page
        assert len(pages) >= 4
    assert store.list_names("data-00000") == names[:8]
    assert store.list_names("sub/") == ["sub/c", "sub/deeper/d"]
    top = list(store.list_dir(""))
    assert sorted(top) == sorted([(n, len(n), False) for n in names[:8] + ["zz"]] + [("sub/", 0, True)])
    assert sorted(store.list_dir("sub/")) == [("sub/c", 5, False), ("sub/deeper/", 0, True)]
    assert list(store.list_dir("nothing/")) == []


def test_head_and_get_range_edges(backend):
    store = backend.store()
    data = bytes(range(256)) * 4
    store.write_bytes("obj", data)
    size, version = loop.run(store.head("obj"))
    assert size == 1024 and version
    for start, end, want in [(0, 1024, data), (0, None, data), (1023, 1024, data[-1:]), (1000, 5000, data[1000:])]:
        pieces, total, got_version = get_range(store, "obj", start, end)
        assert b"".join(pieces) == want and total == 1024 and got_version == version
    for start, end in [(17, 17), (1024, None), (1024, 2000)]:  # from the end: empty, not an error
        assert get_range(store, "obj", start, end) == ([], 1024, version)
    for start, end in [(1025, None), (5000, 6000), (2000, 2000)]:
        with pytest.raises(CorruptShardError, match=f"{store.url_of('obj')}: ends before byte {start}"):
            get_range(store, "obj", start, end)

    store.write_bytes("empty", b"")
    size, version = loop.run(store.head("empty"))
    assert size == 0
    assert get_range(store, "empty", 0, None) == ([], 0, version)
    assert get_range(store, "empty", 0, 10) == ([], 0, version)
    with pytest.raises(CorruptShardError, match="ends before byte 1"):
        get_range(store, "empty", 1, 10)


def test_version_change_between_reads(backend):
    store = backend.store()
    store.write_bytes("shard", b"a" * 100)
    _, _, first = get_range(store, "shard", 0, 10)
    store.write_bytes("shard", b"b" * 100)
    pieces, _, second = get_range(store, "shard", 10, 20)
    assert second != first  # what the fetcher compares across the parts of a shard
    assert loop.run(store.head("shard"))[1] == second
    with pytest.raises(CorruptShardError, match=f"{store.url_of('shard')}: changed while it was being read"):
        get_range(store, "shard", 20, 30, version=first)
    assert b"".join(get_range(store, "shard", 20, 30, version=second)[0]) == b"b" * 10


def test_not_found(backend):
    store = backend.store()
    for call in (
        lambda: loop.run(store.head("nope")),
        lambda: store.read_bytes("nope"),
        lambda: get_range(store, "nope", 0, 10),
    ):
        with pytest.raises(ShardNotFoundError, match=store.url_of("nope")):
            call()
    assert not store.exists("nope")

    missing = backend.store(bucket="no-such-bucket")
    for call in (
        missing.check_writable,
        missing.list_names,
        lambda: list(missing.list_dir("")),
        lambda: loop.run(missing.head("x")),
        lambda: missing.read_bytes("x"),
        lambda: missing.exists("x"),
        lambda: missing.write_bytes("x", b"1"),
    ):
        with pytest.raises(BucketNotFoundError, match="no-such-bucket"):
            call()


def test_azure_wrong_key_is_an_access_error(azurite, monkeypatch):
    good = AzureStore(f"az://{_container(azurite, monkeypatch)}/ds")
    good.write_bytes("a", b"1")
    wrong_key = "A" * 86 + "=="
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string.replace(AZURITE_KEY, wrong_key))
    store = AzureStore(good.url)
    for call in (store.check_writable, lambda: store.read_bytes("a"), store.list_names):
        with pytest.raises(StorageAccessError, match="AZURE_STORAGE_CONNECTION_STRING") as caught:
            call()
        assert wrong_key not in str(caught.value) and AZURITE_KEY not in str(caught.value)
    assert wrong_key not in repr(store) and wrong_key not in str(pickle.dumps(store))


def _container(azurite, monkeypatch) -> str:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    name = f"t{os.getpid()}-{next(_numbers)}"
    azurite.create_container(name)
    return name


def test_gcs_refusals_are_access_errors():
    """The emulator checks no credentials: the translation of gcsfs's 401/403 errors instead."""
    from gcsfs.retry import HttpError

    from shardstream.storage.gcs import _translate

    for exc in (HttpError({"code": 401, "message": "Invalid Credentials"}), OSError("Forbidden: b/x\nno access")):
        error = _translate(exc, url="gs://b/x", endpoint="Google Cloud Storage")
        assert isinstance(error, StorageAccessError) and "GOOGLE_APPLICATION_CREDENTIALS" in str(error)
