"""ShardDataset on local shards: sources, order, shuffle, decoding, workers, errors."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardstream import CpuDecoder, RandomResizedCrop, ShardDataset, pack
from shardstream.errors import CorruptShardError, DecodeError, ShardNotFoundError
from shardstream.reading.assign import WorkerSlot


def make_dataset(tmp_path: Path, *, num_samples: int = 120, per_shard: int = 10) -> tuple[Path, list[str]]:
    """``num_samples`` samples (a .txt and a .cls each) in the folders class0..class2 of
    ``tmp_path/src``, packed (one worker) into ``tmp_path/ds``, ``per_shard`` samples a shard.
    Returns the dataset and its keys in the order packing writes them, derived from the source
    files alone, as a user would (docs/packing.md): a sample's key is its file's path under
    SOURCE up to the first dot of the file name, and the walk visits a folder's samples sorted by
    key, folders sorted by name (here every file sits one folder deep: sorted keys)."""
    src = tmp_path / "src"
    for i in range(num_samples):
        d = src / f"class{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:05d}.txt").write_text(f"sample {i}")
        (d / f"{i:05d}.cls").write_text(str(i % 3))
    dest = tmp_path / "ds"
    pack(src, dest, max_samples_per_shard=per_shard, progress=False)
    files = [p.relative_to(src) for p in src.rglob("*") if p.is_file()]
    keys = sorted({(f.parent / f.name.split(".", 1)[0]).as_posix() for f in files})
    assert len(keys) == num_samples
    return dest, keys


def keys_of(dataset) -> list[str]:
    return [s["__key__"] for s in dataset]


def test_without_shuffle_samples_come_in_index_order(tmp_path):
    dest, keys = make_dataset(tmp_path)
    assert keys_of(ShardDataset(dest, shuffle=False)) == keys
    assert keys_of(ShardDataset(dest / "index.bin", shuffle=False)) == keys


def test_shuffle_differs_between_epochs_and_repeats_for_the_same_seed(tmp_path):
    dest, keys = make_dataset(tmp_path)
    dataset = ShardDataset(dest, shuffle_buffer=30, seed=7)
    epoch0 = keys_of(dataset)
    dataset.set_epoch(0)
    assert keys_of(dataset) == epoch0
    dataset.set_epoch(1)
    epoch1 = keys_of(dataset)
    assert sorted(epoch0) == sorted(epoch1) == sorted(keys)
    assert epoch0 != epoch1 and epoch0 != keys
    again = ShardDataset(dest, shuffle_buffer=30, seed=7)
    again.set_epoch(1)
    assert keys_of(again) == epoch1
    assert keys_of(ShardDataset(dest, shuffle_buffer=30, seed=8)) != epoch0
    # the shard order itself changes between epochs, not only the buffer's mixing
    order1 = dataset.shards_for(WorkerSlot())
    dataset.set_epoch(0)
    assert dataset.shards_for(WorkerSlot()) != order1 and sorted(order1) == sorted(dataset.shard_urls)


def test_sources_as_list_brace_pattern_and_single_shard(tmp_path):
    dest, keys = make_dataset(tmp_path)
    shards = sorted(str(p) for p in dest.glob("*.tar"))
    assert keys_of(ShardDataset(shards, shuffle=False)) == keys
    pattern = str(dest / f"data-{{000000..{len(shards) - 1:06d}}}.tar")
    assert keys_of(ShardDataset(pattern, shuffle=False)) == keys
    assert keys_of(ShardDataset("file://" + shards[0], shuffle=False)) == keys[:10]
    assert ShardDataset(dest).num_samples == 120 and ShardDataset(shards).num_samples == 120  # by their tables


def test_dataloader_workers_split_shards_and_read_every_sample_once(tmp_path):
    dest, keys = make_dataset(tmp_path)
    dataset = ShardDataset(
        dest, shuffle_buffer=16, decode=lambda s: {**s, "worker": torch.utils.data.get_worker_info().id}
    )
    loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None)
    seen = list(loader)
    assert sorted(s["__key__"] for s in seen) == sorted(keys)
    shards_by_worker = [{s["__shard__"] for s in seen if s["worker"] == w} for w in (0, 1)]
    assert shards_by_worker[0] and shards_by_worker[1] and not shards_by_worker[0] & shards_by_worker[1]


def test_ranks_from_torchrun_environment_split_the_shards(tmp_path, monkeypatch):
    dest, keys = make_dataset(tmp_path)
    per_rank = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        per_rank.append(keys_of(ShardDataset(dest, shuffle_buffer=8)))
    assert sorted(sum(per_rank, [])) == sorted(keys)
    assert all(len(k) == 40 for k in per_rank)  # 12 shards of 10 over 3 ranks


def jpeg_bytes(width=320, height=240) -> bytes:
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture
def image_dataset(tmp_path) -> Path:
    src = tmp_path / "img"
    src.mkdir()
    (src / "a.jpg").write_bytes(jpeg_bytes())
    (src / "a.cls").write_bytes(b"7")
    (src / "a.json").write_bytes(b'{"w": 320}')
    (src / "a.txt").write_bytes("caf\u00e9".encode())
    (src / "a.bin").write_bytes(b"\x00\x01")
    pack(src, tmp_path / "ds", progress=False)
    return tmp_path / "ds"


def test_named_decoders(image_dataset):
    (s,) = ShardDataset(image_dataset, decode="numpy")
    assert s["jpg"].shape == (240, 320, 3) and s["jpg"].dtype == np.uint8
    assert (s["cls"], s["json"], s["txt"], s["bin"]) == (7, {"w": 320}, "caf\u00e9", b"\x00\x01")
    (s,) = ShardDataset(image_dataset, decode="torch")
    assert s["jpg"].shape == (3, 240, 320) and s["jpg"].dtype == torch.uint8
    (s,) = ShardDataset(image_dataset, decode="pil")
    assert s["jpg"].size == (320, 240) and s["jpg"].mode == "RGB"
    decoder = CpuDecoder("torch", crop=RandomResizedCrop(size_px=224))
    (s,) = ShardDataset(image_dataset, decode=decoder)
    assert s["jpg"].shape == (3, 224, 224)
    with pytest.raises(ValueError, match="decode='jpeg' must be None, a callable, or one of"):
        ShardDataset(image_dataset, decode="jpeg")


def test_undecodable_member_names_shard_key_and_extension(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "broken.jpg").write_bytes(b"not a jpeg")
    pack(src, tmp_path / "ds", progress=False)
    with pytest.raises(DecodeError, match=r"data-000000.tar: sample 'broken', member 'jpg': cannot decode"):
        list(ShardDataset(tmp_path / "ds", decode="numpy"))


@pytest.mark.parametrize(("width", "height"), [(301, 300), (300, 301), (1001, 999), (457, 1023), (224, 224)])
def test_random_resized_crop_decodes_any_jpeg_size(width, height):
    import random

    data = jpeg_bytes(width, height)
    crop = RandomResizedCrop(size_px=64)
    rng = random.Random(1)
    for _ in range(300):
        assert crop(data, rng).size == (64, 64)


@pytest.mark.parametrize(("width", "height"), [(301, 300), (1001, 999), (457, 1023), (224, 224)])
def test_random_resized_crop_tensor_matches_the_pillow_path(width, height):
    """The torch-resized crop is the same crop as the Pillow one, within a few levels."""
    import random

    import numpy as np
    import torch

    y, x = np.mgrid[0:height, 0:width]
    smooth = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], axis=-1)
    buf = io.BytesIO()
    Image.fromarray(smooth.astype(np.uint8)).save(buf, format="JPEG", quality=95)
    data = buf.getvalue()
    crop = RandomResizedCrop(size_px=64)
    for seed in range(30):
        tensor = crop.tensor(data, random.Random(seed))
        assert tensor.shape == (3, 64, 64) and tensor.dtype == torch.uint8
        reference = np.asarray(crop(data, random.Random(seed))).astype(int)
        difference = np.abs(tensor.permute(1, 2, 0).numpy().astype(int) - reference)
        assert difference.mean() < 3 and np.percentile(difference, 99) < 40


def test_random_resized_crop_stays_inside_the_image():
    import random

    crop = RandomResizedCrop(size_px=224)
    rng = random.Random(0)
    for width, height in [(500, 375), (100, 1000), (1000, 100), (224, 224)]:
        for _ in range(200):
            left, top, right, bottom = crop.box(width, height, rng)
            assert 0 <= left < right <= width and 0 <= top < bottom <= height


def test_missing_index_and_missing_shard_are_named(tmp_path):
    with pytest.raises(ShardNotFoundError, match=r"nowhere/index.bin: no index here; pass a directory"):
        ShardDataset(tmp_path / "nowhere")
    missing = tmp_path / "data-000000.tar"
    with pytest.raises(ShardNotFoundError, match=rf"{missing}: no such shard file"):
        list(ShardDataset([str(missing)]))


def test_truncated_shard_is_reported_with_its_url(tmp_path):
    dest, _ = make_dataset(tmp_path)
    shard = dest / "data-000003.tar"
    shard.write_bytes(shard.read_bytes()[:1500])
    with pytest.raises(CorruptShardError, match=rf"{shard}: .*(ends early|truncated)"):
        list(ShardDataset(dest, shuffle=False))


def test_a_shard_that_disagrees_with_the_index_is_reported(tmp_path):
    dest, _ = make_dataset(tmp_path)
    other, _ = make_dataset(tmp_path / "other", num_samples=9, per_shard=9)
    (dest / "data-000002.tar").write_bytes((other / "data-000000.tar").read_bytes())  # a valid tar, 9 samples
    with pytest.raises(CorruptShardError, match=r"data-000002.tar: is \d+ bytes but the index says \d+"):
        list(ShardDataset(dest, shuffle=False))


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"shuffle_buffer": -1}, "shuffle_buffer=-1"), ({"seed": "x"}, "seed='x'")]
)
def test_bad_arguments(tmp_path, kwargs, message):
    dest, _ = make_dataset(tmp_path, num_samples=3)
    with pytest.raises(ValueError, match=message):
        ShardDataset(dest, **kwargs)
    with pytest.raises(ValueError, match="epoch=-1"):
        ShardDataset(dest).set_epoch(-1)


def test_cpu_decoder_scales_16_bit_images_and_converts_every_mode_to_rgb():
    """Pillow's own convert("RGB") turns a 16-bit grey PNG white; the decoder keeps its top
    byte (as DALI does). Palette and alpha images come out RGB (H, W, 3) uint8."""
    grey16 = (np.arange(48 * 32, dtype=np.uint16).reshape(32, 48) * 40).astype(np.uint16)
    decoder = CpuDecoder("numpy")
    for image, expected in [
        (Image.fromarray(grey16), np.repeat((grey16 >> 8).astype(np.uint8)[..., None], 3, -1)),
        (Image.new("RGBA", (48, 32), (10, 20, 30, 0)), np.full((32, 48, 3), (10, 20, 30), np.uint8)),
        (Image.new("P", (48, 32), 7), None),
    ]:
        out = io.BytesIO()
        image.save(out, "PNG")
        decoded = decoder({"__key__": "a", "png": out.getvalue()})["png"]
        assert decoded.shape == (32, 48, 3) and decoded.dtype == np.uint8
        if expected is not None:
            assert np.array_equal(decoded, expected)
