"""Raw bytes through DataLoader workers: ``ByteCollate`` against torch's default collate, in one run.

Issue 28's target: raw bytes through ``DataLoader(num_workers=2)`` at 3x or more the pickled
rate (torch's default collate) on the small corpus, in the same run. The corpus is
``bench/corpus.py``'s small one (30,000 JPEGs of ~17 KB and a ``.cls`` label each, ~515 MB),
packed by ``shardstream.pack`` into 64 MiB shards on local disk, which stay in the page cache.
Every loader reads ``ShardDataset(shuffle=False, batch_size=64)`` with
``DataLoader(num_workers=2)``, persistent workers unless said:

  - ``default``: torch's default collate (a batch is pickled through the workers' pipe);
  - ``default again``: a second, identical loader: the ratio of the two is the run's noise;
  - ``ByteCollate as collate_fn``: ``shardstream.collate.ByteCollate`` as the DataLoader's
    ``collate_fn`` (a batch's payloads in a worker's shared-memory slot; its name and layout
    are pickled);
  - ``default, fresh workers``: torch's default collate with ``persistent_workers=False``
    (torch's default), whose workers are forked and joined in every epoch's time;
  - ``ShardDataset(collate=ByteCollate())`` through ``DataLoader(batch_size=None)``: each
    worker reads a batch straight from the shard files into its slot (``FileRun``).

Each loader reads one untimed epoch (its persistent workers start there), then ``--rounds``
rounds are timed: one epoch of each loader a round, in an order rotated every round
(``timing.interleaved_rates``), so the machine's drift falls on all of them alike and the
rates of a round are compared pair by pair. The consumer counts each batch's samples and
takes every payload's length, as a training loop hands them on (no decoding). Printed: each
loader's median and best rate (samples/s and GB/s of payload); CPU seconds per epoch of the
training process and of its workers (``/proc``) and the training process's voluntary
context switches per epoch (``getrusage``: how often it blocked), medians over the rounds;
the median and range of the paired ratios; and a target row for each ``ByteCollate`` way
against ``default``: the median paired ratio, 3.00x or more. The from-construction rates (workers' start included) are
``bench/stream.py``'s ``loader-batched`` and ``loader-bytes`` readers.

Usage:
    python bench/collate.py [--num-small 30000] [--rounds 9] [--batch-size 64] [--workers 2] [--prefetch-factor 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from corpus import small_corpus, write_file_list
from procs import process_cpu_s, processes
from timing import interleaved_rates, paired_ratios, ratio_summary

from shardstream import ShardDataset, pack
from shardstream.collate import ByteCollate

TARGET = 3.0


def children_cpu_s() -> float:
    """CPU seconds of this process's children (the DataLoaders' workers): those alive and
    those reaped. The children are read from ``/proc/self/task/PID/children`` (the main
    thread's: the DataLoaders fork their workers there), else from the process table."""
    me = os.getpid()
    try:
        with open(f"/proc/self/task/{me}/children") as f:
            pids = [int(pid) for pid in f.read().split()]
    except OSError:
        pids = [pid for pid, proc in processes().items() if proc.ppid == me]
    alive = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # it ended meanwhile: counted as reaped, or soon
            alive += process_cpu_s(pid)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return alive + reaped.ru_utime + reaped.ru_stime


class Loader:
    """One timed loader: its epochs (a count of samples a batch), payload bytes and CPU."""

    def __init__(self, label: str, source: str, args: argparse.Namespace, *, collate: str, persistent: bool = True):
        """``collate``: "default" (torch's), "bytes" (``ByteCollate`` as the DataLoader's
        ``collate_fn``) or "dataset" (``ShardDataset(collate=ByteCollate())``, the batches
        made by the dataset, ``DataLoader(batch_size=None)``)."""
        from torch.utils.data import DataLoader

        self.label = label
        in_dataset = {"collate": ByteCollate()} if collate == "dataset" else {}
        self.dataset = ShardDataset(source, shuffle=False, batch_size=args.batch_size, **in_dataset)
        collate_fn = {"collate_fn": ByteCollate()} if collate == "bytes" else {}
        self.loader = DataLoader(
            self.dataset,
            batch_size=None if in_dataset else args.batch_size,
            num_workers=args.workers,
            persistent_workers=persistent,
            prefetch_factor=args.prefetch_factor,
            timeout=120,  # a stuck worker is an error, not a hang
            **collate_fn,
        )
        self.epoch_number = 0
        self.payload_bytes = 0
        self.main_cpu_s: list[float] = []
        self.workers_cpu_s: list[float] = []
        self.switches: list[int] = []  # the training process's voluntary context switches

    def epoch(self) -> Iterator[int]:
        self.epoch_number += 1
        self.dataset.set_epoch(self.epoch_number)
        workers = children_cpu_s()  # first: reading them is not the training process's CPU
        switches, main = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw, time.process_time()
        payload = 0
        for batch in self.loader:
            payload += sum(len(v) for field, values in batch.items() if not field.startswith("__") for v in values)
            yield len(batch["__key__"])
        self.main_cpu_s.append(time.process_time() - main)
        self.switches.append(resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches)
        self.workers_cpu_s.append(children_cpu_s() - workers)
        self.payload_bytes = payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-small", type=int, default=30_000, help="samples of the small-JPEG corpus")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (one epoch of each loader), >= 1")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader num_workers of every loader")
    parser.add_argument("--prefetch-factor", type=int, default=2, help="DataLoader prefetch_factor of every loader")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    corpus = small_corpus(args.num_small)
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-collate-") as tmp:
        source = f"{tmp}/shards"
        files = write_file_list(corpus, Path(tmp, "files.txt"))
        pack(corpus, source, max_shard_bytes=64 << 20, files_from=files, progress=False)
        loaders = [
            Loader("default collate (pickled), persistent workers", source, args, collate="default"),
            Loader("the same again (the noise)", source, args, collate="default"),
            Loader("ByteCollate as collate_fn, persistent workers", source, args, collate="bytes"),
            Loader("default collate, workers forked each epoch", source, args, collate="default", persistent=False),
            Loader("ShardDataset(collate=ByteCollate()), persistent", source, args, collate="dataset"),
        ]
        epochs: list[Callable[[], Any]] = [loader.epoch for loader in loaders]
        rates = interleaved_rates(epochs, args.rounds)
    print(
        f"\n{args.num_small} samples ({loaders[0].payload_bytes / 1e6:.0f} MB of payload) an epoch, "
        f"DataLoader(num_workers={args.workers}, batch_size={args.batch_size}, "
        f"prefetch_factor={args.prefetch_factor}), {args.rounds} rounds, {os.cpu_count()} cores\n"
    )
    print(
        f"{'loader':48s} {'median/s':>9s} {'best/s':>9s} {'GB/s':>6s} {'CPU s/epoch: main':>18s} {'workers':>8s} "
        f"{'main vol. switches/epoch':>25s}"
    )
    for loader, runs in zip(loaders, rates):
        timed = slice(1, None)  # the warm-up epoch's CPU is not a round's
        main_s, workers_s = statistics.median(loader.main_cpu_s[timed]), statistics.median(loader.workers_cpu_s[timed])
        print(
            f"{loader.label:48s} {statistics.median(runs):9.0f} {max(runs):9.0f} "
            f"{statistics.median(runs) * loader.payload_bytes / args.num_small / 1e9:6.2f} "
            f"{main_s:18.3f} {workers_s:8.3f} {statistics.median(loader.switches[timed]):25.0f}"
        )
    default, again, byte_collate, fresh, in_dataset = rates
    print(f"\ndefault again / default (the noise):                 {ratio_summary(paired_ratios(again, default))}")
    print(f"ByteCollate as collate_fn / default, fresh workers:  {ratio_summary(paired_ratios(byte_collate, fresh))}")
    print(f"ShardDataset(collate=) / default, fresh workers:     {ratio_summary(paired_ratios(in_dataset, fresh))}")
    over = ratio_summary(paired_ratios(in_dataset, byte_collate))
    print(f"ShardDataset(collate=) / ByteCollate as collate_fn:  {over}")
    few = "" if args.rounds >= 5 else f"  (only {args.rounds} rounds: use --rounds 9)"
    ways = (("ByteCollate as collate_fn", byte_collate), ("ShardDataset(collate=ByteCollate())", in_dataset))
    for label, runs in ways:
        ratios = paired_ratios(runs, default)
        ratio = statistics.median(ratios)
        print(
            f"{label} / default collate, {len(ratios)} paired epochs: {ratio_summary(ratios)}  "
            f"target >= {TARGET:.2f}x  {'met' if ratio >= TARGET else 'NOT met'}{few}"
        )
    print("command: python bench/collate.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
