"""What the commands share: the size rule, number and list arguments, the store option groups
(S3, requests), the options and report of the commands that pack (``pack``, ``pack-text``) and
the dataset argument (checked, opened, and an unfinished pack named)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from ..config import RequestConfig, S3Config

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """``"256MiB"`` -> 268435456, ``"1GB"`` and ``"1G"`` -> 10**9, ``"4096"`` -> 4096 (bytes): the
    one rule of every option that takes a size. A number without a unit counts bytes; K, M, G,
    T are KB, MB, GB, TB (powers of 1000); KiB, MiB, GiB, TiB powers of 1024; any case.

    Raises:
        ValueError: not a number with one of the units B, K, KB, KiB, M, MB, MiB, G, GB, GiB, T,
            TB, TiB.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size; write bytes like 4096, 256MiB or 1GB (256M is 256MB)")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{text!r} must be more than 0 bytes")
    return size


class _Size(int):
    """A size in bytes that remembers how it was written (for :func:`shard_size_note`)."""

    text: str


def size_arg(text: str) -> _Size:
    try:
        size = _Size(parse_size(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    size.text = text
    return size


def plan_size(text: str) -> int:
    """A size or rate for ``shardstream plan``: :func:`parse_size`'s (``200G``, ``1.25GB``)."""
    return size_arg(text)


def positive_number(text: str, *, unit: str = "") -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number{unit} > 0")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer > 0")
    return value


def add_s3_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("S3 (default: the standard AWS environment variables and profiles)")
    group.add_argument("--endpoint-url", help="S3 endpoint, e.g. http://127.0.0.1:8333 (default AWS_ENDPOINT_URL)")
    group.add_argument("--profile", help="AWS profile name (default AWS_PROFILE)")
    group.add_argument("--region", help="AWS region (default AWS_REGION / AWS_DEFAULT_REGION)")


def s3_config(args: argparse.Namespace) -> S3Config:
    return S3Config(endpoint_url=args.endpoint_url, profile=args.profile, region_name=args.region)


def seconds(text: str) -> float:
    return positive_number(text, unit=" of seconds")


def add_request_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "requests to remote stores: s3://, http(s)://, hf://, gs://, az:// (default: RequestConfig's, "
        "for S3 S3Config's)"
    )
    group.add_argument("--connect-timeout", type=seconds, metavar="SECONDS", help="wait for a connection (default: 10)")
    group.add_argument(
        "--read-timeout", type=seconds, metavar="SECONDS", help="wait for each piece of an answer (default: 60)"
    )
    group.add_argument(
        "--max-attempts",
        type=positive_int,
        metavar="N",
        help="attempts per request, the first included: a dropped connection, a timeout or a 429/5xx "
        "answer is tried again (default: 5; 1: no retry)",
    )
    group.add_argument(
        "--max-connections",
        type=positive_int,
        metavar="N",
        help="connections per process and server (default: 32)",
    )


def request_config(args: argparse.Namespace) -> RequestConfig | None:
    """The RequestConfig the request flags give, or None where none is given (every store's default)."""
    given = {
        field: value
        for field, value in (
            ("connect_timeout_s", args.connect_timeout),
            ("read_timeout_s", args.read_timeout),
            ("max_attempts", args.max_attempts),
            ("max_pool_connections", args.max_connections),
        )
        if value is not None
    }
    return RequestConfig(**given) if given else None


def add_store_args(parser: argparse.ArgumentParser) -> None:
    add_s3_args(parser)
    add_request_args(parser)


def class_list(text: str) -> list[str]:
    """``--classes cat,dog`` -> ``["cat", "dog"]``."""
    names = [name.strip() for name in text.split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct, non-empty class names separated by commas")
    return names


def part_arg(text: str):
    from ..packing.parts import Part

    try:
        return Part.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# the commands that pack (pack, pack-text)

PROBLEMS_SHOWN = 20  # problems a pack prints on stderr; pack-report.jsonl lists every one
RESUME_HINT = "; run the same command again to resume: the shards published so far are kept"


def add_parallel_args(parser: argparse.ArgumentParser, *, workers: str, default: str) -> None:
    """``--workers`` (``workers``: what one is; ``default``: how many without it), ``--ray`` and
    ``--part``, the way a pack is spread over processes, a Ray cluster or machines."""
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"{workers} (default: {default}; with --ray, Ray tasks, default the cluster's CPU count)",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="run the pack as tasks on the Ray cluster at ADDRESS (default: RAY_ADDRESS, else auto, the "
        "cluster started on this machine); SOURCE and DEST must be reachable from every node",
    )
    parser.add_argument(
        "--part",
        type=part_arg,
        default=None,
        metavar="I/N",
        help="pack part I of N of the input (default: RANK/WORLD_SIZE or a job array's index, "
        "else all); the last part to finish writes the index",
    )


def add_replace_args(parser: argparse.ArgumentParser, *, deletes: str, writer: str, names: str) -> None:
    """``--overwrite`` (it deletes what the dataset records: ``deletes``) and ``--clobber`` (the
    ``names`` that ``writer`` writes)."""
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset (or unfinished pack) at DEST: delete what its index and pack state record "
        f"({deletes}) and nothing else; what is kept is listed",
    )
    parser.add_argument(
        "--clobber",
        action="store_true",
        help=f"write over files at DEST with the names {writer} writes ({names}) that no index or pack state "
        "there records; without it such a DEST is refused, naming them",
    )


def add_pack_tail(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int | None]) -> None:
    """``--no-progress`` and the store options, last, and ``run``: a command a rerun resumes."""
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_store_args(parser)
    parser.set_defaults(run=run, resume_hint=RESUME_HINT)


def print_report(report: Any, line: Callable[[Any], str]) -> None:
    """A pack's report: its first :data:`PROBLEMS_SHOWN` problems on stderr (``line(problem)``
    each, then how many more ``pack-report.jsonl`` lists), then its summary on stdout."""
    for problem in report.problems[:PROBLEMS_SHOWN]:
        print(line(problem), file=sys.stderr)
    more = len(report.problems) - PROBLEMS_SHOWN
    if more > 0:
        print(f"... and {more} more, all listed in {report.dest}/pack-report.jsonl", file=sys.stderr)
    print(report.summary())


DATASET_HELP = "local directory, a URL (s3://, https://, hf://datasets/..., gs://, az://), or its index file"


def dataset_usage_error(given: str) -> str | None:
    """Why ``given`` is not a dataset ``info`` and ``verify`` can open, as one line that says
    what to pass instead; None when it may be one (an index file, a directory holding an index,
    or a remote location, which the store answers for)."""
    from ..format import SHARD_SUFFIXES
    from ..index import INDEX_NAME, MANIFEST_NAME
    from ..index.status import SPEC_NAME
    from ..storage import is_remote_url

    instead = "pass a dataset's directory (what shardstream pack wrote) or its index.bin"
    if is_remote_url(given):
        if given.endswith(SHARD_SUFFIXES):
            parent = given.rsplit("/", 1)[0]
            return (
                f"{given} is a shard, not a dataset; pass its dataset's prefix ({parent}) or index ({parent}/index.bin)"
            )
        return None
    path = os.path.abspath(given)
    if not os.path.exists(path):
        return f"{given}: no such file or directory; {instead}"
    if os.path.isdir(path):
        if any(os.path.isfile(os.path.join(path, name)) for name in (MANIFEST_NAME, INDEX_NAME, SPEC_NAME)):
            return None  # a dataset, or a pack's state: open_index says whether it is unfinished
        shards = any(name.endswith(SHARD_SUFFIXES) for name in os.listdir(path))
        hint = f" (to index the tar shards it holds: shardstream index build {given})" if shards else ""
        return f"{given} holds no index.bin, so it is not a dataset; {instead}{hint}"
    if given.endswith((".bin", ".json")):
        return None
    if given.endswith(SHARD_SUFFIXES):
        parent = os.path.dirname(given.rstrip("/")) or "."
        if any(os.path.isfile(os.path.join(os.path.dirname(path), n)) for n in (MANIFEST_NAME, INDEX_NAME)):
            return (
                f"{given} is one shard of a dataset; pass the dataset's directory ({parent}) or its index "
                f"({os.path.join(parent, MANIFEST_NAME)})"
            )
        return (
            f"{given} is a tar shard and {parent} holds no index; index the shards first "
            f"(shardstream index build {parent}), then pass {parent}"
        )
    return f"{given} is a file, not a dataset; {instead}"


def no_index(exc: Exception) -> ValueError:
    """A usage error (exit 2) for a location where the store found no index (its message names
    the index URL it looked for and what to pass)."""
    return ValueError(str(exc))


def open_dataset(location: str, args: argparse.Namespace):
    """The :class:`~shardstream.index.DatasetIndex` at ``location``; ValueError (exit 2) with
    one line saying what to pass when it is not a dataset."""
    from ..errors import ShardNotFoundError, UnfinishedPackError
    from ..index import open_index

    problem = dataset_usage_error(location)
    if problem is not None:
        raise ValueError(problem)
    try:
        return open_index(location, s3=s3_config(args), requests=request_config(args))
    except UnfinishedPackError:
        raise
    except ShardNotFoundError as exc:
        raise no_index(exc) from None


def unfinished_note(index, args: argparse.Namespace) -> str | None:
    """One line when the dataset ``index`` opened is not a finished pack's whole result: its
    index says it is partial (``index build --partial``), or the pack state beside it says
    the pack has not finished (an index built over its shards by an older shardstream)."""
    from ..index import unfinished_pack
    from ..storage import open_store

    if index.manifest.partial:
        return f"{index.root}: a partial index: it {index.manifest.partial}"
    if index.manifest.shards_url is not None:
        return None
    status = unfinished_pack(open_store(index.root, s3=s3_config(args), requests=request_config(args)), index.manifest)
    return None if status is None else f"{status.describe()}; the index there covers only part of it"
