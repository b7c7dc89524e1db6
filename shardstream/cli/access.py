"""``shardstream ls``, ``head``, ``cat`` and ``get``: samples by key or index, from the shell."""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Sequence

from ..errors import ShardstreamError
from ..index.browse import iter_tables
from .options import (
    DATASET_HELP,
    add_store_args,
    open_dataset,
    positive_int,
    request_config,
    s3_config,
    unfinished_note,
)

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
    index = open_dataset(args.dataset, args)
    note = unfinished_note(index, args)
    if note is not None:
        print(f"shardstream: warning: {note}", file=sys.stderr)
    left = args.limit
    shards = _first_shards(index, _shard_range(index, args.shard, args.dataset), left)
    if args.long:
        out.write("# key\tmembers: extension and size in bytes (B), one a column\n")
    for _, table in iter_tables(index, shards):
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
    index = open_dataset(args.dataset, args)
    rows: list[tuple[str, str, str, str]] = []
    number = 0
    for shard, table in iter_tables(index, _first_shards(index, range(index.num_shards), args.n)):
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
    from ..reading.access import SampleAccess

    return SampleAccess(index, s3=s3_config(args), requests=request_config(args))


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
    index = open_dataset(args.dataset, args)
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
    index = open_dataset(args.dataset, args)
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


def add_parsers(commands) -> None:
    """Add ``ls``, ``head``, ``cat`` and ``get``."""
    ls = commands.add_parser("ls", help="list a dataset's sample keys in index order, one a line")
    ls.add_argument("dataset", metavar="DATASET", help=DATASET_HELP)
    ls.add_argument("--shard", type=int, metavar="N", help="list shard N only (0 is the first, as in the index)")
    ls.add_argument("--limit", type=positive_int, metavar="N", help="list the first N keys only")
    ls.add_argument(
        "--long", action="store_true", help="after each key, its members' extensions and sizes in bytes, tab-separated"
    )
    add_store_args(ls)

    h = commands.add_parser("head", help="the first samples' keys, members and sizes, as a table")
    h.add_argument("dataset", metavar="DATASET", help=DATASET_HELP)
    h.add_argument("-n", type=positive_int, default=HEAD_SAMPLES, metavar="N", help="samples shown (default: 10)")
    add_store_args(h)

    c = commands.add_parser(
        "cat", help="write one sample's member to stdout (--member EXT), or all its members as a tar stream"
    )
    c.add_argument("dataset", metavar="DATASET", help=DATASET_HELP)
    c.add_argument("key", metavar="KEY", nargs="?", help="the sample's key (or give --index)")
    c.add_argument("--index", type=int, metavar="I", help="the sample at index I (0 is the first, in index order)")
    c.add_argument("--member", metavar="EXT", help="write this member's bytes only (jpg, cls, ...)")
    add_store_args(c)

    g = commands.add_parser("get", help="write each member of the samples with these keys as DIR/KEY.EXT")
    g.add_argument("dataset", metavar="DATASET", help=DATASET_HELP)
    g.add_argument("keys", metavar="KEY", nargs="*", help="sample keys")
    g.add_argument("--index", type=int, nargs="+", metavar="I", help="also the samples at these indices")
    g.add_argument("-o", "--output", required=True, metavar="DIR", help="the directory to write to (made if absent)")
    add_store_args(g)
    ls.set_defaults(run=run_ls)
    h.set_defaults(run=run_head)
    c.set_defaults(run=run_cat)
    g.set_defaults(run=run_get)


def run_ls(args: argparse.Namespace) -> int | None:
    """``shardstream ls``."""
    _ls(args, sys.stdout)
    sys.stdout.flush()


def run_head(args: argparse.Namespace) -> int | None:
    """``shardstream head``."""
    _head(args, sys.stdout)
    sys.stdout.flush()


def run_cat(args: argparse.Namespace) -> int | None:
    """``shardstream cat``."""
    _cat(args, sys.stdout.buffer)
    sys.stdout.buffer.flush()


def run_get(args: argparse.Namespace) -> int | None:
    """``shardstream get``."""
    return _get(args, sys.stdout)
