"""The tokenizer of ``pack-text`` (:func:`~shardstream.tokens.pack.pack_tokens`): a Hugging Face
``tokenizers`` tokenizer (a ``tokenizer.json`` path or a ``tokenizers.Tokenizer``) or any Python
callable, resolved once into a :class:`TextTokenizer` that knows the vocabulary size, the
end-of-document token and what ``tokens.bin`` records about it, pickles small to worker
processes and Ray tasks (a Hugging Face tokenizer travels as its JSON), and turns a batch of
texts into one flat array of token ids (:meth:`TextTokenizer.encode_lists`,
:meth:`TextTokenizer.flatten`).

Callables: ``fn(text) -> sequence of int ids`` (called once per document), or, with
``batched=True``, ``fn(list of texts) -> list of id sequences`` (called once per batch of up to
``batch_size`` documents). A callable has no vocabulary: give ``vocab_size`` and ``eod_id``
(or ``append_eod=False``), unless it has the ``get_vocab_size()`` / ``token_to_id()`` methods
of a Hugging Face tokenizer.

Threads: a Hugging Face tokenizer encodes a batch on its own (Rust, Rayon) threads unless
``TOKENIZERS_PARALLELISM=false``. Worker processes (``workers > 1``) and Ray tasks set it, so N
workers use N cores without oversubscribing them; one worker (``workers=1``, the default,
packing in the calling process) leaves the threads as they are, which was faster. Measured on
the 2-core test machine (8 JSON Lines files, 40,000 documents of ~230 tokens, byte-level BPE of
1,000 ids, batches of 1,000; the machine shared with other jobs, so the best runs): bare
``encode_batch`` 1.18 M tokens/s on 1.77 cores (0.78 with the threads off); ``pack_tokens``
with 1 worker 1.16 M tokens/s on 1.55 cores with the threads on, 0.86 with them off.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["EOD_CANDIDATES", "TextTokenizer", "resolve_tokenizer"]

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[EOS]", "<|end_of_text|>")


class TextTokenizer:
    """A tokenizer resolved for packing (:func:`resolve_tokenizer` makes one).

    Attributes:
        vocab_size: token ids are below it (decides ``uint16`` or ``uint32`` on disk).
        eod_id: the end-of-document id appended to each document, or None.
        eod_token: its name where known, else None.
        info: what ``tokens.bin`` records: ``{"name", "sha256", "eod"}`` (``sha256`` of the
            ``tokenizer.json`` text, None for a callable).
        identity: what decides the tokens (a resumed or parallel pack must use the same).
    """

    def __init__(
        self,
        *,
        kind: str,
        payload: Any,
        vocab_size: int,
        eod_id: int | None,
        eod_token: str | None,
        info: dict[str, Any],
        identity: str,
    ) -> None:
        self.kind, self.payload = kind, payload  # "hf": tokenizer.json text; "one"/"batch": the callable
        self.vocab_size, self.eod_id, self.eod_token = vocab_size, eod_id, eod_token
        self.info, self.identity = info, identity
        self._built: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_built": None}

    def __repr__(self) -> str:
        return f"TextTokenizer({self.info.get('name')!r}, vocab_size={self.vocab_size}, eod_id={self.eod_id})"

    def _encoder(self) -> Callable[[list[str]], list[Sequence[int]]]:
        if self._built is None:
            if self.kind == "hf":
                from tokenizers import Tokenizer

                tokenizer = Tokenizer.from_str(self.payload)
                tokenizer.no_truncation()  # a document is packed whole
                tokenizer.no_padding()
                fast = getattr(tokenizer, "encode_batch_fast", None)  # no character offsets: faster (>= 0.20)
                encode = fast or tokenizer.encode_batch

                def batch(texts: list[str]) -> list[Sequence[int]]:
                    return [e.ids for e in encode(texts)]

                self._built = batch
            elif self.kind == "batch":
                fn = self.payload
                self._built = lambda texts: list(fn(texts))
            else:
                fn = self.payload
                self._built = lambda texts: [fn(text) for text in texts]
        return self._built

    def encode_lists(self, texts: list[str]) -> list[Sequence[int]]:
        """The ids of each text (without the end token), as the tokenizer gives them.

        Raises:
            whatever the tokenizer raises; ValueError: a batched callable gave another number
            of sequences than texts.
        """
        out = self._encoder()(texts)
        if len(out) != len(texts):
            raise ValueError(f"the tokenizer gave {len(out)} id sequences for {len(texts)} texts")
        return out

    def flatten(self, lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, lengths)``: the id sequences one after another (``int64``), and each one's
        length (``int64``), no end token.

        Raises:
            ValueError: an id is negative or not below :attr:`vocab_size`.
        """
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        total = int(lengths.sum())
        ids = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=total)
        if total and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            bad = int(ids.max()) if int(ids.max()) >= self.vocab_size else int(ids.min())
            raise ValueError(
                f"the tokenizer gave token id {bad}, outside 0..{self.vocab_size - 1} (vocab_size {self.vocab_size}); "
                "give the tokenizer's vocabulary size"
            )
        return ids, lengths


def _sha256_text(text: str | bytes) -> str:
    return hashlib.sha256(text.encode("utf-8") if isinstance(text, str) else text).hexdigest()


def resolve_tokenizer(
    tokenizer: Any,
    *,
    eod_token: str | None = None,
    eod_id: int | None = None,
    append_eod: bool = True,
    vocab_size: int | None = None,
    batched: bool = False,
    name: str | None = None,
) -> TextTokenizer:
    """Resolve what ``pack_tokens`` was given as its tokenizer (module doc).

    Args:
        tokenizer: a ``tokenizer.json`` path (str or PathLike), a ``tokenizers.Tokenizer``, or a
            callable (one text -> ids; a list of texts -> lists of ids with ``batched``).
        eod_token: the end-of-document token by name (looked up in the vocabulary).
        eod_id: the end-of-document token by id.
        append_eod: False: documents end without a token (``tokens.bin`` records ``eod_id`` null).
        vocab_size: ids are below it; default the tokenizer's ``get_vocab_size()`` (added
            tokens included). Required for a callable without that method.
        batched: a callable takes a list of texts.
        name: recorded as ``tokenizer["name"]`` (default: a path's folder name, or file name
            when it is not ``tokenizer.json``; a callable's qualified name; "tokenizer").

    Raises:
        FileNotFoundError: no file at the path.
        ValueError: no end-of-document token found (none of :data:`EOD_CANDIDATES`, and none
            given), a token name not in the vocabulary, an ``eod_id`` at or above
            ``vocab_size``, conflicting options, or a callable without ``vocab_size``.
        TypeError: ``tokenizer`` is none of the above.
    """
    if not append_eod and (eod_token is not None or eod_id is not None):
        raise ValueError("give an end-of-document token (eod_token / eod_id) or append_eod=False, not both")
    if eod_token is not None and eod_id is not None:
        raise ValueError("give eod_token or eod_id, not both")
    if isinstance(tokenizer, (str, os.PathLike)):
        from tokenizers import Tokenizer

        path = os.fspath(tokenizer)
        with open(path, "rb") as f:  # FileNotFoundError names it
            raw = f.read()
        text = raw.decode("utf-8")
        built = Tokenizer.from_str(text)
        folder, file = os.path.split(os.path.abspath(path))
        default_name = os.path.basename(folder) if file == "tokenizer.json" and os.path.basename(folder) else file
        return _of_hf(built, text, _sha256_text(raw), name or default_name, eod_token, eod_id, append_eod, vocab_size)
    if type(tokenizer).__module__.startswith("tokenizers") and hasattr(tokenizer, "encode_batch"):
        text = tokenizer.to_str()
        return _of_hf(
            tokenizer, text, _sha256_text(text), name or "tokenizer", eod_token, eod_id, append_eod, vocab_size
        )
    if not callable(tokenizer):
        raise TypeError(
            f"tokenizer {tokenizer!r}: give a tokenizer.json path, a tokenizers.Tokenizer, or a callable "
            "(text -> ids; with batched=True, list of texts -> lists of ids)"
        )
    qualified = getattr(tokenizer, "__qualname__", None) or type(tokenizer).__qualname__
    if vocab_size is None:
        get = getattr(tokenizer, "get_vocab_size", None)
        if get is None:
            raise ValueError(f"tokenizer {qualified}: a callable has no vocabulary; give vocab_size")
        vocab_size = int(get())
    eod_id, eod_token = _end_token(tokenizer, eod_token, eod_id, append_eod, what=qualified)
    _check_ids(vocab_size, eod_id)
    module = getattr(tokenizer, "__module__", "") or ""
    return TextTokenizer(
        kind="batch" if batched else "one",
        payload=tokenizer,
        vocab_size=vocab_size,
        eod_id=eod_id,
        eod_token=eod_token,
        info={"name": name or qualified, "sha256": None, "eod": eod_token},
        identity=f"callable:{module}.{qualified}:{'batch' if batched else 'one'}",
    )


def _of_hf(
    built: Any,
    text: str,
    sha256: str,
    name: str,
    eod_token: str | None,
    eod_id: int | None,
    append_eod: bool,
    vocab_size: int | None,
) -> TextTokenizer:
    vocab_size = int(built.get_vocab_size(with_added_tokens=True)) if vocab_size is None else vocab_size
    eod_id, eod_token = _end_token(built, eod_token, eod_id, append_eod, what=name)
    _check_ids(vocab_size, eod_id)
    return TextTokenizer(
        kind="hf",
        payload=text,
        vocab_size=vocab_size,
        eod_id=eod_id,
        eod_token=eod_token,
        info={"name": name, "sha256": sha256, "eod": eod_token},
        identity=f"tokenizers:{sha256}",
    )


def _end_token(
    tokenizer: Any, eod_token: str | None, eod_id: int | None, append_eod: bool, *, what: str
) -> tuple[int | None, str | None]:
    """``(eod_id, eod_token)`` from the options and the vocabulary."""
    if not append_eod:
        return None, None
    to_id = getattr(tokenizer, "token_to_id", None)
    to_token = getattr(tokenizer, "id_to_token", None)
    if eod_id is not None:
        if eod_id < 0:
            raise ValueError(f"eod_id {eod_id} must be >= 0")
        return int(eod_id), (to_token(int(eod_id)) if to_token is not None else None)
    if eod_token is not None:
        found = to_id(eod_token) if to_id is not None else None
        if found is None:
            raise ValueError(
                f"tokenizer {what}: end-of-document token {eod_token!r} is not in its vocabulary"
                + ("" if to_id is not None else " (a callable: give eod_id)")
            )
        return int(found), eod_token
    if to_id is not None:
        for candidate in EOD_CANDIDATES:
            found = to_id(candidate)
            if found is not None:
                return int(found), candidate
    raise ValueError(
        f"tokenizer {what}: no end-of-document token found (looked for {', '.join(EOD_CANDIDATES)}); give one "
        "(--eod-token NAME or --eod-id N), or --no-eod to end documents without a token"
    )


def _check_ids(vocab_size: int, eod_id: int | None) -> None:
    if not 0 < vocab_size <= 1 << 32:
        raise ValueError(f"vocab_size {vocab_size} must be between 1 and 2**32")
    if eod_id is not None and eod_id >= vocab_size:
        raise ValueError(f"eod_id {eod_id} must be below vocab_size {vocab_size}")
