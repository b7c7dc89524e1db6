"""Helpers for tests, benchmarks and the demo; not public API.

- :mod:`.s3server`: a real local S3 server (SeaweedFS ``weed mini``) on 127.0.0.1;
  ``python -m shardstream.testing`` starts one and prints its environment;
- :mod:`.emulators`: local GCS and Azure Blob servers (``gcp-storage-emulator``, Azurite);
- :mod:`.webservers`: nginx, a fault-injecting file server and a fake Hugging Face Hub;
- :mod:`.process`: the process handling these servers share (ports, waits, logs, stops);
- :mod:`.faults`: a TCP proxy that cuts, stalls or slows connections to a server;
- :mod:`.synth`: synthetic JPEG photos in class folders.

The library itself never imports this package (only :mod:`shardstream.demo` does).
"""

from .s3server import S3ServerError, S3ServerInfo, SeaweedS3Server, main

__all__ = ["S3ServerError", "S3ServerInfo", "SeaweedS3Server", "main"]
