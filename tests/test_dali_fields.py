"""DaliLoader(fields=...) and its evaluation transform (resize_shorter_px), on the CPU
pipeline (device_id=None): the same pipeline the GPU runs with device="mixed".

Fields: members found by extension alternatives, case-insensitively and by the last dot part
(a ``.JPEG`` or ``view.JPEG`` member is found by "jpg;jpeg"), samples lacking one raised or
skipped by ``on_error``, other shapes refused.

Evaluation: DALI's output is compared with an independent reference computed here with
Pillow alone (resize the shorter side, cut the centre square), and the CPU fallback
(Pillow, for images DALI is not given) with DALI's output on the same bytes."""

from __future__ import annotations

import inspect
import io
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from shardstream import ShardDataset, pack
from shardstream.errors import DecodeError
from shardstream.fields import MissingFieldError
from shardstream.testing.synth import make_image_dataset

if os.environ.get("SHARDSTREAM_NO_DALI") == "1":
    pytest.skip("SHARDSTREAM_NO_DALI=1: DALI tests skipped on request", allow_module_level=True)

from PIL import Image, ImageOps

from shardstream.dali import DaliLoader

pytestmark = pytest.mark.slow  # DALI pipelines (tests/lanes.py)

# The image member of sample i is named by NAMES[i % 6]: upper, mixed and lower case, a PNG
# (decoded on the CPU), and a multi-dot name whose member is "view.JPEG".
NAMES = ["{i:03d}.jpg", "{i:03d}.JPEG", "{i:03d}.png", "{i:03d}.Jpg", "{i:03d}.view.JPEG", "{i:03d}.jpeg"]
NUM = 18


def _encode(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> list[bytes]:
    """NUM photo-like JPEGs of 64-160 px (shardstream.testing.synth), in order of their number."""
    root = tmp_path_factory.mktemp("pictures")
    make_image_dataset(root, num_images=NUM, num_classes=3, min_side_px=64, max_side_px=160)
    return [path.read_bytes() for path in sorted(root.rglob("*.jpg"), key=lambda p: int(p.stem))]


@pytest.fixture(scope="module")
def odd_names(tmp_path_factory, pictures) -> tuple[Path, dict[int, bytes]]:
    """Sample i: its picture under NAMES[i % 6] (the PNG re-encoded losslessly) and a label
    member holding i, ``cls`` or (every 4th) ``CLS``. Returns the dataset and each sample's
    image bytes as stored."""
    root = tmp_path_factory.mktemp("odd-names")
    stored = {}
    for i, data in enumerate(pictures):
        name = NAMES[i % len(NAMES)].format(i=i)
        if name.endswith(".png"):
            data = _encode(Image.open(io.BytesIO(data)), "PNG")
        (root / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / name).write_bytes(data)
        (root / "src" / f"{i:03d}.{'CLS' if i % 4 == 0 else 'cls'}").write_text(str(i))
        stored[i] = data
    pack(root / "src", root / "ds", max_samples_per_shard=5, progress=False)
    return root / "ds", stored


def _ids(loader: DaliLoader) -> list[int]:
    return torch.cat([labels for _, labels in loader]).tolist()


@pytest.mark.parametrize(
    "fields",
    [{"image": "jpg;jpeg;png", "label": "cls"}, ("jpg;jpeg;png", "cls"), {"label": "CLS", "image": "PNG;JPEG;JPG"}],
)
def test_fields_find_members_whatever_their_case_and_dots(odd_names, fields):
    ds, _ = odd_names
    loader = DaliLoader(ShardDataset(ds, shuffle_buffer=6), batch_size=4, fields=fields, crop_px=16, device_id=None)
    assert sorted(_ids(loader)) == list(range(NUM))  # every sample once, its label from cls or CLS
    stats = loader.stats()
    assert stats["cpu_decoded"] == NUM // len(NAMES) and stats["cpu_reasons"] == {"not a JPEG": NUM // len(NAMES)}


def test_a_single_image_field_gives_labels_of_minus_one(odd_names):
    ds, _ = odd_names
    for fields in ({"image": "jpeg;jpg;png"}, ("jpeg;jpg;png",)):
        loader = DaliLoader(ShardDataset(ds), batch_size=5, fields=fields, crop_px=16, device_id=None)
        batches = list(loader)
        assert [len(y) for _, y in batches] == [5, 5, 5, 3]
        assert torch.cat([y for _, y in batches]).tolist() == [-1] * NUM


def test_the_extension_arguments_still_name_members_exactly(odd_names):
    ds, _ = odd_names
    message = (
        r"sample '000' has no 'cls' member \(it has \['CLS', 'jpg'\]\); set image_ext / label_ext, or pass fields="
    )
    with pytest.raises(DecodeError, match=message):
        list(DaliLoader(ShardDataset(ds, shuffle=False), batch_size=4, crop_px=16, device_id=None))
    message = r"sample '001' has no 'jpg' member \(it has \['JPEG', 'cls'\]\)"
    with pytest.raises(DecodeError, match=message):
        list(DaliLoader(ShardDataset(ds, shuffle=False), batch_size=4, label_ext=None, crop_px=16, device_id=None))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fields": ("jpg", "cls", "txt")}, r"names 3 fields; DaliLoader yields \(images, labels\)"),
        (
            {"fields": {"img": "jpg", "label": "cls"}},
            r"takes the keys 'image' and, optionally, 'label'.*\['img', 'label'\]",
        ),
        ({"fields": {"label": "cls"}}, r"takes the keys 'image'"),
        ({"fields": "jpg;png"}, r"DaliLoader\(fields=...\): fields='jpg;png' must be a dict"),
        ({"fields": ()}, r"names no field"),
        ({"fields": ("jpg;;png", "cls")}, r"empty alternative"),
        ({"fields": ("jpg", "cls"), "image_ext": "jpg"}, r"fields=\('jpg', 'cls'\) and image_ext='jpg' are both given"),
        ({"fields": ("jpg",), "label_ext": None}, r"and label_ext=None are both given"),
    ],
)
def test_fields_of_another_shape_are_refused_by_name(odd_names, options, message):
    ds, _ = odd_names
    with pytest.raises(ValueError, match=message):
        DaliLoader(ShardDataset(ds), batch_size=4, device_id=None, **options)


@pytest.mark.skipif(
    "fields" not in inspect.signature(ShardDataset).parameters, reason="ShardDataset has no fields= here"
)
def test_fields_given_to_the_dataset_instead_are_refused_by_name(odd_names):
    ds, _ = odd_names
    with pytest.raises(ValueError, match=r"without fields=.*DaliLoader\(fields=...\) instead"):
        DaliLoader(ShardDataset(ds, fields=("jpg;jpeg;png", "cls")), batch_size=4, device_id=None)


@pytest.fixture(scope="module")
def one_lacks_its_label(tmp_path_factory, pictures) -> Path:
    """10 samples with jpg and cls (= its number), but sample 006 has a txt instead of its cls."""
    src = tmp_path_factory.mktemp("missing") / "src"
    src.mkdir()
    for i, data in enumerate(pictures[:10]):
        (src / f"{i:03d}.jpg").write_bytes(data)
        (src / f"{i:03d}.{'txt' if i == 6 else 'cls'}").write_text(str(i))
    pack(src, src.parent / "ds", max_samples_per_shard=4, progress=False)
    return src.parent / "ds"


def test_a_sample_lacking_a_field_raises_naming_shard_key_fields_and_members(one_lacks_its_label):
    loader = DaliLoader(
        ShardDataset(one_lacks_its_label, shuffle=False),
        batch_size=4,
        fields={"image": "jpg;jpeg", "label": "cls"},
        crop_px=16,
        device_id=None,
    )
    with pytest.raises(MissingFieldError) as raised:  # as ShardDataset(fields=) raises it
        list(loader)
    message = str(raised.value)
    assert f"{one_lacks_its_label}/data-000001.tar: sample '006'" in message
    assert "field 'label' (cls) matches no member" in message
    assert "fields={'image': 'jpg;jpeg', 'label': 'cls'}" in message
    assert "members ['jpg', 'txt']" in message


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sample_lacking_a_field_is_skipped_under_on_error_skip(one_lacks_its_label, num_workers):
    loader = DaliLoader(
        ShardDataset(one_lacks_its_label, shuffle=False, on_error="skip", batch_size=5),
        batch_size=5,
        fields=("jpg", "cls"),
        crop_px=16,
        device_id=None,
        num_workers=num_workers,
    )
    batches = list(loader)
    loader.close()
    assert [len(y) for _, y in batches] == [5, 5]  # the batch count and sizes are kept
    ids = torch.cat([y for _, y in batches]).tolist()
    assert 6 not in ids and set(ids) == set(range(10)) - {6}  # a repeat of a good sample in its place
    assert loader.stats()["skipped"] == 1


def test_the_old_extension_arguments_follow_on_error_for_a_missing_member_too(one_lacks_its_label):
    loader = DaliLoader(ShardDataset(one_lacks_its_label, on_error="skip"), batch_size=5, crop_px=16, device_id=None)
    assert len(set(_ids(loader))) == 9 and loader.stats()["skipped"] == 1


# Evaluation: resize the shorter side to S, cut the centre C x C square. The pictures' shorter
# sides are 76-147 px: S = 48 shrinks every one, S = 128 enlarges all but two, S = 100 both.


def pillow_reference(data: bytes, shorter_px: int, size_px: int, shift_px: int = 0) -> torch.Tensor:
    """The evaluation transform with Pillow alone, written from its definition: the image
    upright (EXIF), resized (bilinear, antialiased) so that its shorter side is ``shorter_px``
    and its longer one the nearest integer to keep the aspect ratio (halves rounded up, as
    DALI rounds), then the centre ``size_px`` square (a corner at half the margin, halves up);
    ``shift_px`` moves the square right, for the controls. float ``(3, size_px, size_px)``."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    width, height = image.size
    aspect = width / height
    if width <= height:
        size = (shorter_px, int(shorter_px / aspect + 0.5))
    else:
        size = (int(shorter_px * aspect + 0.5), shorter_px)
    resized = image.resize(size, Image.Resampling.BILINEAR)
    left = int((size[0] - size_px) / 2 + 0.5) + shift_px
    top = int((size[1] - size_px) / 2 + 0.5)
    crop = resized.crop((left, top, left + size_px, top + size_px))
    return torch.from_numpy(np.array(crop)).permute(2, 0, 1).float()


def _outputs(loader: DaliLoader) -> dict[int, torch.Tensor]:
    return {i: image.float() for images, ids in loader for image, i in zip(images, ids.tolist())}


def _eval_loader(ds: Path, shorter_px: int, size_px: int, **options) -> DaliLoader:
    return DaliLoader(
        ShardDataset(ds, shuffle=False),
        batch_size=4,
        fields=("jpg;jpeg;png", "cls"),
        crop_px=size_px,
        resize_shorter_px=shorter_px,
        dtype=torch.uint8,
        **{"device_id": None, **options},
    )


# DALI against the Pillow reference, in levels of 0-255, mean over an image's pixels. Both
# resample bilinearly with antialiasing, and DALI's CPU decoder gives these JPEGs Pillow's
# pixels exactly; they differ in the scale of the longer side: DALI keeps the exact scale of the
# shorter side on both axes (its subpixel_scale) where Pillow maps the image onto the rounded
# size, a misalignment under half a pixel at the crop's far edges. Measured (DALI 2.4.0, CPU,
# tests/ pictures, S/C = 48/40, 128/112, 100/96): 0.12-0.65 per image, 0.23-0.32 on average.
# The controls, what a real mistake costs: the square one pixel off (a corner rounded the other
# way) 1.53 or more, a flip 6.77 or more. So 1.0: half as much again as the worst measured,
# below the one-pixel control. (On 64 textured photos of bench/corpus.py, at 256/224 and 37/32,
# the same comparison gives 0.39 on average and up to 1.87 per image: the bound is for these
# smooth pictures, not a general one.)
DALI_VS_PILLOW = 1.0

# The CPU fallback against DALI on the same bytes: the fallback reproduces DALI's geometry
# (exact scale, same rounding), so only the two resamplers' rounding remains: measured at most
# 1 level at any pixel and at most 0.19 mean over an image (1 level and 0.20 on the photos).
FALLBACK_MAX, FALLBACK_MEAN = 2, 0.5


@pytest.mark.parametrize(("shorter_px", "size_px"), [(48, 40), (128, 112)])
def test_evaluation_resizes_the_shorter_side_and_cuts_the_centre_as_pillow_does(odd_names, shorter_px, size_px):
    ds, stored = odd_names
    loader = _eval_loader(ds, shorter_px, size_px)
    first = _outputs(loader)
    loader.set_epoch(1)
    second = _outputs(loader)
    assert sorted(first) == list(range(NUM))
    assert all(first[i].shape == (3, size_px, size_px) for i in first)
    assert all(torch.equal(first[i], second[i]) for i in first)  # no randomness: no crop, no flip
    for i, image in first.items():
        data = stored[i]
        diff = (image - pillow_reference(data, shorter_px, size_px)).abs().mean().item()
        assert diff < DALI_VS_PILLOW, (i, diff)
        # the controls: a square one pixel off, or flipped, is told apart
        assert (image - pillow_reference(data, shorter_px, size_px, shift_px=1)).abs().mean() > diff
        assert (image - pillow_reference(data, shorter_px, size_px).flip(-1)).abs().mean() > 3 * DALI_VS_PILLOW
    assert loader.stats()["cpu_decoded"] == 2 * NUM // len(NAMES)  # the PNGs of 2 epochs, through the fallback


def test_evaluation_normalises_like_training(odd_names):
    ds, stored = odd_names
    loader = DaliLoader(
        ShardDataset(ds, shuffle=False),
        batch_size=6,
        fields=("jpg;jpeg;png", "cls"),
        crop_px=40,
        resize_shorter_px=48,
        device_id=None,
    )
    images, ids = next(iter(loader))
    assert images.dtype == torch.float32 and images.shape == (6, 3, 40, 40)
    mean = torch.tensor(loader.mean).view(3, 1, 1) * 255
    std = torch.tensor(loader.std).view(3, 1, 1) * 255
    for image, i in zip(images, ids.tolist()):
        back = image * std + mean
        assert (back - pillow_reference(stored[i], 48, 40)).abs().mean() < DALI_VS_PILLOW


def test_the_cpu_fallback_gives_what_dali_gives_on_the_same_bytes(tmp_path, pictures):
    """PNGs go to Pillow (the check sends DALI JPEGs only); with check_images=False DALI
    decodes the same PNG bytes itself. An EXIF-rotated JPEG with junk before a marker goes to
    Pillow, and its clean copy to DALI: both come out upright and alike. Without the check,
    DALI fails on the damaged one, and its batch is decoded on the CPU after all."""
    src = tmp_path / "src"
    src.mkdir()
    for i, data in enumerate(pictures[:7]):
        (src / f"{i:03d}.png").write_bytes(_encode(Image.open(io.BytesIO(data)), "PNG"))
        (src / f"{i:03d}.cls").write_text(str(i))
    upright = Image.open(io.BytesIO(pictures[8]))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned a quarter; EXIF turns it back
    clean = _encode(upright.transpose(Image.Transpose.ROTATE_90), "JPEG", quality=95, exif=exif.tobytes())
    cut = 4 + struct.unpack(">H", clean[4:6])[0]  # after the first segment (APP0)
    (src / "007.jpg").write_bytes(clean)  # with 004-006 in the second batch of 4
    (src / "101.jpg").write_bytes(clean[:cut] + b"\x00\x00" + clean[cut:])  # alone in the third; DALI fails on it
    (src / "007.cls").write_text("7")
    (src / "101.cls").write_text("101")
    pack(src, tmp_path / "ds", progress=False)

    fallback = _eval_loader(tmp_path / "ds", 100, 96)
    pillow = _outputs(fallback)
    assert fallback.stats()["cpu_decoded"] == 8  # 7 PNGs and the damaged JPEG
    unchecked = _eval_loader(tmp_path / "ds", 100, 96, check_images=False)
    dali = _outputs(unchecked)
    stats = unchecked.stats()
    assert stats["pipeline_rebuilds"] == 1 and stats["cpu_reasons"] == {"DALI failed on its batch": 1}
    for i in range(7):
        assert pillow[i].shape == dali[i].shape == (3, 96, 96)
        diff = (pillow[i] - dali[i]).abs()
        assert diff.max() <= FALLBACK_MAX and diff.mean() < FALLBACK_MEAN, (i, diff.max(), diff.mean())
    # the damaged copy on the CPU (by the reader, and after DALI failed) against its clean twin through DALI
    assert torch.equal(pillow[101], dali[101]) and dali[101].shape == (3, 96, 96)
    diff = (pillow[101] - dali[7]).abs()
    assert diff.max() <= FALLBACK_MAX and diff.mean() < FALLBACK_MEAN, (diff.max(), diff.mean())
    upright = pillow_reference(pictures[8], 100, 96)
    assert (upright - dali[7]).abs().mean() < DALI_VS_PILLOW < (upright - dali[7].transpose(1, 2)).abs().mean()


def test_evaluation_arguments_are_checked(odd_names):
    ds, _ = odd_names
    with pytest.raises(ValueError, match=r"resize_shorter_px=200 must be an int >= crop_px \(224\)"):
        DaliLoader(ShardDataset(ds), batch_size=4, resize_shorter_px=200, device_id=None)
    with pytest.raises(ValueError, match=r"flip_p set the training crop and flip; with resize_shorter_px=256"):
        DaliLoader(ShardDataset(ds), batch_size=4, resize_shorter_px=256, flip_p=0.5, device_id=None)
    with pytest.raises(ValueError, match=r"scale, ratio set the training crop"):
        DaliLoader(ShardDataset(ds), batch_size=4, resize_shorter_px=256, scale=(1, 1), ratio=(1, 1), device_id=None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU here")
def test_evaluation_on_the_gpu_path(odd_names):
    """The mixed (nvJPEG) path of the evaluation transform: cuda batches of the centre crop,
    the same in every epoch, each image closer to Pillow's upright centre crop than to its
    mirror image and to the square one pixel off. (No absolute bound: nvJPEG's decode differs
    from libjpeg's, and no GPU was at hand to measure by how much.)"""
    from shardstream.dali import gpu_available

    assert gpu_available(), "torch sees a CUDA GPU but DALI does not: install the matching nvidia-dali-cudaXXX"
    ds, stored = odd_names
    loader = _eval_loader(ds, 72, 64, device_id="auto")
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert all(x.device == y.device == torch.device("cuda", 0) for x, y in batches)
        epochs.append({i: image.float().cpu() for x, y in batches for image, i in zip(x, y.tolist())})
    first, second = epochs
    assert sorted(first) == list(range(NUM)) and all(torch.equal(first[i], second[i]) for i in first)
    for i, image in first.items():
        assert image.shape == (3, 64, 64)
        reference = pillow_reference(stored[i], 72, 64)
        diff = (image - reference).abs().mean()
        assert diff < (image - reference.flip(-1)).abs().mean(), i
        assert diff < (image - pillow_reference(stored[i], 72, 64, shift_px=1)).abs().mean(), i
