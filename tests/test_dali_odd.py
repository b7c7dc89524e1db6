"""DaliLoader on odd images (CPU path, device_id=None): real JPEGs damaged the ways cameras,
editors and crawls damage them, other formats written by Pillow under the .jpg extension,
and undecodable bytes. Pillow is the reference reader: every "damaged" file here is one it
decodes, so each is an image training must not lose."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from shardstream import ShardDataset, pack
from shardstream.decode.check import gpu_jpeg_problem
from shardstream.errors import DecodeError

if os.environ.get("SHARDSTREAM_NO_DALI") == "1":
    pytest.skip("SHARDSTREAM_NO_DALI=1: DALI tests skipped on request", allow_module_level=True)

from PIL import Image

from shardstream.dali import DaliLoader

pytestmark = pytest.mark.slow  # DALI pipelines (tests/lanes.py)

W, H = 96, 64  # every variant shows this picture (after EXIF orientation)


def picture() -> Image.Image:
    """A smooth photo-like picture (gradients, a bright disc), so resampling differences
    between decoders stay small and orientation mistakes show."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    r = 255 * x / W
    g = 255 * y / H
    b = np.where((x - 25) ** 2 + (y - 20) ** 2 < 150, 255, 60)
    return Image.fromarray(np.stack([r, g, b], -1).astype(np.uint8))


def encode(image: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kw)
    return out.getvalue()


def insert_after_soi(jpeg: bytes, segment: bytes) -> bytes:
    return jpeg[:2] + segment + jpeg[2:]


def first_segment_end(jpeg: bytes) -> int:
    """Where the first marker segment after SOI ends (APP0, as Pillow writes)."""
    return 4 + struct.unpack(">H", jpeg[4:6])[0]


def variants() -> dict[str, bytes]:
    """name -> bytes stored as the sample's .jpg member."""
    base = picture()
    clean = encode(base, quality=92)
    rotated = base.transpose(Image.Transpose.ROTATE_90)  # stored turned; EXIF 6 turns it back
    exif = Image.Exif()
    exif[0x0112] = 6
    exif_jpeg = encode(rotated, quality=92, exif=exif.tobytes())
    cut = first_segment_end(clean)
    photoshop = b"Photoshop 3.0\x00" + b"8BIM\x04\x04\x00\x00" + struct.pack(">I", 400) + b"\x1c\x02" * 8
    return {
        # to DALI
        "clean": clean,
        "progressive": encode(base, quality=92, progressive=True),
        "grey": encode(base.convert("L"), quality=92),
        "exif": exif_jpeg,
        "trailing_bytes": clean + b"\x00" * 64,
        # JPEGs Pillow reads and DALI must not see
        "junk_before_marker": clean[:cut] + b"\x00\x13\x37\x00" + clean[cut:],
        "junk_before_marker_exif": exif_jpeg[: first_segment_end(exif_jpeg)]
        + b"\x00\x00"
        + exif_jpeg[first_segment_end(exif_jpeg) :],
        "truncated_app14": insert_after_soi(clean, b"\xff\xee" + struct.pack(">H", 9) + b"Adobe\x00\x64"),
        "broken_photoshop": insert_after_soi(clean, b"\xff\xed" + struct.pack(">H", 2 + len(photoshop)) + photoshop),
        "cmyk": encode(base.convert("CMYK"), quality=92),
        # other formats under .jpg
        "png": encode(base, "PNG"),
        "png16": encode(Image.fromarray(np.asarray(base.convert("L")).astype(np.uint16) * 257), "PNG"),
        "rgba_png": encode(base.convert("RGBA"), "PNG"),
        "webp": encode(base, "WEBP", lossless=True),
        "gif": encode(base, "GIF"),
    }


TO_DALI = {"clean", "progressive", "grey", "exif", "trailing_bytes"}
UNDECODABLE = {"garbage": b"<html>404 Not Found</html>", "empty": b"", "cut_short": None}


def build(root: Path, members: dict[str, bytes]) -> Path:
    """One sample per variant (key = its number, .id = that number), packed into shards of 4."""
    src = root / "src"
    src.mkdir(parents=True)
    for i, (name, data) in enumerate(members.items()):
        (src / f"{i:03d}.jpg").write_bytes(data)
        (src / f"{i:03d}.id").write_text(str(i))
        (src / f"{i:03d}.txt").write_text(name)
    pack(src, root / "ds", max_samples_per_shard=4, progress=False)
    return root / "ds"


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> tuple[Path, list[str]]:
    members = variants()
    return build(tmp_path_factory.mktemp("odd"), members), list(members)


def test_pillow_decodes_every_variant_and_the_check_sends_only_plain_jpegs_to_dali():
    for name, data in variants().items():
        image = Image.open(io.BytesIO(data))
        image.load()  # the reference reader takes each of them
        assert (gpu_jpeg_problem(data) is None) == (name in TO_DALI), (name, gpu_jpeg_problem(data))
    problems = {name: gpu_jpeg_problem(data) for name, data in variants().items()}
    assert problems["junk_before_marker"].startswith("junk before a marker")
    assert problems["truncated_app14"] == "truncated Adobe APP14 segment"
    assert problems["broken_photoshop"] == "truncated Photoshop APP13 segment"
    assert problems["cmyk"] == "4 components (CMYK or YCCK)"
    assert problems["png"] == problems["gif"] == "not a JPEG"
    clean = variants()["clean"]
    assert gpu_jpeg_problem(clean[: len(clean) // 2]) == "no end-of-image marker (cut short)"


def test_dali_itself_fails_on_a_jpeg_pillow_reads():
    """Why the check exists: one junk byte before a marker kills a DALI pipeline."""
    from nvidia.dali import fn, pipeline_def, types

    data = np.frombuffer(variants()["junk_before_marker"], np.uint8)

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        jpegs = fn.external_source(source=lambda: [data], batch=True, dtype=types.UINT8)
        return fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)

    p = pipe()
    p.build()
    with pytest.raises(RuntimeError):
        p.run()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_odd_images_come_out_rgb_in_their_batches_and_are_counted(odd, num_workers):
    ds, names = odd
    loader = DaliLoader(
        ShardDataset(ds, shuffle_buffer=4),
        batch_size=4,
        crop_px=24,
        label_ext="id",
        device_id=None,
        num_workers=num_workers,
    )
    batches = list(loader)
    assert [len(y) for _, y in batches] == [4, 4, 4, 3] == [4] * (len(loader) - 1) + [3]
    images = torch.cat([x for x, _ in batches])
    ids = torch.cat([y for _, y in batches]).tolist()
    assert sorted(ids) == list(range(len(names)))
    assert images.shape == (len(names), 3, 24, 24) and images.dtype == torch.float32
    stats = loader.stats()
    assert stats["images"] == len(names) and stats["skipped"] == 0 and stats["pipeline_rebuilds"] == 0
    assert stats["cpu_decoded"] == len(names) - len(TO_DALI)
    assert stats["cpu_reasons"]["not a JPEG"] == 5 and stats["cpu_reasons"]["junk before a marker"] == 2


def test_cpu_decoded_images_match_what_dali_makes_of_the_clean_file(odd):
    """Full-image crops, no flip, uint8: each variant equals the clean JPEG through DALI to
    within resampling and re-encoding noise; EXIF orientation is applied on both paths."""
    ds, names = odd
    loader = DaliLoader(
        ShardDataset(ds, shuffle=False),
        batch_size=4,
        crop_px=32,
        label_ext="id",
        device_id=None,
        scale=(1.0, 1.0),
        ratio=(W / H, W / H),
        flip_p=0.0,
        dtype=torch.uint8,
    )
    out = {}
    for images, ids in loader:
        for image, i in zip(images, ids.tolist()):
            out[names[i]] = image.float()
    for name, image in out.items():
        reference = out["grey"] if name == "png16" else out["clean"]  # the 16-bit PNG is grey (CPU vs DALI)
        if name != "grey":
            diff = (image - reference).abs().mean().item()
            assert diff < 6, (name, diff)  # levels of 0-255, mean over pixels
    assert (out["grey"][0] - out["grey"][1]).abs().max() == 0  # grey comes out RGB with R = G = B
    upright = out["clean"]
    assert (out["exif"] - upright).abs().mean() < 6 and (out["junk_before_marker_exif"] - upright).abs().mean() < 6
    turned = upright.transpose(1, 2)  # the same picture not turned upright would differ a lot
    assert (out["junk_before_marker_exif"] - turned).abs().mean() > 30


def test_a_batch_dali_fails_on_is_decoded_on_the_cpu_and_the_pipeline_rebuilt(odd):
    ds, names = odd
    loader = DaliLoader(
        ShardDataset(ds, shuffle=False), batch_size=4, crop_px=16, label_ext="id", device_id=None, check_images=False
    )
    batches = list(loader)
    ids = torch.cat([y for _, y in batches]).tolist()
    assert sorted(ids) == list(range(len(names)))
    assert all(x.shape[1:] == (3, 16, 16) and x.dtype == torch.float32 for x, _ in batches)
    stats = loader.stats()
    assert stats["pipeline_rebuilds"] >= 1 and stats["cpu_reasons"]["DALI failed on its batch"] >= 1


def test_undecodable_images_raise_naming_shard_key_and_member(tmp_path):
    members = variants()
    members["garbage"] = UNDECODABLE["garbage"]
    ds = build(tmp_path, members)
    with pytest.raises(DecodeError, match=r"data-\d+\.tar: sample '015', member 'jpg': no decoder can read"):
        list(DaliLoader(ShardDataset(ds, shuffle=False), batch_size=4, crop_px=16, label_ext="id", device_id=None))


def test_undecodable_images_skipped_keep_every_ranks_batch_count(tmp_path, monkeypatch):
    members = variants()
    clean = members["clean"]
    members.update(garbage=UNDECODABLE["garbage"], empty=b"", cut_short=clean[: len(clean) // 2])
    ds = build(tmp_path, members)  # 18 samples
    counts, seen = [], []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = DaliLoader(
            ShardDataset(ds, on_error="skip", seed=1), batch_size=4, crop_px=16, label_ext="id", device_id=None
        )
        batches = list(loader)
        counts.append((len(loader), [len(y) for _, y in batches]))
        seen += torch.cat([y for _, y in batches]).tolist()
        assert loader.stats()["images"] == 9
    assert counts == [(3, [4, 4, 1])] * 2
    bad = {i for i, name in enumerate(members) if name in UNDECODABLE}
    assert set(seen) == set(range(len(members))) - bad  # each good one, and repeats in the bad ones' places
    assert len(seen) == 18


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU here")
def test_odd_images_on_the_gpu_path(odd):
    """The mixed (nvJPEG / hardware decoder) path: the same odd dataset, every sample once,
    batches on cuda:0, the odd ones decoded on the CPU and moved there."""
    from shardstream.dali import gpu_available

    # torch sees a GPU here (else the skip above): DALI must use it too, not leave the GPU path untested
    assert gpu_available(), (
        "torch sees a CUDA GPU but DALI does not (nvidia.dali.backend.GetCUDADeviceCount() == 0): "
        "install the nvidia-dali-cudaXXX wheel that matches this driver's CUDA"
    )
    ds, names = odd
    loader = DaliLoader(ShardDataset(ds, shuffle_buffer=4), batch_size=4, crop_px=24, label_ext="id", device_id="auto")
    batches = list(loader)
    images = torch.cat([x for x, _ in batches])
    ids = torch.cat([y for _, y in batches]).tolist()
    assert images.device == torch.device("cuda", 0) and images.shape == (len(names), 3, 24, 24)
    assert sorted(ids) == list(range(len(names)))
    assert loader.stats()["cpu_decoded"] == len(names) - len(TO_DALI)
