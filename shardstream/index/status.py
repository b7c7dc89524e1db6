"""What a dataset's location says about the writer that made it: a finished dataset, or a pack
that has not finished (and must never be taken for a dataset).

Every writer that resumes (``pack``, :class:`~shardstream.ShardWriter`,
:func:`~shardstream.pack_samples`) keeps its state in ``DEST/.shardstream/``
(:mod:`shardstream.packing.journal`): its options (``pack.json``), a record per shard
published (``sSSSSS-QQQQQQQ.json``), a done marker per stream (``sSSSSS-done.json``), a
listed pack's plan (``list-done.json``: the shards it will write) and, written right after
the index, ``merged.json``: the :meth:`~shardstream.index.Manifest.content_digest` of the
index the pack wrote. From these, :func:`unfinished_pack` tells, for the readers (``info``,
``verify``, ``ls``, ``ShardDataset``) and for ``index build``:

- no ``pack.json``: no pack state (another tool's shards, or a dataset without its state);
- ``merged.json`` agrees with the index there: the pack's own, finished dataset;
- every stream done and an index there (an older shardstream wrote no ``merged.json``): finished;
- otherwise a :class:`PackStatus` whose :meth:`~PackStatus.describe` says, in one line, what is
  missing and how to finish it: streams not done (an unfinished pack, whatever index someone
  built over its shards meanwhile), or every stream done but the index missing or not the
  pack's own.

Cost: two small reads on the way of a finished pack; an unfinished one lists its records
(O(shards) names), which only the commands that report it pay.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import IndexFormatError, ShardNotFoundError
from .manifest import Manifest

__all__ = [
    "LISTING_DONE",
    "MERGED_NAME",
    "RECORD_NAME",
    "SPEC_NAME",
    "STATE_DIR",
    "PackStatus",
    "read_json",
    "unfinished_pack",
]

STATE_DIR = ".shardstream"
SPEC_NAME = f"{STATE_DIR}/pack.json"
LISTING_DONE = f"{STATE_DIR}/list-done.json"
MERGED_NAME = f"{STATE_DIR}/merged.json"
RECORD_NAME = re.compile(r"^\.shardstream/s(\d{5})-(\d{7}|done)\.json$")


@dataclass(frozen=True, kw_only=True)
class PackStatus:
    """Where the pack recorded at :attr:`url` stands.

    Attributes:
        url: the destination.
        source: what the pack read, as recorded: a directory or URL (``pack``), ``ShardWriter``,
            or ``pack_samples:MODULE.FUNCTION``.
        num_parts: parts of the pack (``--part I/N``); their streams: :attr:`num_streams`.
        unfinished_parts: the parts with a stream not done.
        num_published: shards recorded as written (a listed pack also records a planned shard
            whose every file was skipped).
        num_planned: the shards a listed pack will write, else None (not known in advance).
        index_missing: every stream is done but no index is there.
        index_differs: every stream is done but the index there is not the one the pack wrote.
    """

    url: str
    source: str
    num_parts: int
    num_streams: int
    unfinished_parts: tuple[int, ...]
    num_published: int
    num_planned: int | None
    index_missing: bool = False
    index_differs: bool = False

    @property
    def complete(self) -> bool:
        """Every stream of every part is done."""
        return not self.unfinished_parts

    def progress(self) -> str:
        """``"7 of 12 shards published"`` (``"7 shards published"`` where the plan is not known)."""
        planned = f" of {self.num_planned}" if self.num_planned is not None else ""
        return f"{self.num_published}{planned} shard{'' if self.num_published == 1 and not planned else 's'} published"

    def what(self) -> str:
        """``"an unfinished pack of SOURCE (7 of 12 shards published)"``: what is there."""
        if self.index_missing:
            return (
                f"a pack of {self.source} whose every part is done but whose index was not written ({self.progress()})"
            )
        if self.index_differs:
            return f"a finished pack of {self.source} whose index was replaced by another ({self.progress()})"
        if self.source == "ShardWriter":
            return f"an unfinished ShardWriter write ({self.progress()})"
        if self.source.startswith("pack_samples:"):
            return f"an unfinished pack_samples of {self.source.partition(':')[2]} ({self.progress()})"
        return f"an unfinished pack of {self.source} ({self.progress()})"

    def fix(self) -> str:
        """How to finish it: ``"run the same pack command again to finish it"``."""
        if self.index_missing:
            return f"run the same command again, or shardstream index merge {self.url}"
        if self.index_differs:
            return f"shardstream index merge {self.url} --overwrite writes the pack's own index again"
        if self.source == "ShardWriter":
            return (
                "it was not closed: write it again with ShardWriter(DEST, overwrite=True), or use pack_samples, "
                "which resumes"
            )
        if self.source.startswith("pack_samples:"):
            return "call pack_samples again with the same fn, inputs and options to finish it"
        if self.num_parts > 1:
            parts = ", ".join(map(str, self.unfinished_parts))
            return f"run the same pack command with --part I/{self.num_parts} for I = {parts} to finish it"
        return "run the same pack command again to finish it"

    def describe(self) -> str:
        """One line: what :attr:`url` holds and how to finish it (module doc)."""
        return f"{self.url} holds {self.what()}: {self.fix()}"


def read_json(store: Any, name: str) -> dict[str, Any] | None:
    """The JSON object ``name`` holds, or None where there is none.

    Raises:
        IndexFormatError: it is not a JSON object (names it, says how to start over).
    """
    try:
        data = store.read_bytes(name)
    except (FileNotFoundError, ShardNotFoundError):
        return None
    try:
        doc = json.loads(data.partition(b"\n")[0])
    except ValueError as exc:
        raise IndexFormatError(
            f"{store.url_of(name)}: damaged pack state ({exc}); pack again with --overwrite"
        ) from exc
    if not isinstance(doc, dict):
        raise IndexFormatError(f"{store.url_of(name)}: damaged pack state; pack again with --overwrite")
    return doc


def unfinished_pack(store: Any, manifest: Manifest | None) -> PackStatus | None:
    """The pack at ``store`` that has not finished, or None where none is there (module doc).

    Args:
        store: the dataset's location (a :class:`~shardstream.storage.Store`).
        manifest: the index there, or None where there is none.

    Raises:
        IndexFormatError: the pack state is damaged.
    """
    if not store.exists(SPEC_NAME):
        return None
    merged = read_json(store, MERGED_NAME)
    if merged is not None and manifest is not None and merged.get("index") == manifest.content_digest():
        return None
    status = read_status(store)
    if status.complete:
        if manifest is None:
            return PackStatus(**{**status.__dict__, "index_missing": True})
        if merged is None:  # finished by a shardstream that wrote no merge record
            return None
        return PackStatus(**{**status.__dict__, "index_differs": True})
    return status


def read_status(store: Any) -> PackStatus:
    """The status of the pack recorded at ``store`` (its ``pack.json`` is there): lists its
    records, O(shards) names.

    Raises:
        IndexFormatError: the pack state is damaged.
    """
    spec = read_json(store, SPEC_NAME) or {}
    try:
        num_parts, workers = int(spec["num_parts"]), int(spec["workers"])
        source = str(spec["source"])
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexFormatError(
            f"{store.url_of(SPEC_NAME)}: damaged pack state ({exc!r}); pack again with --overwrite"
        ) from exc
    num_streams = num_parts * workers
    published = 0
    done: set[int] = set()
    for name in store.list_names(f"{STATE_DIR}/s"):
        match = RECORD_NAME.match(name)
        if match is None:
            continue
        if match.group(2) == "done":
            done.add(int(match.group(1)))
        else:
            published += 1
    listing = read_json(store, LISTING_DONE) if spec.get("listed") else None
    planned = None if listing is None else int(listing.get("num_shards", 0))
    return PackStatus(
        url=store.url,
        source=source,
        num_parts=num_parts,
        num_streams=num_streams,
        unfinished_parts=tuple(sorted({s % num_parts for s in range(num_streams) if s not in done})),
        num_published=published,
        num_planned=planned,
    )
