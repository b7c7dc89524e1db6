"""``shardstream verify``: every shard re-read and checked against the index (``--decode``: every image decoded)."""

from __future__ import annotations

import argparse
import sys

from .options import add_store_args, no_index, open_dataset, positive_int, request_config, s3_config, unfinished_note


def _verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..errors import ShardNotFoundError
    from ..packing.verify import verify

    bad = total = images = undecodable = 0
    unit, desc = (" images", "decoding") if args.decode else (" shards", "verifying")
    with tqdm(unit=unit, desc=desc, disable=args.no_progress, file=sys.stderr) as bar:
        checks = verify(
            args.dest,
            s3=s3_config(args),
            requests=request_config(args),
            decode=args.decode,
            decode_threads=args.decode_threads,
            on_images=bar.update if args.decode else None,  # a live count, not one step per shard
        )
        try:
            for check in checks:
                total += 1
                images += check.num_images
                undecodable += check.num_undecodable
                if args.decode:
                    bar.set_postfix_str(f"{total} shards", refresh=False)
                else:
                    bar.update()
                if not check.ok:
                    bad += 1
                    for problem in check.problems:
                        bar.write(f"BAD {check.url}: {problem}", file=sys.stdout)
        except ShardNotFoundError as exc:  # raised before any shard is checked: no index there
            if total:
                raise
            raise no_index(exc) from None
    print(f"{total - bad} of {total} shards match the index" + (f"; {bad} do not" if bad else ""))
    if args.decode:
        if not images:
            print("no image members to decode (none ends in .jpg, .jpeg, .png, .webp or another image extension)")
        elif undecodable:
            print(f"{images} images decoded, {undecodable} do not decode: replace or remove those files and pack again")
        else:
            print(f"{images} images decoded, all decode")
    return 1 if bad else 0


# --- ls, head, cat, get and info --members: samples by key or index (issue 40) ---------------


def add_parsers(commands) -> None:
    """Add ``verify``."""
    v = commands.add_parser("verify", help="re-read every shard and check it against the index")
    v.add_argument("dest", metavar="DATASET", help="local directory or a URL (s3://, https://, hf://, gs://, az://)")
    v.add_argument(
        "--decode",
        action="store_true",
        help="also decode every image member (jpg, png, webp, ...) with Pillow and name each one that does not",
    )
    v.add_argument(
        "--decode-threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --decode: threads decoding images (default: the CPUs this process may use)",
    )
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_store_args(v)
    v.set_defaults(run=run)


def run(args: argparse.Namespace) -> int | None:
    """``shardstream verify``: exit 1 when a shard does not match, or the dataset is not whole."""
    note = unfinished_note(open_dataset(args.dest, args), args)
    code = _verify(args)
    if note is not None:
        print(f"the dataset is not whole: {note}")
    return code or (1 if note is not None else 0)
