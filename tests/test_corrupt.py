"""Corrupt shards and undecodable samples: on_error="raise" names shard, key and byte offset;
on_error="skip" keeps every rank's count, counts the skips and logs once per shard; and a
seeded fuzz of 500 mutated shards ends each case in a documented outcome, quickly."""

from __future__ import annotations

import io
import logging
import random
import shutil
import time
from pathlib import Path

import pytest
from PIL import Image

from shardstream import ShardDataset, open_index, pack
from shardstream.errors import CorruptShardError, DecodeError


def jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 12), (i * 20 % 256, 80, 160)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    """2 shards of 8 samples: a 16x12 JPEG and a .cls each."""
    src = tmp_path_factory.mktemp("corrupt") / "src"
    src.mkdir()
    for i in range(16):
        (src / f"{i:03d}.jpg").write_bytes(jpeg(i))
        (src / f"{i:03d}.cls").write_text(str(i % 3))
    pack(src, src.parent / "ds", max_samples_per_shard=8, progress=False)
    return src.parent / "ds"


def damaged(clean: Path, tmp_path: Path, mutate) -> Path:
    dest = tmp_path / "ds"
    shutil.copytree(clean, dest)
    shard = dest / "data-000001.tar"
    shard.write_bytes(mutate(bytearray(shard.read_bytes())))
    return dest


def member_offset(clean: Path, shard: int, sample: int, ext: str = "jpg") -> tuple[int, int]:
    members = list(open_index(clean).table(shard).samples())[sample][1]
    _, offset, size = next(m for m in members if m[0].endswith(ext))
    return offset, size


def flip_header_byte(data: bytearray, clean: Path) -> bytearray:
    offset, _ = member_offset(clean, 1, 3)
    data[offset - 512 + 1] ^= 0x55  # inside the name of sample 3's header
    return data


def test_a_bad_header_checksum_names_shard_and_byte(clean, tmp_path):
    dest = damaged(clean, tmp_path, lambda d: flip_header_byte(d, clean))
    offset, _ = member_offset(clean, 1, 3)
    with pytest.raises(
        CorruptShardError, match=rf"data-000001.tar: tar header checksum mismatch at byte {offset - 512}"
    ):
        list(ShardDataset(dest, shuffle=False))


def test_skip_keeps_the_count_counts_the_skips_and_logs_once(clean, tmp_path, caplog):
    dest = damaged(clean, tmp_path, lambda d: flip_header_byte(d, clean))
    dataset = ShardDataset(dest, shuffle=False, on_error="skip", decode="numpy")
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        samples = list(dataset)
    assert len(samples) == len(dataset) == 16
    keys = [s["__key__"] for s in samples]
    assert keys[:11] == [f"{i:03d}" for i in range(11)]  # shard 0 and samples 0-2 of shard 1
    assert keys[11:] == ["010"] * 5  # the rest of shard 1 from the bad header, each a repeat
    assert dataset.stats().skipped == 5
    assert len([r for r in caplog.records if "data-000001.tar" in r.getMessage()]) == 1


def test_a_short_member_and_a_truncated_shard(clean, tmp_path):
    offset, size = member_offset(clean, 1, 7)
    dest = damaged(clean, tmp_path, lambda d: d[: offset + size // 2])
    with pytest.raises(
        CorruptShardError, match=r"data-000001.tar: is \d+ bytes but the index says \d+; the shard is truncated"
    ):
        list(ShardDataset(dest, shuffle=False))
    with pytest.raises(CorruptShardError, match=r"data-000001.tar: ends at byte \d+, but the index says sample '015'"):
        list(ShardDataset(sorted(str(p) for p in dest.glob("*.tar")), shuffle=False))  # its table beside it
    (tmp_path / "bare").mkdir()
    bare = [shutil.copy(p, tmp_path / "bare") for p in sorted(dest.glob("*.tar"))]  # no tables: the parser finds it
    with pytest.raises(
        CorruptShardError,
        match=rf"data-000001.tar: member '015.jpg' ends early \(expected {size} bytes from byte {offset}\)",
    ):
        list(ShardDataset(bare, shuffle=False))
    skipped = ShardDataset(dest, shuffle=False, on_error="skip")
    assert len(list(skipped)) == 16 and skipped.stats().skipped == 8  # the whole shard


def test_an_undecodable_image(clean, tmp_path):
    offset, size = member_offset(clean, 1, 2)

    def garble(d: bytearray) -> bytearray:
        d[offset : offset + size] = b"\0" * size  # same size: the tar stays valid
        return d

    dest = damaged(clean, tmp_path, garble)
    with pytest.raises(DecodeError, match=r"data-000001.tar: sample '010', member 'jpg': cannot decode"):
        list(ShardDataset(dest, shuffle=False, decode="numpy"))
    dataset = ShardDataset(dest, shuffle=False, decode="numpy", on_error="skip")
    keys = [s["__key__"] for s in dataset]
    assert len(keys) == 16 and keys[10] == keys[9] == "009" and dataset.stats().skipped == 1


MUTATIONS = ("flip", "truncate", "insert", "zero_block", "header_garbage")


def mutate(data: bytearray, rng: random.Random) -> bytearray:
    kind = rng.choice(MUTATIONS)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del data[rng.randrange(len(data)) :]
    elif kind == "insert":
        at = rng.randrange(len(data))
        data[at:at] = rng.randbytes(rng.randint(1, 700))
    elif kind == "zero_block":
        at = rng.randrange(0, len(data), 512)
        data[at : at + 512] = bytes(512)
    else:
        at = rng.randrange(0, len(data), 512)
        data[at : at + 512] = rng.randbytes(512)
    return data


def test_fuzz_500_mutated_shards_end_in_documented_outcomes(clean, tmp_path):
    rng = random.Random(20261122)
    original = (clean / "data-000001.tar").read_bytes()
    outcomes: dict[str, int] = {}
    slowest = 0.0
    for case in range(500):
        dest = tmp_path / f"case{case % 2}"  # two directories, reused
        if not dest.exists():
            shutil.copytree(clean, dest)
        (dest / "data-000001.tar").write_bytes(mutate(bytearray(original), rng))
        on_error = rng.choice(("raise", "skip"))
        started = time.perf_counter()
        try:
            dataset = ShardDataset(dest, shuffle=case % 3 == 0, decode="numpy", on_error=on_error)
            count = sum(1 for _ in dataset)
            assert count == 16, (case, count)  # every rank's count is kept, skips or not
            outcome = f"{on_error}: read" + (" with skips" if dataset.stats().skipped else "")
        except (CorruptShardError, DecodeError) as exc:
            assert on_error == "raise" or "nothing to repeat" in str(exc), (case, exc)
            assert "data-000001.tar" in str(exc), (case, exc)
            outcome = f"{on_error}: {type(exc).__name__}"
        slowest = max(slowest, time.perf_counter() - started)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert slowest < 5.0, slowest
    assert outcomes.get("raise: CorruptShardError", 0) > 50 and outcomes.get("skip: read with skips", 0) > 50, outcomes


def test_verify_checksums_catches_changed_bytes_the_tar_structure_cannot(clean, tmp_path):
    offset, _ = member_offset(clean, 1, 5, "cls")

    def change(d: bytearray) -> bytearray:
        d[offset] = ord("2") if d[offset] != ord("2") else ord("1")  # a valid label, another one
        return d

    dest = damaged(clean, tmp_path, change)
    assert len(list(ShardDataset(dest, shuffle=False))) == 16  # structure and keys are intact
    with pytest.raises(CorruptShardError, match=r"data-000001.tar: CRC-32 [0-9a-f]{8} but the index says [0-9a-f]{8}"):
        list(ShardDataset(dest, shuffle=False, verify_checksums=True))
    assert len(list(ShardDataset(clean, verify_checksums=True, max_open_shards=2))) == 16
