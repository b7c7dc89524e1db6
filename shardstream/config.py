"""Settings as frozen dataclasses; the only place that reads environment variables
(:func:`env`, :func:`env_items`: every variable shardstream reads is listed in
:data:`ENVIRONMENT`, with what it is for; the other modules ask the named readers:
:func:`torchrun_env`, :func:`slurm_array_env`, :func:`ray_address`, :func:`ssl_cert_paths`,
:func:`http_proxy`, :func:`hf_endpoint`, :func:`hf_token`, :func:`gcs_emulator_host` and the
``azure_*`` ones).

The AWS variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, ``AWS_REGION`` ...) are read by botocore itself; :class:`S3Config` only
overrides them when a field is set, and peeks at the endpoint to pick path-style addressing
and to name the endpoint in error messages.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "ENVIRONMENT",
    "Affinity",
    "FetchConfig",
    "HttpConfig",
    "LastBatch",
    "MixMode",
    "OnError",
    "OrderSettings",
    "RequestConfig",
    "S3Config",
    "SlurmArrayEnv",
    "StoreSettings",
    "TorchrunEnv",
    "azure_account_name",
    "azure_connection_string",
    "azure_storage_env",
    "env",
    "env_items",
    "gcs_emulator_host",
    "hf_endpoint",
    "hf_token",
    "http_proxy",
    "on_error_of",
    "ray_address",
    "slurm_array_env",
    "ssl_cert_paths",
    "torchrun_env",
]

ENVIRONMENT = {
    "AWS_ENDPOINT_URL_S3": "S3's endpoint (botocore's; peeked at for path-style addressing and messages)",
    "AWS_ENDPOINT_URL": "S3's endpoint, when AWS_ENDPOINT_URL_S3 is not set",
    "AWS_REGION": "S3's region (botocore's; peeked at for messages)",
    "AWS_DEFAULT_REGION": "S3's region, when AWS_REGION is not set",
    "RANK": "this process's rank (torchrun), without torch.distributed initialised; pack's part",
    "WORLD_SIZE": "the job's ranks (torchrun), as RANK",
    "LOCAL_RANK": "this process's GPU on its node (torchrun): DaliLoader's device",
    "LOCAL_WORLD_SIZE": "ranks per node (torchrun): shard_affinity='node'",
    "GROUP_RANK": "this node's number (torchrun): checked against node affinity's shares",
    "NODE_RANK": "this node's number, when GROUP_RANK is not set",
    "SLURM_ARRAY_TASK_ID": "pack's part in a Slurm job array",
    "SLURM_ARRAY_TASK_COUNT": "pack's parts in a Slurm job array",
    "SLURM_ARRAY_TASK_MIN": "a Slurm job array's first task id",
    "SLURM_ARRAY_TASK_MAX": "a Slurm job array's last task id",
    "SLURM_ARRAY_TASK_STEP": "a Slurm job array's step",
    "RAY_ADDRESS": "the Ray cluster pack --ray joins (default 'auto')",
    "SSL_CERT_FILE": "CA bundle of https:// and the Hub",
    "SSL_CERT_DIR": "CA directory of https:// and the Hub",
    "HTTPS_PROXY": "the proxy of https:// and the Hub (or https_proxy; read through urllib.request)",
    "HTTP_PROXY": "the proxy of http:// (or http_proxy; read through urllib.request)",
    "NO_PROXY": "hosts reached without a proxy (or no_proxy; read through urllib.request)",
    "HF_ENDPOINT": "the Hugging Face Hub's URL",
    "HF_TOKEN": "the Hub's token",
    "HUGGING_FACE_HUB_TOKEN": "the Hub's token, its older name",
    "HF_TOKEN_PATH": "the file holding the Hub's token",
    "HF_HOME": "the Hub's home (its token file under it)",
    "XDG_CACHE_HOME": "where HF_HOME defaults to",
    "STORAGE_EMULATOR_HOST": "a GCS emulator's address (gcsfs's)",
    "AZURE_STORAGE_CONNECTION_STRING": "Azure's account and credentials (adlfs's)",
    "AZURE_STORAGE_ACCOUNT_NAME": "Azure's account (adlfs's)",
    "TOKENIZERS_PARALLELISM": "set to false in pack-text's worker processes: one core each (Hugging Face tokenizers')",
    "OPENBLAS_NUM_THREADS": "set to 1, where unset, for the worker processes of pack and pack-text: they do no linear "
    "algebra, and each idle OpenBLAS thread spins about 0.1 CPU-s when numpy is imported",
}
"""Every environment variable shardstream reads, with what it is for (the libraries below it,
botocore, gcsfs, adlfs, read theirs too: docs/stores.md)."""
_ENV_PREFIXES = ("AZURE_STORAGE_",)  # read as a group: Azure's credentials fingerprint a client


def env(name: str, default: str | None = None) -> str | None:
    """The environment variable ``name`` (one of :data:`ENVIRONMENT`), or ``default`` where
    it is not set.

    Raises:
        KeyError: ``name`` is not listed in :data:`ENVIRONMENT` (a read to add there first).
    """
    if name not in ENVIRONMENT:
        raise KeyError(f"{name}: not one of the environment variables shardstream reads (config.ENVIRONMENT)")
    return os.environ.get(name, default)


def set_env(name: str, value: str) -> None:
    """Set environment variable ``name`` (one of :data:`ENVIRONMENT`) for this process and
    the ones it starts: what shardstream tells a library below it (``TOKENIZERS_PARALLELISM``
    in a pack-text worker).

    Raises:
        KeyError: ``name`` is not listed in :data:`ENVIRONMENT`.
    """
    if name not in ENVIRONMENT:
        raise KeyError(f"{name}: not one of the environment variables shardstream uses (config.ENVIRONMENT)")
    os.environ[name] = value


@contextlib.contextmanager
def child_env(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables (each one of :data:`ENVIRONMENT`) for the processes started
    in the block, where the user has not set them; this process's own environment is as before
    once the block ends.

    Raises:
        KeyError: a name is not listed in :data:`ENVIRONMENT`.
    """
    unknown = [name for name in values if name not in ENVIRONMENT]
    if unknown:
        raise KeyError(f"{unknown[0]}: not one of the environment variables shardstream uses (config.ENVIRONMENT)")
    added = [name for name in values if name not in os.environ]
    try:
        for name in added:
            os.environ[name] = values[name]
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def env_items(prefix: str) -> tuple[tuple[str, str], ...]:
    """The environment variables whose names start with ``prefix`` (``"AZURE_STORAGE_"``), as
    ``(name, value)`` pairs.

    Raises:
        KeyError: ``prefix`` is not one shardstream reads as a group.
    """
    if prefix not in _ENV_PREFIXES:
        raise KeyError(f"{prefix}: not a group of environment variables shardstream reads")
    return tuple((name, value) for name, value in os.environ.items() if name.startswith(prefix))


# Named readers: what each module asks of the environment, so no variable name is spelt
# outside this module. Values are the text as set (None: not set); each caller parses the one
# it needs and names the variable in its own error.


@dataclass(frozen=True)
class TorchrunEnv:
    """torchrun's variables as this process got them (any launcher that sets them counts).

    Attributes:
        rank: ``RANK``, this process's rank in the job.
        world_size: ``WORLD_SIZE``, the job's ranks.
        local_rank: ``LOCAL_RANK``, this process's GPU on its node.
        local_world_size: ``LOCAL_WORLD_SIZE``, ranks per node.
        node_rank: ``GROUP_RANK``, else ``NODE_RANK``: this node's number.
    """

    rank: str | None
    world_size: str | None
    local_rank: str | None
    local_world_size: str | None
    node_rank: str | None


def torchrun_env() -> TorchrunEnv:
    """torchrun's variables now (:class:`TorchrunEnv`)."""
    return TorchrunEnv(
        rank=env("RANK"),
        world_size=env("WORLD_SIZE"),
        local_rank=env("LOCAL_RANK"),
        local_world_size=env("LOCAL_WORLD_SIZE"),
        node_rank=env("GROUP_RANK", env("NODE_RANK")),
    )


@dataclass(frozen=True)
class SlurmArrayEnv:
    """A Slurm job array's variables as this task got them: pack's part.

    Attributes:
        task_id: ``SLURM_ARRAY_TASK_ID``, this task's id.
        task_count: ``SLURM_ARRAY_TASK_COUNT``, the array's tasks.
        bounds: ``SLURM_ARRAY_TASK_MIN``, ``_MAX`` and ``_STEP`` by their suffix
            (``{"MIN": ..., "MAX": ..., "STEP": ...}``), as the array was given.
    """

    task_id: str | None
    task_count: str | None
    bounds: dict[str, str | None]


def slurm_array_env() -> SlurmArrayEnv:
    """A Slurm job array's variables now (:class:`SlurmArrayEnv`)."""
    return SlurmArrayEnv(
        task_id=env("SLURM_ARRAY_TASK_ID"),
        task_count=env("SLURM_ARRAY_TASK_COUNT"),
        bounds={name: env(f"SLURM_ARRAY_TASK_{name}") for name in ("MIN", "MAX", "STEP")},
    )


def ray_address() -> str | None:
    """``RAY_ADDRESS``: the Ray cluster ``pack --ray`` joins when none is given."""
    return env("RAY_ADDRESS")


def ssl_cert_paths() -> tuple[str | None, str | None]:
    """``(SSL_CERT_FILE, SSL_CERT_DIR)``: the CA bundle and directory of https:// and the Hub
    (OpenSSL's own variables; None: the system's CAs)."""
    return env("SSL_CERT_FILE"), env("SSL_CERT_DIR")


def http_proxy(scheme: str, host: str) -> str | None:
    """The proxy ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` (or their lowercase names) give
    for ``scheme://host``, as curl and requests read them; None: connect directly."""
    import urllib.request

    if urllib.request.proxy_bypass(host):
        return None
    return urllib.request.getproxies().get(scheme)


def hf_endpoint() -> str:
    """The Hub's URL: ``HF_ENDPOINT``, else ``https://huggingface.co``."""
    return (env("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hf_token() -> str | None:
    """The Hub token of the standard chain, or None: ``HF_TOKEN``, else
    ``HUGGING_FACE_HUB_TOKEN``, else the file ``HF_TOKEN_PATH``, else ``token`` under
    ``HF_HOME`` (default ``$XDG_CACHE_HOME/huggingface``, ``~/.cache/huggingface``); a file
    that cannot be read gives None."""
    token = env("HF_TOKEN") or env("HUGGING_FACE_HUB_TOKEN")
    if token:
        return token.strip()
    path = env("HF_TOKEN_PATH")
    if not path:
        home = env("HF_HOME") or os.path.join(
            env("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "huggingface"
        )
        path = os.path.join(home, "token")
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def gcs_emulator_host() -> str | None:
    """``STORAGE_EMULATOR_HOST``: a GCS emulator's address (``host:port`` or a URL), None when
    unset, empty or ``default`` (as gcsfs and google-cloud-storage read it: real GCS)."""
    host = env("STORAGE_EMULATOR_HOST") or ""
    return None if host in ("", "default") else host


def azure_connection_string() -> str:
    """``AZURE_STORAGE_CONNECTION_STRING`` ("" when unset): Azure's account and credentials."""
    return env("AZURE_STORAGE_CONNECTION_STRING") or ""


def azure_account_name() -> str | None:
    """``AZURE_STORAGE_ACCOUNT_NAME``: Azure's account when no URL or connection string names one."""
    return env("AZURE_STORAGE_ACCOUNT_NAME")


def azure_storage_env() -> tuple[tuple[str, str], ...]:
    """Every ``AZURE_STORAGE_*`` variable as ``(name, value)`` pairs: what adlfs reads for
    Azure's account and credentials (a client is made per distinct set)."""
    return env_items("AZURE_STORAGE_")


AddressingStyle = Literal["auto", "path", "virtual"]
OnError = Literal["raise", "skip"]
"""What a reader or a writer does with bad input: ``"raise"`` (stop, naming it) or ``"skip"``
(go on without it, counted and logged). Writers accept their former word ``"fail"`` for ``"raise"``."""
MixMode = Literal["stratified", "random"]
"""How a mixture interleaves its sources: in every batch by their shares, or at random."""
Affinity = Literal["node"]
"""``shard_affinity``: each node keeps the same share of the shards in every epoch."""
LastBatch = Literal["keep", "drop", "pad"]
"""What a batched loader does with an epoch's short last batch."""


def on_error_of(value: object, *, where: str, old: tuple[str, ...] = ("fail",)) -> OnError:
    """``value`` as one word of :data:`OnError`: ``"raise"`` or ``"skip"``, with a former word
    (``old``: writers' ``"fail"``) taken for ``"raise"``.

    Raises:
        ValueError: another value, naming ``where`` it was given.
    """
    if value in ("raise", "skip"):
        return value  # type: ignore[return-value]  # narrowed by the test
    if value in old:
        return "raise"
    raise ValueError(f"{where}: on_error={value!r} must be 'raise' or 'skip'")


@dataclass(frozen=True, kw_only=True)
class S3Config:
    """How to reach S3. Every field left ``None`` falls back to the standard AWS environment.

    Attributes:
        endpoint_url: e.g. ``"http://127.0.0.1:8333"``; default ``AWS_ENDPOINT_URL_S3`` /
            ``AWS_ENDPOINT_URL``, else AWS itself.
        access_key_id, secret_access_key, session_token: explicit credentials; default the
            botocore chain (env, ``AWS_PROFILE``, config files, instance roles).
        profile: a profile name in ``~/.aws/config``.
        region_name: default ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` / the profile, else
            ``us-east-1``.
        addressing_style: ``None`` picks ``"path"`` when a custom endpoint is set.
        connect_timeout_s, read_timeout_s, max_attempts, max_pool_connections: the request
            policy of S3 when no :class:`RequestConfig` is given (the fields of one, with
            its ``max_retry_after_s`` and ``max_redirects`` at their defaults). A
            :class:`RequestConfig` given beside this one (``requests=``) wins: these four
            fields are then not used.
    """

    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    profile: str | None = None
    region_name: str | None = None
    addressing_style: AddressingStyle | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    max_attempts: int = 5
    max_pool_connections: int = 32

    def __repr__(self) -> str:
        secret = "***" if self.secret_access_key else None
        return (
            f"S3Config(endpoint_url={self.resolved_endpoint_url()!r}, "
            f"access_key_id={self.access_key_id!r}, secret_access_key={secret!r}, "
            f"profile={self.profile!r}, region_name={self.region_name!r})"
        )

    def resolved_endpoint_url(self) -> str | None:
        """The endpoint botocore will use: the field, else the AWS env variables, else None."""
        return self.endpoint_url or env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL")

    def resolved_region_name(self) -> str | None:
        """The field, else ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else None (profile or default)."""
        return self.region_name or env("AWS_REGION") or env("AWS_DEFAULT_REGION")

    def request_config(self) -> RequestConfig:
        """This config's request fields as the :class:`RequestConfig` S3 uses when none is given."""
        return RequestConfig(
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            max_attempts=self.max_attempts,
            max_pool_connections=self.max_pool_connections,
        )

    def resolved_addressing_style(self) -> AddressingStyle:
        """``"path"`` for custom endpoints (local servers), else ``"auto"``, unless set."""
        if self.addressing_style is not None:
            return self.addressing_style
        return "path" if self.resolved_endpoint_url() else "auto"


@dataclass(frozen=True, kw_only=True)
class RequestConfig:
    """How requests to a remote store go, for every store: S3, http(s), the Hugging Face Hub,
    GCS and Azure (the stores' own settings, such as endpoints and credentials, live elsewhere:
    :class:`S3Config` for S3; the environment for the others, see ``docs/stores.md``).

    Every ranged read of every store runs one retry loop with these numbers
    (:mod:`shardstream.storage.ranged`): a dropped or refused connection, a timeout, a body cut
    mid-transfer, or a 408/429/5xx answer is tried again (a cut body from its first missing
    byte), after the answer's ``Retry-After`` where it sends one, else after a backoff of 0.2 s
    doubling up to 5 s; anything else fails at once.

    Attributes:
        connect_timeout_s, read_timeout_s: socket timeouts in seconds (a read waits at most
            ``read_timeout_s`` for each piece of a body); one attempt waits at most their sum
            for its answer, a pooled connection included.
        max_attempts: total attempts per request (1: no retry). S3 uses these for every
            request; GCS and Azure for ranged reads (their libraries retry metadata requests,
            listings and uploads themselves: Azure's SDK ``max_attempts`` times, gcsfs its own
            6 times, each bounded by :attr:`request_limit_s`).
        max_retry_after_s: the longest wait between two attempts (seconds): a longer
            ``Retry-After`` is waited for this long.
        max_pool_connections: connections per process and server: the size of the client's
            pool for S3, http(s) and the Hub; for GCS and Azure, whose libraries keep their own
            pools, the ranged reads in flight at once per process and endpoint.
        max_redirects: redirects followed per request (http(s) and the Hub).

    ``HttpConfig`` is the same class under its former name.
    """

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    max_attempts: int = 5
    max_retry_after_s: float = 30.0
    max_pool_connections: int = 32
    max_redirects: int = 10

    def __post_init__(self) -> None:
        for field in ("max_attempts", "max_pool_connections", "max_redirects"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"RequestConfig.{field}={value!r} must be an int >= 1")
        for field in ("connect_timeout_s", "read_timeout_s", "max_retry_after_s"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ValueError(f"RequestConfig.{field}={value!r} must be a number > 0 (seconds)")

    @property
    def attempt_limit_s(self) -> float:
        """The longest one attempt waits for its answer (seconds): ``connect_timeout_s + read_timeout_s``."""
        return self.connect_timeout_s + self.read_timeout_s

    @property
    def request_limit_s(self) -> float:
        """The longest one request may wait for its answer, every attempt and the waits between
        them included (seconds): ``max_attempts`` attempts and ``max_attempts - 1`` waits."""
        return self.max_attempts * self.attempt_limit_s + (self.max_attempts - 1) * self.max_retry_after_s


HttpConfig = RequestConfig  # the name before RequestConfig applied to every store


@dataclass(frozen=True, kw_only=True)
class FetchConfig:
    """How shards are read and written. Sizes are bytes.

    Attributes:
        max_inflight_shards: S3 shards fetched ahead per reader (process), the one being
            parsed included.
        part_bytes: size of one ranged GET when reading from S3.
        max_inflight_requests: ranged GETs in flight at once per reader.
        max_buffer_bytes: bytes fetched from S3 and not yet consumed, at most, per rank
            (a ShardDataset's process: its DataLoader workers share it equally, each with
            ranged GETs of at most half its share, but not below 1 MiB); fetching pauses
            when it is reached (>= ``part_bytes``).
        chunk_bytes: read buffer of local shard files.
        upload_part_bytes: multipart upload part size when writing to S3 (>= 5 MiB, the S3
            minimum part).
        max_inflight_upload_parts: upload parts sent at once per shard being written.
        cache_wait_s: with a node cache, how long a reader waits for another process's
            download of a shard into the cache before it reads the shard from S3 itself
            (uncached, counted in ``stats().cache_bypasses``).
    """

    max_inflight_shards: int = 4
    part_bytes: int = 16 << 20
    max_inflight_requests: int = 8
    max_buffer_bytes: int = 256 << 20
    chunk_bytes: int = 1 << 20
    upload_part_bytes: int = 16 << 20
    max_inflight_upload_parts: int = 4
    cache_wait_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.cache_wait_s, (int, float)) or not self.cache_wait_s >= 0:
            raise ValueError(f"FetchConfig.cache_wait_s={self.cache_wait_s!r} must be a number >= 0 (seconds)")
        for field in (
            "max_inflight_shards",
            "part_bytes",
            "max_inflight_requests",
            "chunk_bytes",
            "max_inflight_upload_parts",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"FetchConfig.{field}={value!r} must be an int >= 1")
        if not isinstance(self.upload_part_bytes, int) or self.upload_part_bytes < 5 << 20:
            raise ValueError(
                f"FetchConfig.upload_part_bytes={self.upload_part_bytes!r} must be an int >= 5 MiB (S3 minimum)"
            )
        if not isinstance(self.max_buffer_bytes, int) or self.max_buffer_bytes < self.part_bytes:
            raise ValueError(
                f"FetchConfig.max_buffer_bytes={self.max_buffer_bytes!r} must be an int >= part_bytes "
                f"({self.part_bytes})"
            )


@dataclass(frozen=True, kw_only=True)
class OrderSettings:
    """The settings that fix an epoch's order, made once from a dataset's keyword arguments
    and passed whole (to the schedule, the planner, checkpoints).

    Attributes:
        seed: seed of shard order and sample shuffle.
        shuffle: permute shards, interleave lanes, shuffle samples; False keeps index order.
        shuffle_buffer: samples in each reader's shuffle buffer (>= 0).
        max_open_shards: lanes (shards read at once) per reader (>= 1).
        drop_last: drop the fewest samples instead of repeating some to even out ranks.
        batch_size: the DataLoader's batch size readers' pieces are cut by; None: evenly.

    Raises:
        ValueError: a bad value, named.
    """

    seed: int = 0
    shuffle: bool = True
    shuffle_buffer: int = 1000
    max_open_shards: int = 4
    drop_last: bool = False
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} must be an int")
        if not isinstance(self.shuffle_buffer, int) or self.shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer={self.shuffle_buffer!r} must be an int >= 0 (samples)")
        if not isinstance(self.max_open_shards, int) or self.max_open_shards < 1:
            raise ValueError(f"max_open_shards={self.max_open_shards!r} must be an int >= 1")
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"batch_size={self.batch_size!r} must be an int >= 1 (the DataLoader's) or None")


@dataclass(frozen=True, kw_only=True)
class StoreSettings:
    """How shards are reached, made once from a dataset's keyword arguments and passed whole
    (to the reading engines, random access, index resolution, the planner).

    Attributes:
        s3: S3 endpoint and credentials; None: the standard AWS environment.
        requests: timeouts, attempts and connections of remote requests; None: the defaults.
        fetch: read-ahead bounds (bytes, requests, shards); None: the defaults.
        cache_dir: a node-local directory caching remote shards; None: no cache.
        cache_limit_bytes: the cache's size bound in bytes (required with ``cache_dir``).

    Raises:
        ValueError: ``cache_dir`` without a positive ``cache_limit_bytes``.
    """

    s3: S3Config | None = None
    requests: RequestConfig | None = None
    fetch: FetchConfig | None = None
    cache_dir: str | None = None
    cache_limit_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
            if not isinstance(self.cache_limit_bytes, int) or self.cache_limit_bytes < 1:
                raise ValueError(
                    f"cache_limit_bytes={self.cache_limit_bytes!r} must be an int >= 1 (bytes) when cache_dir is set"
                )

    @property
    def fetch_or_default(self) -> FetchConfig:
        """:attr:`fetch`, or the default :class:`FetchConfig`."""
        return self.fetch or FetchConfig()
