"""Benchmark corpora, generated once and cached.

- :func:`photo_corpus`: JPEGs of 60-150 KB cut from real photographs: the colour photos that
  scikit-image ships in its wheel (astronaut, chelsea, coffee, rocket, motorcycles, ...).
  The wheel is fetched with ``pip download`` (no install) and only its images are read.
  Each JPEG is a random crop, scale, flip and quality of one photo, one class per source
  photo and directory, so neighbouring files are alike, as in real datasets.
- :func:`small_corpus`: the same kind of JPEGs at about 200 x 200 px (~18 KB): a web-scale
  image-text dataset's thumbnails.
- :func:`tiny_corpus`: many 100-byte files, 1,000 per directory.
- :func:`write_once`: a peer's copy of a corpus written once into a folder and kept.
- :func:`import_mosaic`: Mosaic Streaming imported without its torchvision datasets.
- :func:`upload_tree`: such a folder PUT to a bucket, 4 files at a time; :func:`boto3_client`:
  the client for it, of a local S3 server.
"""

from __future__ import annotations

import importlib.machinery
import io
import os
import random
import shutil
import subprocess
import sys
import time
import types
import zipfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

CACHE = Path(os.environ.get("SHARDSTREAM_BENCH_CACHE", Path.home() / ".cache" / "shardstream-bench"))
PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "grass.png",
    "gravel.png",
    "brick.png",
    "color.png",
    "ihc.png",
    "logo.png",
)


def source_photos() -> list[Path]:
    """The real photographs, extracted from the scikit-image wheel into the cache."""
    folder = CACHE / "photos"
    if not all((folder / name).exists() for name in PHOTOS):
        wheels = CACHE / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        if not list(wheels.glob("scikit_image-*.whl")):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "-q",
                    "-d",
                    str(wheels),
                    "scikit-image==0.26.0",
                ],
                check=True,
            )
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(next(wheels.glob("scikit_image-*.whl"))) as wheel:
            for name in PHOTOS:
                (folder / name).write_bytes(wheel.read(f"skimage/data/{name}"))
    return [folder / name for name in PHOTOS]


PHOTO_PX = ((460, 700), (380, 580))  # (width range, height range) of photo_corpus's JPEGs
SMALL_PX = ((210, 280), (170, 240))  # small_corpus's


def _make_chunk(args: tuple[Path, int, int, int, tuple[tuple[int, int], tuple[int, int]]]) -> int:
    root, first, count, seed, (widths, heights) = args
    photos = [Image.open(p).convert("RGB") for p in source_photos()]
    grain = np.random.default_rng(seed).integers(-12, 13, (1024, 1024, 3), dtype=np.int16)
    total = 0
    for i in range(first, first + count):
        rng = random.Random(seed * 1_000_003 + i)
        label = i % len(photos)
        photo = photos[label]
        cw, ch = rng.randint(*widths), rng.randint(*heights)
        scale = max(rng.uniform(1.0, 2.0), cw / photo.width, ch / photo.height)
        sw, sh = min(cw / scale, photo.width), min(ch / scale, photo.height)  # the crop, in source pixels
        left, top = rng.uniform(0, max(0.0, photo.width - sw)), rng.uniform(0, max(0.0, photo.height - sh))
        image = photo.resize((cw, ch), Image.Resampling.BILINEAR, box=(left, top, left + sw, top + sh))
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        gy, gx = rng.randint(0, 1024 - ch), rng.randint(0, 1024 - cw)
        noisy = np.asarray(image, dtype=np.int16) + grain[gy : gy + ch, gx : gx + cw]
        image = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=rng.randint(85, 94))
        data = buf.getvalue()
        folder = root / f"class{label:02d}"
        (folder / f"{i:07d}.jpg").write_bytes(data)
        (folder / f"{i:07d}.cls").write_bytes(str(label).encode())
        total += len(data)
    return total


def photo_corpus(num_images: int, *, seed: int = 0, processes: int = 2) -> Path:
    """``num_images`` JPEGs (+ a ``.cls`` label each) under the cache; made once."""
    return _jpeg_corpus(CACHE / f"photos-{num_images}-{seed}", num_images, seed, PHOTO_PX, processes)


def small_corpus(num_images: int, *, seed: int = 0, processes: int = 2) -> Path:
    """``num_images`` small JPEGs (~18 KB, + a ``.cls`` label each) under the cache; made once."""
    return _jpeg_corpus(CACHE / f"small-{num_images}-{seed}", num_images, seed, SMALL_PX, processes)


def _jpeg_corpus(
    root: Path, num_images: int, seed: int, px: tuple[tuple[int, int], tuple[int, int]], processes: int
) -> Path:
    done = root / ".complete"
    if done.exists():
        return root
    for label in range(len(source_photos())):
        (root / f"class{label:02d}").mkdir(parents=True, exist_ok=True)
    step = 500
    chunks = [(root, first, min(step, num_images - first), seed, px) for first in range(0, num_images, step)]
    with ProcessPoolExecutor(processes) as pool:
        total = sum(pool.map(_make_chunk, chunks))
    done.write_text(str(total))
    return root


def write_file_list(corpus: Path, path: Path) -> Path:
    """``path`` made to list the corpus's members (relative paths, one a line, sorted): what
    ``pack(files_from=...)`` takes, without the corpus's ``.complete`` marker."""
    members = [p for p in sorted(corpus.rglob("*.*")) if p.suffix != "" and not p.name.startswith(".")]
    path.write_text("".join(f"{p.relative_to(corpus)}\n" for p in members))
    return path


def tiny_corpus(num_files: int, *, size_bytes: int = 100) -> Path:
    """``num_files`` files of ``size_bytes`` random bytes, 1,000 per directory; made once."""
    root = CACHE / f"tiny-{num_files}-{size_bytes}"
    done = root / ".complete"
    if done.exists():
        return root
    payload = os.urandom(size_bytes)
    for first in range(0, num_files, 1000):
        folder = root / f"d{first // 1000:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(first, min(first + 1000, num_files)):
            with open(folder / f"{i:07d}.bin", "wb") as f:
                f.write(payload)
    done.write_text(str(num_files))
    return root


def write_once(folder: Path, write: Callable[[Path], None]) -> float:
    """``write(partial)`` into ``folder`` unless a finished copy is there (its ``.complete``
    marker); the folder appears whole or not at all. Returns the seconds spent (0.0: kept)."""
    if (folder / ".complete").exists():
        return 0.0
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    started = time.perf_counter()
    write(partial)
    seconds = time.perf_counter() - started
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    (folder / ".complete").write_text(f"{seconds:.1f}")
    return seconds


def upload_tree(client: Any, folder: Path, bucket: str, prefix: str) -> None:
    """PUT every file under ``folder`` (but ``.complete``) to ``s3://bucket/prefix/`` with a
    boto3 ``client``, 4 at a time."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != ".complete"]

    def put(path: Path) -> None:
        with path.open("rb") as body:
            client.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(folder).as_posix()}", Body=body)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(put, files))


def _client_args(info: Any) -> dict[str, Any]:
    """The keywords both S3 client makers give for the local server ``info`` describes."""
    return {
        "endpoint_url": info.endpoint_url,
        "aws_access_key_id": info.access_key_id,
        "aws_secret_access_key": info.secret_access_key,
        "region_name": info.region_name,
    }


def boto3_client(info: Any, *, max_pool_connections: int = 8) -> Any:
    """A boto3 S3 client of the local server ``info`` describes (``SeaweedS3Server.info``)."""
    import boto3
    from botocore.config import Config

    config = Config(s3={"addressing_style": "path"}, max_pool_connections=max_pool_connections)
    return boto3.client("s3", **_client_args(info), config=config)


def aio_client(info: Any, *, max_pool_connections: int = 16) -> Any:
    """An aiobotocore S3 client of the local server ``info`` describes, to enter with ``async with``."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    config = AioConfig(s3={"addressing_style": "path"}, max_pool_connections=max_pool_connections)
    return get_session().create_client("s3", **_client_args(info), config=config)


def import_mosaic() -> types.ModuleType:
    """``import streaming`` with an empty ``streaming.vision``: it needs torchvision, which does
    not import beside the CPU torch here (bench/stream.py says more)."""
    if "streaming.vision" not in sys.modules:
        stub = types.ModuleType("streaming.vision")
        stub.__spec__ = importlib.machinery.ModuleSpec("streaming.vision", None)
        sys.modules["streaming.vision"] = stub
    import streaming

    return streaming
