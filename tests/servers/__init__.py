"""Real local servers for the tests and benchmarks (not part of the wheel).

Each listens on 127.0.0.1 only, starts with a bounded wait and stops on exit (``with``,
``stop()``, or an ``atexit`` fallback):

- :mod:`servers.nginx`: ``NginxServer``, the system nginx serving a directory over http or
  https (a throwaway CA);
- :mod:`servers.faultserver`: ``FaultServer``, an aiohttp file server whose faults (cut bodies,
  error statuses, ignored ranges, replaced ETags, stalls) are switched at run time;
- :mod:`servers.hub`: ``FakeHub``, a fake of the Hugging Face Hub (revisions, paged trees,
  ``resolve`` redirects to a second host);
- :mod:`servers.httpapp`: what the fault server and the fake Hub share (child processes, fault
  rules, range and ETag handling, the request log, control routes);
- :mod:`servers.emulators`: ``GcsEmulator`` (``gcp-storage-emulator``) and ``Azurite``, with
  ``AZURITE_ACCOUNT`` and ``AZURITE_KEY``;
- :mod:`servers.faultproxy`: ``FaultProxy``, a TCP proxy that cuts, stalls or slows connections
  to a server;
- :mod:`servers.ray_cluster`: ``LocalRayCluster``, a two-raylet local Ray cluster.

The local S3 server (``SeaweedS3Server``) stays in :mod:`shardstream.testing`, with the process
handling these servers share (:mod:`shardstream.testing.process`).

``tests/`` has no ``__init__.py``: pytest puts it on ``sys.path``, so tests import ``from
servers.nginx import NginxServer``. Scripts under ``tests/`` get it as their own directory; the
benchmarks add it themselves (``sys.path.insert(0, str(Path(__file__).resolve().parents[1] /
"tests"))``). By hand: ``PYTHONPATH=tests python -m servers.hub --help`` (likewise
``servers.nginx``, ``servers.faultserver``). This package imports nothing itself.
"""
