"""Evaluation steps of CpuDecoder: Resize(shorter_side_px) and CenterCrop(size_px), alone and
as a sequence, and transform=. Each output is compared with what Pillow's own resize and crop
make of the original file, at the sizes and offsets torchvision's Resize(int) and CenterCrop
compute (written out here from torchvision's documented rules, not taken from shardstream)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardstream import CenterCrop, CpuDecoder, RandomResizedCrop, Resize, ShardDataset
from shardstream.decode import CenterCrop as CenterCrop2
from shardstream.decode import Resize as Resize2


def resized_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    """torchvision Resize(int): the smaller edge becomes ``shorter``, the other
    ``int(shorter * long / short)``."""
    if width <= height:
        return shorter, int(shorter * height / width)
    return int(shorter * width / height), shorter


def centre_crop_reference(pixels: np.ndarray, size: int) -> np.ndarray:
    """torchvision CenterCrop on an HWC array: zero padding where the image is smaller
    (left/top get ``(size - side) // 2``), then the crop at ``int(round((side - size) / 2))``."""
    height, width = pixels.shape[:2]
    pad_top = (size - height) // 2 if size > height else 0
    pad_left = (size - width) // 2 if size > width else 0
    padded_h, padded_w = max(height, size), max(width, size)
    padded = np.zeros((padded_h, padded_w, 3), np.uint8)
    padded[pad_top : pad_top + height, pad_left : pad_left + width] = pixels
    top = round((padded_h - size) / 2.0)  # torchvision: int(round(...)), half to even
    left = round((padded_w - size) / 2.0)
    return padded[top : top + size, left : left + size]


def write_image(path: Path, width: int, height: int, fmt: str, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    # smooth content (a gradient plus noise), so a draft decode stays close to a full one
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) % 256], -1)
    pixels = np.clip(base + rng.integers(-10, 10, base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return path


def pillow(path: Path) -> Image.Image:
    image = Image.open(path)
    return image.convert("RGB")


@pytest.mark.parametrize(("width", "height"), [(500, 375), (375, 500), (300, 300), (1000, 100), (257, 999)])
@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_resize_matches_pillow_at_torchvisions_size(tmp_path, width, height, fmt):
    path = write_image(tmp_path / f"x.{fmt.lower()}", width, height, fmt)
    size = resized_size(width, height, 256)
    expected = np.array(pillow(path).resize(size, Image.Resampling.BILINEAR))
    out = CpuDecoder("numpy", steps=Resize(256, draft=False)).decode_member("jpg", path.read_bytes())
    np.testing.assert_array_equal(out, expected)
    drafted = CpuDecoder("numpy", steps=Resize(256)).decode_member("JPEG", path.read_bytes())
    assert drafted.shape == expected.shape == (size[1], size[0], 3)
    if fmt == "PNG":
        np.testing.assert_array_equal(drafted, expected)  # draft mode is for JPEGs only


def test_resize_drafts_large_jpegs_close_to_a_full_decode(tmp_path):
    path = write_image(tmp_path / "big.jpg", 2000, 1500, "JPEG")
    size = resized_size(2000, 1500, 256)
    full = np.array(pillow(path).resize(size, Image.Resampling.BILINEAR)).astype(int)
    reduced = Image.open(path)
    reduced.draft("RGB", size)  # Pillow's draft at the output size: 1/4 scale here
    assert reduced.size == (500, 375)
    by_draft = np.array(reduced.convert("RGB").resize(size, Image.Resampling.BILINEAR))
    out = CpuDecoder("numpy", steps=Resize(256)).decode_member("jpg", path.read_bytes())
    np.testing.assert_array_equal(out, by_draft)
    assert np.abs(out.astype(int) - full).mean() < 2.0  # within a few grey levels of the full decode
    upsized = CpuDecoder("numpy", steps=Resize(2048)).decode_member("jpg", path.read_bytes())  # no draft upwards
    np.testing.assert_array_equal(upsized, np.array(pillow(path).resize((2730, 2048), Image.Resampling.BILINEAR)))


@pytest.mark.parametrize(("width", "height"), [(256, 341), (225, 227), (227, 300), (300, 224), (100, 60), (230, 100)])
def test_center_crop_matches_torchvision_offsets_and_zero_padding(tmp_path, width, height):
    path = write_image(tmp_path / "x.png", width, height, "PNG")
    pixels = np.array(pillow(path))
    out = CpuDecoder("numpy", steps=CenterCrop(224)).decode_member("png", path.read_bytes())
    np.testing.assert_array_equal(out, centre_crop_reference(pixels, 224))
    box = CenterCrop(224).box(width, height)
    if width >= 224 and height >= 224:  # within the image: Pillow's own crop at the same box
        np.testing.assert_array_equal(out, np.array(pillow(path).crop(box)))


def test_resize_then_center_crop_on_upper_case_jpegs_in_a_gnu_tar(tmp_path):
    folder = tmp_path / "val"
    folder.mkdir()
    sizes = {"n01_0001": (500, 375), "n01_0002": (375, 500), "n02_0003": (640, 427)}
    for i, (stem, (w, h)) in enumerate(sizes.items()):
        write_image(folder / f"{stem}.JPEG", w, h, "JPEG", seed=i)
        (folder / f"{stem}.cls").write_text(str(i))
    names = sorted(p.name for p in folder.iterdir())
    subprocess.run(["tar", "-cf", str(tmp_path / "val.tar"), "-C", str(folder), *names], check=True)
    decoder = CpuDecoder("torch", steps=[Resize(256, draft=False), CenterCrop(224)])
    dataset = ShardDataset([str(tmp_path / "val.tar")], shuffle=False, decode=decoder, fields=("jpg;jpeg", "cls"))
    out = list(dataset)
    assert [label for _, label in out] == [0, 1, 2]
    for (image, _), (stem, (w, h)) in zip(out, sizes.items()):
        resized = pillow(folder / f"{stem}.JPEG").resize(resized_size(w, h, 256), Image.Resampling.BILINEAR)
        expected = centre_crop_reference(np.array(resized), 224)
        assert image.shape == (3, 224, 224) and image.dtype == torch.uint8
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), expected)
    as_pil = CpuDecoder("pil", steps=[Resize(256, draft=False), CenterCrop(224)])
    picture = as_pil.decode_member("JPEG", (folder / "n01_0001.JPEG").read_bytes())
    assert picture.mode == "RGB" and picture.size == (224, 224)
    np.testing.assert_array_equal(np.array(picture), out[0][0].permute(1, 2, 0).numpy())


def test_transform_gets_the_decoded_sample(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    write_image(folder / "a.png", 40, 30, "PNG")
    (folder / "a.cls").write_text("3")
    subprocess.run(["tar", "-cf", str(tmp_path / "s.tar"), "-C", str(folder), "a.cls", "a.png"], check=True)

    def flip(sample):
        return {**sample, "png": sample["png"].flip(-1), "seen": sorted(sample)}

    (sample,) = list(ShardDataset([str(tmp_path / "s.tar")], decode=CpuDecoder("torch", transform=flip)))
    assert sample["seen"] == ["__key__", "__shard__", "cls", "png"] and sample["cls"] == 3
    np.testing.assert_array_equal(sample["png"].flip(-1).permute(1, 2, 0).numpy(), np.array(pillow(folder / "a.png")))


def test_arguments_are_checked_and_crop_still_works():
    assert Resize is Resize2 and CenterCrop is CenterCrop2
    crop = RandomResizedCrop(size_px=32)
    assert CpuDecoder("torch", crop=crop).steps == (crop,) and CpuDecoder("torch", crop=crop).crop is crop
    assert CpuDecoder(steps=[Resize(8), CenterCrop(4)]).steps == (Resize(8), CenterCrop(4))
    with pytest.raises(ValueError, match="not both"):
        CpuDecoder(steps=crop, crop=crop)
    with pytest.raises(TypeError, match="is not an image step"):
        CpuDecoder(steps=[Resize(8), 224])
    with pytest.raises(ValueError, match="shorter_side_px=0 must be an int >= 1"):
        Resize(0)
    with pytest.raises(ValueError, match="size_px=2.5 must be an int >= 1"):
        CenterCrop(2.5)
    with pytest.raises(TypeError, match="transform=3 must be callable"):
        CpuDecoder(transform=3)
