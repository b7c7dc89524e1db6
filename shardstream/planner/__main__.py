"""``python -m shardstream.planner --selftest-scale``: time a plan of 10^6 shards, 10^10 samples,
128 nodes x 8 GPUs x 8 workers on this machine."""

from __future__ import annotations

import argparse
import sys

from . import selftest_scale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardstream.planner")
    parser.add_argument("--selftest-scale", action="store_true", help="plan 10^6 synthetic shards and time it")
    parser.add_argument("--shards", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=10_000_000_000)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args(argv)
    if not args.selftest_scale:
        parser.print_help()
        return 2
    job, seconds = selftest_scale(args.shards, args.samples, args.nodes, args.gpus_per_node, args.workers)
    print(job.table())
    print(
        f"\nplanned {args.shards:,} shards, {args.samples:,} samples, {job.world_size:,} ranks x {args.workers} "
        f"workers, 2 epochs in {seconds:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
