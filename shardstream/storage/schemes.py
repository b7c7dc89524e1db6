"""Which backend a URL names: :func:`open_store`, and :func:`pin_urls` to fix URLs' versions.

Every remote scheme's store comes from the factory registered for it
(:func:`~.base.register_store`, public as ``shardstream.register_store``); the built-in
backends are registered here, each imported only when a URL of its scheme is used, so aiobotocore, gcsfs and
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
from .base import Store, register_store, scheme_of, store_factory
from .local import LocalStore

__all__ = ["open_store", "pin_urls", "register_store"]

# scheme -> (module, class, extra that installs its library, the library's import name)
_BACKENDS = {
    "s3": (".s3", "S3Store", None, "aiobotocore"),
    "http": (".http", "HttpStore", None, "aiohttp"),
    "https": (".http", "HttpStore", None, "aiohttp"),
    "hf": (".hf", "HfStore", None, "aiohttp"),
    "gs": (".gcs", "GcsStore", "gcs", "gcsfs"),
    "gcs": (".gcs", "GcsStore", "gcs", "gcsfs"),
    "az": (".azure", "AzureStore", "azure", "adlfs"),
    "abfs": (".azure", "AzureStore", "azure", "adlfs"),
    "abfss": (".azure", "AzureStore", "azure", "adlfs"),
}


class _BuiltIn:
    """The factory of a built-in backend: its module imported on first use, a missing optional
    library named with the extra that installs it."""

    def __init__(self, scheme: str) -> None:
        self.scheme = scheme

    def __repr__(self) -> str:
        return f"shardstream's {_BACKENDS[self.scheme][1]}"

    def __call__(
        self,
        url: str,
        *,
        s3: S3Config | None = None,
        requests: RequestConfig | None = None,
        fetch: FetchConfig | None = None,
    ) -> Store:
        module_name, class_name, extra, library = _BACKENDS[self.scheme]
        try:
            importlib.import_module(library)
        except ImportError as exc:
            hint = f"pip install 'shardstream[{extra}]'" if extra else f"pip install {library}"
            raise MissingDependencyError(f"{self.scheme}:// URLs need the {library} package: {hint}") from exc
        backend = getattr(importlib.import_module(module_name, __package__), class_name)
        if self.scheme == "s3":
            return backend(url, s3=s3, fetch=fetch, requests=requests)
        return backend(url, fetch=fetch, requests=requests)


for _scheme in _BACKENDS:
    register_store(_scheme, _BuiltIn(_scheme))


def open_store(
    url: str | os.PathLike[str],
    *,
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    fetch: FetchConfig | None = None,
) -> Store:
    """The store for a dataset location: a local path or ``file:///dir``, or a URL of a
    remote store (``s3://bucket/prefix``, ``https://host/dir``, ``hf://datasets/ORG/NAME/dir``,
    ``gs://bucket/prefix``, ``az://container/prefix``, or any scheme given a store with
    :func:`~.base.register_store`), made by the factory registered for its scheme.

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
    if scheme is not None:
        return store_factory(scheme)(text, s3=s3, requests=requests, fetch=fetch)
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
