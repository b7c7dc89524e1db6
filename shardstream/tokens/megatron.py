"""Reading Megatron-LM indexed datasets (``PREFIX.bin``/``PREFIX.idx`` pairs) for
:func:`~.imports.import_megatron`, with numpy alone (megatron-core is not needed): the ``.idx``
(megatron-core's ``indexed_dataset._IndexWriter``) is little-endian ``MMIDIDX\\0\\0`` (9 bytes),
version ``<Q`` (1), dtype code ``<B`` (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
7 float32, 8 uint16), sequence count S ``<Q``, document count D ``<Q``, then ``int32[S]``
sequence lengths (tokens), ``int64[S]`` sequence byte offsets into the ``.bin``, ``int64[D]``
document indices (the sequence where each document starts, ``0`` first, ``S`` last: document
``i`` is sequences ``[doc[i], doc[i+1])``), and for a multimodal dataset ``int8[S]`` sequence
modes; the ``.bin`` is the sequences' tokens back to back. :func:`open_megatron` checks a
pair's ``.idx`` entirely (chunk by chunk) and gives its tokens memory-mapped with its
documents' token ends, read a window at a time; :func:`need_file` and :func:`memmap_tokens`
serve the datatrove reader too.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import SourceError, SourceNotFoundError

__all__ = [
    "MEGATRON_DTYPES",
    "MEGATRON_MAGIC",
    "MegatronPair",
    "megatron_prefixes",
    "memmap_tokens",
    "need_file",
    "open_megatron",
]

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
_MEGATRON_HEADER = 9 + 8 + 1 + 8 + 8  # magic, version, dtype code, sequence count, document count
_CHUNK = 1 << 22  # index entries checked at a time (32 MB of int64)


@dataclasses.dataclass(frozen=True)
class MegatronPair:
    """One checked Megatron pair: its ``.bin`` (the path errors name), the ids' prefix (the
    prefix's last part), its tokens (memory-mapped), its document count and ``doc_ends(d0, d1)``:
    the int64 token ends (exclusive) of documents ``[d0, d1)``."""

    bin_path: str
    name: str
    tokens: np.ndarray
    num_docs: int
    doc_ends: Callable[[int, int], np.ndarray]


def memmap_tokens(path: str, dtype: np.dtype[Any], count: int) -> np.ndarray:
    """``count`` tokens of ``dtype`` at ``path``, memory-mapped (an empty array for none)."""
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


def need_file(path: str, what: str, fix: str) -> None:
    """SourceNotFoundError naming ``path`` (``what`` it is, and ``fix``) when it is not a file."""
    if not os.path.isfile(path):
        raise SourceNotFoundError(f"{path}: no such file ({what}); {fix}")


def _prefix(given: str | os.PathLike[str]) -> str:
    text = os.fspath(given)
    for suffix in (".bin", ".idx"):
        if text.endswith(suffix):
            return text[: -len(suffix)]
    return text


def megatron_prefixes(given: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Each given PREFIX, PREFIX.bin or PREFIX.idx as its prefix; a directory as the prefix of every ``.idx`` in it."""
    out = []
    for p in given:
        text = os.fspath(p)
        if os.path.isdir(text):
            found = sorted(os.path.join(text, n[: -len(".idx")]) for n in os.listdir(text) if n.endswith(".idx"))
            if not found:
                raise SourceNotFoundError(f"{text}: holds no .idx file; pass Megatron PREFIX.bin/PREFIX.idx pairs")
            out += found
        else:
            out.append(_prefix(text))
    return out


def open_megatron(prefix: str) -> MegatronPair:
    """A Megatron pair, its ``.idx`` checked entirely (chunk by chunk) against itself and the ``.bin``'s size."""
    bin_path, idx_path = prefix + ".bin", prefix + ".idx"
    need_file(
        bin_path,
        f"the tokens of the Megatron dataset {prefix}",
        "a Megatron dataset is a PREFIX.bin and PREFIX.idx pair: pass PREFIX, PREFIX.bin or PREFIX.idx",
    )
    need_file(
        idx_path,
        f"the index of {bin_path}",
        f"copy the .idx written with {os.path.basename(bin_path)} (Megatron's preprocess_data.py writes both) "
        "beside it",
    )
    redo = "re-copy the pair, or re-run Megatron's preprocess_data.py"
    idx_size, bin_size = os.path.getsize(idx_path), os.path.getsize(bin_path)
    with open(idx_path, "rb") as f:
        head = f.read(_MEGATRON_HEADER)
    if len(head) < _MEGATRON_HEADER or head[:9] != MEGATRON_MAGIC:
        raise SourceError(f"{idx_path}: not a Megatron index (no MMIDIDX header); pass a Megatron .bin/.idx pair")
    version, code, num_seqs, num_bounds = struct.unpack("<QBQQ", head[9:])
    if version != 1:
        raise SourceError(f"{idx_path}: Megatron index version {version}; shardstream reads version 1")
    if code not in MEGATRON_DTYPES or MEGATRON_DTYPES[code].startswith("float"):
        raise SourceError(
            f"{idx_path}: dtype code {code} ({MEGATRON_DTYPES.get(code, 'unknown')}) is not a token id type; "
            "pass a dataset of integer tokens"
        )
    dtype = np.dtype(MEGATRON_DTYPES[code]).newbyteorder("<")
    plain = _MEGATRON_HEADER + 4 * num_seqs + 8 * num_seqs + 8 * num_bounds
    if idx_size not in (plain, plain + num_seqs):
        raise SourceError(
            f"{idx_path}: {idx_size} bytes, where its header ({num_seqs} sequences, {num_bounds} document indices) "
            f"makes {plain} (or {plain + num_seqs} with sequence modes): truncated or damaged; {redo}"
        )
    lengths = np.memmap(idx_path, dtype="<i4", mode="r", offset=_MEGATRON_HEADER, shape=(num_seqs,))
    pointers = np.memmap(idx_path, dtype="<i8", mode="r", offset=_MEGATRON_HEADER + 4 * num_seqs, shape=(num_seqs,))
    bounds = np.memmap(idx_path, dtype="<i8", mode="r", offset=_MEGATRON_HEADER + 12 * num_seqs, shape=(num_bounds,))
    if idx_size == plain + num_seqs and num_seqs:
        modes = np.memmap(idx_path, dtype="i1", mode="r", offset=plain, shape=(num_seqs,))
        for a in range(0, num_seqs, _CHUNK):
            if modes[a : a + _CHUNK].any():
                raise SourceError(
                    f"{idx_path}: a multimodal Megatron dataset (sequences of other modes than 0); a token dataset "
                    "holds one stream of text tokens: import the text sequences only"
                )
    total = 0  # tokens, so far
    for a in range(0, num_seqs, _CHUNK):
        chunk = lengths[a : a + _CHUNK].astype(np.int64)
        if (chunk < 0).any():
            raise SourceError(f"{idx_path}: a negative sequence length near sequence {a}: damaged; {redo}")
        expected = (total + np.concatenate([[0], np.cumsum(chunk[:-1])])) * dtype.itemsize
        if not np.array_equal(pointers[a : a + _CHUNK], expected):
            at = a + int(np.flatnonzero(pointers[a : a + _CHUNK] != expected)[0])
            raise SourceError(
                f"{idx_path}: sequence {at} starts at byte {int(pointers[at])} of the .bin where the lengths before it "
                f"make {int(expected[at - a])}: the sequences are not back to back; {redo}"
            )
        total += int(chunk.sum())
    if bin_size != total * dtype.itemsize:
        how = "truncated" if bin_size < total * dtype.itemsize else "longer than its index says"
        raise SourceError(
            f"{bin_path}: {bin_size} bytes, where {idx_path} makes {total} {dtype.name} tokens "
            f"({total * dtype.itemsize} bytes): {how}; the .bin and .idx must be written together: {redo}"
        )
    if num_bounds == 0 or int(bounds[0]) != 0:
        raise SourceError(
            f"{idx_path}: its document indices do not start at sequence 0; not written by Megatron's "
            f"IndexedDatasetBuilder: {redo}"
        )
    last = 0
    for a in range(0, num_bounds, _CHUNK):
        chunk = bounds[a : a + _CHUNK]
        if int(chunk[0]) < last or (np.diff(chunk) < 0).any() or int(chunk[-1]) > num_seqs:
            raise SourceError(
                f"{idx_path}: document indices near document {a} go back or past its {num_seqs} sequences: "
                f"damaged; {redo}"
            )
        last = int(chunk[-1])
    if last != num_seqs:
        raise SourceError(
            f"{idx_path}: {num_seqs - last} sequences after the last document end (megatron-core's IndexedDataset "
            f"refuses it too: the builder's end_document() was not called last); {redo}"
        )

    def doc_ends(d0: int, d1: int) -> np.ndarray:
        seqs = np.asarray(bounds[d0 + 1 : d1 + 1], dtype=np.int64)
        ends = np.full(len(seqs), total, dtype=np.int64)
        inside = seqs < num_seqs
        ends[inside] = pointers[seqs[inside]] // dtype.itemsize
        return ends

    return MegatronPair(
        bin_path=bin_path,
        name=os.path.basename(prefix),
        tokens=memmap_tokens(bin_path, dtype, total),
        num_docs=num_bounds - 1,
        doc_ends=doc_ends,
    )
