"""``verify(decode=True)`` and ``shardstream verify --decode``: every image member is decoded
with Pillow, and each one that does not decode is named by shard, sample key and member."""

from __future__ import annotations

import io
import re
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardstream import pack
from shardstream.packing.verify import ShardCheck, verify

SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))
TRUNCATED = re.compile(r"image file is truncated \(\d+ bytes not processed\)")
PNG_DAMAGED = "broken data stream when reading image file"


def photo(seed: int, side_px: int = 48) -> Image.Image:
    """A smooth gradient with noise: compresses like a photo, unlike pure noise."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, side_px, dtype=np.float32)
    pixels = (
        ramp[None, :, None] + ramp[:, None, None] * rng.uniform(0.2, 0.8, 3) + rng.normal(0, 12, (side_px,) * 2 + (3,))
    )
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def damaged_png(seed: int) -> bytes:
    """A PNG whose IDAT data does not inflate: the zlib header's check byte is flipped, the
    chunk's CRC fixed, so only the image data is wrong."""
    data = bytearray(encoded(photo(seed), "PNG"))
    at = data.index(b"IDAT")
    (length,) = struct.unpack(">I", data[at - 4 : at])
    data[at + 5] ^= 0xFF
    data[at + 4 + length : at + 8 + length] = struct.pack(">I", zlib.crc32(bytes(data[at : at + 4 + length])))
    return bytes(data)


def good_tree(root: Path) -> Path:
    """Every image kind that must pass: RGB, CMYK and progressive JPEG (upper-case extension
    too), PNG, grayscale PNG, WebP; beside non-image members (cls, txt, json)."""
    (root / "cat").mkdir(parents=True)
    (root / "dog").mkdir()
    (root / "cat" / "rgb.jpg").write_bytes(encoded(photo(1), "JPEG", quality=85))
    (root / "cat" / "rgb.cls").write_text("0")
    (root / "cat" / "cmyk.jpg").write_bytes(encoded(photo(2).convert("CMYK"), "JPEG"))
    (root / "cat" / "cmyk.cls").write_text("0")
    (root / "dog" / "progressive.JPEG").write_bytes(encoded(photo(3), "JPEG", progressive=True))
    (root / "dog" / "progressive.cls").write_text("1")
    (root / "dog" / "plain.png").write_bytes(encoded(photo(4), "PNG"))
    (root / "dog" / "plain.txt").write_text("a dog")
    (root / "dog" / "gray.png").write_bytes(encoded(photo(5).convert("L"), "PNG"))
    (root / "dog" / "gray.json").write_text("{}")
    (root / "dog" / "lossy.webp").write_bytes(encoded(photo(6), "WEBP"))
    return root


def bad_tree(root: Path) -> Path:
    """The good tree plus a JPEG cut in half (with a cls beside it) and a PNG with damaged IDAT data."""
    good_tree(root)
    whole = encoded(photo(7), "JPEG", quality=90)
    (root / "cat" / "half.jpg").write_bytes(whole[: len(whole) // 2])
    (root / "cat" / "half.cls").write_text("0")
    (root / "dog" / "broken.png").write_bytes(damaged_png(8))
    return root


def packed(src: Path, dest: Path, **options: object) -> str:
    pack(src, dest, progress=False, **options)
    return str(dest)


def problems_by_shard(checks: list[ShardCheck]) -> dict[str, tuple[str, ...]]:
    return {Path(check.url).name: check.problems for check in checks if check.problems}


def test_the_images_users_have_pass_and_are_counted(tmp_path):
    dest = packed(good_tree(tmp_path / "src"), tmp_path / "out", max_samples_per_shard=2)
    checks = list(verify(dest, decode=True, decode_threads=2))
    assert [Path(check.url).name for check in checks] == ["data-000000.tar", "data-000001.tar", "data-000002.tar"]
    assert all(check.ok for check in checks), [check.problems for check in checks]
    assert sum(check.num_images for check in checks) == 6
    assert sum(check.num_undecodable for check in checks) == 0


def test_a_truncated_jpeg_and_a_damaged_png_are_named_by_shard_key_and_member(tmp_path):
    dest = packed(bad_tree(tmp_path / "src"), tmp_path / "out", max_samples_per_shard=4)
    checks = list(verify(dest, decode=True))
    # Samples in path order: cat/cmyk cat/half cat/rgb dog/broken | dog/gray dog/lossy dog/plain dog/progressive
    assert [(Path(c.url).name, c.num_images, c.num_undecodable) for c in checks] == [
        ("data-000000.tar", 4, 2),
        ("data-000001.tar", 4, 0),
    ]
    first, second = checks
    assert second.ok
    assert len(first.problems) == 2
    half, broken = first.problems
    prefix = "sample 'cat/half' member 'cat/half.jpg' does not decode: "
    assert half.startswith(prefix) and TRUNCATED.fullmatch(half[len(prefix) :]), half
    assert broken == f"sample 'dog/broken' member 'dog/broken.png' does not decode: {PNG_DAMAGED}"


def test_without_decode_the_damaged_images_still_pass_as_before(tmp_path):
    dest = packed(bad_tree(tmp_path / "src"), tmp_path / "out")
    checks = list(verify(dest))
    assert [(c.ok, c.num_images, c.num_undecodable) for c in checks] == [(True, 0, 0)]


def test_a_dataset_without_images_checks_nothing_and_says_so(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.txt").write_text(f"text {i}")
        (src / f"{i}.cls").write_text(str(i))
    checks = list(verify(packed(src, tmp_path / "out"), decode=True))
    assert [(c.ok, c.num_images, c.num_undecodable) for c in checks] == [(True, 0, 0)]


def test_every_image_member_of_a_sample_is_checked_and_progress_is_reported_per_image(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(encoded(photo(1), "JPEG"))
    (src / "a.png").write_bytes(damaged_png(2))  # the sample's second image
    (src / "b.left.png").write_bytes(encoded(photo(3), "PNG"))
    (src / "b.right.jpg").write_bytes(b"")  # empty
    done: list[int] = []
    (check,) = verify(packed(src, tmp_path / "out"), decode=True, decode_threads=1, on_images=done.append)
    assert check.problems == (
        f"sample 'a' member 'a.png' does not decode: {PNG_DAMAGED}",
        "sample 'b' member 'b.right.jpg' does not decode: empty file",
    )
    assert (check.num_images, check.num_undecodable, sum(done)) == (4, 2, 4)


def test_shards_of_many_images_are_checked_in_member_order_with_a_small_window(tmp_path):
    """More images than the window of decodes in flight (2 per thread): every problem comes,
    in member order, and the images counted are all of them."""
    src = tmp_path / "src"
    src.mkdir()
    good, half = encoded(photo(1, 32), "JPEG"), encoded(photo(2, 32), "JPEG")[:200]
    broken = {7, 8, 23, 40}
    for i in range(48):
        (src / f"{i:03d}.jpg").write_bytes(half if i in broken else good)
    (check,) = verify(packed(src, tmp_path / "out"), decode=True, decode_threads=2)
    assert [problem.split(" member ")[0] for problem in check.problems] == [f"sample '{i:03d}'" for i in sorted(broken)]
    assert (check.num_images, check.num_undecodable) == (48, 4)


def test_memory_holds_a_window_of_images_not_a_shard(tmp_path, monkeypatch):
    """The reader runs at most a window of images (2 per thread, plus the one just read) ahead
    of the decodes taken back, however many images the shard holds: with the first decode held
    up, it waits instead of reading the whole shard into memory."""
    import shardstream.packing.verify as verify_module

    src = tmp_path / "src"
    src.mkdir()
    for i in range(60):
        (src / f"{i:03d}.jpg").write_bytes(encoded(photo(i, 16), "JPEG"))
    read, done, ahead = [0], [0], []
    members, decode = verify_module.iter_members_at, verify_module.image_problem

    def counted_members(*args, **kwargs):
        for member in members(*args, **kwargs):
            read[0] += 1
            yield member

    def slow_decode(name: str, data: bytes) -> str | None:
        time.sleep(0.2 if not ahead else 0.001)  # the reader's chance to run ahead
        ahead.append(read[0] - done[0])
        return decode(name, data)

    monkeypatch.setattr(verify_module, "iter_members_at", counted_members)
    monkeypatch.setattr(verify_module, "image_problem", slow_decode)
    on_images = lambda n: done.__setitem__(0, done[0] + n)  # noqa: E731
    (check,) = verify(packed(src, tmp_path / "out"), decode=True, decode_threads=1, on_images=on_images)
    assert (check.ok, check.num_images, read[0], done[0]) == (True, 60, 60, 60)
    assert 1 <= max(ahead) <= 3, ahead


def test_decode_threads_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match=re.escape("decode_threads=0 must be >= 1 (or None: one per CPU)")):
        next(verify(str(tmp_path), decode=True, decode_threads=0))


def test_a_shard_whose_table_is_missing_is_one_problem_and_decodes_nothing(tmp_path):
    dest = packed(good_tree(tmp_path / "src"), tmp_path / "out", max_samples_per_shard=2)
    (tmp_path / "out" / "data-000001.tar.samples").unlink()
    checks = list(verify(dest, decode=True))
    assert [(c.ok, c.num_images) for c in checks] == [(True, 2), (False, 0), (True, 2)]


# --- the command line: `shardstream verify --decode` ---------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHARDSTREAM, *args], capture_output=True, text=True, timeout=120)


def test_cli_verify_decode_names_each_undecodable_image_and_exits_1(tmp_path):
    dest = packed(bad_tree(tmp_path / "src"), tmp_path / "out", max_samples_per_shard=4)
    done = run_cli("verify", "--decode", "--no-progress", dest)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    shard = f"{dest}/data-000000.tar"
    prefix = f"BAD {shard}: sample 'cat/half' member 'cat/half.jpg' does not decode: "
    assert lines[0].startswith(prefix) and TRUNCATED.fullmatch(lines[0][len(prefix) :]), lines
    assert lines[1:] == [
        f"BAD {shard}: sample 'dog/broken' member 'dog/broken.png' does not decode: {PNG_DAMAGED}",
        "1 of 2 shards match the index; 1 do not",
        "8 images decoded, 2 do not decode: replace or remove those files and pack again",
    ]


def test_cli_verify_decode_passes_a_clean_dataset_and_without_decode_the_damaged_one(tmp_path):
    clean = packed(good_tree(tmp_path / "good"), tmp_path / "good-out", max_samples_per_shard=2)
    done = run_cli("verify", "--decode", "--decode-threads", "2", "--no-progress", clean)
    assert (done.returncode, done.stdout.splitlines()) == (
        0,
        ["3 of 3 shards match the index", "6 images decoded, all decode"],
    ), done.stderr
    damaged = packed(bad_tree(tmp_path / "bad"), tmp_path / "bad-out")
    done = run_cli("verify", "--no-progress", damaged)
    assert (done.returncode, done.stdout.splitlines()) == (0, ["1 of 1 shards match the index"]), done.stderr


def test_cli_verify_decode_on_a_dataset_without_images_says_nothing_was_decoded(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    done = run_cli("verify", "--decode", "--no-progress", packed(src, tmp_path / "out"))
    assert (done.returncode, done.stdout.splitlines()) == (
        0,
        [
            "1 of 1 shards match the index",
            "no image members to decode (none ends in .jpg, .jpeg, .png, .webp or another image extension)",
        ],
    ), done.stderr
