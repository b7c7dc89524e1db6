"""Which backend a URL names: :func:`open_store`.

The S3 backend (and so aiobotocore) is imported only when an ``s3://`` URL is used.
"""

from __future__ import annotations

import os

from ..config import FetchConfig, S3Config
from .base import Store, is_s3_url
from .local import LocalStore

__all__ = ["open_store"]


def open_store(url: str | os.PathLike[str], *, s3: S3Config | None = None, fetch: FetchConfig | None = None) -> Store:
    """The store for a dataset location: ``s3://bucket/prefix``, ``file:///dir`` or a path."""
    text = os.fspath(url)
    if is_s3_url(text):
        from .s3 import S3Store

        return S3Store(text, s3=s3, fetch=fetch)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise ValueError(f"{text!r}: unsupported URL scheme; use s3://BUCKET/PREFIX or a local path")
    return LocalStore(text)
