"""``shardstream demo`` and ``shardstream s3-server``: the main job on an embedded default, and a local S3 server."""

from __future__ import annotations

import argparse

from .options import positive_int


def add_parsers(commands) -> None:
    """Add ``demo`` and ``s3-server``."""
    d = commands.add_parser(
        "demo", help="make a small image dataset, pack it to a local S3 server, train-read one epoch"
    )
    d.add_argument("--num-images", type=positive_int, default=3000, help="images to make and pack (default: 3000)")
    d.add_argument("--num-workers", type=int, default=2, help="DataLoader workers reading them (default: 2)")
    d.add_argument("--batch-size", type=positive_int, default=64, help="DataLoader batch size (default: 64)")
    d.add_argument("--workdir", help="keep the generated files here (default: a temporary directory)")
    d.add_argument("--local", action="store_true", help="pack to a local directory instead of S3")

    from ..testing.s3server import add_arguments as add_s3_server_arguments

    s = commands.add_parser(
        "s3-server",
        help="run a local S3 server (SeaweedFS) for local work: create --bucket NAMEs, print the export "
        "AWS_... lines, stop on Ctrl-C",
    )
    add_s3_server_arguments(s)
    d.set_defaults(run=run_demo)
    s.set_defaults(run=run_s3_server)


def run_demo(args: argparse.Namespace) -> int | None:
    """``shardstream demo``."""
    from ..demo import run_demo

    run_demo(
        num_images=args.num_images,
        num_workers=args.num_workers,
        batch_size=args.batch_size,
        workdir=args.workdir,
        local=args.local,
    )


def run_s3_server(args: argparse.Namespace) -> int | None:
    """``shardstream s3-server``: until Ctrl-C."""
    from ..testing.s3server import run

    return run(args, prog="shardstream s3-server")
