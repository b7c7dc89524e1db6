"""Undecodable members read for training (issue 51): the DecodeError says what is wrong (an
empty member, not an image format Pillow knows, Pillow's reason) without Pillow's file-object
repr, names shard, key and member, and gives the ways out; the same for the DALI loader's
Pillow fallback."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest
from PIL import Image

from shardstream import ShardDataset, pack
from shardstream.decode import CpuDecoder
from shardstream.decode.reasons import why_undecodable
from shardstream.errors import DecodeError

WAYS_OUT = ("shardstream verify --decode DATASET", "on_error='skip'", "pack --check-images")


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16, 12), (200, 80, 160)).save(out, "JPEG")
    return out.getvalue()


def one_bad(tmp_path: Path, bad: bytes, ext: str = "jpg") -> Path:
    """A dataset of 3 samples (.jpg, .cls) in one shard; sample '001''s .``ext`` is ``bad``."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i:03d}.jpg").write_bytes(jpeg())
        (src / f"{i:03d}.cls").write_text(str(i))
    (src / f"001.{ext}").write_bytes(bad)
    pack(src, tmp_path / "ds", progress=False)
    return tmp_path / "ds"


def decode_error(ds: Path) -> str:
    with pytest.raises(DecodeError) as info:
        list(ShardDataset(ds, shuffle=False, decode=CpuDecoder("numpy")))
    return str(info.value)


def assert_plain(message: str) -> None:
    """No object repr or address (``<_io.BytesIO object at 0x7f...>``) in ``message``."""
    assert "BytesIO" not in message and not re.search(r"0x[0-9a-f]{6,}", message), message


def test_an_empty_image_says_it_is_empty_and_the_ways_out(tmp_path):
    message = decode_error(one_bad(tmp_path, b""))
    assert re.match(r".*data-000000\.tar: sample '001', member 'jpg': cannot decode: it is empty \(0 bytes\);", message)
    assert_plain(message)
    for way in WAYS_OUT:
        assert way in message, way


def test_an_unknown_format_says_so_with_its_first_bytes(tmp_path):
    message = decode_error(one_bad(tmp_path, b"<html>404 Not Found</html>"))
    assert "data-000000.tar: sample '001', member 'jpg': cannot decode: not a recognised image format" in message
    assert "26 bytes, starting b'<html>40'" in message  # an error page saved as .jpg shows itself
    assert_plain(message)
    for way in WAYS_OUT:
        assert way in message, way


def test_a_truncated_image_gives_pillows_reason(tmp_path):
    data = jpeg()
    message = decode_error(one_bad(tmp_path, data[: len(data) // 2]))
    assert re.search(r"member 'jpg': cannot decode: [^;]*truncated", message, re.IGNORECASE), message
    assert_plain(message)
    assert "shardstream verify --decode DATASET" in message


def test_a_bad_label_points_to_the_raw_bytes_not_to_image_checks(tmp_path):
    message = decode_error(one_bad(tmp_path, b"seven", ext="cls"))
    assert "member 'cls': cannot decode: invalid literal for int()" in message
    assert "on_error='skip'" in message and "decode=None" in message
    assert "verify --decode" not in message  # it checks images only


def test_skip_still_skips_them(tmp_path):
    dataset = ShardDataset(one_bad(tmp_path, b""), shuffle=False, decode=CpuDecoder("numpy"), on_error="skip")
    keys = [s["__key__"] for s in dataset]
    assert len(keys) == 3 and "001" not in keys and dataset.stats().skipped == 1


def test_why_undecodable_strips_the_file_object_from_any_message():
    exc = OSError("broken data stream when reading image file <_io.BytesIO object at 0x7f3a2c1b9e50>")
    assert why_undecodable(b"x", exc) == "broken data stream when reading image file"
    assert why_undecodable(b"", ValueError("whatever")) == "it is empty (0 bytes)"
    assert why_undecodable(b"x", ValueError()) == "ValueError"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("bad", "says"), [(b"", "it is empty (0 bytes)"), (b"\0" * 64, "not a recognised image format")]
)
def test_the_dali_loaders_pillow_fallback_says_the_same(tmp_path, bad, says):
    if os.environ.get("SHARDSTREAM_NO_DALI") == "1":
        pytest.skip("SHARDSTREAM_NO_DALI=1: DALI tests skipped on request")
    pytest.importorskip("nvidia.dali")
    from shardstream.dali import DaliLoader

    ds = one_bad(tmp_path, bad)
    loader = DaliLoader(ShardDataset(ds, shuffle=False), batch_size=3, crop_px=8, label_ext="cls", device_id=None)
    with pytest.raises(DecodeError) as info:
        list(loader)
    message = str(info.value)
    assert f"data-000000.tar: sample '001', member 'jpg': no decoder can read this image: {says}" in message
    assert_plain(message)
    for way in WAYS_OUT:
        assert way in message, way
