"""The ``shardstream`` command: argparse -> library call -> exit code.

Exit codes: 0 success, 1 a :class:`~shardstream.errors.ShardstreamError` (one line on
stderr naming the thing and the way out), 2 bad command-line usage (including a value the
library refuses, such as a bad URL or shard name), 130 interrupted.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from .config import S3Config
from .errors import ShardstreamError

__all__ = ["main", "parse_size"]

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """``"256MiB"`` -> 268435456, ``"1GB"`` -> 10**9, ``"4096"`` -> 4096 (bytes).

    Raises:
        ValueError: not a number with one of the units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size; write bytes like 4096, 256MiB or 1GB")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{text!r} must be more than 0 bytes")
    return size


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer > 0")
    return value


def _add_s3_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("S3 (default: the standard AWS environment variables and profiles)")
    group.add_argument("--endpoint-url", help="S3 endpoint, e.g. http://127.0.0.1:8333 (default AWS_ENDPOINT_URL)")
    group.add_argument("--profile", help="AWS profile name (default AWS_PROFILE)")
    group.add_argument("--region", help="AWS region (default AWS_REGION / AWS_DEFAULT_REGION)")


def _s3_config(args: argparse.Namespace) -> S3Config:
    return S3Config(endpoint_url=args.endpoint_url, profile=args.profile, region_name=args.region)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardstream", description="Pack small files into tar shards and stream them back.")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("pack", help="pack a directory of files into tar shards plus index.json")
    p.add_argument("source", metavar="SOURCE", help="local directory to pack")
    p.add_argument("dest", metavar="DEST", help="local directory or s3://bucket/prefix")
    p.add_argument("--name", default="data", help="shard name prefix: NAME-000000.tar ... (default: data)")
    p.add_argument("--shard-size", type=_size_arg, default="256MiB", metavar="SIZE",
                   help="max bytes per shard, e.g. 256MiB, 1GB (default: 256MiB)")
    p.add_argument("--max-samples-per-shard", type=_positive_int, default=None, metavar="N")
    p.add_argument("--skip-unreadable", action="store_true",
                   help="pack the rest when a file cannot be read, and list it (default: stop)")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already at DEST")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_s3_args(p)

    i = commands.add_parser("info", help="summarise a packed dataset")
    i.add_argument("source", metavar="DATASET", help="local directory, s3://bucket/prefix, or its index.json")
    _add_s3_args(i)

    d = commands.add_parser("demo", help="make a small image dataset, pack it to a local S3 server, train-read one epoch")
    d.add_argument("--num-images", type=_positive_int, default=3000)
    d.add_argument("--num-workers", type=int, default=2)
    d.add_argument("--batch-size", type=_positive_int, default=64)
    d.add_argument("--workdir", help="keep the generated files here (default: a temporary directory)")
    d.add_argument("--local", action="store_true", help="pack to a local directory instead of S3")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the command, map :class:`ShardstreamError` to exit code 1."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "pack":
            from .pack import pack

            report = pack(
                args.source, args.dest, name=args.name, max_shard_bytes=args.shard_size,
                max_samples_per_shard=args.max_samples_per_shard, skip_unreadable=args.skip_unreadable,
                overwrite=args.overwrite, s3=_s3_config(args), progress=not args.no_progress,
            )
            print(report.summary())
        elif args.command == "info":
            from .dataset import ShardDataset

            ds = ShardDataset(args.source, s3=_s3_config(args))
            index = ds.index
            if index is None:
                raise ShardstreamError(f"{args.source}: shard URLs have no index to summarise")
            print(
                f"{args.source}: {index.num_shards} shards, {index.num_samples} samples, "
                f"{index.num_members} members, {index.total_bytes / 1e6:.1f} MB"
            )
        elif args.command == "demo":
            from .demo import run_demo

            run_demo(num_images=args.num_images, num_workers=args.num_workers, batch_size=args.batch_size,
                     workdir=args.workdir, local=args.local)
    except ShardstreamError as exc:
        print(f"shardstream: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # an argument the library refused: a usage error
        print(f"shardstream: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("shardstream: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
