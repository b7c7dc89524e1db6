"""ShardDataset(fields=...): members picked by alternatives (case-insensitive, last dot part),
named as dicts or tuples, decoded by the extension that matched; missing fields raise or are
skipped; custom decoders, collate, mixtures and DataLoader workers. Shards are written by GNU
tar, webdataset's TarWriter and Python's tarfile over files Pillow wrote, and by pack; every
decoded value is compared with Pillow's own decode of the original file."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate
from webdataset import TarWriter

from shardstream import ByteCollate, CpuDecoder, MissingFieldError, ShardDataset, Source, pack
from shardstream.errors import DecodeError
from shardstream.fields import Fields

# name -> (Pillow format, label): odd extensions as users have them
FILES = {
    "a": ("jpg", "JPEG", 0),
    "b": ("JPEG", "JPEG", 1),
    "c": ("png", "PNG", 2),
    "d": ("webp", "WEBP", 0),
    "e": ("JPG", "JPEG", 1),
    "f": ("Png", "PNG", 2),
}


def write_tree(folder: Path) -> dict[str, tuple[Path, int]]:
    """Each sample of FILES as an image Pillow wrote and a ``.cls``, plus a ``.json`` that is not
    JSON (decoding it would fail): ``{key: (image path, label)}``."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    out = {}
    for i, (key, (ext, fmt, label)) in enumerate(FILES.items()):
        pixels = rng.integers(0, 255, (20 + i, 30 + 2 * i, 3), dtype=np.uint8)
        path = folder / f"{key}.{ext}"
        Image.fromarray(pixels).save(path, format=fmt)
        (folder / f"{key}.cls").write_text(str(label))
        (folder / f"{key}.json").write_text("{not json")
        out[key] = (path, label)
    return out


def pillow_rgb(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.array(image.convert("RGB"))


def gnu_tar(folder: Path, shard: Path) -> str:
    names = sorted(p.name for p in folder.iterdir())
    subprocess.run(["tar", "--format=gnu", "-cf", str(shard), "-C", str(folder), *names], check=True)
    return str(shard)


@pytest.fixture
def tree(tmp_path):
    files = write_tree(tmp_path / "src")
    return files, gnu_tar(tmp_path / "src", tmp_path / "gnu.tar")


def test_a_dict_spec_names_the_fields_and_decodes_by_the_extension_that_matched(tree):
    files, shard = tree
    dataset = ShardDataset(
        [shard], shuffle=False, decode="numpy", fields={"image": "jpg;jpeg;png;webp", "label": "cls"}
    )
    samples = list(dataset)
    assert [s["__key__"] for s in samples] == sorted(FILES)
    for sample in samples:
        path, label = files[sample["__key__"]]
        assert set(sample) == {"image", "label", "__key__", "__shard__"}  # the .json is not decoded, nor kept
        assert sample["__shard__"] == shard
        assert sample["label"] == label and type(sample["label"]) is int
        np.testing.assert_array_equal(sample["image"], pillow_rgb(path))
    with pytest.raises(DecodeError, match=r"gnu.tar: sample 'a', member 'json': cannot decode"):
        list(ShardDataset([shard], shuffle=False, decode="numpy"))  # without fields every member is decoded


def test_a_tuple_spec_yields_tuples_in_order_and_torch_tensors(tree):
    files, shard = tree
    dataset = ShardDataset([shard], shuffle=False, decode="torch", fields=("jpg;jpeg;png;webp", "cls"))
    samples = list(dataset)
    assert len(samples) == len(FILES)
    for key, (image, label) in zip(sorted(FILES), samples):
        path, expected = files[key]
        assert label == expected and image.dtype == torch.uint8
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), pillow_rgb(path))
    raw = list(ShardDataset([shard], shuffle=False, fields=("cls", "jpg;jpeg;png;webp")))  # decode=None: bytes
    assert [(int(c), bytes(img)) for c, img in raw] == [
        (label, path.read_bytes()) for path, label in (files[k] for k in sorted(FILES))
    ]


def test_the_first_alternative_present_wins_and_matching_ignores_case_and_leading_parts():
    assert Fields.parse({"image": "png;jpg"}).match(["JPG", "x.PNG", "__key__"]) == ["x.PNG"]  # png first
    assert Fields.parse({"image": "jpg", "mask": "seg.png"}).match(["jpg", "left.SEG.png"]) == ["jpg", "left.SEG.png"]
    assert Fields.parse(("JPEG",)).match(["jpg", "jpeg"]) == ["jpeg"]
    with pytest.raises(TypeError, match="for one field write a tuple of one"):
        ShardDataset("/nowhere", fields="jpg")
    with pytest.raises(ValueError, match="'__key__' is reserved"):
        Fields.parse({"__key__": "jpg"})


def test_a_missing_field_raises_naming_shard_key_fields_and_members_or_is_skipped(tmp_path, tree):
    files, _ = tree
    folder = tmp_path / "gappy"
    folder.mkdir()
    for key, (path, label) in files.items():
        if key != "c":  # c has no image
            (folder / path.name).write_bytes(path.read_bytes())
        (folder / f"{key}.cls").write_text(str(label))
    shard = gnu_tar(folder, tmp_path / "gappy.tar")
    spec = {"image": "jpg;jpeg;webp;png", "label": "cls"}
    with pytest.raises(MissingFieldError) as info:
        list(ShardDataset([shard], shuffle=False, fields=spec))
    message = str(info.value)
    assert isinstance(info.value, DecodeError) and isinstance(info.value, KeyError)
    assert f"{shard}: sample 'c': field 'image' (jpg;jpeg;webp;png) matches no member" in message
    assert "fields={'image': 'jpg;jpeg;webp;png', 'label': 'cls'}" in message
    assert "the sample has members ['cls']" in message and "on_error='skip'" in message
    skipping = ShardDataset([shard], shuffle=False, fields=spec, on_error="skip", decode="numpy")
    samples = list(skipping)
    assert [s["__key__"] for s in samples] == ["a", "b", "b", "d", "e", "f"]  # c replaced by a repeat
    assert skipping.stats().skipped == 1


def test_a_custom_decode_gets_the_picked_sample_by_field_name(tree):
    files, shard = tree
    seen = []

    def decode(sample):
        seen.append(sorted(sample))
        return {**sample, "image": Image.open(io.BytesIO(sample["image"])).size}

    dataset = ShardDataset([shard], shuffle=False, decode=decode, fields={"image": "png;jpg;jpeg;webp", "label": "cls"})
    out = list(dataset)
    assert seen[0] == ["__key__", "__shard__", "image", "label"]
    assert [s["label"] for s in out] == [str(files[k][1]).encode() for k in sorted(FILES)]  # bytes: not decoded
    assert [s["image"] for s in out] == [Image.open(files[k][0]).size for k in sorted(FILES)]

    def by_position(sample):
        return {"0": int(sample["0"]), "1": len(sample["1"])}

    tuples = list(ShardDataset([shard], shuffle=False, decode=by_position, fields=("cls", "jpg;jpeg;png;webp")))
    assert tuples == [(files[k][1], files[k][0].stat().st_size) for k in sorted(FILES)]


def test_shards_by_webdataset_and_tarfile_read_alike(tmp_path, tree):
    files, gnu = tree
    wds = tmp_path / "wds.tar"
    with TarWriter(str(wds), encoder=False, mtime=0) as writer:
        for key in sorted(FILES):
            path, label = files[key]
            writer.write({"__key__": key, path.suffix[1:]: path.read_bytes(), "cls": str(label).encode()})
    plain = tmp_path / "tarfile.tar"
    with tarfile.open(plain, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in sorted(FILES):
            for name in (files[key][0].name, f"{key}.cls"):
                tar.add(tmp_path / "src" / name, arcname=name)
    spec = ("jpg;jpeg;png;webp", "cls")
    read = [
        [
            (k, img.tolist(), c)
            for (img, c), k in zip(ShardDataset([str(s)], shuffle=False, decode="numpy", fields=spec), sorted(FILES))
        ]
        for s in (gnu, wds, plain)
    ]
    assert read[0] == read[1] == read[2]


@pytest.fixture
def packed(tmp_path):
    """Two datasets packed from class folders holding mixed-case extensions."""
    out = {}
    for name, n in (("one", 12), ("two", 8)):
        src = tmp_path / f"src-{name}"
        rng = np.random.default_rng(len(name) + n)
        for i in range(n):
            ext, fmt = [("jpg", "JPEG"), ("JPEG", "JPEG"), ("png", "PNG"), ("WEBP", "WEBP")][i % 4]
            folder = src / f"class{i % 2}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (16, 16 + i, 3), dtype=np.uint8)).save(
                folder / f"{name}{i:03d}.{ext}", format=fmt
            )
            (folder / f"{name}{i:03d}.cls").write_text(str(i % 2))
        pack(src, tmp_path / name, max_samples_per_shard=3, progress=False)
        out[name] = (tmp_path / name, src)
    return out


def reference(src: Path) -> dict[str, tuple[np.ndarray, int]]:
    """Each sample of a packed tree by its key, decoded by Pillow from the original files."""
    out = {}
    for path in src.rglob("*"):
        if path.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"):
            key = path.relative_to(src).with_suffix("").as_posix()
            out[key] = (pillow_rgb(path), int(path.with_suffix(".cls").read_text()))
    return out


def test_a_mixture_keeps_its_source_in_dicts(packed):
    sources = [Source(packed["one"][0], name="one"), Source(packed["two"][0], name="two")]
    expected = {**reference(packed["one"][1]), **reference(packed["two"][1])}
    dataset = ShardDataset(sources, seed=1, decode="numpy", fields={"image": "jpg;jpeg;png;webp", "label": "cls"})
    samples = list(dataset)
    assert sorted(s["__key__"] for s in samples) == sorted(expected)
    for s in samples:
        assert s["__source__"] == ("one" if "one" in s["__key__"] else "two")
        np.testing.assert_array_equal(s["image"], expected[s["__key__"]][0])
        assert s["label"] == expected[s["__key__"]][1]
    tuples = list(ShardDataset(sources, seed=1, fields=("cls",)))
    assert sorted(int(t[0]) for t in tuples) == sorted(v[1] for v in expected.values())


def test_dataloader_workers_persistent_over_epochs(packed):
    dest, src = packed["one"]
    expected = reference(src)
    dataset = ShardDataset(dest, decode="torch", batch_size=4, fields={"image": "jpg;jpeg;png;webp", "label": "cls"})
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True, collate_fn=list)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        samples = [s for batch in loader for s in batch]
        assert sorted(s["__key__"] for s in samples) == sorted(expected)
        for s in samples:
            np.testing.assert_array_equal(s["image"].permute(1, 2, 0).numpy(), expected[s["__key__"]][0])
            assert s["label"] == expected[s["__key__"]][1]


def test_fields_with_collate(packed):
    dest, src = packed["one"]
    expected = reference(src)
    batches = list(
        ShardDataset(dest, shuffle=False, batch_size=5, collate=default_collate, fields=("cls",), decode="numpy")
    )
    assert [len(b[0]) for b in batches] == [5, 5, 2]
    assert torch.cat([b[0] for b in batches]).tolist() == [expected[k][1] for k in sorted(expected)]
    spec = {"image": "jpg;jpeg;png;webp", "label": "cls"}
    byte_batches = list(
        ShardDataset(dest, shuffle=False, batch_size=5, collate=ByteCollate(label_field="label"), fields=spec)
    )
    assert torch.cat([b.labels for b in byte_batches]).tolist() == [expected[k][1] for k in sorted(expected)]
    images = [np.array(Image.open(io.BytesIO(bytes(v))).convert("RGB")) for b in byte_batches for v in b["image"]]
    for key, image in zip(sorted(expected), images):
        np.testing.assert_array_equal(image, expected[key][0])
    with pytest.raises(ValueError, match="ByteCollate takes samples as dicts, not a tuple"):
        list(ShardDataset(dest, batch_size=5, collate=ByteCollate(), fields=("jpg;jpeg;png;webp", "cls")))


def test_a_transform_sees_the_named_sample_in_the_worker(packed):
    dest, src = packed["two"]
    expected = reference(src)

    def to_float(sample):  # as a torchvision v2 transform takes (image, label)
        image, label = sample
        return image.float() / 255, label, os.getpid()

    dataset = ShardDataset(dest, decode=CpuDecoder("torch", transform=to_float), fields=("jpg;jpeg;png;webp", "cls"))
    out = list(DataLoader(dataset, batch_size=None, num_workers=2))
    assert len(out) == len(expected) and {pid for _, _, pid in out} - {os.getpid()}
    assert all(image.dtype == torch.float32 and 0 <= image.min() and image.max() <= 1 for image, _, _ in out)
    assert sorted(label for _, label, _ in out) == sorted(v[1] for v in expected.values())
