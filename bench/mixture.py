"""What a mixture costs: three sources read as one ShardDataset mixture against the same three
datasets read one after another, in the same run, on the same files.

The sources are packed by shardstream from generated samples (a ``.bin`` of ``--sample-bytes``
random bytes and a ``.cls`` each): A of ``--samples`` samples, B of half as many, C of a
fifth. The mixture reads each whole once (``Source(..., repeat=1.0)``), so both ways read the
same samples; the difference is the interleaving (per-batch apportionment and the sources'
own lanes and shuffle buffers). A second mixture, A at weight 0.6, B 0.3 and C 2.0 repeats,
shows the same for a sub-sampled and a repeated source (its samples/s only: there is no
"one after another" twin of it).

Both ways run ``--rounds`` times alternately (machines here are noisy) in one process or
through a DataLoader with ``--workers``; the medians and their ratio are printed. Target: the
mixture within 5% of reading the sources one after another.

Usage:
    python bench/mixture.py [--samples 60000] [--sample-bytes 2000] [--rounds 5] [--workers 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_source(root: Path, name: str, num_samples: int, sample_bytes: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    src = root / f"src-{name}" / name
    src.mkdir(parents=True)
    for i in range(num_samples):
        (src / f"{i:07d}.bin").write_bytes(rng.bytes(sample_bytes))
        (src / f"{i:07d}.cls").write_text(str(i % 10))
    from shardstream import pack

    pack(src.parent, root / name, max_shard_bytes=8 << 20, progress=False)
    return root / name


def timed(make, workers: int, batch_size: int) -> tuple[float, int]:
    """Seconds to read every sample of the datasets ``make()`` returns, and the samples."""
    from torch.utils.data import DataLoader

    started = time.perf_counter()
    count = 0
    for dataset in make():
        if workers:
            loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=list)
            count += sum(len(batch) for batch in loader)
        else:
            count += sum(1 for _ in dataset)
    return time.perf_counter() - started, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=60000, help="samples of source A (B: half, C: a fifth)")
    parser.add_argument("--sample-bytes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    from shardstream import ShardDataset, Source

    with tempfile.TemporaryDirectory(prefix="shardstream-bench-mixture-") as tmp:
        root = Path(tmp)
        sizes = {"A": args.samples, "B": args.samples // 2, "C": args.samples // 5}
        started = time.perf_counter()
        paths = {
            name: make_source(root, name, n, args.sample_bytes, seed) for seed, (name, n) in enumerate(sizes.items())
        }
        total = sum(sizes.values())
        print(
            f"sources {sizes} ({args.sample_bytes} B samples) packed in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        common = {"shuffle_buffer": 1000, "seed": 0, "batch_size": args.batch_size}

        def one_after_another():
            return [ShardDataset(paths[name], **common) for name in sizes]

        def mixture():
            return [ShardDataset([Source(paths[name], name=name) for name in sizes], **common)]

        def weighted():
            return [
                ShardDataset(
                    [
                        Source(paths["A"], weight=0.6, name="A"),
                        Source(paths["B"], weight=0.3, name="B"),
                        Source(paths["C"], repeat=2.0, name="C"),
                    ],
                    epoch_samples=total,
                    **common,
                )
            ]

        results: dict[str, list[float]] = {"one after another": [], "mixture (each once)": [], "weighted mixture": []}
        ways = {"one after another": one_after_another, "mixture (each once)": mixture, "weighted mixture": weighted}
        for make in ways.values():  # warm the page cache, imports and each way's first pass
            timed(make, args.workers, args.batch_size)
        for round_ in range(args.rounds):
            names = list(ways)
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:  # each way goes first in turn
                make = ways[name]
                seconds, count = timed(make, args.workers, args.batch_size)
                assert count == total, (name, count, total)
                results[name].append(count / seconds)
            print(f"round {round_}: " + ", ".join(f"{n} {r[-1]:.0f}" for n, r in results.items()), flush=True)
    print(f"\n{'way':24s}{'samples/s (median)':>20s}{'min':>10s}{'max':>10s}")
    for name, rates in results.items():
        print(f"{name:24s}{statistics.median(rates):20.0f}{min(rates):10.0f}{max(rates):10.0f}")
    base = statistics.median(results["one after another"])
    mixed = statistics.median(results["mixture (each once)"])
    print(
        f"\nmixture / one after another: {mixed / base:.3f} (overhead {100 * (1 - mixed / base):+.1f}%; "
        f"target <= 5%); weighted mixture / one after another: "
        f"{statistics.median(results['weighted mixture']) / base:.3f}"
    )
    print("command: python bench/mixture.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
