"""``shardstream import-tokens`` (Megatron ``.bin``/``.idx`` pairs or datatrove ``.ds`` files ->
a token dataset) and ``shardstream tokens-get`` (a document of a token dataset by its id):
see docs/tokens.md."""

from __future__ import annotations

import argparse
import os
import sys

from .options import add_store_args, dataset_usage_error, positive_int, request_config, s3_config

__all__ = ["add_parsers", "detect_format"]

FORMATS = ("megatron", "datatrove")
_NAMES = {"megatron": "Megatron", "datatrove": "datatrove"}


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 0")
    return value


def _format_of(path: str) -> str | None:
    """``"megatron"``, ``"datatrove"`` or None (cannot tell) for one SRC."""
    if path.endswith((".ds", ".ds.index", ".ds.metadata")):
        return "datatrove"
    if path.endswith((".bin", ".idx")):
        return "megatron"
    if os.path.isdir(path):
        names = os.listdir(path)
        found = {"datatrove" for n in names if n.endswith(".ds")} | {"megatron" for n in names if n.endswith(".idx")}
        return found.pop() if len(found) == 1 else None
    if os.path.isfile(path + ".bin") or os.path.isfile(path + ".idx"):
        return "megatron"  # a Megatron prefix
    return None


def detect_format(sources: list[str]) -> str:
    """The ``--from`` the SRC paths' names say: ``.bin``/``.idx`` (or a Megatron PREFIX)
    Megatron, ``.ds`` datatrove, a directory by the files it holds.

    Raises:
        ValueError: a SRC that says neither, or SRCs of both (names them; give --from).
    """
    found = {source: _format_of(source) for source in sources}
    unknown = [source for source, kind in found.items() if kind is None]
    if unknown:
        what = "no such file or directory" if not os.path.exists(unknown[0]) else "neither Megatron nor datatrove files"
        raise ValueError(
            f"{unknown[0]}: {what}, by its name; pass Megatron PREFIX, PREFIX.bin or PREFIX.idx, datatrove .ds "
            "files, or a directory of either, or say which with --from megatron|datatrove"
        )
    kinds = set(found.values())
    if len(kinds) > 1:
        raise ValueError(
            "the SRCs mix Megatron and datatrove files; import each kind with its own shardstream import-tokens run"
        )
    return kinds.pop()  # type: ignore[return-value]


def add_parsers(commands) -> None:
    """Add ``import-tokens`` and ``tokens-get``."""
    i = commands.add_parser(
        "import-tokens",
        help="import Megatron .bin/.idx pairs or datatrove .ds files into a token dataset (documents kept exactly)",
    )
    i.add_argument(
        "sources",
        metavar="SRC",
        nargs="+",
        help="Megatron PREFIX (or PREFIX.bin / PREFIX.idx), datatrove .ds files, or directories of them; "
        "their documents follow each other in this order",
    )
    i.add_argument("dest", metavar="DEST", help="a new local directory or a writable prefix: s3://, gs://, az://")
    i.add_argument(
        "--from",
        dest="kind",
        choices=FORMATS,
        help="what the SRCs are (default: told by their names: .bin/.idx Megatron, .ds datatrove)",
    )
    i.add_argument(
        "--vocab-size",
        type=positive_int,
        metavar="N",
        help="token ids are below N (checked); up to 65536 the tokens are stored as uint16, else uint32 "
        "(default: the largest id + 1, rounded up to a multiple of 128)",
    )
    i.add_argument(
        "--eod-id",
        type=non_negative_int,
        metavar="N",
        help="the end-of-document token, recorded (not appended: the documents are copied as they are)",
    )
    i.add_argument(
        "--max-shard-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="tokens per shard at most (a longer document makes a shard of its own; default: 67108864)",
    )
    i.add_argument(
        "--tokenizer",
        metavar="NAME_OR_PATH",
        help="the tokenizer to record (a tokenizer.json's sha256 is recorded too; default for datatrove: the one "
        "its .ds.metadata names)",
    )
    i.add_argument("--name", default="tokens", help="shard name prefix: NAME-000000.tar ... (default: tokens)")
    i.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_store_args(i)
    i.set_defaults(run=run_import, resume_hint=": DEST holds the shards written so far; remove it and run again")

    g = commands.add_parser(
        "tokens-get",
        help="print a token dataset's documents by id: their token ids, or with --decode their text",
    )
    g.add_argument("dest", metavar="DEST", help="the token dataset (local directory or URL)")
    g.add_argument(
        "doc_ids", metavar="DOC_ID", nargs="*", help="document ids (import-tokens: NAME:N), one line printed each"
    )
    g.add_argument(
        "--decode", metavar="TOKENIZER_JSON", help="print each document's text, decoded with this tokenizer.json"
    )
    g.add_argument(
        "--build-index",
        action="store_true",
        help="first build DEST/docids/, the document-id index (import-tokens and pack-text build it when they finish)",
    )
    add_store_args(g)
    g.set_defaults(run=run_get)


def run_import(args: argparse.Namespace) -> int | None:
    """``shardstream import-tokens``."""
    from tqdm import tqdm

    from ..tokens.imports import import_datatrove, import_megatron
    from ..tokens.writer import DEFAULT_MAX_SHARD_TOKENS

    kind = args.kind or detect_format(args.sources)
    importer = import_megatron if kind == "megatron" else import_datatrove
    with tqdm(unit=" tokens", unit_scale=True, desc="importing", disable=args.no_progress, file=sys.stderr) as bar:
        report = importer(
            args.sources,
            args.dest,
            vocab_size=args.vocab_size,
            eod_id=args.eod_id,
            max_shard_tokens=args.max_shard_tokens or DEFAULT_MAX_SHARD_TOKENS,
            tokenizer=args.tokenizer,
            name=args.name,
            s3=s3_config(args),
            requests=request_config(args),
            on_tokens=bar.update,
        )
    print(report.summary(_NAMES[kind]))
    return None


def _tokenizer(path: str):
    """The ``tokenizers.Tokenizer`` of the file ``path``; ValueError naming it when it cannot be loaded."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("--decode needs the tokenizers package: pip install 'shardstream[text]'") from None
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # noqa: BLE001 (tokenizers raises plain Exceptions)
        raise ValueError(f"{path}: not a tokenizer.json that tokenizers can load ({exc})") from None


def run_get(args: argparse.Namespace) -> int | None:
    """``shardstream tokens-get``."""
    from ..tokens.docids import TokenIds, build_docid_index

    if not args.doc_ids and not args.build_index:
        raise ValueError("shardstream tokens-get needs DOC_IDs (or --build-index)")
    problem = dataset_usage_error(args.dest)
    if problem is not None:
        raise ValueError(problem)
    s3, requests = s3_config(args), request_config(args)
    if args.build_index:
        report = build_docid_index(args.dest, s3=s3, requests=requests)
        print(
            f"wrote {report.url}: {report.num_keys} document ids in {report.num_partitions} partitions, "
            f"{report.bytes / 1e6:.1f} MB, in {report.seconds:.1f} s",
            file=sys.stderr if args.doc_ids else sys.stdout,
        )
    if not args.doc_ids:
        return None
    decode = _tokenizer(args.decode) if args.decode else None
    ids = TokenIds.open(args.dest, s3=s3, requests=requests)
    for doc_id in args.doc_ids:
        try:
            tokens = ids.get(doc_id)
        except KeyError as exc:
            print(f"shardstream: error: {exc.args[0]}", file=sys.stderr)
            return 1
        if decode is not None:
            print(decode.decode(tokens.tolist(), skip_special_tokens=False))
        else:
            print(" ".join(map(str, tokens.tolist())))
    return None
