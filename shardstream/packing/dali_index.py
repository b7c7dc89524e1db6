"""DALI index files (``.idx``) for shards, written from the index (the shards' sample tables) without reading a tar.

``fn.readers.webdataset`` (NVIDIA DALI) reads local tar shards faster with an index per
shard, the file its ``wds2idx`` tool writes by scanning the tar. Our index already holds every
member's payload offset and size, so the same file is written here byte for byte without
reading the shards. Format (DALI "v1.2"), one text line per sample after a header::

    v1.2 <number of samples>
    <ext> <payload offset> <payload size> <member name> [<ext> <offset> <size> <name> ...]

Offsets and sizes are bytes from the start of the shard; ``ext`` is the WebDataset extension
(the file name after its first dot, e.g. ``seg.png``). This module does not import DALI.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..format import split_key
from ..index import ShardTable, open_index

__all__ = ["dali_index_text", "write_dali_index"]


def dali_index_text(table: ShardTable) -> str:
    """The ``.idx`` text of one shard (from its sample table), as ``wds2idx`` writes it
    (module doc).

    Raises:
        IndexFormatError: the table's keys or names are not UTF-8.
    """
    lines = [f"v1.2 {table.num_samples}"]
    for _, members in table.samples():
        lines.append(" ".join(f"{split_key(name)[1]} {offset} {size} {name}" for name, offset, size in members))
    return "\n".join(lines) + "\n"


def write_dali_index(
    dataset_dir: str | os.PathLike[str], *, out_dir: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Write ``<shard name without .tar>.idx`` for every shard of a local dataset.

    Args:
        dataset_dir: a local directory written by ``shardstream pack`` (with its index).
        out_dir: where to write the files (created if missing); default next to the shards.

    Returns:
        The paths written, in index order.

    Raises:
        ValueError: ``dataset_dir`` is an ``s3://`` URL (DALI's webdataset reader needs local
            files: copy the shards first).
        ShardNotFoundError: no index in ``dataset_dir``, or a shard's sample table is missing.
        IndexFormatError: the index is malformed.
    """
    text = os.fspath(dataset_dir)
    if "://" in text:
        raise ValueError(
            f"{text}: DALI's fn.readers.webdataset reads local files only; copy the dataset to a local "
            "directory (e.g. aws s3 sync) and write the .idx files there"
        )
    root = Path(text)
    index = open_index(root)
    target = Path(out_dir) if out_dir is not None else root
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(index.num_shards):
        path = target / (index.manifest.name(i).removesuffix(".tar") + ".idx")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(dali_index_text(index.table(i)), encoding="utf-8")
        os.replace(tmp, path)
        written.append(path)
    return written
