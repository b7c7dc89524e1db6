"""``shardstream info``: a dataset's totals, shard statistics, classes and (``--members``) member extensions;
for a token dataset (``tokens.bin`` beside ``index.bin``) also its tokens, documents and tokenizer."""

from __future__ import annotations

import argparse
import re
import sys

from ..index import browse
from .access import escape
from .options import add_store_args, open_dataset, request_config, s3_config, unfinished_note

CLASSES_SHOWN = 10  # `shardstream info` lists the first and last this many classes (--all-classes: every one)


def _info(source: str, manifest, *, all_classes: bool = False) -> str:
    import numpy as np

    from ..packing.destination import counted

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


def _tokens_info(tokens, *, has_docids: bool, source: str) -> list[str]:
    """``shardstream info``'s lines on a token dataset, from its ``tokens.bin`` (a
    :class:`~shardstream.tokens.format.TokenManifest`)."""
    import numpy as np

    fields = tokens.fields
    eod = fields.get("eod_id")
    lines = [
        f"tokens: {tokens.num_tokens:,} in {tokens.num_docs:,} documents, {fields.get('dtype')}, "
        f"vocab_size {fields.get('vocab_size')}, eod id {'none' if eod is None else eod}"
    ]
    tokenizer = fields.get("tokenizer")
    if isinstance(tokenizer, dict) and tokenizer.get("name"):
        sha = tokenizer.get("sha256")
        lines.append(f"tokenizer: {escape(str(tokenizer['name']))}" + (f" (sha256 {sha})" if sha else ""))
    else:
        lines.append("tokenizer: none recorded")
    percentiles = fields.get("doc_length_percentiles") or {}
    if percentiles:
        order = sorted(percentiles, key=lambda k: (k == "max", int(k[1:]) if k[1:].isdigit() else 0))
        lines.append("document length in tokens: " + ", ".join(f"{k} {percentiles[k]}" for k in order))
    column = tokens.columns["num_tokens"]
    if len(column):
        lines.append(f"tokens per shard: min {column.min()}, median {np.median(column):.0f}, max {column.max()}")
    if fields.get("source"):
        lines.append(f"source: {escape(str(fields['source']))}")
    lines.append(
        f"document ids: docids/ (a document by id: shardstream tokens-get {source} ID)"
        if has_docids
        else f"document ids: no index (build it: shardstream tokens-get {source} --build-index)"
    )
    return lines


def _token_manifest(index, args: argparse.Namespace):
    """``(TokenManifest, docids/ present)`` of a token dataset, or None for a dataset of samples."""
    from ..errors import ShardNotFoundError
    from ..storage import open_store
    from ..tokens.format import TOKENS_INDEX_NAME, TokenManifest

    store = open_store(index.root, s3=s3_config(args), requests=request_config(args))
    try:
        data = store.read_bytes(TOKENS_INDEX_NAME)
    except ShardNotFoundError:
        return None
    return TokenManifest.parse(data, url=store.url_of(TOKENS_INDEX_NAME)), store.exists("docids/header.bin")


def extension_totals(index, *, progress: bool = False) -> dict[str, list[int]]:
    """:func:`shardstream.index.browse.extension_totals` with a bar on stderr counting the
    tables read (``progress``)."""
    from tqdm import tqdm

    with tqdm(
        total=index.num_shards, unit=" tables", desc="reading tables", disable=not progress, file=sys.stderr
    ) as bar:
        return browse.extension_totals(index, on_table=bar.update)


def _members_info(totals: dict[str, list[int]]) -> list[str]:
    """``info --members``' table: one row per extension, its samples, members and bytes."""
    rows = [("extension", "samples", "members", "bytes")]
    rows += [(escape(ext) if ext else "(none)", *map(str, values)) for ext, values in totals.items()]
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    return [f"  {a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}  {d:>{widths[3]}}" for a, b, c, d in rows]


def add_parsers(commands) -> None:
    """Add ``info``."""
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
    add_store_args(i)
    i.set_defaults(run=run)


def run(args: argparse.Namespace) -> int | None:
    """``shardstream info``."""
    index = open_dataset(args.source, args)
    note = unfinished_note(index, args)
    if note is not None:
        print(f"warning: {note}")
    print(_info(args.source, index.manifest, all_classes=args.all_classes))
    tokens = _token_manifest(index, args)
    if tokens is not None:
        print("\n".join(_tokens_info(tokens[0], has_docids=tokens[1], source=args.source)))
    if args.members:
        totals = extension_totals(index, progress=not args.no_progress)
        print("\n".join(["members by extension:", *_members_info(totals)]))
