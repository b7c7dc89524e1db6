"""Streaming read speed: shardstream against WebDataset, Mosaic Streaming and LitData, in one run.

Three corpora (bench/corpus.py), each read by every reader that applies to it:
  - ``photos``: JPEGs of 60-150 KB cut from real photos, a ``.cls`` label each (~1 GB at
    the default 10,000): every reader below, raw and decoding, local and S3;
  - ``small``: the same kind of JPEGs at ~240 x 200 px (~17 KB) and a label, 120,000 samples
    (~2.1 GB, so a run's start-up, reported as first sample, is a small part of it):
    raw local reading (``cat``, shardstream, WebDataset) and shardstream through a
    DataLoader with ``batch_size=None`` against ``batch_size=64`` (what crossing from the
    workers one sample at a time costs);
  - ``tiny``: 200,000 files of 100 bytes, one member a sample: raw local reading.
``--dir`` reads a directory laid out like the photo corpus instead of the three.

Each corpus is packed once per system with that system's own writer, all with the same
shard size (64 MiB, the peers' default): shardstream ``pack`` (to local disk, and to S3 by
itself), webdataset ``ShardWriter``, Mosaic ``MDSWriter`` and LitData ``optimize`` (written
locally, then uploaded as they are). S3 is one local SeaweedFS server started here. The
peers' conversions are cached under ~/.cache/shardstream-bench/stream-TAG-SHARDMiB;
shardstream packs anew every run. All members are stored as bytes in every format.

Every reader runs in its own subprocess (``--_reader NAME``), one at a time, on the same
machine; each peer's download cache is a fresh empty directory, so every S3 run downloads.
Reported per reader: samples/s; MB/s of payload (JPEG + label bytes; the limits: bytes read);
time to first sample, from dataset construction (after imports, the S3 library of each system
included: boto3, aiobotocore) to the first sample or batch (the limits: first bytes, from client
creation); the reader's CPU seconds (user + system of its process, and of its DataLoader workers)
split there (the keep floors: at their first bytes, as the limits, see ``mark_steady``):
start-up, from the process's start to its first sample (interpreter, imports, client and
dataset construction, the first sample; the bench's reading of its setup file left out),
reported on its own; and steady, from there to the end, per GB of the bytes read after the
first sample and per 1,000 samples after it, which unlike a rate does not move with how much of
the cores the S3 server leaves it, nor with the corpus's size;
peak RSS of its main process (VmHWM, read by the process itself) and of its whole process
tree (sum of RSS sampled every 0.2 s; pages shared by forked workers count once per process).
Raw readers also count damaged samples (a JPEG without its start or end marker).
``--pin`` (a diagnostic; the targets are read unpinned): each reader on CPU 0 alone and the S3
server on CPU 1 while the readers run, so shardstream's two threads (event loop and consumer)
share one CPU as the keep floor's one thread has it: what is left is the reader's own work
(bench/http_read.py's ``--pin`` says why the two differ unpinned).

Raw reading (one process, no decoding; one byte of every 4 KiB of each sample's payload read):
  - limits: ``cat`` of the shard files to /dev/null; concurrent aiobotocore GETs of shardstream's
    shard objects, bytes discarded, swept over 8 x 16 MiB, 16 x 8 MiB and 32 x 4 MiB in flight
    (``s3-limit``, ``s3-limit-16x8``, ``s3-limit-32x4``) with asyncio's socket reads of 256 KiB,
    and 8 x 16 MiB with shardstream's growing to 2 MiB (``s3-limit-2m``), timed from client
    creation as shardstream is from construction; the rate targets take the fastest of the
    sweep (shardstream >= 0.9x its samples/s, on photos and small);
  - ``s3-keep``, the keep floor: the 8 x 16 MiB GETs of ``s3-limit-2m`` with each body kept
    until it is whole and every member inside it copied out as bytes by the index (one byte of
    every 4 KiB read): the least any reader does that hands out sample bytes; the CPU targets
    are against it (shardstream's steady CPU per GB <= 1.15x its, on photos and small), the
    limits' CPU is shown beside them (no target);
  - ``s3-threads``, ``s3-threads-16``, ``s3-threads-keep`` and ``s3-threads-keep-fresh``: the
    same GETs made another way, which shardstream does not use: 8 or 16 threads, each with one
    ``http.client`` connection and presigned URLs, each body received straight into the
    thread's reused 16 MiB buffer (``readinto``: the kernel's copy is the only one, made with
    the GIL released; ``-fresh``: into a new anonymous memory map each, as a reader holding
    parts until they are consumed would without a pool of buffers), then discarded or, with
    ``-keep``, copied out as ``s3-keep`` does. They are the floors of a receive path that
    bypasses aiohttp's (no target);
  - shardstream ``ShardDataset(shuffle=False)`` from local disk and from s3://; from s3:// also
    with asyncio's socket reads of 256 KiB (``s3-shardstream-256k``), as shardstream read before
    its reads grew to 2 MiB where they fill: what that gains, in the same run (no target);
  - WebDataset from local files, from S3 via ``pipe:aws s3 cp URL -`` (awscli), and via a
    gopen handler streaming boto3 ``get_object`` bodies;
  - Mosaic ``StreamingDataset`` and LitData ``StreamingDataset``, from local disk and s3://.

Decoding (JPEG decode + RandomResizedCrop to 224 x 224 + CHW uint8 tensor, shuffled, from S3,
a torch DataLoader with 2 workers and batches of 64): shardstream with its ``CpuDecoder``
(Pillow, draft mode); WebDataset (boto3 handler), Mosaic and LitData with Pillow and a
torchvision-equivalent RandomResizedCrop (crop, then bilinear resize). Baseline: shardstream's
``CpuDecoder`` on the same JPEG bytes held in memory, in 2 forked processes; loader overhead =
1 - loader images/s / in-memory images/s. ``decode-memory-loader`` puts the same in-memory
bytes through the same DataLoader (2 workers, batches of 64, collate, shared memory), which
splits that overhead into what any DataLoader costs and what reading from S3 adds.

A run that passes ``--cap-s`` seconds stops there and is marked ``capped`` (rate over what it
read). The best of ``--repeat`` runs is shown (highest samples/s, lowest steady CPU per GB,
lowest first-sample time, each from the run where it was best; highest RSS). Then the targets
are printed as met / NOT met, and a bar chart of samples/s is saved as a PNG. These machines are
noisy: compare the ratios, which come from one run. On 2 cores the S3 server shares the CPU with
the readers, so S3 numbers include its cost (the table's "S3 srv cores": the server's CPU
seconds per second of the run, set-up included). Each reader's output goes to
~/.cache/shardstream-bench/stream-logs/NAME-RUN.log.

Usage:
    python bench/stream.py [--corpora photos,small,tiny] [--num-images 10000] [--num-small 120000]
                           [--num-tiny 200000] [--dir DIR] [--repeat 2] [--skip-peers] [--png PATH]
                           [--shard-mib 64] [--cap-s 60] [--readers NAME,...] [--pin]

``--dir`` takes a directory laid out like the photo corpus: ``<key>.jpg`` (+ ``<key>.cls``)
files, the same members in every sample. A whole node (ranks x DataLoader workers) is
measured by bench/node.py.

Dependencies: ``pip install -e '.[bench]'``, then the two peers without their dependencies:

    pip install --no-deps mosaicml-streaming==0.13.0 litdata==0.2.76

Both peers declare torchvision, whose PyPI wheels do not import beside the CPU torch 2.13 here
("operator torchvision::nms does not exist"), and mosaicml-streaming pins numpy<2.2 (pip would
downgrade numpy); the ``bench`` extra holds the dependencies they do import. awscli >= 1.46
vendors its own botocore, so it leaves the botocore that aiobotocore pins alone.

Workarounds, each needed to run a peer here at all:
  - Mosaic's ``import streaming`` imports its ``streaming.vision`` datasets, which need
    torchvision: an empty ``streaming.vision`` module is registered first (nothing here uses
    those datasets).
  - Mosaic 0.13.0 keeps the boto3 client that read index.json in the parent; forked DataLoader
    workers inherit its pooled connection, and their shard downloads interleave on that one
    socket into damaged shards of the right size (here: JPEGs Pillow cannot open, in about a
    third of the runs). The Mosaic decode reader drops that client before the workers start,
    so each opens its own.
  - LitData 0.2.76 builds its obstore S3 client without ``allow_http``, which an ``http://``
    endpoint such as the local server needs ("builder error"), and has no option for it: the
    LitData readers set it in ``litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import importlib.machinery
import io
import json
import math
import os
import random
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from corpus import CACHE, aio_client, boto3_client, import_mosaic, photo_corpus, small_corpus, tiny_corpus, write_once
from floors import (
    _FIRST,
    IMAGE_EXT,
    Progress,
    mark_first,
    read_cat,
    read_s3_keep,
    read_s3_limit,
    read_s3_threads,
    touched,
)
from pack import tree_rss_bytes
from procs import pin_tree, process_cpu_s, rusage_cpu_s
from report import Result, print_table, print_targets, run_cpu_s_per_gb

BUCKET = "bench"
CROP_PX = 224
BATCH = 64
WORKERS = 2
RESULT_TAG = "BENCH-RESULT "
PEER_INSTALL = "pip install --no-deps mosaicml-streaming==0.13.0 litdata==0.2.76"


# ---------------------------------------------------------------- the corpus and its conversions


@dataclass(frozen=True)
class Setup:
    """Everything a reader subprocess needs; written as JSON by the parent."""

    root: str  # the corpus directory
    samples: list[tuple[str, dict[str, str]]]  # (key, {extension: path relative to root})
    local: dict[str, str]  # system -> local directory of its shards
    endpoint_url: str
    access_key_id: str
    secret_access_key: str
    region_name: str
    scratch: str  # where readers put their download caches
    cap_s: float
    corpus: str  # its objects lie under s3://BUCKET/CORPUS/SYSTEM, so corpora of one run do not meet

    def s3_prefix(self, system: str) -> str:
        return f"{self.corpus}/{system}"

    def fields(self) -> list[str]:
        """The members every sample holds, by extension (the first sample's)."""
        return list(self.samples[0][1])

    @property
    def bucket(self) -> str:
        return BUCKET

    def s3_url(self, system: str) -> str:
        return f"s3://{BUCKET}/{self.s3_prefix(system)}"

    def shard_names(self, system: str, suffix: str) -> list[str]:
        return sorted(p.name for p in Path(self.local[system]).iterdir() if p.name.endswith(suffix))

    def s3_config(self) -> Any:
        from shardstream import S3Config

        return S3Config(
            endpoint_url=self.endpoint_url,
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            region_name=self.region_name,
        )

    def aio_client(self) -> Any:
        return aio_client(self)  # bench/corpus.py's, as boto3_client below

    def boto3_client(self) -> Any:
        return boto3_client(self)  # bench/corpus.py's: a Setup names the server as its info does

    def storage_options(self) -> dict[str, str]:
        return {
            "endpoint_url": self.endpoint_url,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "region_name": self.region_name,
        }

    def fresh_cache(self, name: str) -> str:
        return tempfile.mkdtemp(prefix=f"{name}-", dir=self.scratch)


def split_key(relative: str) -> tuple[str, str]:
    """The WebDataset rule: the key ends at the first dot of the file name."""
    folder, _, name = relative.rpartition("/")
    stem, _, ext = name.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


CORPORA = ("photos", "small", "tiny")


def corpus_samples(corpus: str, args: argparse.Namespace) -> tuple[Path, list[tuple[str, dict[str, str]]], str]:
    """(root, samples in sorted path order, cache tag or "" for --dir) of a corpus.

    ``photos``: the first ``--num-images`` images of the smallest cached photo corpus that has
    that many (``photo_corpus`` makes image ``i`` the same whatever its size), else a new one;
    ``small``: ``--num-small`` JPEGs of ~18 KB and a label each; ``tiny``: ``--num-tiny``
    files of 100 bytes, one member a sample; ``dir``: ``--dir``.
    """
    if corpus == "dir":
        root, tag = Path(args.dir).resolve(), ""

        def wanted(name: str) -> bool:
            return not name.startswith(".")
    elif corpus == "photos":
        sizes = sorted(int(p.name.split("-")[1]) for p in CACHE.glob("photos-*-0") if (p / ".complete").exists())
        size = next((s for s in sizes if s >= args.num_images), None)
        root = CACHE / f"photos-{size}-0" if size else photo_corpus(args.num_images)
        tag = f"photos{args.num_images}"

        def wanted(name: str) -> bool:
            return not name.startswith(".") and int(name.split(".")[0]) < args.num_images
    else:
        root = small_corpus(args.num_small) if corpus == "small" else tiny_corpus(args.num_tiny)
        tag = root.name

        def wanted(name: str) -> bool:
            return not name.startswith(".")

    relatives = sorted(
        os.path.relpath(os.path.join(folder, name), root)
        for folder, _, names in os.walk(root)
        for name in names
        if wanted(name)
    )
    samples: dict[str, dict[str, str]] = {}
    for relative in relatives:
        key, ext = split_key(relative)
        samples.setdefault(key, {})[ext] = relative
    members = {tuple(sorted(m)) for m in samples.values()}
    if len(members) != 1 or (corpus != "tiny" and IMAGE_EXT not in next(iter(members))):
        raise SystemExit(f"{root}: every sample needs the same members, one of them .{IMAGE_EXT}; found {members}")
    return root, list(samples.items()), tag


def read_member(root: str, members: dict[str, str]) -> dict[str, bytes]:
    return {ext: Path(root, relative).read_bytes() for ext, relative in members.items()}


def write_wds(setup: Setup, out: Path, shard_bytes: int) -> None:
    import webdataset as wds

    with wds.ShardWriter(str(out / "wds-%06d.tar"), maxsize=shard_bytes, maxcount=10**9, verbose=0) as sink:
        for key, members in setup.samples:
            sink.write({"__key__": key, **read_member(setup.root, members)})


def write_mds(setup: Setup, out: Path, shard_bytes: int) -> None:
    mds_writer = import_mosaic().MDSWriter
    columns = {ext: "bytes" for ext in setup.samples[0][1]}
    with mds_writer(out=str(out), columns=columns, size_limit=shard_bytes, compression=None) as sink:
        for _, members in setup.samples:
            sink.write(read_member(setup.root, members))


def litdata_item(item: tuple[str, dict[str, str]]) -> dict[str, bytes]:
    """LitData ``optimize`` fn: (root, members) -> the sample (module level, so workers can pickle it)."""
    return read_member(*item)


def write_litdata(setup: Setup, out: Path, shard_bytes: int) -> None:
    from litdata import optimize

    optimize(
        fn=litdata_item,
        inputs=[(setup.root, members) for _, members in setup.samples],
        output_dir=str(out),
        chunk_bytes=shard_bytes,
        num_workers=WORKERS,
        verbose=False,
    )


PEER_WRITERS: dict[str, Callable[[Setup, Path, int], None]] = {
    "wds": write_wds,
    "mds": write_mds,
    "litdata": write_litdata,
}


def convert_peer(setup: Setup, system: str, folder: Path, shard_bytes: int) -> float:
    """Write ``system``'s copy of the corpus into ``folder`` unless it is there; returns seconds spent."""
    return write_once(folder, lambda partial: PEER_WRITERS[system](setup, partial, shard_bytes))


def upload_tree(setup: Setup, folder: Path, prefix: str) -> None:
    """PUT every file under ``folder`` (but ``.complete``) to ``s3://BUCKET/CORPUS/prefix/``, 8 at a time."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != ".complete"]

    async def upload() -> None:
        async with setup.aio_client() as client:
            limit = asyncio.Semaphore(8)

            async def put(path: Path) -> None:
                async with limit:
                    await client.put_object(
                        Bucket=BUCKET,
                        Key=f"{setup.s3_prefix(prefix)}/{path.relative_to(folder).as_posix()}",
                        Body=path.read_bytes(),
                    )

            await asyncio.gather(*(put(p) for p in files))

    asyncio.run(upload())


# ---------------------------------------------------------------- the readers (run in subprocesses)


def vm_hwm_bytes() -> int:
    """This process's peak resident memory (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def read_shardstream(source: str, receive_bytes: int | None = None) -> Callable[[Setup], Progress]:
    """``ShardDataset(shuffle=False)`` over shardstream's shards; ``receive_bytes``: the most a
    socket read grows to (:data:`~shardstream.storage.requests.RECEIVE_BYTES`; 256 KiB: reads
    stay asyncio's, as shardstream's were before they grew)."""

    def read(setup: Setup) -> Progress:
        from shardstream import ShardDataset
        from shardstream.storage import requests

        if receive_bytes is not None:
            requests.RECEIVE_BYTES = receive_bytes

        url = setup.s3_url("shardstream") if source == "s3" else setup.local["shardstream"]
        yield from touched(ShardDataset(url, shuffle=False, s3=setup.s3_config()), setup.fields())

    return read


def boto3_gopen(setup: Setup) -> None:
    """Teach webdataset's ``gopen`` to open ``s3://`` URLs as streaming boto3 bodies."""
    from webdataset.gopen import gopen_schemes

    client = setup.boto3_client()

    def open_s3(url: str, mode: str = "rb", bufsize: int = 8192, **_: Any) -> Any:
        bucket, _, key = url.removeprefix("s3://").partition("/")
        return client.get_object(Bucket=bucket, Key=key)["Body"]

    gopen_schemes["s3"] = open_s3


def wds_urls(setup: Setup, how: str) -> list[str]:
    names = setup.shard_names("wds", ".tar")
    if how == "local":
        return [str(Path(setup.local["wds"], n)) for n in names]
    if how == "pipe":
        return [f"pipe:aws s3 cp --only-show-errors {setup.s3_url('wds')}/{n} -" for n in names]
    boto3_gopen(setup)
    return [f"{setup.s3_url('wds')}/{n}" for n in names]


def read_wds(how: str) -> Callable[[Setup], Progress]:
    def read(setup: Setup) -> Progress:
        import webdataset as wds

        yield from touched(wds.WebDataset(wds_urls(setup, how), shardshuffle=False, empty_check=False), setup.fields())

    return read


def clean_mosaic_shm(setup: Setup) -> None:
    """Mosaic's advice against shared memory left behind by an earlier, killed run."""
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()


def mosaic_dataset(setup: Setup, source: str, cls: type | None = None, **kwargs: Any) -> Any:
    streaming = import_mosaic()
    if source == "s3":
        location = {"remote": setup.s3_url("mds"), "local": setup.fresh_cache("mosaic")}
    else:
        location = {"local": setup.local["mds"]}
    return (cls or streaming.StreamingDataset)(**location, **kwargs)


def read_mosaic(source: str) -> Callable[[Setup], Progress]:
    def read(setup: Setup) -> Progress:
        yield from touched(mosaic_dataset(setup, source, shuffle=False, batch_size=BATCH), setup.fields())

    return read


def litdata_dataset(setup: Setup, source: str, cls: type | None = None, **kwargs: Any) -> Any:
    import litdata
    from litdata.streaming import downloader

    # LitData builds its obstore S3 client without allow_http, so an http:// endpoint fails
    # with "builder error"; it has no setting for that, hence this patch (module doc).
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    if source == "s3":
        location = {
            "input_dir": setup.s3_url("litdata"),
            "cache_dir": setup.fresh_cache("litdata"),
            "storage_options": setup.storage_options(),
        }
    else:
        location = {"input_dir": setup.local["litdata"]}
    return (cls or litdata.StreamingDataset)(**location, **kwargs)


def read_litdata(source: str) -> Callable[[Setup], Progress]:
    def read(setup: Setup) -> Progress:
        yield from touched(litdata_dataset(setup, source, shuffle=False), setup.fields())

    return read


def crop_params(width: int, height: int, rng: Any) -> tuple[int, int, int, int]:
    """torchvision ``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3): (top, left, h, w)."""
    area, log_ratio = width * height, (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    if width / height < 3 / 4:
        w, h = width, round(width / (3 / 4))
    elif width / height > 4 / 3:
        w, h = round(height * 4 / 3), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def pillow_decode(sample: dict[str, Any]) -> dict[str, Any]:
    """What a peer's user writes: Pillow decode, torchvision-style crop + resize, CHW uint8 tensor."""
    import numpy as np
    import torch
    from PIL import Image

    image = Image.open(io.BytesIO(sample[IMAGE_EXT])).convert("RGB")
    top, left, h, w = crop_params(image.width, image.height, random)
    image = image.crop((left, top, left + w, top + h)).resize((CROP_PX, CROP_PX), Image.Resampling.BILINEAR)
    out = {IMAGE_EXT: torch.from_numpy(np.array(image)).permute(2, 0, 1)}
    if "cls" in sample:
        out["cls"] = int(sample["cls"])
    return out


def batches(dataset: Any, loader: type | None = None) -> Progress:
    from torch.utils.data import DataLoader

    for batch in (loader or DataLoader)(dataset, batch_size=BATCH, num_workers=WORKERS):
        yield len(batch[IMAGE_EXT]), 0, 0


def decode_shardstream(setup: Setup) -> Progress:
    from shardstream import ShardDataset
    from shardstream.decode import CpuDecoder, RandomResizedCrop

    decoder = CpuDecoder(image="torch", crop=RandomResizedCrop(size_px=CROP_PX))
    yield from batches(ShardDataset(setup.s3_url("shardstream"), shuffle=True, decode=decoder, s3=setup.s3_config()))


def decode_wds(setup: Setup) -> Progress:
    import webdataset as wds

    dataset = wds.WebDataset(wds_urls(setup, "boto3"), shardshuffle=100, empty_check=False).shuffle(1000)
    yield from batches(dataset.map(pillow_decode))


def decode_mosaic(setup: Setup) -> Progress:
    streaming = import_mosaic()

    class Decoded(streaming.StreamingDataset):
        def __getitem__(self, index: int) -> dict[str, Any]:
            return pillow_decode(super().__getitem__(index))

    dataset = mosaic_dataset(setup, "s3", Decoded, shuffle=True, batch_size=BATCH)
    # Mosaic keeps the boto3 client that fetched index.json here; forked DataLoader workers
    # inherit it and share its pooled connection, and their downloads interleave on that
    # socket into damaged shards. Dropping the client makes each worker open its own.
    for stream in dataset.streams:
        stream._downloader.clean_up()
    yield from batches(dataset)


def decode_litdata(setup: Setup) -> Progress:
    import litdata

    class Decoded(litdata.StreamingDataset):
        def __getitem__(self, index: Any) -> dict[str, Any]:
            return pillow_decode(super().__getitem__(index))

    yield from batches(litdata_dataset(setup, "s3", Decoded, shuffle=True), litdata.StreamingDataLoader)


_IN_MEMORY: list[dict[str, bytes]] = []  # filled before the pool forks


def preload(setup: Setup) -> None:
    _IN_MEMORY[:] = [read_member(setup.root, members) for _, members in setup.samples]


def _decode_share(share: int, draft: bool = True) -> int:
    from shardstream.decode import CpuDecoder, RandomResizedCrop

    decoder = CpuDecoder(image="torch", crop=RandomResizedCrop(size_px=CROP_PX, draft=draft))
    for sample in _IN_MEMORY[share::WORKERS]:
        decoder(sample)
    return len(_IN_MEMORY[share::WORKERS])


def decode_in_memory(draft: bool) -> Callable[[Setup], Progress]:
    """shardstream's CpuDecoder over the preloaded bytes in 2 forked processes: the decode
    limit; with ``draft=False`` each JPEG is decoded at full size (what Pillow's DCT scaling
    saves)."""

    def read(setup: Setup) -> Progress:
        import functools
        import multiprocessing

        mark_first(timed=False)  # its samples come at once, at the end: steady from the pool's start
        with multiprocessing.get_context("fork").Pool(WORKERS) as pool:
            yield sum(pool.map(functools.partial(_decode_share, draft=draft), range(WORKERS))), 0, 0

    return read


class _MemoryShares:
    """An IterableDataset over the preloaded samples, split by DataLoader worker (built lazily:
    torch is imported only in readers that use it)."""

    def __new__(cls) -> Any:
        from torch.utils.data import IterableDataset, get_worker_info

        from shardstream.decode import CpuDecoder, RandomResizedCrop

        class Shares(IterableDataset):
            def __iter__(self) -> Any:
                info = get_worker_info()
                share, count = (info.id, info.num_workers) if info else (0, 1)
                decoder = CpuDecoder(image="torch", crop=RandomResizedCrop(size_px=CROP_PX))
                return (decoder(sample) for sample in _IN_MEMORY[share::count])

        return Shares()


def decode_memory_loader(setup: Setup) -> Progress:
    """The same decoder over the preloaded bytes, through the same DataLoader (2 workers,
    batches, collate, shared-memory transfer): what a DataLoader costs before any reading."""
    yield from batches(_MemoryShares())


def batched_loader(setup: Setup, *, bytes_collate: bool, persistent: bool = False) -> tuple[Any, Any]:
    """``(dataset, loader)``: shardstream over the local shards through a DataLoader with 2
    workers and batches of 64, collated by torch's default collate (pickled) or by
    ``ByteCollate`` (one shared-memory block)."""
    from torch.utils.data import DataLoader

    from shardstream import ShardDataset
    from shardstream.collate import ByteCollate

    dataset = ShardDataset(setup.local["shardstream"], shuffle=False, batch_size=BATCH)
    collate = {"collate_fn": ByteCollate()} if bytes_collate else {}
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, persistent_workers=persistent, **collate)
    return dataset, loader


def batch_progress(batch: Any) -> tuple[int, int, int]:
    """A batch's samples and payload bytes (each member touched), as a default-collated dict
    of lists or a ``ByteBatch``."""
    payload = sum(len(v) for field, values in batch.items() if not field.startswith("__") for v in values)
    return len(batch["__key__"]), payload, 0


def read_loader(batched: bool) -> Callable[[Setup], Progress]:
    """shardstream from local disk through a DataLoader with 2 workers: samples cross one at
    a time (``batch_size=None``: each pickled on its own) or in batches of 64 collated in the
    worker (the way to use it)."""

    def read(setup: Setup) -> Progress:
        from torch.utils.data import DataLoader

        from shardstream import ShardDataset

        if batched:
            yield from map(batch_progress, batched_loader(setup, bytes_collate=False)[1])
        else:
            dataset = ShardDataset(setup.local["shardstream"], shuffle=False)
            yield from touched(DataLoader(dataset, batch_size=None, num_workers=WORKERS), setup.fields())

    return read


def read_loader_bytes(setup: Setup) -> Progress:
    """As ``read_loader(True)``, the batches collated by ``ByteCollate``: the payloads (JPEG
    and label bytes, as there) in one shared-memory block, not pickled."""
    yield from map(batch_progress, batched_loader(setup, bytes_collate=True)[1])


_WARM: dict[str, Any] = {}  # the warmed loader of a ``*-epochs`` reader (its process runs one reader)


def warm_loader(bytes_collate: bool) -> Callable[[Setup], None]:
    """Untimed: the batched loader with persistent workers (default collate or ``ByteCollate``)
    and its first epoch read, the workers' start in it."""

    def prepare(setup: Setup) -> None:
        dataset, loader = batched_loader(setup, bytes_collate=bytes_collate, persistent=True)
        for _ in loader:
            pass
        _WARM.update(loader=loader, dataset=dataset)

    return prepare


def read_warm_loader(setup: Setup) -> Progress:
    """Epochs 2 to 5 of the warmed loader: the rate a training loop sees once its workers run
    (the rate of bytes through the DataLoader; the workers' start, ~40 ms for either collate,
    is no rate)."""
    loader, dataset = _WARM["loader"], _WARM["dataset"]
    for epoch in (1, 2, 3, 4):
        dataset.set_epoch(epoch)
        yield from map(batch_progress, loader)


@dataclass(frozen=True)
class Reader:
    label: str
    system: str  # shardstream, webdataset, mosaic, litdata, limit
    group: str  # raw or decode
    source: str  # s3, local or memory
    read: Callable[[Setup], Progress]
    imports: tuple[str, ...] = ()  # imported before the clock starts ("streaming": Mosaic, module doc)
    prepare: Callable[[Setup], None] | None = None  # untimed work before ``read``
    corpora: tuple[str, ...] = ("photos", "dir")  # the corpora it runs on


def s3_floor(label: str, read: Callable[[Setup], Progress], imports: tuple[str, ...]) -> Reader:
    """A plain-GET reader of shardstream's S3 objects (a limit or floor, module doc)."""
    return Reader(label, "limit", "raw", "s3", read, imports, corpora=("photos", "dir", "small"))


SS, WDS, WDS_S3 = ("shardstream.dataset",), ("webdataset",), ("webdataset", "boto3")
SS_S3 = (*SS, "aiobotocore.session")  # each system's S3 library is imported before the clock, as boto3 is
MOSAIC, LITDATA = ("streaming",), ("litdata", "litdata.streaming.downloader")
LOADER = ("torch.utils.data", "numpy", "PIL.Image", "shardstream.decode")
EVERY = ("photos", "dir", "small", "tiny")
READERS = {
    **{
        f"s3-limit{suffix}": s3_floor(
            f"aiobotocore {inflight}x{part_mib}MiB ranged GETs{', reads to 2 MiB' if wide else ''}",
            functools.partial(read_s3_limit, inflight=inflight, range_bytes=part_mib << 20, wide_reads=wide),
            ("aiobotocore.session", "shardstream.storage.requests"),
        )
        for suffix, inflight, part_mib, wide in (
            ("", 8, 16, False),
            ("-16x8", 16, 8, False),
            ("-32x4", 32, 4, False),
            ("-2m", 8, 16, True),
        )
    },
    "s3-keep": s3_floor(
        "keep floor: 8x16MiB, 2 MiB reads, copied",
        read_s3_keep,
        ("aiobotocore.session", "numpy", "shardstream.index", "shardstream.storage.requests"),
    ),
    **{
        f"s3-threads{suffix}": s3_floor(
            f"http.client {threads} threads x 16MiB readinto{label}", reader, ("boto3", "numpy", "shardstream.index")
        )
        for suffix, threads, label, reader in (
            ("", 8, "", read_s3_threads),
            ("-16", 16, "", functools.partial(read_s3_threads, threads=16)),
            ("-keep", 8, ", payloads copied", functools.partial(read_s3_keep, threaded=True)),
            (
                "-keep-fresh",
                8,
                " (a new buffer each), payloads copied",
                functools.partial(read_s3_keep, threaded=True, fresh=True),
            ),
        )
    },
    "s3-shardstream": Reader(
        "shardstream", "shardstream", "raw", "s3", read_shardstream("s3"), SS_S3, corpora=("photos", "dir", "small")
    ),
    "s3-shardstream-256k": Reader(
        "shardstream, 256 KiB socket reads",
        "shardstream",
        "raw",
        "s3",
        read_shardstream("s3", receive_bytes=256 << 10),
        SS_S3,
        corpora=("photos", "dir", "small"),
    ),
    "s3-wds-pipe": Reader("webdataset pipe:aws s3 cp", "webdataset", "raw", "s3", read_wds("pipe"), WDS),
    "s3-wds-boto3": Reader("webdataset boto3 gopen", "webdataset", "raw", "s3", read_wds("boto3"), WDS_S3),
    "s3-mosaic": Reader("mosaic streaming", "mosaic", "raw", "s3", read_mosaic("s3"), MOSAIC, clean_mosaic_shm),
    "s3-litdata": Reader("litdata", "litdata", "raw", "s3", read_litdata("s3"), LITDATA),
    "local-cat": Reader("cat > /dev/null", "limit", "raw", "local", read_cat, corpora=EVERY),
    "local-shardstream": Reader(
        "shardstream", "shardstream", "raw", "local", read_shardstream("local"), SS, corpora=EVERY
    ),
    "local-wds": Reader("webdataset", "webdataset", "raw", "local", read_wds("local"), WDS, corpora=EVERY),
    "loader-unbatched": Reader(
        "shardstream, DataLoader batch_size=None",
        "shardstream",
        "loader",
        "local",
        read_loader(False),
        SS + LOADER,
        corpora=("small",),
    ),
    "loader-batched": Reader(
        "shardstream, DataLoader batch_size=64",
        "shardstream",
        "loader",
        "local",
        read_loader(True),
        SS + LOADER,
        corpora=("small",),
    ),
    "loader-bytes": Reader(
        "shardstream, DataLoader batch_size=64, ByteCollate",
        "shardstream",
        "loader",
        "local",
        read_loader_bytes,
        SS + LOADER + ("shardstream.collate",),
        corpora=("small",),
    ),
    "loader-batched-epochs": Reader(
        "shardstream, DataLoader batch_size=64, persistent workers, epochs 2-5",
        "shardstream",
        "loader",
        "local",
        read_warm_loader,
        SS + LOADER,
        warm_loader(False),
        corpora=("small",),
    ),
    "loader-bytes-epochs": Reader(
        "shardstream, DataLoader batch_size=64, ByteCollate, persistent workers, epochs 2-5",
        "shardstream",
        "loader",
        "local",
        read_warm_loader,
        SS + LOADER + ("shardstream.collate",),
        warm_loader(True),
        corpora=("small",),
    ),
    "local-mosaic": Reader(
        "mosaic streaming", "mosaic", "raw", "local", read_mosaic("local"), MOSAIC, clean_mosaic_shm
    ),
    "local-litdata": Reader("litdata", "litdata", "raw", "local", read_litdata("local"), LITDATA),
    "decode-memory": Reader(
        "CpuDecoder, bytes in memory", "limit", "decode", "memory", decode_in_memory(True), LOADER, preload
    ),
    "decode-memory-full": Reader(
        "CpuDecoder, bytes in memory, no draft", "limit", "decode", "memory", decode_in_memory(False), LOADER, preload
    ),
    "decode-memory-loader": Reader(
        "CpuDecoder, bytes in memory, DataLoader", "limit", "decode", "memory", decode_memory_loader, LOADER, preload
    ),
    "decode-shardstream": Reader(
        "shardstream CpuDecoder", "shardstream", "decode", "s3", decode_shardstream, SS_S3 + LOADER
    ),
    "decode-wds": Reader("webdataset boto3 + Pillow", "webdataset", "decode", "s3", decode_wds, WDS_S3 + LOADER),
    "decode-mosaic": Reader(
        "mosaic streaming + Pillow", "mosaic", "decode", "s3", decode_mosaic, MOSAIC + LOADER, clean_mosaic_shm
    ),
    "decode-litdata": Reader("litdata + Pillow", "litdata", "decode", "s3", decode_litdata, LITDATA + LOADER),
}


def reader_main(name: str, setup_path: str, cpu: int | None = None) -> None:
    """Subprocess mode: run one reader, print its measurements as one JSON line.

    Its CPU is split where its first sample (a limit: its first bytes) is in hand
    (:func:`mark_first`): start-up, the process's CPU seconds from its start to there
    (interpreter, imports, ``prepare``, dataset or client construction, the first sample),
    less the bench's own reading of its setup file; steady, from there to the end, its
    DataLoader workers' included, with the samples and bytes read after that point.

    Torch's threads are limited by OMP_NUM_THREADS=1 from the parent (importing torch here
    would add its memory to readers that do not use it). ``cpu``: the process runs on that CPU
    alone (``--pin``).
    """
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    harness_cpu = rusage_cpu_s(resource.RUSAGE_SELF)
    setup = Setup(**json.loads(Path(setup_path).read_text()))
    harness_cpu = rusage_cpu_s(resource.RUSAGE_SELF) - harness_cpu  # the bench's, not the reader's start-up
    reader = READERS[name]
    samples = nbytes = damaged = 0
    capped = False
    for module in reader.imports:
        import_mosaic() if module == "streaming" else importlib.import_module(module)
    if reader.prepare is not None:
        reader.prepare(setup)
    started = time.perf_counter()
    at_start = {"self_cpu": rusage_cpu_s(resource.RUSAGE_SELF), "children_cpu": rusage_cpu_s(resource.RUSAGE_CHILDREN)}
    progress = reader.read(setup)
    for count, size, bad in progress:
        if count:
            mark_first(count, size)  # the first sample (once); a limit has marked its first bytes
        samples, nbytes, damaged = samples + count, nbytes + size, damaged + bad
        if time.perf_counter() - started > setup.cap_s:
            capped = True
            break
    seconds = time.perf_counter() - started
    self_cpu = rusage_cpu_s(resource.RUSAGE_SELF)
    progress.close()  # its DataLoader workers exit and are reaped: their CPU counts too
    children_cpu = rusage_cpu_s(resource.RUSAGE_CHILDREN)
    # Nothing read: no first sample, steady from construction.
    mark = {"at": None, **_FIRST} if _FIRST else {**at_start, "at": None, "samples": 0, "bytes": 0}
    result = {
        "samples": samples,
        "bytes": nbytes,
        "seconds": seconds,
        "first_s": None if mark["at"] is None else mark["at"] - started,
        "capped": capped,
        "damaged": damaged,
        "vm_hwm": vm_hwm_bytes(),
        "startup_cpu_s": mark["self_cpu"] + mark["children_cpu"] - harness_cpu,
        "cpu_s": self_cpu - mark["self_cpu"] + children_cpu - mark["children_cpu"],  # steady
        "steady_samples": samples - mark["samples"],
        "steady_bytes": nbytes - mark["bytes"],
    }
    print(RESULT_TAG + json.dumps(result), flush=True)


# ---------------------------------------------------------------- the parent: run, tabulate, judge


def run_reader(
    name: str, setup_path: Path, env: dict[str, str], log: Path, cap_s: float, server_pid: int, cpu: int | None = None
) -> dict[str, Any] | str:
    """Run reader ``name`` in a subprocess logging to ``log`` (on CPU ``cpu`` alone, if given);
    its measurements (with the S3 server's CPU seconds meanwhile), or why there are none."""
    server_cpu_s = process_cpu_s(server_pid)
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, __file__, "--_reader", name, "--_setup", str(setup_path)]
            + ([] if cpu is None else ["--_cpu", str(cpu)]),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + cap_s + 120  # imports, setup and teardown
    tree_peak = 0
    while process.poll() is None and time.monotonic() < deadline:
        tree_peak = max(tree_peak, tree_rss_bytes(process.pid)[0])
        if RESULT_TAG in log.read_text(errors="replace"):
            deadline = min(deadline, time.monotonic() + 20)  # measured; its teardown gets 20 s
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # a hung teardown, or helpers left behind
    process.wait()
    lines = log.read_text(errors="replace").splitlines()
    for line in lines:
        if line.startswith(RESULT_TAG):
            return {
                **json.loads(line[len(RESULT_TAG) :]),
                "tree_peak": tree_peak,
                "server_cpu_s": process_cpu_s(server_pid) - server_cpu_s,
            }
    last = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
    return f"exit code {process.returncode}: {last[:200]} (log: {log})"


def peer_problems(skip_peers: bool) -> dict[str, str]:
    """Systems that cannot run here, and why."""
    if skip_peers:
        return {s: "--skip-peers" for s in ("webdataset", "mosaic", "litdata")}
    problems = {}
    for system, load in (("mosaic", import_mosaic), ("litdata", lambda: __import__("litdata"))):
        try:
            load()
        except Exception as exc:  # noqa: BLE001 - any import failure keeps that peer out
            problems[system] = f"cannot import ({type(exc).__name__}: {exc}); {PEER_INSTALL}"
    return problems


def save_chart(results: dict[str, Result], sizes: dict[str, tuple[int, int]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "shardstream": "tab:blue",
        "webdataset": "tab:orange",
        "mosaic": "tab:green",
        "litdata": "tab:red",
        "limit": "tab:gray",
    }
    headings = {
        "raw": "raw reading, 1 process (samples/s)",
        "loader": f"DataLoader, {WORKERS} workers (samples/s)",
        "decode": f"decode + crop {CROP_PX}, {WORKERS} workers (images/s)",
    }
    groups = [
        (corpus, group)
        for corpus in sizes
        for group in headings
        if any(r.runs and r.corpus == corpus and r.reader.group == group for r in results.values())
    ]
    rows_of = {g: [r for r in results.values() if (r.corpus, r.reader.group) == g and r.runs] for g in groups}
    figure, axes = plt.subplots(
        len(groups),
        1,
        figsize=(10, 2 + 0.4 * sum(len(v) for v in rows_of.values())),
        height_ratios=[len(rows_of[g]) for g in groups],
        squeeze=False,
    )
    for axis, (corpus, group) in zip(axes[:, 0], groups):
        rows = rows_of[(corpus, group)]
        num_samples, payload_bytes = sizes[corpus]
        labels = [f"{r.reader.source}: {r.reader.label}" for r in rows]
        values = [r.samples_per_s(num_samples) for r in rows]
        bars = axis.barh(labels, values, color=[colors[r.reader.system] for r in rows])
        axis.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=3, fontsize=8)
        axis.invert_yaxis()
        axis.set_xscale("log" if group == "raw" and len(rows) > 1 else "linear")
        axis.set_title(
            f"{corpus} ({payload_bytes / max(num_samples, 1) / 1e3:.1f} KB samples): {headings[group]}", fontsize=10
        )
        axis.tick_params(axis="y", labelsize=8)
        axis.margins(x=0.15)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", type=int, default=10_000, help="photos of the photo corpus")
    parser.add_argument(
        "--num-small", type=int, default=120_000, help="samples of the small-JPEG corpus (~2.1 GB at the default)"
    )
    parser.add_argument("--num-tiny", type=int, default=200_000, help="100-byte files of the tiny corpus")
    parser.add_argument("--corpora", default=",".join(CORPORA), help=f"comma-separated subset of {', '.join(CORPORA)}")
    parser.add_argument("--dir", help="use this directory's files instead of the corpora")
    parser.add_argument("--repeat", type=int, default=2, help="runs per reader; the best is shown")
    parser.add_argument("--skip-peers", action="store_true", help="only shardstream and the limits")
    parser.add_argument("--png", help="bar chart path (default: ~/.cache/shardstream-bench/stream.png)")
    parser.add_argument("--shard-mib", type=int, default=64, help="shard / chunk size of every system")
    parser.add_argument("--cap-s", type=float, default=60.0, help="stop a run after this many seconds")
    parser.add_argument("--readers", help=f"comma-separated subset of: {', '.join(READERS)}")
    parser.add_argument("--_reader", help=argparse.SUPPRESS)
    parser.add_argument(
        "--pin",
        action="store_true",
        help="a diagnostic: each reader on CPU 0 alone, the S3 server on CPU 1 while readers run (see above)",
    )
    parser.add_argument("--_setup", help=argparse.SUPPRESS)
    parser.add_argument("--_cpu", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._reader:
        reader_main(args._reader, args._setup, args._cpu)
        return
    if args.pin and not {0, 1} <= os.sched_getaffinity(0):
        parser.error(
            f"--pin puts readers on CPU 0 and the server on CPU 1; this process may use {os.sched_getaffinity(0)}"
        )

    from shardstream.testing import SeaweedS3Server

    corpora = ["dir"] if args.dir else args.corpora.split(",")
    problems = peer_problems(args.skip_peers)
    if not args.skip_peers and not Path(sys.executable).with_name("aws").exists() and not shutil.which("aws"):
        problems["s3-wds-pipe"] = "no aws CLI (pip install awscli)"
    for system, why in problems.items():
        print(f"left out: {system}: {why}")
    results: dict[str, Result] = {}
    sizes: dict[str, tuple[int, int]] = {}  # corpus -> (samples, payload bytes)
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-stream-") as scratch, SeaweedS3Server() as server:
        server.create_bucket(BUCKET)
        logs = CACHE / "stream-logs"  # kept after the run, to read why a reader failed
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir(parents=True)
        for corpus in corpora:
            results.update(run_corpus(corpus, args, problems, server, Path(scratch) / corpus, logs, sizes))
    print(f"\nshards/chunks of {args.shard_mib} MiB; best of {args.repeat} run(s), each in its own process")
    print_table(results, sizes)
    print_targets(results, sizes)
    png = Path(args.png) if args.png else CACHE / "stream.png"
    save_chart(results, sizes, png, f"shardstream vs peers: local SeaweedFS S3 and local disk, {os.cpu_count()} cores")
    print(f"\nchart: {png}")
    print(f"command: {shlex.join(['python', *sys.argv])}")


def run_corpus(
    corpus: str,
    args: argparse.Namespace,
    problems: dict[str, str],
    server: Any,
    tmp: Path,
    logs: Path,
    sizes: dict[str, tuple[int, int]],
) -> dict[str, Result]:
    """Pack one corpus for every system that reads it, run its readers; results keyed
    ``corpus:reader``."""
    from shardstream import pack

    root, samples, tag = corpus_samples(corpus, args)
    relatives = [r for _, members in samples for r in members.values()]
    payload_bytes = sum(os.path.getsize(root / r) for r in relatives)
    sizes[corpus] = (len(samples), payload_bytes)
    print(
        f"\n{corpus}: {len(samples)} samples ({len(relatives)} files, {payload_bytes / 1e6:.0f} MB) from {root}; "
        "warming the page cache ...",
        flush=True,
    )
    subprocess.run(
        ["xargs", "-0", "cat"], input="\0".join(relatives).encode(), cwd=root, stdout=subprocess.DEVNULL, check=True
    )
    shard_bytes = args.shard_mib << 20
    wanted = args.readers.split(",") if args.readers else list(READERS)
    chosen = {
        n: r
        for n, r in READERS.items()
        if n in wanted and corpus in r.corpora and r.system not in problems and n not in problems
    }
    info = server.info
    peer_root = CACHE / f"stream-{tag}-{args.shard_mib}MiB" if tag else tmp / "peers"
    needed = {r.system for r in chosen.values()}
    peers = [s for s, system in (("wds", "webdataset"), ("mds", "mosaic"), ("litdata", "litdata")) if system in needed]
    (tmp / "caches").mkdir(parents=True)
    setup = Setup(
        root=str(root),
        samples=samples,
        local={"shardstream": str(tmp / "shardstream"), **{s: str(peer_root / s) for s in peers}},
        endpoint_url=info.endpoint_url,
        access_key_id=info.access_key_id,
        secret_access_key=info.secret_access_key,
        region_name=info.region_name,
        scratch=str(tmp / "caches"),
        cap_s=args.cap_s,
        corpus=corpus,
    )
    files_from = tmp / "files.txt"
    files_from.write_text("".join(f"{r}\n" for r in relatives))
    on_s3 = any(r.source == "s3" for r in chosen.values())
    for dest in (setup.local["shardstream"], *([f"{setup.s3_url('shardstream')}"] if on_s3 else [])):
        started = time.perf_counter()
        pack(root, dest, max_shard_bytes=shard_bytes, files_from=files_from, s3=setup.s3_config(), progress=False)
        print(f"shardstream pack -> {dest}: {time.perf_counter() - started:.1f} s", flush=True)
    for system in peers:
        seconds = convert_peer(setup, system, peer_root / system, shard_bytes)
        made = f"converted in {seconds:.1f} s" if seconds else "cached"
        if on_s3:
            started = time.perf_counter()
            upload_tree(setup, peer_root / system, system)
            made += f", uploaded in {time.perf_counter() - started:.1f} s"
        print(f"{system}: {made} at {peer_root / system}", flush=True)
    setup_path = tmp / "setup.json"
    setup_path.write_text(json.dumps(asdict(setup)))
    env = {
        **os.environ,
        **info.env(),
        "S3_ENDPOINT_URL": info.endpoint_url,
        "AWS_EC2_METADATA_DISABLED": "true",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    results = {n: Result(r, corpus) for n, r in chosen.items()}
    if args.pin:  # the corpora packed on both CPUs; the readers' runs pinned
        pin_tree(server.pid, {1})
    for repeat in range(args.repeat):
        for name in chosen:
            print(f"run {repeat + 1}/{args.repeat}: {corpus} {name} ...", end=" ", flush=True)
            log = logs / f"{corpus}-{name}-{repeat + 1}.log"
            run = run_reader(name, setup_path, env, log, args.cap_s, server.pid, 0 if args.pin else None)
            shutil.rmtree(setup.scratch, ignore_errors=True)  # every run downloads anew
            Path(setup.scratch).mkdir()
            if isinstance(run, str):
                results[name].error = run
                results[name].failures += 1
                print(f"failed: {run}", flush=True)
            else:
                results[name].add(run)
                results[name].round_cpu_s_per_gb[repeat] = run_cpu_s_per_gb(run, len(samples), sizes[corpus][1])
                print(f"{run['seconds']:.1f} s, {run['samples']} samples", flush=True)
    if args.pin:  # the next corpus packs on both CPUs again
        pin_tree(server.pid, set(range(os.cpu_count() or 1)))
    for name, r in results.items():
        if r.runs and r.samples != len(samples) and r.reader.system != "limit" and not r.capped:
            print(f"note: {corpus} {name} read {r.samples} samples, the dataset has {len(samples)}")
    counts = ", ".join(
        f"{s} {len([p for p in Path(d).iterdir() if p.suffix in ('.tar', '.mds', '.bin')])}"
        for s, d in setup.local.items()
    )
    print(f"{corpus}: shards/chunks: {counts}")
    return {f"{corpus}:{n}": r for n, r in results.items()}


if __name__ == "__main__":
    main()
