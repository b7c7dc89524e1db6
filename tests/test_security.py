"""Security: credentials never leak, plain-http endpoints off this machine warn, image
decompression bombs are refused. (Links, devices and '..' in tars: tests/test_tarstream.py.)"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import subprocess
import sys
import warnings

import pytest
from PIL import Image

from shardstream import CpuDecoder, S3Config, ShardDataset, pack
from shardstream.errors import DecodeError, StorageAccessError
from shardstream.storage.s3 import warn_plain_http


def test_the_secret_appears_in_no_repr_error_log_index_or_output(tmp_path, s3_server, s3_bucket, s3_config, caplog):
    secret = s3_config.secret_access_key
    assert secret and secret not in repr(s3_config)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    url = f"s3://{s3_bucket}/sec"
    with caplog.at_level(logging.DEBUG):
        pack(src, url, s3=s3_config, progress=False)
        dataset = ShardDataset(url, s3=s3_config)
        assert [s["__key__"] for s in dataset] == ["a"]
        wrong = dataclasses.replace(s3_config, secret_access_key="W" + secret[1:])
        with pytest.raises(StorageAccessError) as refused:
            ShardDataset(url, s3=wrong)
    texts = [repr(dataset), str(refused.value), repr(refused.value), caplog.text]
    assert not [t for t in texts if secret in t or wrong.secret_access_key in t]
    env = {**os.environ, **s3_server.info.env()}
    run = subprocess.run(
        [sys.executable, "-m", "shardstream.cli", "pack", str(src), f"{url}2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    info = subprocess.run(
        [sys.executable, "-m", "shardstream.cli", "info", f"{url}2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and info.returncode == 0, run.stderr + info.stderr
    index = s3_server_read(s3_config, f"{url}2/index.bin")
    assert secret not in run.stdout + run.stderr + info.stdout + info.stderr and secret.encode() not in index


def s3_server_read(s3: S3Config, url: str) -> bytes:
    from shardstream.storage import open_store, split_url

    root, name = split_url(url)
    return open_store(root, s3=s3).read_bytes(name)


@pytest.mark.parametrize(
    ("endpoint", "warns"),
    [
        ("http://10.1.2.3:8333", True),
        ("https://s3.example.com", False),
        ("http://127.0.0.1:9000", False),
        ("http://localhost:9000", False),
    ],
)
def test_plain_http_off_this_machine_warns(endpoint, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_plain_http(endpoint)
    assert bool([w for w in caught if "unencrypted" in str(w.message)]) == warns


def test_decompression_bombs_are_refused_and_the_limit_is_configurable():
    buf = io.BytesIO()
    Image.new("RGB", (2000, 1000)).save(buf, "PNG")  # 2 Mpx, a few KB compressed
    sample = {"__key__": "bomb", "__shard__": "s.tar", "png": buf.getvalue()}
    with pytest.raises(
        DecodeError,
        match=r"s.tar: sample 'bomb', member 'png'.*2000x1000 pixels, more than "
        r"max_image_pixels=1000000 \(a decompression bomb\?\)",
    ):
        CpuDecoder("numpy", max_image_pixels=1_000_000)(sample)
    assert CpuDecoder("numpy")(sample)["png"].shape == (1000, 2000, 3)  # Pillow's default limit: 89 Mpx
    assert CpuDecoder("numpy").max_image_pixels == Image.MAX_IMAGE_PIXELS
