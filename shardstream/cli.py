"""The ``shardstream`` command: argparse -> library call -> exit code.

Exit codes: 0 success, 1 a :class:`~shardstream.errors.ShardstreamError` (one line on
stderr naming the thing and the way out), 2 bad command-line usage (including a value the
library refuses, such as a bad URL or shard name), 130 interrupted.
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import re
import sys
from collections.abc import Sequence

from .config import RequestConfig, S3Config
from .errors import ShardstreamError
from .packing.pack import OnError

__all__ = ["escape", "extension_totals", "main", "parse_size", "unsafe_path"]

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
    """A size in bytes that remembers how it was written (for :func:`_shard_size_note`)."""

    text: str


def _size_arg(text: str) -> _Size:
    try:
        size = _Size(parse_size(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    size.text = text
    return size


def _plan_size(text: str) -> int:
    """A size or rate for ``shardstream plan``: :func:`parse_size`'s (``200G``, ``1.25GB``)."""
    return _size_arg(text)


SMALL_SHARD_BYTES = 1 << 20  # a --shard-size without a unit below this is warned about


def _shard_size_note(text: str, size: int) -> str | None:
    """A warning for ``--shard-size`` given as a small number without a unit (``256``: bytes)."""
    match = _SIZE.match(text)
    if match is not None and not match.group(2) and size < SMALL_SHARD_BYTES:
        return (
            f"--shard-size {text.strip()} is {size} bytes (a number without a unit counts bytes): nearly every "
            f"sample gets a shard of its own; for megabytes write {text.strip()}MiB or {text.strip()}MB"
        )
    return None


def _positive_number(text: str, *, unit: str = "") -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number{unit} > 0")
    return value


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


def _seconds(text: str) -> float:
    return _positive_number(text, unit=" of seconds")


def _add_request_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "requests to remote stores: s3://, http(s)://, hf://, gs://, az:// (default: RequestConfig's, "
        "for S3 S3Config's)"
    )
    group.add_argument(
        "--connect-timeout", type=_seconds, metavar="SECONDS", help="wait for a connection (default: 10)"
    )
    group.add_argument(
        "--read-timeout", type=_seconds, metavar="SECONDS", help="wait for each piece of an answer (default: 60)"
    )
    group.add_argument(
        "--max-attempts",
        type=_positive_int,
        metavar="N",
        help="attempts per request, the first included: a dropped connection, a timeout or a 429/5xx "
        "answer is tried again (default: 5; 1: no retry)",
    )
    group.add_argument(
        "--max-connections",
        type=_positive_int,
        metavar="N",
        help="connections per process and server (default: 32)",
    )


def _request_config(args: argparse.Namespace) -> RequestConfig | None:
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


def _add_store_args(parser: argparse.ArgumentParser) -> None:
    _add_s3_args(parser)
    _add_request_args(parser)


def _class_list(text: str) -> list[str]:
    """``--classes cat,dog`` -> ``["cat", "dog"]``."""
    names = [name.strip() for name in text.split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct, non-empty class names separated by commas")
    return names


def _part_arg(text: str):
    from .packing.parts import Part

    try:
        return Part.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


CLASSES_SHOWN = 10  # `shardstream info` lists the first and last this many classes (--all-classes: every one)


def _info(source: str, manifest, *, all_classes: bool = False) -> str:
    import numpy as np

    from .packing.destination import counted

    lines = [
        f"{source}: {counted(manifest.num_shards, 'shard')}, {counted(manifest.num_samples, 'sample')}, "
        f"{counted(manifest.num_members, 'member')}, {manifest.total_bytes / 1e6:.1f} MB"
    ]
    for what, column in (("shard bytes", manifest.shard_bytes), ("samples per shard", manifest.shard_samples)):
        if len(column):
            lines.append(f"{what}: min {column.min()}, median {np.median(column):.0f}, max {column.max()}")
    if manifest.classes is not None:
        lines += _classes_info(manifest.classes, manifest.class_counts, all_classes=all_classes)
    numbers = [re.search(r"(\d+)\.tar$", manifest.name(i)) for i in range(manifest.num_shards)]
    if manifest.num_shards and all(numbers):
        found = sorted(int(m.group(1)) for m in numbers)  # type: ignore[union-attr]
        if found != list(range(found[0], found[0] + len(found))):
            lines.append(
                f"shard numbers run from {found[0]} to {found[-1]} with gaps (each pack worker numbers its own "
                "shards): read the dataset by its directory or index file, not a {a..b} brace pattern over the numbers"
            )
    return "\n".join(lines)


def _classes_info(names: list[str], counts: list[int] | None, *, all_classes: bool) -> list[str]:
    """``shardstream info``'s lines on a labelled dataset's classes: index, name and samples of
    each, the first and last :data:`CLASSES_SHOWN` of a long list unless ``all_classes``."""
    import numpy as np

    head = f"{len(names)} classes (class index, name" + (", samples)" if counts is not None else ")")
    if counts:
        head += f"; samples per class: min {min(counts)}, median {np.median(counts):.0f}, max {max(counts)}"
    lines = [head]
    shown: list[int | None] = list(range(len(names)))
    if not all_classes and len(names) > 2 * CLASSES_SHOWN + 1:
        shown = [*range(CLASSES_SHOWN), None, *range(len(names) - CLASSES_SHOWN, len(names))]
    width = len(str(len(names) - 1))
    name_width = max((len(names[i]) for i in shown if i is not None), default=0)
    for i in shown:
        if i is None:
            more = len(names) - 2 * CLASSES_SHOWN
            lines.append(f"  {'...':>{width}}  {more} more classes (shardstream info --all-classes lists every one)")
        elif counts is None:
            lines.append(f"  {i:>{width}}  {names[i]}")
        else:
            lines.append(f"  {i:>{width}}  {names[i]:<{name_width}}  {counts[i]}")
    return lines


def _dataset_usage_error(given: str) -> str | None:
    """Why ``given`` is not a dataset ``info`` and ``verify`` can open, as one line that says
    what to pass instead; None when it may be one (an index file, a directory holding an index,
    or a remote location, which the store answers for)."""
    from .format import SHARD_SUFFIXES
    from .index import INDEX_NAME, MANIFEST_NAME
    from .index.status import SPEC_NAME
    from .storage import is_remote_url

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


def _no_index(exc: Exception) -> ValueError:
    """A usage error (exit 2) for a location where the store found no index (its message names
    the index URL it looked for and what to pass)."""
    return ValueError(str(exc))


def _verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .errors import ShardNotFoundError
    from .packing.verify import verify

    bad = total = images = undecodable = 0
    unit, desc = (" images", "decoding") if args.decode else (" shards", "verifying")
    with tqdm(unit=unit, desc=desc, disable=args.no_progress, file=sys.stderr) as bar:
        checks = verify(
            args.dest,
            s3=_s3_config(args),
            requests=_request_config(args),
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
            raise _no_index(exc) from None
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

TABLES_AHEAD = 8  # sample tables of a remote dataset requested ahead of the one being listed
HEAD_SAMPLES = 10  # samples `shardstream head` shows without -n
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def escape(text: str) -> str:
    """A key or member name made safe to print on a terminal (``ls``, ``head``, messages).

    Args:
        text: a key or name as the sample table holds it (any writer's shards).

    Returns:
        ``text`` itself when every character is printable (``str.isprintable``); else ``text``
        with each non-printable character (control characters such as ESC or newline, bidi
        and other format characters) written as ``\\n``, ``\\t``, ``\\r``, ``\\xNN``,
        ``\\uNNNN`` or ``\\UNNNNNNNN``, and each backslash doubled, so a terminal never
        receives raw escape sequences.
    """
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def _open_dataset(location: str, args: argparse.Namespace):
    """The :class:`~shardstream.index.DatasetIndex` at ``location``; ValueError (exit 2) with
    one line saying what to pass when it is not a dataset."""
    from .errors import ShardNotFoundError, UnfinishedPackError
    from .index import open_index

    problem = _dataset_usage_error(location)
    if problem is not None:
        raise ValueError(problem)
    try:
        return open_index(location, s3=_s3_config(args), requests=_request_config(args))
    except UnfinishedPackError:
        raise
    except ShardNotFoundError as exc:
        raise _no_index(exc) from None


def _unfinished_note(index, args: argparse.Namespace) -> str | None:
    """One line when the dataset ``index`` opened is not a finished pack's whole result: its
    index says it is partial (``index build --partial``), or the pack state beside it says
    the pack has not finished (an index built over its shards by an older shardstream)."""
    from .index import unfinished_pack
    from .storage import open_store

    if index.manifest.partial:
        return f"{index.root}: a partial index: it {index.manifest.partial}"
    if index.manifest.shards_url is not None:
        return None
    status = unfinished_pack(
        open_store(index.root, s3=_s3_config(args), requests=_request_config(args)), index.manifest
    )
    return None if status is None else f"{status.describe()}; the index there covers only part of it"


def _tables(index, shards: range):
    """``(shard, ShardTable)`` for each shard in ``shards``, in order, one table held at a time;
    a remote dataset's next :data:`TABLES_AHEAD` tables are requested while one is used."""
    waiting: collections.deque = collections.deque()
    ahead = iter(shards)
    for shard in ahead:
        waiting.append((shard, index.request_table(shard)))
        if len(waiting) > TABLES_AHEAD:
            break
    while waiting:
        shard, collect = waiting.popleft()
        for following in ahead:
            waiting.append((following, index.request_table(following)))
            break
        yield shard, collect()


class _Lookup(ShardstreamError, LookupError):
    """A key or index not in the dataset (exit 1; the message names it and the dataset)."""


def _shard_range(index, shard: int | None, dataset: str) -> range:
    if shard is None:
        return range(index.num_shards)
    if not 0 <= shard < index.num_shards:
        raise _Lookup(
            f"shard {shard} is out of range: {dataset} has {index.num_shards} shards (0 to {index.num_shards - 1})"
        )
    return range(shard, shard + 1)


def _first_shards(index, shards: range, num_samples: int | None) -> range:
    """The shards of ``shards`` that hold their first ``num_samples`` samples (all: None), so
    no table past them is requested."""
    if num_samples is None or not len(shards):
        return shards
    import numpy as np

    counts = np.cumsum(np.asarray(index.manifest.shard_samples[shards.start : shards.stop], np.int64))
    return range(shards.start, shards.start + min(len(shards), int(np.searchsorted(counts, num_samples)) + 1))


def _ls(args: argparse.Namespace, out) -> None:
    index = _open_dataset(args.dataset, args)
    note = _unfinished_note(index, args)
    if note is not None:
        print(f"shardstream: warning: {note}", file=sys.stderr)
    left = args.limit
    shards = _first_shards(index, _shard_range(index, args.shard, args.dataset), left)
    if args.long:
        out.write("# key\tmembers: extension and size in bytes (B), one a column\n")
    for _, table in _tables(index, shards):
        if left is not None and left <= 0:
            return
        count = table.num_samples if left is None else min(left, table.num_samples)
        keys = table.keys()[:count]
        if args.long:
            starts = table.member_start.tolist()
            exts = table.member_extensions
            sizes = table.sizes.tolist()
            lines = [
                "\t".join([escape(key)] + [f"{escape(exts[j])} {sizes[j]} B" for j in range(starts[i], starts[i + 1])])
                for i, key in enumerate(keys)
            ]
        else:
            lines = [escape(key) for key in keys]
        if lines:
            out.write("\n".join(lines) + "\n")
        if left is not None:
            left -= count


def _head(args: argparse.Namespace, out) -> None:
    index = _open_dataset(args.dataset, args)
    rows: list[tuple[str, str, str, str]] = []
    number = 0
    for shard, table in _tables(index, _first_shards(index, range(index.num_shards), args.n)):
        if len(rows) >= args.n:
            break
        starts = table.member_start.tolist()
        exts, sizes = table.member_extensions, table.sizes.tolist()
        for i in range(min(table.num_samples, args.n - len(rows))):
            members = ", ".join(f"{escape(exts[j])} {sizes[j]}" for j in range(starts[i], starts[i + 1]))
            rows.append((str(number), escape(index.manifest.name(shard)), escape(table.key(i)), members))
            number += 1
    header = ("#", "shard", "key", "members (bytes)")
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(3)]
    out.write(f"{index.num_samples} samples in {index.num_shards} shards; the first {len(rows)}:\n")
    for row in [header, *rows]:
        out.write(f"{row[0]:>{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}".rstrip() + "\n")


def _access(index, args: argparse.Namespace):
    from .reading.access import SampleAccess

    return SampleAccess(index, s3=_s3_config(args), requests=_request_config(args))


def _locations(access, index, *, keys: Sequence[str], indices: Sequence[int], dataset: str) -> list[tuple[int, int]]:
    """``(shard, row)`` of each key, then each index; _Lookup naming the first not there."""
    found = []
    for key in keys:
        where = access.find(key)
        if where is None:
            raise _Lookup(f"no sample with key {key!r} in {dataset}{_key_hint(access, key, dataset)}")
        found.append(where)
    for i in indices:
        if not 0 <= i < index.num_samples:
            raise _Lookup(
                f"index {i} is out of range: {dataset} has {index.num_samples} samples"
                + (f" (0 to {index.num_samples - 1})" if index.num_samples else "")
            )
        found.append(access.locate(i))
    return found


def _key_hint(access, key: str, dataset: str) -> str:
    """What to say after "no sample with key KEY": the key and member meant when ``key`` is a
    file's path (``cat/1.jpg``: key ``cat/1``, member ``jpg``; a labelled pack's keys escape the
    file name's dots, ``a.b.jpg``: key ``a%2Eb``), else where the keys are listed."""
    folder, _, name = key.rpartition("/")
    stem, dot, ext = name.rpartition(".")
    if dot and stem:
        escaped = stem.replace("%", "%25").replace(".", "%2E")
        for candidate in dict.fromkeys([f"{folder}/{s}" if folder else s for s in (stem, escaped)]):
            if access.find(candidate) is not None:
                return (
                    f"; did you mean key {candidate!r} with --member {ext}? (a key has no file suffix: the suffix "
                    "names the member)"
                )
        first = name.split(".", 1)[0]
        candidate = f"{folder}/{first}" if folder else first
        if access.find(candidate) is not None:
            return f"; did you mean key {candidate!r} with --member {name.split('.', 1)[1]}?"
    return f" (shardstream ls {dataset} lists the keys)"


def _members(sample: dict) -> list[tuple[str, bytes]]:
    """``(extension, payload)`` of each member of one raw sample, in shard order."""
    return [(ext, data) for ext, data in sample.items() if not ext.startswith("__")]


def _cat(args: argparse.Namespace, out) -> None:
    import tarfile

    if (args.key is None) == (args.index is None):
        raise ValueError("shardstream cat needs a KEY or --index I, not both")
    index = _open_dataset(args.dataset, args)
    access = _access(index, args)
    keys, indices = ([args.key], []) if args.key is not None else ([], [args.index])
    [sample] = access.read(_locations(access, index, keys=keys, indices=indices, dataset=args.dataset))
    members = _members(sample)
    key = sample["__key__"]
    if args.member is not None:
        wanted = args.member.removeprefix(".")
        data = dict(members).get(wanted)
        if data is None:
            data = {ext.lower(): value for ext, value in members}.get(wanted.lower())
        if data is None:
            raise _Lookup(
                f"sample {key!r} of {args.dataset} has no member {wanted!r}; its members: "
                + ", ".join(escape(ext) for ext, _ in members)
            )
        out.write(data)
        return
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for ext, data in members:
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))


def unsafe_path(name: str) -> str | None:
    """Why ``name`` cannot be written under a directory as it is, or None when it can.

    Args:
        name: a relative file name from a sample table, ``KEY`` or ``KEY.EXT``
            (``a/b/c.jpg`` is fine: ``get`` makes the folders).

    Returns:
        None, or the reason as words that follow the name in a message: an absolute path, a
        ``..`` component, an empty or ``.`` component, or a NUL, control or other
        non-printable character (which could also mislead a terminal).
    """
    if name.startswith("/"):
        return "is an absolute path"
    if any(not char.isprintable() for char in name):
        return "holds a NUL, control or other non-printable character"
    parts = name.split("/")
    if ".." in parts:
        return "has a .. component"
    if any(part in ("", ".") for part in parts):
        return "has an empty or . component"
    return None


def _refuse(args: argparse.Namespace, *, key: str, index: int, what: str, name: str, why: str, ext: str) -> int:
    """Print why sample ``key`` is not written by ``get`` (nothing is), and return exit code 2."""
    instead = f"shardstream cat {args.dataset} --index {index} --member {escape(ext)} > FILE"
    print(
        f"shardstream: error: refusing to write sample {key!r} of {args.dataset}: its {what} {name!r} {why}, which "
        f"could land outside {args.output} or mislead a terminal; nothing was written ({instead} writes it to a "
        "name you choose)",
        file=sys.stderr,
    )
    return 2


def _get(args: argparse.Namespace, out) -> int:
    if not args.keys and not args.index:
        raise ValueError("shardstream get needs KEYs or --index I...")
    index = _open_dataset(args.dataset, args)
    access = _access(index, args)
    locations = _locations(access, index, keys=args.keys, indices=args.index or [], dataset=args.dataset)
    for shard, row in locations:  # checked before reading: the tar reader refuses a `..` name outright
        key = index.table(shard).key(row)
        why = unsafe_path(key)
        if why is not None:
            number = access.global_index(shard, row)
            return _refuse(args, key=key, index=number, what="key", name=key, why=why, ext="EXT")
    samples = access.read(locations)
    files = []
    for sample in samples:
        for ext, data in _members(sample):
            name = f"{sample['__key__']}.{ext}"
            why = unsafe_path(name)
            if why is not None:
                key, number = sample["__key__"], sample["__index__"]
                return _refuse(args, key=key, index=number, what="file name", name=name, why=why, ext=ext)
            files.append((name, data))
    root = os.path.realpath(args.output)
    for name, data in files:
        path = os.path.join(root, name)
        if os.path.commonpath([root, os.path.realpath(os.path.dirname(path))]) != root:
            raise ValueError(f"{os.path.dirname(path)} leads outside {args.output} (a symbolic link); not written")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
    total = sum(len(data) for _, data in files)
    out.write(f"wrote {len(files)} files ({total} bytes) of {len(samples)} samples to {args.output}\n")
    return 0


def extension_totals(index, *, progress: bool = False) -> dict[str, list[int]]:
    """Per member extension, the samples having it, its members and their bytes, computed
    from every sample table of the dataset (``NAME.samples``; no shard is read).

    Args:
        index: an opened dataset (:func:`~shardstream.open_index`).
        progress: a bar on stderr counting the tables read.

    Returns:
        ``{extension: [samples, members, bytes]}`` sorted by extension, where the extension is
        the lower-cased last dot part of a member's extension (``seg.PNG`` -> ``png``; "" for
        a member named as its key) and bytes are payload bytes. Costs one table read per shard
        (one GET each, :data:`TABLES_AHEAD` in flight, for a remote dataset), one table held at
        a time: O(shards) requests, memory of one shard's table.

    Raises:
        ShardNotFoundError: a table is missing; IndexFormatError: one is damaged.
    """
    from tqdm import tqdm

    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    with tqdm(
        total=index.num_shards, unit=" tables", desc="reading tables", disable=not progress, file=sys.stderr
    ) as bar:
        for _, table in _tables(index, range(index.num_shards)):
            uniform = table.extensions
            if uniform is not None:
                sizes = table.sizes.reshape(table.num_samples, len(uniform)).sum(axis=0).tolist()
                seen: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
                for ext, size in zip(uniform, sizes, strict=True):
                    seen[ext.rsplit(".", 1)[-1].lower()][0] += 1
                    seen[ext.rsplit(".", 1)[-1].lower()][1] += size
                for ext, (count, size) in seen.items():
                    row = totals[ext]
                    row[0] += table.num_samples
                    row[1] += count * table.num_samples
                    row[2] += size
            else:
                starts = table.member_start.tolist()
                exts, sizes = table.member_extensions, table.sizes.tolist()
                for i in range(table.num_samples):
                    mine = set()
                    for j in range(starts[i], starts[i + 1]):
                        ext = exts[j].rsplit(".", 1)[-1].lower()
                        row = totals[ext]
                        row[1] += 1
                        row[2] += sizes[j]
                        mine.add(ext)
                    for ext in mine:
                        totals[ext][0] += 1
            bar.update()
    return dict(sorted(totals.items()))


def _members_info(totals: dict[str, list[int]]) -> list[str]:
    """``info --members``' table: one row per extension, its samples, members and bytes."""
    rows = [("extension", "samples", "members", "bytes")]
    rows += [(escape(ext) if ext else "(none)", *map(str, values)) for ext, values in totals.items()]
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    return [f"  {a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}  {d:>{widths[3]}}" for a, b, c, d in rows]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="shardstream", description="Pack small files into tar shards and stream them back."
    )
    parser.add_argument("--version", action="version", version=f"shardstream {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("pack", help="pack files into tar shards plus an index (resumable: run it again)")
    p.add_argument(
        "source", metavar="SOURCE", help="local directory, or a prefix of files: s3://, gs://, az://, hf://datasets/..."
    )
    p.add_argument("dest", metavar="DEST", help="local directory or a writable prefix: s3://, gs://, az://")
    p.add_argument("--name", default="data", help="shard name prefix: NAME-000000.tar ... (default: data)")
    p.add_argument(
        "--shard-size",
        type=_size_arg,
        default="256MiB",
        metavar="SIZE",
        help="max bytes per shard, e.g. 256MiB, 256MB or 256M (M = MB); a number without a unit counts bytes "
        "(default: 256MiB)",
    )
    p.add_argument(
        "--max-samples-per-shard",
        type=_positive_int,
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
        choices=[e.value for e in OnError],
        default=OnError.FAIL.value,
        help="on a bad input file: fail naming it (default), or skip it and list it in DEST/pack-report.jsonl",
    )
    p.add_argument("--skip-unreadable", action="store_true", help="the same as --on-error skip")
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help=f"processes writing shards (default: the CPU count, {os.cpu_count()}; with --ray, "
        "Ray tasks, default the cluster's CPU count)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="run the pack as tasks on the Ray cluster at ADDRESS (default: RAY_ADDRESS, else auto, the "
        "cluster started on this machine); SOURCE and DEST must be reachable from every node",
    )
    p.add_argument(
        "--part",
        type=_part_arg,
        default=None,
        metavar="I/N",
        help="pack part I of N of the input (default: RANK/WORLD_SIZE or a job array's index, "
        "else all); the last part to finish writes the index",
    )
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
        type=_class_list,
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
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset (or unfinished pack) at DEST: delete what its index and pack state record "
        "(shards, tables, index.bin, keys/, the report, .shardstream/) and nothing else; what is kept is listed",
    )
    p.add_argument(
        "--clobber",
        action="store_true",
        help="write over files at DEST with the names this pack writes (NAME-NNNNNN.tar, their tables, index.bin, "
        "keys/, pack-report.jsonl, .shardstream/) that no index or pack state there records; without it such a "
        "DEST is refused, naming them",
    )
    p.add_argument(
        "--from-shards",
        action="store_true",
        help="SOURCE is tar shards (a directory or prefix of .tar/.tar.gz/.tar.zst, or a brace pattern): "
        "repack their samples (resharding)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_store_args(p)

    i = commands.add_parser("info", help="totals and shard statistics of a packed dataset")
    i.add_argument(
        "source",
        metavar="DATASET",
        help="local directory, a URL (s3://, https://, hf://datasets/..., gs://, az://), or its index file",
    )
    i.add_argument(
        "--all-classes",
        action="store_true",
        help=f"list every class of a labelled dataset (default: the first and last {CLASSES_SHOWN} of a long list)",
    )
    i.add_argument(
        "--members",
        action="store_true",
        help="also count the samples, members and bytes of each member extension (reads every shard's sample "
        "table: one GET per shard for a remote dataset)",
    )
    i.add_argument("--no-progress", action="store_true", help="with --members: no progress bar")
    _add_store_args(i)

    dataset_help = "local directory, a URL (s3://, https://, hf://datasets/..., gs://, az://), or its index file"
    ls = commands.add_parser("ls", help="list a dataset's sample keys in index order, one a line")
    ls.add_argument("dataset", metavar="DATASET", help=dataset_help)
    ls.add_argument("--shard", type=int, metavar="N", help="list shard N only (0 is the first, as in the index)")
    ls.add_argument("--limit", type=_positive_int, metavar="N", help="list the first N keys only")
    ls.add_argument(
        "--long", action="store_true", help="after each key, its members' extensions and sizes in bytes, tab-separated"
    )
    _add_store_args(ls)

    h = commands.add_parser("head", help="the first samples' keys, members and sizes, as a table")
    h.add_argument("dataset", metavar="DATASET", help=dataset_help)
    h.add_argument("-n", type=_positive_int, default=HEAD_SAMPLES, metavar="N", help="samples shown (default: 10)")
    _add_store_args(h)

    c = commands.add_parser(
        "cat", help="write one sample's member to stdout (--member EXT), or all its members as a tar stream"
    )
    c.add_argument("dataset", metavar="DATASET", help=dataset_help)
    c.add_argument("key", metavar="KEY", nargs="?", help="the sample's key (or give --index)")
    c.add_argument("--index", type=int, metavar="I", help="the sample at index I (0 is the first, in index order)")
    c.add_argument("--member", metavar="EXT", help="write this member's bytes only (jpg, cls, ...)")
    _add_store_args(c)

    g = commands.add_parser("get", help="write each member of the samples with these keys as DIR/KEY.EXT")
    g.add_argument("dataset", metavar="DATASET", help=dataset_help)
    g.add_argument("keys", metavar="KEY", nargs="*", help="sample keys")
    g.add_argument("--index", type=int, nargs="+", metavar="I", help="also the samples at these indices")
    g.add_argument("-o", "--output", required=True, metavar="DIR", help="the directory to write to (made if absent)")
    _add_store_args(g)

    v = commands.add_parser("verify", help="re-read every shard and check it against the index")
    v.add_argument("dest", metavar="DATASET", help="local directory or a URL (s3://, https://, hf://, gs://, az://)")
    v.add_argument(
        "--decode",
        action="store_true",
        help="also decode every image member (jpg, png, webp, ...) with Pillow and name each one that does not",
    )
    v.add_argument(
        "--decode-threads",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --decode: threads decoding images (default: the CPUs this process may use)",
    )
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_store_args(v)

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
    _add_store_args(m)
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
        type=_positive_int,
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
    _add_store_args(b)
    u = x_commands.add_parser(
        "upgrade", help="convert a version 1 dataset (index.json) to version 2 in place; the shards are not touched"
    )
    u.add_argument("dest", metavar="DEST")
    _add_store_args(u)
    k = x_commands.add_parser(
        "keys",
        help="add a key index (DEST/keys/) to a dataset, from its tables, so samples are found by key in one "
        "small read: for shuffled packs, foreign datasets (index build) and datasets written before keys/",
    )
    k.add_argument("dest", metavar="DEST")
    k.add_argument("--no-progress", action="store_true", help="no progress lines")
    _add_store_args(k)

    pl = commands.add_parser(
        "plan",
        help="predict a training job's loading speed, egress, requests and cost from the dataset's index",
    )
    pl.add_argument("dataset", metavar="DATASET", help=dataset_help)
    pl.add_argument("--nodes", type=_positive_int, default=1, metavar="N", help="nodes (default: 1)")
    pl.add_argument("--gpus-per-node", type=_positive_int, default=1, metavar="G", help="ranks per node (default: 1)")
    pl.add_argument("--workers", type=int, default=2, metavar="W", help="DataLoader workers per rank (default: 2)")
    pl.add_argument("--batch-size", type=_positive_int, default=64, metavar="B", help="batch size (default: 64)")
    pace = pl.add_mutually_exclusive_group()
    pace.add_argument("--step-time-s", type=_seconds, metavar="S", help="seconds per training step (the pace)")
    pace.add_argument(
        "--samples-per-s-per-gpu", type=_positive_number, metavar="R", help="samples/s each GPU consumes (the pace)"
    )
    pl.add_argument(
        "--cache-bytes", type=_plan_size, default=0, metavar="SIZE", help="node cache per node, e.g. 200G (default: 0)"
    )
    pl.add_argument("--no-shuffle", action="store_true", help="shuffle=False")
    pl.add_argument("--seed", type=int, default=0, help="shuffle seed (default: 0)")
    pl.add_argument("--shuffle-buffer", type=int, default=1000, metavar="N", help="samples (default: 1000)")
    pl.add_argument("--max-open-shards", type=_positive_int, default=4, metavar="N", help="lanes (default: 4)")
    pl.add_argument("--drop-last", action="store_true", help="drop_last=True")
    pl.add_argument("--shard-affinity", choices=["node"], help="node: each node keeps its share of the shards")
    pl.add_argument("--epochs", type=_positive_int, default=2, metavar="E", help="epochs to plan (default: 2)")
    pl.add_argument("--latency-ms", type=_positive_number, metavar="MS", help="first-byte time of a GET")
    pl.add_argument(
        "--bandwidth-per-node", type=_plan_size, metavar="BYTES/S", help="a node's read bandwidth, e.g. 1.25G"
    )
    pl.add_argument("--bandwidth-per-stream", type=_plan_size, metavar="BYTES/S", help="one connection's, e.g. 100M")
    pl.add_argument(
        "--request-rate-limit", type=_positive_number, metavar="GETS/S", help="GETs/s the store serves the whole job"
    )
    pl.add_argument("--price-per-gb", type=float, metavar="USD", help="egress price per GB")
    pl.add_argument("--price-per-1000-gets", type=float, metavar="USD", help="price per 1,000 GETs")
    pl.add_argument("--cpu-s-per-sample", type=_seconds, metavar="S", help="reader CPU seconds per sample")
    pl.add_argument(
        "--cpu-s-per-sample-cached", type=_seconds, metavar="S", help="the same, for samples read from the node cache"
    )
    pl.add_argument("--open-s", type=_seconds, metavar="S", help="seconds to open the dataset (index, client)")
    pl.add_argument("--client-s", type=_seconds, metavar="S", help="seconds a new store client takes to its first GET")
    pl.add_argument("--worker-start-s", type=_seconds, metavar="S", help="seconds to start a DataLoader worker")
    pl.add_argument("--cores-per-node", type=int, metavar="N", help="CPU cores per node (default: one per worker)")
    pl.add_argument("--persistent-workers", action="store_true", help="the DataLoader's persistent_workers=True")
    pl.add_argument(
        "--probe", action="store_true", help="measure latency, bandwidth and CPU from here against the store"
    )
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--plot", metavar="FILE.png", help="also draw the plan into this PNG (needs matplotlib)")
    _add_s3_args(pl)

    d = commands.add_parser(
        "demo", help="make a small image dataset, pack it to a local S3 server, train-read one epoch"
    )
    d.add_argument("--num-images", type=_positive_int, default=3000, help="images to make and pack (default: 3000)")
    d.add_argument("--num-workers", type=int, default=2, help="DataLoader workers reading them (default: 2)")
    d.add_argument("--batch-size", type=_positive_int, default=64, help="DataLoader batch size (default: 64)")
    d.add_argument("--workdir", help="keep the generated files here (default: a temporary directory)")
    d.add_argument("--local", action="store_true", help="pack to a local directory instead of S3")

    from .testing.s3server import add_arguments as add_s3_server_arguments

    s = commands.add_parser(
        "s3-server",
        help="run a local S3 server (SeaweedFS) for local work: create --bucket NAMEs, print the export "
        "AWS_... lines, stop on Ctrl-C",
    )
    add_s3_server_arguments(s)
    return parser


PROBLEMS_SHOWN = 20  # problems `shardstream pack` prints on stderr; pack-report.jsonl lists every one


def _print_problems(report) -> None:
    """The pack's problems on stderr, as the report lists them: ``not packed: PATH: REASON``, or
    ``warning: PATH: REASON`` for what was packed all the same; the first :data:`PROBLEMS_SHOWN`."""
    for problem in report.problems[:PROBLEMS_SHOWN]:
        print(f"{'warning' if problem.packed else 'not packed'}: {problem.path}: {problem.reason}", file=sys.stderr)
    more = len(report.problems) - PROBLEMS_SHOWN
    if more > 0:
        print(f"... and {more} more, all listed in {report.dest}/pack-report.jsonl", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the command, map :class:`ShardstreamError` to exit code 1."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "pack":
            from .packing.pack import pack

            note = _shard_size_note(args.shard_size.text, args.shard_size)
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
                s3=_s3_config(args),
                progress=not args.no_progress,
                from_shards=args.from_shards,
                ray=args.ray,
                requests=_request_config(args),
                labels_from_dirs=args.labels_from_dirs,
                check_images=args.check_images,
                labels_from=args.labels_from,
                classes=args.classes,
                classes_from=args.classes_from,
            )
            _print_problems(report)
            print(report.summary())
        elif args.command == "info":
            index = _open_dataset(args.source, args)
            note = _unfinished_note(index, args)
            if note is not None:
                print(f"warning: {note}")
            print(_info(args.source, index.manifest, all_classes=args.all_classes))
            if args.members:
                totals = extension_totals(index, progress=not args.no_progress)
                print("\n".join(["members by extension:", *_members_info(totals)]))
        elif args.command == "ls":
            _ls(args, sys.stdout)
            sys.stdout.flush()
        elif args.command == "head":
            _head(args, sys.stdout)
            sys.stdout.flush()
        elif args.command == "cat":
            _cat(args, sys.stdout.buffer)
            sys.stdout.buffer.flush()
        elif args.command == "get":
            return _get(args, sys.stdout)
        elif args.command == "verify":
            note = _unfinished_note(_open_dataset(args.dest, args), args)
            code = _verify(args)
            if note is not None:
                print(f"the dataset is not whole: {note}")
            return code or (1 if note is not None else 0)
        elif args.command == "index" and args.dali:
            from .packing.dali_index import write_dali_index

            written = write_dali_index(args.dali, out_dir=args.out_dir)
            where = args.out_dir or args.dali
            print(f"wrote {len(written)} DALI index files (.idx) to {where}")
        elif args.command == "index" and args.index_command == "build":
            from tqdm import tqdm

            from .packing.build import build_index, shard_urls_of

            s3, requests = _s3_config(args), _request_config(args)
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
        elif args.command == "index" and args.index_command == "upgrade":
            from .index import MANIFEST_NAME, upgrade
            from .storage import open_store

            s3, requests = _s3_config(args), _request_config(args)
            totals = upgrade(args.dest, s3=s3, requests=requests)
            print(
                f"wrote {open_store(args.dest, s3=s3, requests=requests).url_of(MANIFEST_NAME)} and a sample table "
                f"beside each shard: {totals['num_shards']} shards, {totals['num_samples']} samples"
            )
        elif args.command == "index" and args.index_command == "keys":
            from .index import build_key_index

            report = build_key_index(
                args.dest, s3=_s3_config(args), requests=_request_config(args), progress=not args.no_progress
            )
            print(
                f"wrote {report.url}: {report.num_keys} keys in {report.num_partitions} partitions, "
                f"{report.bytes / 1e6:.1f} MB, in {report.seconds:.1f} s"
                + ("; key ranges recorded in index.bin (keys sorted)" if report.key_ranges is not None else "")
            )
        elif args.command == "index":
            if args.index_command != "merge":
                raise ValueError(
                    "`shardstream index` needs a command: build SHARDS..., merge DEST, upgrade DEST, keys DEST, "
                    "or --dali DEST"
                )
            from .index import MANIFEST_NAME
            from .packing.destination import merge_pack
            from .storage import open_store

            store = open_store(args.dest, s3=_s3_config(args), requests=_request_config(args))
            totals, problems = merge_pack(store, overwrite=args.overwrite)
            print(
                f"wrote {store.url_of(MANIFEST_NAME)}: {totals['num_shards']} shards, "
                f"{totals['num_samples']} samples, {len(problems)} problems in pack-report.jsonl"
            )
        elif args.command == "plan":
            from .planner import plan, plot

            job = plan(
                args.dataset,
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                workers=args.workers,
                batch_size=args.batch_size,
                step_time_s=args.step_time_s,
                samples_per_s_per_gpu=args.samples_per_s_per_gpu,
                cache_bytes=args.cache_bytes,
                shuffle=not args.no_shuffle,
                seed=args.seed,
                shuffle_buffer=args.shuffle_buffer,
                max_open_shards=args.max_open_shards,
                drop_last=args.drop_last,
                shard_affinity=args.shard_affinity,
                epochs=args.epochs,
                latency_ms=args.latency_ms,
                bandwidth_per_node=args.bandwidth_per_node,
                bandwidth_per_stream=args.bandwidth_per_stream,
                request_rate_limit=args.request_rate_limit,
                price_per_gb=args.price_per_gb,
                price_per_1000_gets=args.price_per_1000_gets,
                cpu_s_per_sample=args.cpu_s_per_sample,
                cpu_s_per_sample_cached=args.cpu_s_per_sample_cached,
                open_s=args.open_s,
                client_s=args.client_s,
                worker_start_s=args.worker_start_s,
                cores_per_node=args.cores_per_node,
                persistent_workers=args.persistent_workers,
                probe=args.probe,
                s3=_s3_config(args),
            )
            if args.plot:
                plot(job, args.plot)
            print(job.to_json(indent=2) if args.json else job.table())
        elif args.command == "s3-server":
            from .testing.s3server import run

            return run(args, prog="shardstream s3-server")
        elif args.command == "demo":
            from .demo import run_demo

            run_demo(
                num_images=args.num_images,
                num_workers=args.num_workers,
                batch_size=args.batch_size,
                workdir=args.workdir,
                local=args.local,
            )
    except ShardstreamError as exc:
        print(f"shardstream: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # an argument the library refused: a usage error
        print(f"shardstream: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        resume = ""
        if args.command == "pack":
            resume = "; run the same command again to resume: the shards published so far are kept"
        elif args.command == "index" and args.index_command == "build":
            resume = "; run the same command again with --overwrite (the tables written so far have no index yet)"
        print(f"shardstream: interrupted{resume}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `shardstream info ... | head`: the reader has gone, which is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail again
        return 141  # 128 + SIGPIPE, as a shell reports a command a pipe cut short
    return 0


if __name__ == "__main__":
    sys.exit(main())
