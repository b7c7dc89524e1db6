"""``shardstream index``: ``build`` (an index for other tools' shards), ``merge`` (a split pack's index),
``upgrade`` (version 1 to 2), ``keys`` (the key index) and ``--dali`` (DALI's index files)."""

from __future__ import annotations

import argparse
import os
import sys

from .options import add_store_args, positive_int, request_config, s3_config


def add_parsers(commands) -> None:
    """Add ``index`` and its commands."""
    x = commands.add_parser("index", help="index commands: build, merge, upgrade, keys, or --dali DEST")
    x.add_argument(
        "--dali",
        metavar="DEST",
        help="write DALI .idx files (as wds2idx does) next to the shards of the local dataset DEST, from its index",
    )
    x.add_argument("--out-dir", help="with --dali: write the .idx files here instead")
    x_commands = x.add_subparsers(dest="index_command")
    m = x_commands.add_parser("merge", help="write DEST/index.bin once every part of a split pack is done")
    m.add_argument("dest", metavar="DEST")
    m.add_argument(
        "--overwrite", action="store_true", help="replace an index.bin there that is not the one this pack wrote"
    )
    add_store_args(m)
    b = x_commands.add_parser(
        "build",
        help="index existing tar shards (other tools' WebDataset shards) in place, without copying or changing them",
    )
    b.add_argument(
        "shards",
        metavar="SHARDS",
        nargs="+",
        help="shard paths or URLs (s3://, https://, hf://, gs://, az://), brace patterns, "
        "or a directory or prefix of .tar shards",
    )
    b.add_argument(
        "--workers",
        type=positive_int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="shards scanned at once (default: the CPU count)",
    )
    b.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="scan the shards in tasks on the Ray cluster at ADDRESS (default: RAY_ADDRESS, else auto)",
    )
    b.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an index already there, and tables or keys/ there that no index or pack state records",
    )
    b.add_argument(
        "--partial",
        action="store_true",
        help="index the shards of a pack that has not finished all the same; the index records that it is "
        "partial, and the pack, run again, finishes and writes its own",
    )
    b.add_argument(
        "--output",
        metavar="DIR",
        help="write the index and tables to this directory or prefix (s3://, gs://, az://) "
        "instead of beside the shards (which stay untouched where they are)",
    )
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_store_args(b)
    u = x_commands.add_parser(
        "upgrade", help="convert a version 1 dataset (index.json) to version 2 in place; the shards are not touched"
    )
    u.add_argument("dest", metavar="DEST")
    add_store_args(u)
    k = x_commands.add_parser(
        "keys",
        help="add a key index (DEST/keys/) to a dataset, from its tables, so samples are found by key in one "
        "small read: for shuffled packs, foreign datasets (index build) and datasets written before keys/",
    )
    k.add_argument("dest", metavar="DEST")
    k.add_argument("--no-progress", action="store_true", help="no progress lines")
    add_store_args(k)
    x.set_defaults(run=run, resume_hint="")


def run(args: argparse.Namespace) -> int | None:
    """``shardstream index build | merge | upgrade | keys`` or ``index --dali``."""
    if args.dali:
        return _dali(args)
    commands = {"build": _build, "merge": _merge, "upgrade": _upgrade, "keys": _keys}
    if args.index_command not in commands:
        raise ValueError(
            "`shardstream index` needs a command: build SHARDS..., merge DEST, upgrade DEST, keys DEST, or --dali DEST"
        )
    return commands[args.index_command](args)


def _dali(args: argparse.Namespace) -> int | None:
    """``index --dali``."""
    from ..packing.dali_index import write_dali_index

    written = write_dali_index(args.dali, out_dir=args.out_dir)
    where = args.out_dir or args.dali
    print(f"wrote {len(written)} DALI index files (.idx) to {where}")


def _build(args: argparse.Namespace) -> int | None:
    """``index build``."""
    from tqdm import tqdm

    from ..packing.build import build_index, shard_urls_of

    s3, requests = s3_config(args), request_config(args)
    total = len(shard_urls_of(args.shards, s3=s3, requests=requests))
    with tqdm(total=total, unit=" shards", desc="indexing", disable=args.no_progress, file=sys.stderr) as bar:
        manifest = build_index(
            args.shards,
            s3=s3,
            requests=requests,
            workers=args.workers,
            overwrite=args.overwrite,
            output=args.output,
            on_shard=lambda _: bar.update(),
            ray=args.ray,
            partial=args.partial,
        )
    print(
        f"wrote {manifest.url}: {manifest.num_shards} shards, {manifest.num_samples} samples, "
        f"{manifest.total_bytes / 1e6:.1f} MB"
    )


def _merge(args: argparse.Namespace) -> int | None:
    """``index merge``."""
    from ..index import MANIFEST_NAME
    from ..packing.destination import merge_pack
    from ..storage import open_store

    store = open_store(args.dest, s3=s3_config(args), requests=request_config(args))
    totals, problems = merge_pack(store, overwrite=args.overwrite)
    print(
        f"wrote {store.url_of(MANIFEST_NAME)}: {totals['num_shards']} shards, "
        f"{totals['num_samples']} samples, {len(problems)} problems in pack-report.jsonl"
    )


def _upgrade(args: argparse.Namespace) -> int | None:
    """``index upgrade``."""
    from ..index import MANIFEST_NAME, upgrade
    from ..storage import open_store

    s3, requests = s3_config(args), request_config(args)
    totals = upgrade(args.dest, s3=s3, requests=requests)
    print(
        f"wrote {open_store(args.dest, s3=s3, requests=requests).url_of(MANIFEST_NAME)} and a sample table "
        f"beside each shard: {totals['num_shards']} shards, {totals['num_samples']} samples"
    )


def _keys(args: argparse.Namespace) -> int | None:
    """``index keys``."""
    from ..index import build_key_index

    report = build_key_index(
        args.dest, s3=s3_config(args), requests=request_config(args), progress=not args.no_progress
    )
    print(
        f"wrote {report.url}: {report.num_keys} keys in {report.num_partitions} partitions, "
        f"{report.bytes / 1e6:.1f} MB, in {report.seconds:.1f} s"
        + ("; key ranges recorded in index.bin (keys sorted)" if report.key_ranges is not None else "")
    )
