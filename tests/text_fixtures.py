"""Shared helpers of the text tests: a byte-level BPE tokenizer trained on the spot
(:func:`train_tokenizer`), a synthetic corpus of JSON Lines documents with dotted ids
(:func:`make_docs`, :func:`write_jsonl`), and the same documents as ``.jsonl.gz``,
``.jsonl.zst``, Parquet and a Hugging Face ``datasets`` folder saved to disk
(:func:`write_gz`, :func:`write_zst`, :func:`write_parquet`, :func:`write_hf`).

Everything is deterministic (seeded), so two calls give the same bytes.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EOD = "<|endoftext|>"
_LETTERS = "abcdefghijklmnopqrstuvwxyz\u00e9\u00fc\u00df\u03b1\u03b2\u03b3\u0436\u0449"  # a few non-ASCII letters: byte-level BPE must round-trip them


def words(n: int = 1500, seed: int = 1) -> list[str]:
    """``n`` made-up words (2-9 letters), the corpus vocabulary."""
    rng = random.Random(seed)
    return ["".join(rng.choice(_LETTERS) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def make_docs(
    n: int, *, seed: int = 0, min_words: int = 20, max_words: int = 200, id_prefix: str = "en.wiki."
) -> list[dict[str, Any]]:
    """``n`` documents ``{"id": "en.wiki.7", "text": ...}``: Zipf-ish word choice, some
    punctuation and line breaks, ids with dots (and, every 7th, a slash and a non-ASCII letter)."""
    rng = random.Random(seed)
    vocab = words()
    weights = [1 / (i + 1) for i in range(len(vocab))]
    docs = []
    for i in range(n):
        count = rng.randint(min_words, max_words)
        chosen = rng.choices(vocab, weights, k=count)
        text = " ".join(
            w + ("." if rng.random() < 0.08 else "") + ("\n" if rng.random() < 0.02 else "") for w in chosen
        )
        doc_id = f"{id_prefix}{i}" if i % 7 else f"{id_prefix}{i}/ß.x"
        docs.append({"id": doc_id, "text": text})
    return docs


def train_tokenizer(path: Path, *, vocab_size: int = 1000, docs: Sequence[dict[str, Any]] | None = None) -> Path:
    """Train a byte-level BPE tokenizer (``vocab_size`` ids, special token ``<|endoftext|>``,
    id 0) on ``docs`` (default: 400 of :func:`make_docs`) and save it as ``path``
    (a ``tokenizer.json``); returns ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [d["text"] for d in (docs if docs is not None else make_docs(400, seed=99))]
    tokenizer.train_from_iterator(texts, trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def jsonl_bytes(docs: Sequence[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(d, ensure_ascii=False).encode("utf-8") + b"\n" for d in docs)


def write_jsonl(path: Path, docs: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(jsonl_bytes(docs))
    return path


def write_gz(path: Path, docs: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(jsonl_bytes(docs), mtime=0))
    return path


def write_zst(path: Path, docs: Sequence[dict[str, Any]]) -> Path:
    import zstandard

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(jsonl_bytes(docs)))
    return path


def write_parquet(path: Path, docs: Sequence[dict[str, Any]], *, row_group_size: int = 100) -> Path:
    """Parquet with columns ``id`` and ``text`` in row groups of ``row_group_size``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_hf(path: Path, docs: Sequence[dict[str, Any]], *, num_shards: int = 2) -> Path:
    """A Hugging Face dataset saved with ``Dataset.save_to_disk`` (arrow files, ``state.json``,
    ``dataset_info.json``) in ``num_shards`` files."""
    import datasets

    dataset = datasets.Dataset.from_dict({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]})
    dataset.save_to_disk(str(path), num_shards=num_shards)
    return path
