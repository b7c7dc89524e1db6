"""The exceptions shardstream raises.

Every error derives from :class:`ShardstreamError` and also from the built-in type that fits,
so callers can catch either. Messages name the file, shard, key or URL and say what to do::

    ShardstreamError
    ├── SourceError (ValueError)               SOURCE of `pack` is empty or not a directory
    │   └── SourceNotFoundError (FileNotFoundError)
    ├── UnreadableFileError (PermissionError)  a file under SOURCE cannot be read
    ├── MemberNameError (ValueError)           a file name cannot become a tar member / sample entry
    ├── SampleFnError (ValueError)             pack_samples: fn failed on an input (names it)
    ├── DestinationError (PermissionError)     DEST cannot be written
    │   └── ReadOnlyStoreError                 the store is read-only here (http(s), hf://)
    ├── StorageError (OSError)                 any other failure of the storage, with its code
    │   ├── StorageNotFoundError (FileNotFoundError)
    │   │   ├── BucketNotFoundError            the S3 bucket does not exist
    │   │   └── ShardNotFoundError             a shard URL or an index does not exist
    │   │       └── UnfinishedPackError        no index: an unfinished pack is there (says how to finish it)
    │   ├── StorageAccessError (PermissionError)  S3 rejected the credentials or denied access
    │   └── StorageConnectionError (ConnectionError)  the S3 endpoint cannot be reached
    ├── IndexFormatError (ValueError)          an index file is malformed or of an unknown version
    ├── CorruptShardError (ValueError)         a shard's tar bytes are malformed or truncated
    ├── DecodeError (ValueError)               a sample's member cannot be decoded (or, pack --check-images, a file)
    │   └── MissingFieldError (KeyError)       a sample lacks a field of fields= (shardstream.fields)
    └── MissingDependencyError (ImportError)   an optional extra is not installed
"""

from __future__ import annotations

__all__ = [
    "BucketNotFoundError",
    "CorruptShardError",
    "DecodeError",
    "DestinationError",
    "IndexFormatError",
    "MemberNameError",
    "MissingDependencyError",
    "ReadOnlyStoreError",
    "SampleFnError",
    "ShardNotFoundError",
    "ShardstreamError",
    "SourceError",
    "SourceNotFoundError",
    "StorageAccessError",
    "StorageConnectionError",
    "StorageError",
    "StorageNotFoundError",
    "UnfinishedPackError",
    "UnreadableFileError",
]


class ShardstreamError(Exception):
    """Base of every error shardstream raises on purpose."""


class SourceError(ShardstreamError, ValueError):
    """The input of `pack` cannot be used (empty, not a directory)."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """The input of `pack` does not exist."""


class UnreadableFileError(ShardstreamError, PermissionError):
    """A file under the pack source cannot be read, or changed while it was read."""


class MemberNameError(ShardstreamError, ValueError):
    """A file's name cannot be stored as a tar member or a sample entry."""


class SampleFnError(ShardstreamError, ValueError):
    """``pack_samples``: ``fn`` raised on an input, or gave a sample that cannot be written;
    the message names the input (its repr) and the error."""


class DestinationError(ShardstreamError, PermissionError):
    """The pack destination cannot be written."""


class ReadOnlyStoreError(DestinationError):
    """The store cannot be written by shardstream (http(s) servers, the Hugging Face Hub)."""


class StorageError(ShardstreamError, OSError):
    """The storage failed; the message names the URL, the endpoint and the storage's code."""


class StorageNotFoundError(StorageError, FileNotFoundError):
    """A bucket, object or file that was asked for does not exist."""


class BucketNotFoundError(StorageNotFoundError):
    """The S3 bucket does not exist."""


class ShardNotFoundError(StorageNotFoundError):
    """A shard or an index does not exist at its URL."""


class UnfinishedPackError(ShardNotFoundError):
    """Where a dataset was asked for, the shards of a pack that has not finished are: no index
    yet; the message says how far the pack got, what it read and how to finish it."""


class StorageAccessError(StorageError, PermissionError):
    """The storage refused the credentials or denied access (HTTP 401/403)."""


class StorageConnectionError(StorageError, ConnectionError):
    """The storage endpoint cannot be reached."""


class IndexFormatError(ShardstreamError, ValueError):
    """An index file is malformed, or written by an unknown format version."""


class CorruptShardError(ShardstreamError, ValueError):
    """A shard's tar stream is malformed or ends early."""


class DecodeError(ShardstreamError, ValueError):
    """A member of a sample cannot be decoded; the message names shard, key and extension (for
    ``pack --check-images``: the image file and Pillow's reason)."""


class MissingDependencyError(ShardstreamError, ImportError):
    """An optional dependency is not installed; the message gives the pip command."""
