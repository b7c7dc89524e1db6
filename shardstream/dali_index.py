"""DALI index files (``.idx``) for shards, written from ``index.json`` without reading a tar.

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

from .errors import ShardNotFoundError
from .format import split_key
from .index import INDEX_NAME, Index, ShardEntry

__all__ = ["dali_index_text", "write_dali_index"]


def dali_index_text(shard: ShardEntry) -> str:
    """The ``.idx`` text of one shard, as ``wds2idx`` writes it (module doc).

    Raises:
        IndexFormatError: the shard's sample entries are malformed.
    """
    lines = [f"v1.2 {shard.num_samples}"]
    for sample in shard.samples:
        lines.append(" ".join(f"{split_key(m.name)[1]} {m.offset} {m.size} {m.name}" for m in sample.members))
    return "\n".join(lines) + "\n"


def write_dali_index(dataset_dir: str | os.PathLike[str], *, out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Write ``<shard name without .tar>.idx`` for every shard of a local dataset.

    Args:
        dataset_dir: a local directory written by ``shardstream pack`` (with ``index.json``).
        out_dir: where to write the files (created if missing); default next to the shards.

    Returns:
        The paths written, in index order.

    Raises:
        ValueError: ``dataset_dir`` is an ``s3://`` URL (DALI's webdataset reader needs local
            files: copy the shards first).
        ShardNotFoundError: no ``index.json`` in ``dataset_dir``.
        IndexFormatError: the index is malformed.
    """
    text = os.fspath(dataset_dir)
    if "://" in text:
        raise ValueError(
            f"{text}: DALI's fn.readers.webdataset reads local files only; copy the dataset to a local "
            "directory (e.g. aws s3 sync) and write the .idx files there"
        )
    root = Path(text)
    index_path = root / INDEX_NAME
    try:
        data = index_path.read_bytes()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise ShardNotFoundError(f"{index_path}: no index here; pass a directory written by shardstream pack") from exc
    index = Index.from_json(data, url=str(index_path))
    target = Path(out_dir) if out_dir is not None else root
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for shard in index.shards:
        path = target / (shard.name.removesuffix(".tar") + ".idx")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(dali_index_text(shard), encoding="utf-8")
        os.replace(tmp, path)
        written.append(path)
    return written
