"""Documents of a token dataset by their ids: the document-id index ``docids/`` and
:func:`get_document`.

``docids/`` lies beside ``index.bin`` and ``tokens.bin``, in the layout of the key index of
sample datasets (:mod:`shardstream.index.keys`: a header of O(partitions), hash partitions of
buckets of about 4 KB): document id -> ``(shard, doc)``, ``doc`` the document's number within
its shard (the order of the shard's ``KEY.docids.json.gz``). The header's ``format`` is
``"shardstream-docids"``; its fields ``num_shards``, ``num_docs`` and ``manifest_crc32`` tie it
to the dataset it was built for (a stale one is refused). An id's hash is BLAKE2b-8 of its
UTF-8 bytes, as for sample keys.

Opening (:meth:`TokenIds.open`) reads ``index.bin``, ``tokens.bin`` and the header: O(shards
+ partitions), never O(documents). A lookup reads one bucket (one small ranged read); several
candidates (equal 64-bit hashes, or one id given to several documents) are told apart by
reading the candidate shards' ids (:meth:`TokenIndex.docids`). Fetching the document then
reads its shard's document lengths and its tokens (:meth:`TokenIndex.document`).

``shardstream import-tokens`` and ``pack-text`` build ``docids/`` at their end
(:func:`build_docid_index`); for a dataset without one, call it, or run
``shardstream tokens-get DEST --build-index``.
"""

from __future__ import annotations

import concurrent.futures
import os
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..config import RequestConfig
from ..errors import IndexFormatError, ShardNotFoundError
from ..index.keys import KeyIndex, KeyIndexReport, manifest_crc32, read_hash_header, write_hash_index
from ..storage import LocalStore, open_store
from .format import TokenIndex

__all__ = ["DOCIDS_DIR", "TokenIds", "build_docid_index", "get_document"]

DOCIDS_DIR = "docids"
FORMAT = "shardstream-docids"
_SHARDS_AHEAD = 16  # shards' ids read ahead (threads) from a remote store while building


def _id_bytes(doc_id: str) -> bytes:
    return doc_id.encode("utf-8", "surrogatepass")  # any str JSON gives, lone surrogates included


def _docs_crc32(tokens: TokenIndex) -> int:
    """A fingerprint of the documents per shard (``tokens.bin``'s ``num_docs`` column)."""
    return zlib.crc32(np.ascontiguousarray(tokens.tokens.columns["num_docs"], dtype="<i8").tobytes())


def _build_hint(root: str) -> str:
    return (
        f"build it with shardstream tokens-get {root} --build-index (or shardstream.tokens.build_docid_index); "
        "shardstream import-tokens and pack-text build it when they finish"
    )


def _open_tokens(
    dataset: str | os.PathLike[str] | TokenIndex, *, s3: Any, requests: RequestConfig | None
) -> TokenIndex:
    if isinstance(dataset, TokenIndex):
        return dataset
    return TokenIndex.open(dataset, s3=s3, requests=requests)


def _shard_ids(tokens: TokenIndex, store: Any) -> Iterator[tuple[int, list[bytes]]]:
    """Every shard's ``(shard, id bytes)``, in order; a few read ahead in threads from a remote store."""

    def read(shard: int) -> tuple[int, list[bytes]]:
        ids = tokens.docids(shard)
        return shard, [_id_bytes(i if isinstance(i, str) else str(i)) for i in ids]

    if isinstance(store, LocalStore) or tokens.num_shards < 2:
        yield from (read(shard) for shard in range(tokens.num_shards))
        return
    with concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="shardstream-docids") as pool:
        pending: list[concurrent.futures.Future[tuple[int, list[bytes]]]] = []
        for shard in range(tokens.num_shards):
            pending.append(pool.submit(read, shard))
            if len(pending) > _SHARDS_AHEAD:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()


def build_docid_index(
    dest: str | os.PathLike[str] | TokenIndex,
    *,
    s3: Any = None,
    requests: RequestConfig | None = None,
    spill_dir: str | None = None,
) -> KeyIndexReport:
    """Write ``DEST/docids/`` (module doc), the document-id index of the token dataset at
    ``dest``, from its shards' ids (one ranged read per shard): memory bounded by a 16 MB
    buffer and one partition (about 2 Mi ids), never O(documents); an existing ``docids/`` is
    replaced. ``import_megatron``, ``import_datatrove`` and ``pack-text`` call it when done.

    Args:
        dest: the dataset (directory or remote prefix with ``index.bin`` and ``tokens.bin``), or
            its opened :class:`TokenIndex`.
        s3, requests: how the store is reached (a TokenIndex brings its own).
        spill_dir: where the 16 bytes per id are spilled while sorting (default: a temporary
            directory).

    Returns:
        A :class:`~shardstream.index.keys.KeyIndexReport` (``num_keys``: the documents).

    Raises:
        ShardNotFoundError, ValueError, IndexFormatError: as :meth:`TokenIndex.open`;
        CorruptShardError: a shard's ids are damaged; StorageError: the store failed.
    """
    tokens = _open_tokens(dest, s3=s3, requests=requests)
    store = open_store(tokens.index.root, s3=tokens.index.s3, requests=tokens.index.requests)
    store.check_writable()
    return write_hash_index(
        store,
        _shard_ids(tokens, store),
        num_keys=tokens.num_docs,
        num_shards=tokens.num_shards,
        directory=DOCIDS_DIR,
        format=FORMAT,
        fields={
            "num_docs": tokens.num_docs,
            "manifest_crc32": manifest_crc32(tokens.index.manifest),
            "docs_crc32": _docs_crc32(tokens),
        },
        spill_dir=spill_dir,
        fix=f"the shards disagree with {tokens.tokens.url}: re-pack or re-import the dataset",
    )


class TokenIds:
    """A token dataset's document-id index, opened: :meth:`lookup` (id -> ``(shard, doc)``)
    and :meth:`get` (id -> tokens). Picklable (stores are reopened).

    Attributes:
        tokens: the dataset (:class:`TokenIndex`).
        keys: the hash index (:class:`~shardstream.index.keys.KeyIndex` over ``docids/``).
    """

    def __init__(self, tokens: TokenIndex, keys: KeyIndex) -> None:
        self.tokens, self.keys = tokens, keys

    def __repr__(self) -> str:
        return f"TokenIds({self.tokens.index.root!r}, num_docs={self.keys.num_keys})"

    @classmethod
    def open(
        cls, dataset: str | os.PathLike[str] | TokenIndex, *, s3: Any = None, requests: RequestConfig | None = None
    ) -> TokenIds:
        """Open the document-id index of ``dataset`` (a location or an opened :class:`TokenIndex`):
        ``index.bin``, ``tokens.bin`` and ``docids/header.bin``, O(shards + partitions).

        Raises:
            ShardNotFoundError: no dataset there, or it has no ``docids/`` (the message says
                how to build it); ValueError: a dataset of samples, not tokens;
            IndexFormatError: ``docids/`` is damaged or stale (built for other shards).
        """
        tokens = _open_tokens(dataset, s3=s3, requests=requests)
        root = tokens.index.root
        store = open_store(root, s3=tokens.index.s3, requests=tokens.index.requests)
        fix = f"rebuild it: {_build_hint(root)}"
        header = read_hash_header(store, directory=DOCIDS_DIR, format=FORMAT, fix=fix)
        if header is None:
            raise ShardNotFoundError(
                f"{store.url_of(DOCIDS_DIR + '/header.bin')}: the token dataset {root} has no document-id index; "
                + _build_hint(root)
            )
        fields, columns, url = header
        if (
            fields.get("num_shards") != tokens.num_shards
            or fields.get("num_docs") != tokens.num_docs
            or int(fields["num_keys"]) != tokens.num_docs
            or fields.get("manifest_crc32") != manifest_crc32(tokens.index.manifest)
            or fields.get("docs_crc32") != _docs_crc32(tokens)
        ):
            raise IndexFormatError(
                f"{url}: built for other shards than {tokens.index.manifest.url} holds ({fields.get('num_shards')} "
                f"shards, {fields.get('num_docs')} documents); the document-id index is stale, {fix}"
            )
        keys = KeyIndex(
            root=root,
            manifest=tokens.index.manifest,
            fields=fields,
            columns=columns,
            url=url,
            s3=tokens.index.s3,
            requests=tokens.index.requests,
            directory=DOCIDS_DIR,
            shard_rows=tokens.tokens.columns["num_docs"],
            fix=fix,
        )
        return cls(tokens, keys)

    @property
    def num_docs(self) -> int:
        return self.keys.num_keys

    def candidates(self, doc_id: str) -> list[tuple[int, int]]:
        """Every ``(shard, doc)`` whose id hash equals ``doc_id``'s (one small ranged read), unchecked."""
        return self.keys.lookup(_id_bytes(doc_id))

    def lookup(self, doc_id: str, *, verify: bool = False) -> tuple[int, int]:
        """``(shard, doc)`` of the document with id ``doc_id``: one ranged read of one bucket;
        several candidates (equal hashes, or an id given twice: the first in dataset order
        wins) are checked against their shards' ids, and so is a single one when ``verify``.

        Raises:
            KeyError: no document has that id (the message names it and the dataset).
            IndexFormatError: ``docids/`` is damaged; StorageError: the store failed.
        """
        found = self.candidates(doc_id)
        if len(found) == 1 and not verify:
            return found[0]
        ids: dict[int, list[str]] = {}
        for shard, doc in found:
            if shard not in ids:
                ids[shard] = self.tokens.docids(shard)
            if ids[shard][doc] == doc_id:
                return shard, doc
        raise KeyError(f"no document has the id {doc_id!r} in {self.tokens.index.root}")

    def get(self, doc_id: str, *, verify: bool = False) -> np.ndarray:
        """The tokens of the document with id ``doc_id`` (its end token included), in the
        on-disk dtype. Raises as :meth:`lookup`."""
        return self.tokens.document(*self.lookup(doc_id, verify=verify))


def get_document(
    dataset: str | os.PathLike[str] | TokenIndex,
    doc_id: str,
    *,
    s3: Any = None,
    requests: RequestConfig | None = None,
) -> np.ndarray:
    """The tokens (``uint16`` or ``uint32``, the end token included) of the document with id
    ``doc_id`` in the token dataset ``dataset`` (a location or an opened :class:`TokenIndex`).
    Opens the document-id index each call (O(shards + partitions)); for many lookups open a
    :class:`TokenIds` once and call its :meth:`~TokenIds.get`.

    Raises:
        KeyError: no document has that id (names the id and the dataset).
        ShardNotFoundError: the dataset has no ``docids/`` (says how to build it).
        ValueError: a dataset of samples; IndexFormatError: a damaged or stale index.
    """
    return TokenIds.open(dataset, s3=s3, requests=requests).get(doc_id)
