"""``shardstream pack-text``: JSON Lines, Parquet or Hugging Face datasets on disk -> token shards
plus ``index.bin`` and ``tokens.bin`` (:func:`shardstream.tokens.pack.pack_tokens`; docs/tokens.md)."""

from __future__ import annotations

import argparse

from .options import (
    add_pack_tail,
    add_parallel_args,
    add_replace_args,
    positive_int,
    print_report,
    request_config,
    s3_config,
    size_arg,
)

__all__ = ["add_parsers"]


def add_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``pack-text``."""
    from ..tokens.sources import DEFAULT_CHUNK_BYTES
    from ..tokens.writer import DEFAULT_MAX_SHARD_TOKENS

    p = commands.add_parser(
        "pack-text",
        help="tokenize JSON Lines / Parquet / Hugging Face datasets into token shards (resumable: run it again)",
        description="Tokenize documents with a Hugging Face tokenizer into token shards plus index.bin and "
        "tokens.bin. Records that give no document (bad JSON, no text, ...) are skipped and listed in "
        "DEST/pack-report.jsonl by file and line (--on-error raise stops at the first instead). A killed run "
        "resumes where it stopped when run again with the same arguments.",
    )
    p.add_argument(
        "source",
        metavar="SOURCE",
        help="a .jsonl / .jsonl.gz / .jsonl.zst / .json.gz / .parquet / .arrow file, a folder of them (walked "
        "recursively, sorted; a Dataset.save_to_disk folder), or a prefix or file: s3://, gs://, az://",
    )
    p.add_argument("dest", metavar="DEST", help="local directory or a writable prefix: s3://, gs://, az://")
    p.add_argument("--tokenizer", required=True, metavar="PATH", help="a Hugging Face tokenizer.json")
    p.add_argument(
        "--text-field", default="text", metavar="FIELD", help="the field (column) of the text (default: text)"
    )
    p.add_argument(
        "--id-field",
        default=None,
        metavar="FIELD",
        help="the field (column) of each document's id (default: none; ids are RELPATH:LINE, lines from 1, or "
        "RELPATH:ROW, rows from 0)",
    )
    eod = p.add_mutually_exclusive_group()
    eod.add_argument(
        "--eod-token",
        metavar="TOKEN",
        help="the end-of-document token appended to every document (default: the first of <|endoftext|>, </s>, "
        "<eos>, [EOS], <|end_of_text|> in the vocabulary)",
    )
    eod.add_argument("--eod-id", type=int, metavar="N", help="the end-of-document token, by id")
    eod.add_argument("--no-eod", action="store_true", help="append no end-of-document token")
    p.add_argument(
        "--vocab-size",
        type=positive_int,
        metavar="N",
        help="ids are below N (uint16 on disk up to 65536, else uint32; default: the tokenizer's vocabulary size)",
    )
    p.add_argument(
        "--max-shard-tokens",
        type=positive_int,
        default=DEFAULT_MAX_SHARD_TOKENS,
        metavar="N",
        help=f"tokens per shard at most; a document never splits (default: {DEFAULT_MAX_SHARD_TOKENS})",
    )
    p.add_argument("--name", default="tokens", help="shard name prefix: NAME-000000.tar ... (default: tokens)")
    add_parallel_args(
        p,
        workers="processes tokenizing in parallel, one core each",
        default="1, this process, with the tokenizer's own threads",
    )
    p.add_argument(
        "--on-error",
        choices=["skip", "raise", "fail"],
        default="skip",
        help="on a record that gives no document: skip it and list it in DEST/pack-report.jsonl (skip, the "
        "default), or stop naming its file and line (raise, or its older word fail); empty documents are "
        "always skipped and listed",
    )
    add_replace_args(
        p,
        deletes="shards, tables, index.bin, tokens.bin, docids/, the report, .shardstream/",
        writer="pack-text",
        names="NAME-NNNNNN.tar, their tables, index.bin, tokens.bin, pack-report.jsonl, .shardstream/",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=1000,
        metavar="N",
        help="documents per tokenizer call (default: 1000)",
    )
    p.add_argument(
        "--chunk-size",
        type=size_arg,
        default=str(DEFAULT_CHUNK_BYTES),
        metavar="SIZE",
        help="cut a local plain .jsonl file larger than SIZE into runs of lines of about SIZE that workers share "
        "(default: 32MiB)",
    )
    add_pack_tail(p, run)


def run(args: argparse.Namespace) -> int | None:
    """``shardstream pack-text``: the first problems on stderr, the summary on stdout."""
    from ..tokens.pack import pack_tokens

    report = pack_tokens(
        args.source,
        args.dest,
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        id_field=args.id_field,
        eod_token=args.eod_token,
        eod_id=args.eod_id,
        append_eod=not args.no_eod,
        vocab_size=args.vocab_size,
        max_shard_tokens=args.max_shard_tokens,
        name=args.name,
        workers=args.workers or (None if args.ray else 1),
        part=args.part,
        ray=args.ray,
        on_error=args.on_error,
        overwrite=args.overwrite,
        clobber=args.clobber,
        batch_size=args.batch_size,
        chunk_bytes=int(args.chunk_size),
        progress=not args.no_progress,
        s3=s3_config(args),
        requests=request_config(args),
    )
    print_report(report, lambda problem: f"skipped: {problem.where}: {problem.reason}")
    return None
