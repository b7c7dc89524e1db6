"""What only GcsStore and AzureStore do, beside the conformance suite every store runs
(tests/test_stores.py): their protocol attributes, a forked worker reading with a client of its
own after the parent made one, a missing bucket or container named as such, and the translation
of GCS's 401/403 (gcp-storage-emulator checks no credentials, so gcsfs's own errors are used).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import sys
from pathlib import Path

import pytest

from shardstream.config import FetchConfig
from shardstream.errors import (
    BucketNotFoundError,
    ShardNotFoundError,
    StorageAccessError,
)
from shardstream.storage import loop
from shardstream.storage.azure import AzureStore
from shardstream.storage.base import RemoteStore
from shardstream.storage.gcs import GcsStore

PART = 5 << 20  # the smallest upload part FetchConfig allows
_numbers = itertools.count()


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
    server = request.getfixturevalue("gcs_emulator" if request.param == "gcs" else "azurite")
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


def test_gcs_refusals_are_access_errors():
    """The emulator checks no credentials: the translation of gcsfs's 401/403 errors instead."""
    from gcsfs.retry import HttpError

    from shardstream.storage.gcs import _translate

    for exc in (HttpError({"code": 401, "message": "Invalid Credentials"}), OSError("Forbidden: b/x\nno access")):
        error = _translate(exc, url="gs://b/x", endpoint="Google Cloud Storage")
        assert isinstance(error, StorageAccessError) and "GOOGLE_APPLICATION_CREDENTIALS" in str(error)


def test_shard_writer_and_pack_samples_publish_datasets_there(backend, tmp_path):
    """Written from code to gs:// / az://: the same shards as on local disk, read back."""
    sys.path.insert(0, str(Path(__file__).parent))
    import write_fns

    from shardstream import ShardDataset, ShardWriter, pack_samples

    bucket = backend.new_bucket()
    scheme = "gs" if backend.kind == "gcs" else "az"
    with ShardWriter(f"{scheme}://{bucket}/written", max_samples_per_shard=6) as writer:
        for i in range(20):
            writer.write(write_fns.one_sample(i))
    made = pack_samples(
        write_fns.samples_of, range(30), f"{scheme}://{bucket}/made", max_samples_per_shard=6, progress=False
    )
    local = pack_samples(write_fns.samples_of, range(30), tmp_path / "local", max_samples_per_shard=6, progress=False)
    assert made.dataset_totals == local.dataset_totals
    written = [s["__key__"] for s in ShardDataset(f"{scheme}://{bucket}/written", shuffle=False)]
    assert written == [f"{i:06d}" for i in range(20)]
    remote = [(s["__key__"], s["bin"]) for s in ShardDataset(f"{scheme}://{bucket}/made", shuffle=False)]
    assert remote == [(s["__key__"], s["bin"]) for s in ShardDataset(tmp_path / "local", shuffle=False)]
