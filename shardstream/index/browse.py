"""A dataset's sample tables read one after another, the next few requested ahead, and what
can be counted from them without reading a shard: the samples, members and bytes of each
member extension (``shardstream info --members``, ``ls``, ``head``)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator

from .resolve import DatasetIndex
from .table import ShardTable

__all__ = ["TABLES_AHEAD", "extension_totals", "iter_tables"]

TABLES_AHEAD = 8  # sample tables of a remote dataset requested ahead of the one being read


def iter_tables(index: DatasetIndex, shards: range, *, ahead: int = TABLES_AHEAD) -> Iterator[tuple[int, ShardTable]]:
    """``(shard, ShardTable)`` for each shard in ``shards``, in order, one table held at a time;
    a remote dataset's next ``ahead`` tables are requested while one is used."""
    waiting: collections.deque = collections.deque()
    rest = iter(shards)
    for shard in rest:
        waiting.append((shard, index.request_table(shard)))
        if len(waiting) > ahead:
            break
    while waiting:
        shard, collect = waiting.popleft()
        for following in rest:
            waiting.append((following, index.request_table(following)))
            break
        yield shard, collect()


def extension_totals(index: DatasetIndex, *, on_table: Callable[[], None] | None = None) -> dict[str, list[int]]:
    """Per member extension, the samples having it, its members and their bytes, computed
    from every sample table of the dataset (``NAME.samples``; no shard is read).

    Args:
        index: an opened dataset (:func:`~shardstream.open_index`).
        on_table: called after each table is read (a progress bar).

    Returns:
        ``{extension: [samples, members, bytes]}`` sorted by extension, where the extension is
        the lower-cased last dot part of a member's extension (``seg.PNG`` -> ``png``; "" for
        a member named as its key) and bytes are payload bytes. Costs one table read per shard
        (one GET each, :data:`TABLES_AHEAD` in flight, for a remote dataset), one table held at
        a time: O(shards) requests, memory of one shard's table.

    Raises:
        ShardNotFoundError: a table is missing; IndexFormatError: one is damaged.
    """
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for _, table in iter_tables(index, range(index.num_shards)):
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
        if on_table is not None:
            on_table()
    return dict(sorted(totals.items()))
