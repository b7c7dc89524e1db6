"""Which backend a URL names: :func:`open_store`, and :func:`pin_urls` to fix URLs' versions.

Each backend is imported only when a URL of its scheme is used, so aiobotocore, gcsfs and
adlfs load only for ``s3://``, ``gs://`` and ``az://`` URLs. A backend whose optional extra is
missing raises :class:`~shardstream.errors.MissingDependencyError` naming the extra:

========================  ===============  ===================  ==========================
scheme                    module           extra                library
========================  ===============  ===================  ==========================
``s3://``                 :mod:`.s3`       (core)               aiobotocore
``http://``, ``https://``  :mod:`.http`     (core)               aiohttp
``hf://``                 :mod:`.hf`       (core)               aiohttp
``gs://``, ``gcs://``     :mod:`.gcs`      ``shardstream[gcs]``  gcsfs
``az://``, ``abfs[s]://``  :mod:`.azure`    ``shardstream[azure]`` adlfs
========================  ===============  ===================  ==========================
"""

from __future__ import annotations

import importlib
import os

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import MissingDependencyError
from .base import Store, scheme_of
from .local import LocalStore

__all__ = ["open_store", "pin_urls"]

# scheme -> (module, class, extra that installs its library, the library's import name)
_BACKENDS = {
    "http": (".http", "HttpStore", None, "aiohttp"),
    "https": (".http", "HttpStore", None, "aiohttp"),
    "hf": (".hf", "HfStore", None, "aiohttp"),
    "gs": (".gcs", "GcsStore", "gcs", "gcsfs"),
    "gcs": (".gcs", "GcsStore", "gcs", "gcsfs"),
    "az": (".azure", "AzureStore", "azure", "adlfs"),
    "abfs": (".azure", "AzureStore", "azure", "adlfs"),
    "abfss": (".azure", "AzureStore", "azure", "adlfs"),
}


def _backend(scheme: str) -> type:
    module_name, class_name, extra, library = _BACKENDS[scheme]
    try:
        importlib.import_module(library)
    except ImportError as exc:
        hint = f"pip install 'shardstream[{extra}]'" if extra else f"pip install {library}"
        raise MissingDependencyError(f"{scheme}:// URLs need the {library} package: {hint}") from exc
    module = importlib.import_module(module_name, __package__)
    return getattr(module, class_name)


def open_store(
    url: str | os.PathLike[str],
    *,
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    fetch: FetchConfig | None = None,
) -> Store:
    """The store for a dataset location: a local path or ``file:///dir``, or a URL of a
    remote store (``s3://bucket/prefix``, ``https://host/dir``, ``hf://datasets/ORG/NAME/dir``,
    ``gs://bucket/prefix``, ``az://container/prefix``).

    Args:
        url: the location.
        s3: S3's endpoint, credentials and addressing (``s3://`` only).
        requests: timeouts, attempts, waits and connections of the requests to any remote
            store; default :class:`~shardstream.config.RequestConfig`, except for S3, whose
            default is the S3Config's own timeout, attempt and pool fields (a RequestConfig
            given here wins over them). Local stores make no requests.
        fetch: part sizes and concurrency of uploads.

    Raises:
        ValueError: an unsupported scheme or a URL without a bucket or host.
        MissingDependencyError: the backend's optional extra is not installed (names it).
    """
    text = os.fspath(url)
    scheme = scheme_of(text)
    if scheme == "s3":
        from .s3 import S3Store

        return S3Store(text, s3=s3, fetch=fetch, requests=requests)
    if scheme is not None:
        return _backend(scheme)(text, fetch=fetch, requests=requests)
    if text.startswith("file://"):
        text = text[len("file://") :]
    return LocalStore(text)


def pin_urls(urls: list[str], *, requests: RequestConfig | None = None) -> list[str]:
    """``urls`` fixed to the versions they name now, for every process that reads them later:
    an ``hf://`` URL's revision (a branch or tag, ``main`` by default) becomes its commit sha,
    asked of the Hub once per dataset and revision (under ``requests``); other URLs come back
    unchanged.

    Raises:
        as :func:`open_store`; StorageError and subclasses when the Hub cannot say.
    """
    if not any(scheme_of(url) == "hf" for url in urls):
        return list(urls)
    from .hf import pin_hf_urls

    hf = [i for i, url in enumerate(urls) if scheme_of(url) == "hf"]
    pinned = list(urls)
    for i, url in zip(hf, pin_hf_urls([urls[i] for i in hf], requests=requests)):
        pinned[i] = url
    return pinned
