"""What a writer owns at its destination: it writes and deletes only names that are its own.

A destination may hold a user's own files beside (or instead of) a dataset: a
``data-000000.tar`` from another tool, notes, other data under the same prefix. A writer
never replaces or deletes what it did not write (``rsync``, ``tar -x`` and ``aws s3 sync``
never delete what they did not create), so before it claims a destination it asks:

- :func:`recorded_names`: the names an index there (``index.bin`` or a version 1
  ``index.json``: its shards and their tables, ``keys/``) or a pack's state there
  (``.shardstream/``: the shards its records name, and the shard each unfinished stream is
  writing) records as shardstream's, with ``pack-report.jsonl`` and the state itself;
- :func:`foreign_names`: the names the writer would write (``writes``: its shards and tables,
  ``index.bin``, ``keys/``, the report, the state folder) that are there and recorded by
  neither. A writer refuses such a destination, naming up to :data:`NAMES_SHOWN` of them and
  the option that lets it write over them (``--clobber``); ``--overwrite`` deletes only
  :func:`recorded_names` (:func:`shardstream.packing.destination.wipe`) and lists what it kept
  (:func:`top_level_names`).

Cost: listings of the writer's own names (``NAME-*``, ``keys/``, ``.shardstream/``) and the
index's shard names: O(shards), paid when a destination is claimed or wiped, never on a resume.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

from ..errors import DestinationError, IndexFormatError
from ..index import INDEX_NAME, KEYS_DIR, MANIFEST_NAME, TABLE_SUFFIX, Index, Manifest
from ..index.status import SPEC_NAME, STATE_DIR
from ..storage import LocalStore, Store
from .journal import REPORT_NAME, PackSpec, recorded_streams

__all__ = [
    "NAMES_SHOWN",
    "SINK_RECORDS",
    "foreign_names",
    "pack_writes",
    "recorded_names",
    "refuse_foreign",
    "top_level_names",
]

NAMES_SHOWN = 10  # names an error or a report lists; the rest are counted
SINK_RECORDS = f"{STATE_DIR}/sink/"  # the Ray datasink's record of each shard it published


def pack_writes(name: str) -> Callable[[str], bool]:
    """Whether a writer of shards ``NAME-NNNNNN.tar`` (``pack``, ``ShardWriter``,
    ``pack_samples``, a reshard) writes a name: its shards and their tables, the index, the key
    index, the report and its state."""
    shard = re.compile(re.escape(name) + r"-\d{6,}\.tar(?:" + re.escape(TABLE_SUFFIX) + ")?")
    own = {MANIFEST_NAME, REPORT_NAME}
    return lambda n: n in own or n.startswith((f"{KEYS_DIR}/", f"{STATE_DIR}/")) or shard.fullmatch(n) is not None


def recorded_names(store: Store) -> set[str]:
    """The names at ``store`` that an index or a pack's state there records (module doc).

    Raises:
        IndexFormatError: the index or the pack state is damaged.
    """
    names: set[str] = set()
    index = next((n for n in (MANIFEST_NAME, INDEX_NAME) if store.exists(n)), None)
    if index is not None:
        names |= {index, REPORT_NAME, *store.list_names(f"{KEYS_DIR}/")}
        shards, beside = _index_shards(store, index)
        names |= {n + TABLE_SUFFIX for n in shards}
        if beside:
            names |= shards
    for record in store.list_names(SINK_RECORDS):
        shard = record.removeprefix(SINK_RECORDS)
        names |= {record, shard, shard + TABLE_SUFFIX}
    if store.exists(SPEC_NAME):
        spec = PackSpec.from_json(store.read_bytes(SPEC_NAME), url=store.url_of(SPEC_NAME))
        names |= {REPORT_NAME, *store.list_names(f"{STATE_DIR}/")}
        for shard in _state_shards(store, spec):
            names |= {shard, shard + TABLE_SUFFIX}
    return names


def _index_shards(store: Store, index: str) -> tuple[set[str], bool]:
    """The shard names an index lists, and whether the shards lie beside it."""
    data, url = store.read_bytes(index), store.url_of(index)
    if index == MANIFEST_NAME:
        manifest = Manifest.parse(data, url=url)
        return set(manifest.names()), manifest.shards_url is None
    return {s.name for s in Index.from_json(data, url=url).shards}, True


def _state_shards(store: Store, spec: PackSpec) -> Iterable[str]:
    """The shards a pack's records name, and the one each unfinished stream is writing."""
    streams = recorded_streams(store)
    if not spec.listed:
        for stream in range(spec.num_streams):
            seqs, done = streams.get(stream, ([], False))
            yield from (spec.shard_name(stream, seq) for seq in range(len(seqs) + (not done)))
        return
    from .listing import Listing

    try:
        listing = Listing.load(store, spec.digest)
    except FileNotFoundError:  # still listing: no shard is written before the listing is done
        return
    except IndexFormatError:
        return
    for stream in range(spec.num_streams):
        first, end = listing.shard_range(stream, spec.num_streams)
        seqs, done = streams.get(stream, ([], False))
        yield from (spec.shard_name(first, seq) for seq in range(min(end - first, len(seqs) + (not done))))


def foreign_names(store: Store, writes: Callable[[str], bool], recorded: set[str], *, name: str) -> list[str]:
    """The names at ``store`` that ``writes`` accepts and ``recorded`` lacks, sorted: a user's
    files a writer of shards ``NAME-*`` would write over."""
    there = [*store.list_names(f"{name}-"), *store.list_names(f"{KEYS_DIR}/"), *store.list_names(f"{STATE_DIR}/")]
    there += [n for n in (MANIFEST_NAME, REPORT_NAME) if store.exists(n)]
    return sorted({n for n in there if writes(n) and n not in recorded})


def refuse_foreign(store: Store, foreign: list[str], *, option: str, what: str = "this pack") -> None:
    """Raise DestinationError naming up to :data:`NAMES_SHOWN` of ``foreign`` and ``option``,
    which lets the writer write over them; nothing when ``foreign`` is empty."""
    if not foreign:
        return
    shown = ", ".join(foreign[:NAMES_SHOWN]) + (
        f" and {len(foreign) - NAMES_SHOWN} more" if len(foreign) > NAMES_SHOWN else ""
    )
    them = "it" if len(foreign) == 1 else "them"
    raise DestinationError(
        f"{store.url} holds {len(foreign)} file{'s' if len(foreign) != 1 else ''} with names {what} writes that no "
        f"index or pack state there records: {shown}; move {them} away or pick another DEST or shard name, or pass "
        f"{option} to let {what} write over {them} (nothing else there is touched)"
    )


def top_level_names(store: Store) -> list[str]:
    """The files and folders (``name/``) directly in ``store``, sorted, pack state left out."""
    if isinstance(store, LocalStore):
        try:
            entries = list(os.scandir(store.root))
        except FileNotFoundError:
            return []
        names = [e.name + ("/" if e.is_dir() else "") for e in entries]
    else:  # an object store may keep a "folder" whose objects are gone: only those holding one count
        list_dir = getattr(store, "list_dir", None)
        names = [] if list_dir is None else [n + ("/" if d and not n.endswith("/") else "") for n, _, d in list_dir("")]
        names = [n for n in names if not n.endswith("/") or store.list_names(n)]
    return sorted(n for n in names if n.rstrip("/") != STATE_DIR)
