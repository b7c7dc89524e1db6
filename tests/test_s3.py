"""The same round trip through a real S3 server (SeaweedFS on 127.0.0.1), and its errors."""

from __future__ import annotations

import dataclasses
import socket

import pytest
import torch
from conftest import all_files, packed_files

from shardstream import S3Config, ShardDataset, pack
from shardstream.errors import (
    BucketNotFoundError,
    ShardNotFoundError,
    StorageAccessError,
    StorageConnectionError,
    StorageError,
)
from shardstream.storage import loop as io_loop
from shardstream.storage import open_store


def sample_files(samples) -> dict[str, bytes]:
    got = {}
    for sample in samples:
        for ext, payload in sample.items():
            if not ext.startswith("__"):
                got[sample["__key__"] + (f".{ext}" if ext else "")] = payload
    return got


def test_pack_to_s3_and_read_back_byte_for_byte(stdlib_tree, s3_bucket, s3_config, tmp_path):
    url = f"s3://{s3_bucket}/stdlib"
    report = pack(stdlib_tree, url, max_shard_bytes=256 << 10, s3=s3_config, progress=False)
    assert report.index_url == f"{url}/index.bin" and report.num_shards > 4
    expected = packed_files(stdlib_tree)

    dataset = ShardDataset(url, s3=s3_config, shuffle=False)
    assert all(u.startswith(url + "/data-") for u in dataset.shard_urls)
    assert sample_files(dataset) == expected

    # through DataLoader workers (fresh event loops and clients after fork), shuffled
    loader = torch.utils.data.DataLoader(
        ShardDataset(url, s3=s3_config, shuffle_buffer=50), num_workers=2, batch_size=None
    )
    assert sample_files(loader) == expected

    # the S3 shards are byte-identical to a local pack of the same input
    pack(stdlib_tree, tmp_path, max_shard_bytes=256 << 10, progress=False)
    store = open_store(url, s3=s3_config)
    for path in tmp_path.iterdir():
        if path.is_file():
            assert store.read_bytes(path.name) == path.read_bytes(), path.name


def test_shards_are_uploaded_with_multipart_upload(stdlib_tree, s3_bucket, s3_config):
    url = f"s3://{s3_bucket}/mp"
    pack(stdlib_tree / "email", url, s3=s3_config, progress=False)
    store = open_store(url, s3=s3_config)
    head = io_loop.run(store.call("head_object", url=url, Bucket=s3_bucket, Key="mp/data-000000.tar"))
    assert head["ETag"].strip('"').endswith("-1"), head["ETag"]  # S3's mark of a multipart object


def test_large_shards_upload_in_several_parts(tmp_path, s3_bucket, s3_config):
    import os

    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"{i:02d}.bin").write_bytes(os.urandom(1 << 20))
    url = f"s3://{s3_bucket}/big"
    from shardstream import FetchConfig

    pack(src, url, s3=s3_config, fetch=FetchConfig(upload_part_bytes=5 << 20), progress=False)
    store = open_store(url, s3=s3_config)
    head = io_loop.run(store.call("head_object", url=url, Bucket=s3_bucket, Key="big/data-000000.tar"))
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]
    assert sample_files(ShardDataset(url, s3=s3_config, shuffle=False)) == all_files(src)


def test_missing_bucket_is_named(stdlib_tree, s3_config):
    with pytest.raises(
        BucketNotFoundError, match=rf"s3://no-such-bucket-x: no such bucket at {s3_config.endpoint_url}"
    ):
        pack(stdlib_tree / "json", "s3://no-such-bucket-x/p", s3=s3_config, progress=False)
    with pytest.raises(BucketNotFoundError, match="no-such-bucket-x"):
        ShardDataset("s3://no-such-bucket-x/p", s3=s3_config)


def test_wrong_credentials_name_endpoint_and_bucket_but_not_the_secret(stdlib_tree, s3_bucket, s3_config):
    wrong = dataclasses.replace(s3_config, secret_access_key="wrong-secret-value-123")
    with pytest.raises(StorageAccessError) as info:
        pack(stdlib_tree / "json", f"s3://{s3_bucket}/p", s3=wrong, progress=False)
    message = str(info.value)
    assert s3_bucket in message and s3_config.endpoint_url in message and "credentials" in message
    assert "wrong-secret-value-123" not in message and s3_config.secret_access_key not in message
    assert "wrong-secret-value-123" not in repr(wrong)


def test_missing_shard_and_missing_index_on_s3(stdlib_tree, s3_bucket, s3_config):
    with pytest.raises(ShardNotFoundError, match=rf"s3://{s3_bucket}/none/index.bin: no index here"):
        ShardDataset(f"s3://{s3_bucket}/none", s3=s3_config)
    missing = f"s3://{s3_bucket}/none/data-000000.tar"
    with pytest.raises(ShardNotFoundError, match=rf"{missing}: no such object at {s3_config.endpoint_url}"):
        list(ShardDataset([missing], s3=s3_config))


def test_unreachable_endpoint_is_named(stdlib_tree):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = S3Config(endpoint_url=f"http://127.0.0.1:{port}", access_key_id="k", secret_access_key="s", max_attempts=1)
    with pytest.raises(StorageConnectionError, match=rf"cannot reach S3 endpoint http://127.0.0.1:{port}"):
        pack(stdlib_tree / "json", "s3://bucket/p", s3=cfg, progress=False)


def test_environment_variables_alone_configure_s3(stdlib_tree, s3_server, s3_bucket, monkeypatch):
    for key, value in s3_server.info.env().items():
        monkeypatch.setenv(key, value)
    url = f"s3://{s3_bucket}/env"
    pack(stdlib_tree / "json", url, progress=False)
    assert sample_files(ShardDataset(url)) == all_files(stdlib_tree / "json")


def test_dataloader_workers_do_not_stall_the_parents_s3_client(stdlib_tree, s3_bucket, s3_config):
    """Forked workers inherit the parent's epoll instance; if they closed the parent's loop or
    connections, the parent's next read would wait for its read timeout."""
    url = f"s3://{s3_bucket}/fork"
    pack(stdlib_tree / "json", url, s3=s3_config, progress=False)
    store = open_store(url, s3=s3_config)
    store.read_bytes("index.bin")  # the parent's client now holds pooled connections
    for _ in range(2):
        loader = torch.utils.data.DataLoader(ShardDataset(url, s3=s3_config), num_workers=2, batch_size=None)
        assert len(list(loader)) > 0
        for _ in range(4):
            read = store.call("get_object", url=url, Bucket=s3_bucket, Key="fork/data-000000.tar")
            io_loop.run(read, timeout_s=5.0)  # TimeoutError if the parent's loop was broken


def test_a_connection_cut_mid_transfer_is_named(tmp_path):
    """A server that promises 100,000 bytes and hangs up after 5,000: the reader reports the
    shard URL and the endpoint instead of a raw aiohttp error."""
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def serve() -> None:
        for _ in range(12):  # bounded: the client's attempts
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                request = conn.recv(65536)
                head = b'HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nETag: "x"\r\nConnection: close\r\n\r\n'
                conn.sendall(head if request.startswith(b"HEAD") else head + bytes(5000))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    cfg = S3Config(endpoint_url=f"http://127.0.0.1:{port}", access_key_id="k", secret_access_key="s", max_attempts=1)
    try:
        with pytest.raises(
            StorageConnectionError, match=rf"s3://b/x.tar: the connection to http://127.0.0.1:{port} failed"
        ):
            list(ShardDataset(["s3://b/x.tar"], s3=cfg))
        with pytest.raises(StorageConnectionError, match=r"s3://b/p/index.bin: the connection"):
            ShardDataset("s3://b/p", s3=cfg)
    finally:
        server.close()


def test_unknown_profile_and_bad_endpoint_are_named(stdlib_tree):
    with pytest.raises(
        StorageAccessError, match=r"s3://b/p: The config profile \(no-such-profile\) could not be found"
    ):
        pack(stdlib_tree / "json", "s3://b/p", s3=S3Config(profile="no-such-profile"), progress=False)
    with pytest.raises(StorageError, match=r"bad S3 endpoint '127.0.0.1:9'"):
        pack(stdlib_tree / "json", "s3://b/p", s3=S3Config(endpoint_url="127.0.0.1:9"), progress=False)


def test_idle_iterators_hold_no_connection_and_memory_stays_bounded(tmp_path, s3_bucket, s3_config):
    """Ranged GETs read whole parts and give their connection back, and a paused iterator
    stops fetching at max_buffer_bytes: four open iterators over a pool of two connections
    all read to the end, interleaved, with at most max_buffer_bytes in flight each."""
    import os

    from shardstream import FetchConfig

    src = tmp_path / "src"
    src.mkdir()
    payloads = {f"{i}": os.urandom(6 << 20) for i in range(4)}
    for key, data in payloads.items():
        (src / f"{key}.bin").write_bytes(data)
    url = f"s3://{s3_bucket}/idle"
    pack(src, url, max_samples_per_shard=1, s3=s3_config, progress=False)
    tight = dataclasses.replace(
        s3_config, max_pool_connections=2, max_attempts=1, connect_timeout_s=1.0, read_timeout_s=5.0
    )
    fetch = FetchConfig(part_bytes=1 << 20, max_buffer_bytes=2 << 20, max_inflight_shards=2)
    datasets = [ShardDataset(url, s3=tight, fetch=fetch, shuffle=False) for _ in range(4)]
    iterators = [iter(d) for d in datasets]
    seen: list[list[str]] = [[] for _ in iterators]
    for _ in range(len(payloads)):
        for i, iterator in enumerate(iterators):
            sample = next(iterator)
            assert sample["bin"] == payloads[sample["__key__"]]
            seen[i].append(sample["__key__"])
            assert datasets[i].stats().bytes_in_flight <= 2 << 20
    assert all(sorted(keys) == sorted(payloads) for keys in seen)
    for iterator in iterators:
        assert next(iterator, None) is None
