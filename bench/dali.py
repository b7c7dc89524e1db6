"""Decode + augmentation throughput: DALI (GPU when present, else CPU) against Pillow in
DataLoader workers, on the same shards.

Both paths do the same work per image: JPEG decode, a random resized crop to ``--crop-px``
and a tensor of the batch. Pillow runs shardstream's ``CpuDecoder`` (draft-mode decode, crop,
torch antialiased resize) in ``--threads`` DataLoader workers; DALI runs
``shardstream.dali.DaliLoader`` (``image_random_crop`` + resize + flip + normalise) with
``--threads`` CPU threads, on the GPU (``mixed`` decoder) when torch and DALI see one. On a
GPU machine the DALI path is also timed with shards streamed from a local S3 server
(SeaweedFS), and the GPU's memory in use is printed. Each path reads one warm-up epoch, then
the best of ``--repeat`` timed epochs is kept (DaliLoader's reading workers, ``--dali-workers``,
persist across epochs: they are forked in the warm-up epoch, as in training). The DALI loaders
of ``--dali-workers`` are timed in interleaved rounds (one epoch of each a round), beside a
second in-process loader whose ratio to the first is the run's noise; the target row (fed by
workers against fed in-process) is the median of the rounds' paired ratios, 1.00x or more.
A last DALI row feeds the same loader the epoch's bytes from memory: the pipeline's own
rate, the ceiling for any feed. The corpus is the benchmark's photo JPEGs
(``bench/corpus.py``).

Usage:
    python bench/dali.py [--num-images 2000] [--batch-size 64] [--crop-px 224] [--threads 2] [--repeat 2] [--s3]
                          [--dali-workers 0,1,2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from corpus import photo_corpus, write_file_list
from timing import best_rate, interleaved_rates, paired_ratios

from shardstream import CpuDecoder, RandomResizedCrop, ShardDataset, pack
from shardstream.dali import DaliLoader, gpu_available


def pillow_epoch(source: str, args: argparse.Namespace) -> Callable[[], Iterable[int]]:
    from torch.utils.data import DataLoader

    decoder = CpuDecoder("torch", crop=RandomResizedCrop(size_px=args.crop_px))
    loader = DataLoader(
        ShardDataset(source, decode=decoder, batch_size=args.batch_size),
        batch_size=args.batch_size,
        num_workers=args.threads,
    )
    return lambda: (len(batch["jpg"]) for batch in loader)


def dali_epoch(
    source: str, args: argparse.Namespace, device_id: int | None, workers: int, s3: object = None
) -> Callable[[], Iterable[int]]:
    dataset = ShardDataset(source, s3=s3, batch_size=args.batch_size)
    loader = DaliLoader(
        dataset,
        batch_size=args.batch_size,
        crop_px=args.crop_px,
        num_threads=args.threads,
        device_id=device_id,
        num_workers=workers,
    )
    return lambda: (len(labels) for _, labels in loader)


def dali_memory_epoch(source: str, args: argparse.Namespace, device_id: int | None) -> Callable[[], Iterable[int]]:
    """The same DaliLoader with its reader swapped for the epoch's samples (bytes, label) held
    in memory: what the DALI pipeline does when feeding costs nothing (the feed's ceiling)."""
    dataset = ShardDataset(source)
    loader = DaliLoader(
        dataset, batch_size=args.batch_size, crop_px=args.crop_px, num_threads=args.threads, device_id=device_id
    )
    items = list(loader._items())  # bytes and labels, each image checked once here
    loader._items = lambda keep=False: iter(items)  # type: ignore[method-assign]
    return lambda: (len(labels) for _, labels in loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--crop-px", type=int, default=224)
    parser.add_argument("--threads", type=int, default=2, help="DataLoader workers for Pillow, DALI CPU threads")
    parser.add_argument("--repeat", type=int, default=2, help="timed epochs (rounds) of each path, >= 1")
    parser.add_argument("--s3", action="store_true", help="also time DALI from S3 (always on a GPU)")
    parser.add_argument(
        "--dali-workers", default="0", help="DaliLoader num_workers (processes reading shards); a comma list times each"
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    gpu = gpu_available()
    device_id = 0 if gpu else None
    where = torch.cuda.get_device_name(0) if gpu else f"CPU ({os.cpu_count()} cores; DALI device_id=None)"
    print(
        f"device: {where}; {args.num_images} images, batches of {args.batch_size}, crop {args.crop_px} px, "
        f"{args.threads} threads/workers"
    )
    corpus = photo_corpus(args.num_images, processes=min(8, os.cpu_count() or 1))
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-dali-") as tmp:
        local = f"{tmp}/shards"
        files = write_file_list(corpus, Path(tmp, "files.txt"))
        pack(corpus, local, max_shard_bytes=64 << 20, files_from=files, progress=False)
        rows.append(
            (
                f"Pillow CpuDecoder, {args.threads} DataLoader workers, local",
                best_rate(pillow_epoch(local, args), args.repeat),
            )
        )
        free_before = torch.cuda.mem_get_info(0)[0] if gpu else 0
        kind = "mixed (GPU)" if gpu else "CPU"
        workers = [int(w) for w in args.dali_workers.split(",")]
        # with workers 0: a second in-process loader, timed in the same rounds (the run's noise)
        timed = [*workers, 0] if 0 in workers else workers
        rates = interleaved_rates([dali_epoch(local, args, device_id, w) for w in timed], args.repeat)
        for w, runs in zip(workers, rates):
            rows.append((f"DALI {kind}, {w} reading workers, local", max(runs)))
        gpu_used = (free_before - torch.cuda.mem_get_info(0)[0]) if gpu else 0
        rows.append(
            (
                f"DALI {kind}, bytes in memory (no reading: the ceiling)",
                best_rate(dali_memory_epoch(local, args, device_id), args.repeat),
            )
        )
        if gpu or args.s3:
            from shardstream.testing import SeaweedS3Server

            with SeaweedS3Server() as server:
                server.create_bucket("bench")
                info = server.info
                s3 = info.s3_config()
                pack(corpus, "s3://bench/shards", max_shard_bytes=64 << 20, files_from=files, s3=s3, progress=False)
                rate = best_rate(dali_epoch("s3://bench/shards", args, device_id, workers[-1], s3), args.repeat)
                rows.append((f"DALI {kind}, {workers[-1]} reading workers, S3 (local SeaweedFS)", rate))
    print(f"\n{'path':60s} {'images/s':>10s}")
    for label, rate in rows:
        print(f"{label:60s} {rate:10.0f}")
    print(f"\nDALI / Pillow (local): {max(rate for _, rate in rows[1 : 1 + len(workers)]) / rows[0][1]:.2f}x")
    if 0 in workers:  # issue 28: fed by workers, no slower than fed in-process
        inproc = rates[workers.index(0)]
        noise = paired_ratios(rates[-1], inproc)
        print(
            f"DALI {kind} in-process / in-process again, {len(noise)} paired epochs (the noise): median "
            f"{statistics.median(noise):.3f}x, {min(noise):.3f}-{max(noise):.3f}x"
        )
        for w, runs in zip(workers, rates):
            if w:
                ratios = paired_ratios(runs, inproc)
                ratio = statistics.median(ratios)
                verdict = "met" if ratio >= 1.0 else "NOT met"
                few = "" if len(ratios) >= 5 else f"  (only {len(ratios)} rounds: use --repeat 8)"
                print(
                    f"DALI {kind} fed by {w} workers / fed in-process, {len(ratios)} paired epochs: median "
                    f"{ratio:.3f}x ({min(ratios):.3f}-{max(ratios):.3f}x)  target >= 1.00x  {verdict}{few}"
                )
    if gpu:
        print(f"GPU memory taken by the DALI loaders of the run (all open at once): {gpu_used / 2**20:.0f} MiB")
    print("command: python bench/dali.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
