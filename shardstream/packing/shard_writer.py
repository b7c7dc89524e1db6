"""``ShardWriter``: samples made by code -> tar shards plus an index, without files on disk."""

from __future__ import annotations

import numbers
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import DestinationError
from .destination import (
    DEFAULT_MAX_SHARD_BYTES,
    PackReport,
    check_options,
    merge_when_done,
    open_destination,
    prepare_state,
)
from .encode import JPEG_QUALITY, encode_sample
from .journal import JournaledWriter, PackSpec, read_stream_state, remove_stream_partials
from .labels import write_classes
from .parts import Part

__all__ = ["ShardWriter"]


class ShardWriter:
    """Write samples from code into tar shards and an index at ``dest``, as ``pack`` does.

    ::

        with ShardWriter("s3://bucket/ds", max_shard_bytes=256 << 20) as writer:
            for i, (jpeg, label) in enumerate(rows):
                writer.write({"__key__": f"{i:09d}", "jpg": jpeg, "cls": label})

    Values become member bytes by type and extension (:mod:`shardstream.packing.encode`:
    bytes as they are, ``str`` UTF-8, ``int``/``float`` decimal text, anything under
    ``json`` as JSON, numpy arrays under ``npy``, PIL images under an image extension);
    ``ShardDataset(dest, decode="pil")`` reads them back as ``int``, ``str``, parsed JSON,
    arrays and images. Keys follow ``pack``'s rules; a sample may not repeat the key of the one
    before it (readers would merge the two).

    The result is a dataset like ``pack``'s: the same tar layout and headers, shards named
    ``NAME-000000.tar``, ... (with ``part``: numbered ``seq x parts + part``), a sample table
    beside each, ``index.bin`` written by :meth:`close` (by the last part to close), so exact
    epochs, resume, ``verify``, ``index --dali``, byte ranges and the node cache all work.
    Each shard is published atomically (a temporary name and a rename locally; a completed
    multipart upload on object stores), so a writer that dies leaves only whole shards and
    no index; the next ``ShardWriter(dest, overwrite=True)`` starts again (use
    :func:`shardstream.pack_samples` for a write that resumes).

    Args:
        dest: a local directory (created if needed) or a writable store URL (``s3://``,
            ``gs://``, ``az://``).
        name: shard name prefix.
        max_shard_bytes: shard size limit in bytes (exceeded only by a single larger sample).
        max_samples_per_shard: sample limit per shard, or None.
        part: this writer writes part ``I`` of ``N`` of one dataset (N processes or machines,
            each with its own writer, the same options, and ``Part(I, N)``); default the
            whole dataset.
        overwrite: replace what ``dest`` holds (a dataset, or what a writer that did not
            close left): only what its index and state record, nothing else.
        clobber: write over files at ``dest`` with the names this writer writes (shards and
            tables, ``index.bin``, ``keys/``, ``.shardstream/``) that no index or pack state there
            records; without it such a ``dest`` is refused, naming them.
        s3, fetch: endpoint, credentials and multipart settings for ``s3://``.
        requests: timeouts, attempts and connections of the store's requests
            (:class:`~shardstream.config.RequestConfig`; None: its defaults).
        jpeg_quality: quality of PIL images saved as JPEG (1-95).
        classes: the class names, in class-index order, recorded in the index
            (``ShardDataset(dest).classes``, ``shardstream info``). A sample's ``cls`` is then
            its class index (an ``int`` in ``range(len(classes))``) or its class name (written
            as its index); a single-part writer whose every sample has a ``cls`` also records
            the samples of each class.

    Raises:
        DestinationError: ``dest`` holds a dataset or an unfinished write, and not
            ``overwrite``; files with its names that nothing there records, and not
            ``clobber``; or it cannot be written.
        ValueError: bad options.
        StorageError: the store failed (names the URL).
    """

    def __init__(
        self,
        dest: str | os.PathLike[str],
        *,
        name: str = "data",
        max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
        max_samples_per_shard: int | None = None,
        part: Part | None = None,
        overwrite: bool = False,
        clobber: bool = False,
        s3: S3Config | None = None,
        requests: RequestConfig | None = None,
        fetch: FetchConfig | None = None,
        jpeg_quality: int = JPEG_QUALITY,
        classes: Sequence[str] | None = None,
    ) -> None:
        part = part or Part(0, 1)
        check_options(name, max_shard_bytes, max_samples_per_shard, jpeg_quality=jpeg_quality)
        if overwrite and part.count > 1:
            raise ValueError("overwrite=True with several parts would let one part wipe another's; empty DEST first")
        self._started = time.perf_counter()
        self._store = open_destination(dest, s3=s3, fetch=fetch, requests=requests)
        self._spec = PackSpec.of_code(
            "ShardWriter",
            name=name,
            max_shard_bytes=max_shard_bytes,
            max_samples_per_shard=max_samples_per_shard,
            num_parts=part.count,
        )
        self._part = part
        self._jpeg_quality = jpeg_quality
        store = self._store
        claim = prepare_state(
            store,
            self._spec,
            overwrite=overwrite,
            clobber=clobber,
            fix="pass overwrite=True to replace it",
            clobber_option="clobber=True",
            what="this ShardWriter",
        )
        complete, self._kept = claim.complete, claim.kept
        state = read_stream_state(store, self._spec, part.index)
        if complete or state.num_shards or state.done is not None:
            what = "a dataset" if complete else f"shards of a ShardWriter (part {part.index}) that did not close"
            fix = "pass overwrite=True to replace it" if part.count == 1 else "empty it and run every part again"
            raise DestinationError(f"{store.url} already holds {what}; {fix}, or pick another DEST")
        remove_stream_partials(store, self._spec, part.index)
        self._classes = None if classes is None else [str(c) for c in classes]
        self._class_counts = None if self._classes is None else [0] * len(self._classes)
        self._class_index = {name: i for i, name in enumerate(self._classes or ())}
        if self._classes is not None:
            if not self._classes or len(set(self._classes)) != len(self._classes):
                raise ValueError(f"classes must be distinct names; got {self._classes[:5]}")
            write_classes(store, self._classes, None)
        self._journal = JournaledWriter(store, self._spec, part.index, state)
        self._num_samples = 0
        self._payload_bytes = 0
        self._report: PackReport | None = None
        self._closed = False

    @property
    def url(self) -> str:
        """Where the dataset goes."""
        return self._store.url

    @property
    def num_samples(self) -> int:
        """Samples written so far."""
        return self._num_samples

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample (see the class doc for keys and values); may publish the shard in
        progress first, when the sample would take it past a limit.

        Raises:
            TypeError, ValueError: a bad sample (names its key and extension); nothing of it
                is written and the writer stays usable.
            StorageError: the store failed (the writer is then unusable: close() raises,
                the shard in progress is dropped).
        """
        if self._closed:
            raise ValueError(f"this ShardWriter of {self.url} is closed")
        cls = None
        if self._classes is not None:
            sample, cls = self._labelled(sample)
        key, members = encode_sample(sample, jpeg_quality=self._jpeg_quality)
        journal = self._journal
        if key == journal.last_key:
            raise ValueError(
                f"sample key {key!r} repeats the key of the sample before it; readers would join the two "
                "into one sample: give every sample its own key"
            )
        journal.write_sample(key, members)
        journal.input_done()
        self._num_samples += 1
        self._payload_bytes += sum(len(payload) for _, payload in members)
        if self._class_counts is not None:  # counted once written: a refused sample is not
            if cls is None:
                self._class_counts = None  # not every sample has a class: no counts
            else:
                self._class_counts[cls] += 1

    def _labelled(self, sample: Mapping[str, Any]) -> tuple[Mapping[str, Any], int | None]:
        """``sample`` with its ``cls`` as a class index of the classes given, and that index
        (None: the sample has no ``cls``).

        Raises:
            ValueError: ``cls`` is neither a class index nor a class name (names the key).
        """
        assert self._classes is not None  # internal: only called with classes given
        if "cls" not in sample:
            return sample, None
        value = sample["cls"]
        index: int | None = None
        if isinstance(value, str):
            index = self._class_index.get(value)
        elif isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value < len(self._classes):
            index = int(value)  # numpy integers too
        if index is None:
            raise ValueError(
                f"sample {sample.get('__key__')!r}: cls {value!r} is neither a class index (0 to "
                f"{len(self._classes) - 1}) nor one of the {len(self._classes)} class names given (classes=)"
            )
        return {**sample, "cls": index}, index

    def close(self) -> PackReport:
        """Publish the shard in progress, record this part as done and, once every part is,
        write ``index.bin`` (and ``pack-report.jsonl``). Calling it again returns the same report.

        Raises:
            SourceError: no sample was written (by any part): nothing is left at ``dest``.
            StorageError: the store failed.
        """
        if self._report is not None:
            return self._report
        if self._closed:
            raise ValueError(f"this ShardWriter of {self.url} was aborted; nothing more is written")
        self._closed = True
        if self._classes is not None and self._class_counts is not None and self._part.count == 1:
            write_classes(self._store, self._classes, self._class_counts)
        self._journal.finish()
        totals = merge_when_done(
            self._store, self._spec, empty=f"{self.url}: no sample was written; nothing is left there"
        )
        self._report = PackReport.of(
            self._store,
            totals,
            started=self._started,
            num_files=self._num_samples,
            num_samples=self._num_samples,
            num_shards=self._journal.num_shards,
            payload_bytes=self._payload_bytes,
            resumed=False,
            problems=(),
            unit="samples",
            kept=self._kept,
        )
        return self._report

    def abort(self) -> None:
        """Stop without an index: drop the shard in progress; published shards stay until a
        ``ShardWriter(dest, overwrite=True)``."""
        if not self._closed:
            self._closed = True
            self._journal.abort()

    def __enter__(self) -> ShardWriter:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        """Close, or abort when the block raised."""
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __repr__(self) -> str:
        return f"ShardWriter({self.url!r}, samples={self._num_samples}, part={self._part.index}/{self._part.count})"
