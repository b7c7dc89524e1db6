"""``shardstream pack``: files, a file list, an object-store prefix or shards -> shards plus an index."""

from __future__ import annotations

import argparse
import os
import sys

from ..packing.stream import OnError
from .options import (
    _SIZE,
    add_pack_tail,
    add_parallel_args,
    add_replace_args,
    class_list,
    positive_int,
    print_report,
    request_config,
    s3_config,
    size_arg,
)

SMALL_SHARD_BYTES = 1 << 20  # a --shard-size without a unit below this is warned about


def shard_size_note(text: str, size: int) -> str | None:
    """A warning for ``--shard-size`` given as a small number without a unit (``256``: bytes)."""
    match = _SIZE.match(text)
    if match is not None and not match.group(2) and size < SMALL_SHARD_BYTES:
        return (
            f"--shard-size {text.strip()} is {size} bytes (a number without a unit counts bytes): nearly every "
            f"sample gets a shard of its own; for megabytes write {text.strip()}MiB or {text.strip()}MB"
        )
    return None


def problem_line(problem) -> str:
    """A pack problem as ``shardstream pack`` prints it: ``not packed: PATH: REASON``, or
    ``warning: PATH: REASON`` for what was packed all the same."""
    return f"{'warning' if problem.packed else 'not packed'}: {problem.path}: {problem.reason}"


def add_parsers(commands) -> None:
    """Add ``pack``."""
    p = commands.add_parser("pack", help="pack files into tar shards plus an index (resumable: run it again)")
    p.add_argument(
        "source", metavar="SOURCE", help="local directory, or a prefix of files: s3://, gs://, az://, hf://datasets/..."
    )
    p.add_argument("dest", metavar="DEST", help="local directory or a writable prefix: s3://, gs://, az://")
    p.add_argument("--name", default="data", help="shard name prefix: NAME-000000.tar ... (default: data)")
    p.add_argument(
        "--shard-size",
        type=size_arg,
        default="256MiB",
        metavar="SIZE",
        help="max bytes per shard, e.g. 256MiB, 256MB or 256M (M = MB); a number without a unit counts bytes "
        "(default: 256MiB)",
    )
    p.add_argument(
        "--max-samples-per-shard",
        type=positive_int,
        default=None,
        metavar="N",
        help="also start a new shard after N samples (default: no limit, only --shard-size)",
    )
    p.add_argument(
        "--files-from",
        metavar="LIST",
        help="pack only the paths in LIST (relative to SOURCE; newline- or NUL-separated; - for stdin)",
    )
    p.add_argument(
        "--on-error",
        choices=["raise", "fail", "skip"],
        default=OnError.FAIL.value,
        help="on a bad input file: stop naming it (raise, or its older word fail: the default), or skip it and "
        "list it in DEST/pack-report.jsonl",
    )
    p.add_argument("--skip-unreadable", action="store_true", help="the same as --on-error skip")
    add_parallel_args(p, workers="processes writing shards", default=f"the CPU count, {os.cpu_count()}")
    p.add_argument(
        "--labels-from-dirs",
        action="store_true",
        help="SOURCE is a tree of class folders (torchvision's ImageFolder layout): each file becomes its own "
        "sample with a cls member holding its class index (the sorted folder names directly under SOURCE), "
        "and a json member from a metadata.jsonl or metadata.csv row (Hugging Face imagefolder's file_name "
        "column); the index records the class names and counts",
    )
    p.add_argument(
        "--labels-from",
        metavar="FILE",
        help="label the files of SOURCE (a flat folder, or any tree) from FILE, a CSV with a header or JSON Lines: "
        "a file_name (or filename) column naming each file relative to SOURCE and a label column, as Hugging "
        "Face's metadata.csv; each file becomes its own sample with a cls member, as --labels-from-dirs makes",
    )
    p.add_argument(
        "--classes",
        type=class_list,
        metavar="A,B,...",
        help="with --labels-from-dirs or --labels-from: the class list, in class-index order (default: the sorted "
        "folder names or labels); a folder or label not in it is named and left out (or stops the pack)",
    )
    p.add_argument(
        "--classes-from",
        metavar="DATASET",
        help="the same, with the class list of DATASET's index (the training set's, so that a validation set "
        "missing a class keeps its indices)",
    )
    p.add_argument(
        "--check-images",
        action="store_true",
        help="decode every image member (jpg, png, webp, ...) while packing; one that does not decode follows "
        "--on-error (costs a decode per image)",
    )
    p.add_argument("--shuffle", action="store_true", help="spread samples over shards in a seeded random order")
    p.add_argument("--seed", type=int, default=0, help="seed of --shuffle (default: 0)")
    add_replace_args(
        p,
        deletes="shards, tables, index.bin, keys/, the report, .shardstream/",
        writer="this pack",
        names="NAME-NNNNNN.tar, their tables, index.bin, keys/, pack-report.jsonl, .shardstream/",
    )
    p.add_argument(
        "--from-shards",
        action="store_true",
        help="SOURCE is tar shards (a directory or prefix of .tar/.tar.gz/.tar.zst, or a brace pattern): "
        "repack their samples (resharding)",
    )
    add_pack_tail(p, run)


def run(args: argparse.Namespace) -> int | None:
    """``shardstream pack``: the summary on stdout, the first problems on stderr."""
    from ..packing.pack import pack

    note = shard_size_note(args.shard_size.text, args.shard_size)
    if note is not None:
        print(f"shardstream: warning: {note}", file=sys.stderr)

    report = pack(
        args.source,
        args.dest,
        name=args.name,
        max_shard_bytes=int(args.shard_size),
        max_samples_per_shard=args.max_samples_per_shard,
        files_from=args.files_from,
        on_error=OnError.SKIP if args.skip_unreadable else OnError(args.on_error),
        workers=args.workers or (None if args.ray else os.cpu_count() or 1),
        part=args.part,
        shuffle=args.shuffle,
        seed=args.seed,
        overwrite=args.overwrite,
        clobber=args.clobber,
        s3=s3_config(args),
        progress=not args.no_progress,
        from_shards=args.from_shards,
        ray=args.ray,
        requests=request_config(args),
        labels_from_dirs=args.labels_from_dirs,
        check_images=args.check_images,
        labels_from=args.labels_from,
        classes=args.classes,
        classes_from=args.classes_from,
    )
    print_report(report, problem_line)
