"""Running a pack, or an index build, as tasks on a Ray cluster (``pack(..., ray=ADDRESS)``,
``shardstream pack SOURCE DEST --ray [ADDRESS]``; the ``shardstream[ray]`` extra).

The driver (the process that calls :func:`~shardstream.pack`) connects to the cluster, lists the
source once (:mod:`shardstream.packing.listing`), and runs every pack stream as one Ray task
of 1 CPU. A task packs its range of planned shards with the same code as a local worker and
records each shard in the journal; when its worker process dies (killed, out of memory, its
node lost) Ray runs it again (``max_retries``) and it resumes after its last record. The
driver shows one tqdm bar (files/s, MB/s, streams done) fed by a small counter actor, and
writes the index when every task is done. The shards are the same bytes as a one-machine
pack of the same source and options. ``pack-text`` runs its streams on Ray the same way
(:func:`run_stream_tasks`).

Every node must reach SOURCE and DEST by the same name: an object store (``s3://``,
``gs://``, ``az://``) or a file system mounted at the same path everywhere.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from tqdm import tqdm

from ..config import ray_address
from ..errors import ShardstreamError

__all__ = ["cluster_cpus", "connect", "map_on_ray", "run_stream_tasks", "run_streams_on_ray"]

T = TypeVar("T")
R = TypeVar("R")

TASK_RETRIES = 3  # runs of a task whose worker process died, after the first
STALL_TIMEOUT_S = 1800.0  # no file packed and no task finished for this long: the job is stuck
_POLL_S = 0.5


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ShardstreamError("packing on Ray needs the ray extra: pip install 'shardstream[ray]'") from None
    return ray


def connect(address: str | None = None) -> None:
    """Connect this process to the Ray cluster at ``address`` (else ``RAY_ADDRESS``, else
    ``"auto"``: the cluster started on this machine), unless it already is.

    Raises:
        ShardstreamError: ray is not installed, or no cluster answers at the address.
    """
    ray = _ray()
    if ray.is_initialized():
        return
    address = address or ray_address() or "auto"
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ShardstreamError(
            f"no Ray cluster at {address!r} ({exc}); start one (`ray start --head`) or pass its address"
        ) from exc


def cluster_cpus() -> int:
    """CPUs of the connected cluster (at least 1)."""
    return max(1, int(_ray().cluster_resources().get("CPU", 1)))


class _Counter:
    """What the tasks did (files and bytes packed, or documents and tokens), summed across
    tasks; the driver takes the sums it has not shown."""

    def __init__(self) -> None:
        self.a = self.b = 0

    def add(self, a: int, b: int) -> None:
        self.a += a
        self.b += b

    def take(self) -> tuple[int, int]:
        taken = (self.a, self.b)
        self.a = self.b = 0
        return taken


def _stream_task(job: Any, counter: Any, run: Callable[..., Any]) -> Any:
    """One pack stream in a Ray worker, sending its progress to ``counter`` every 0.5 s."""
    pending = [0, 0, time.monotonic()]

    def advance(a: int, b: int) -> None:
        pending[0] += a
        pending[1] += b
        if time.monotonic() - pending[2] > _POLL_S:
            counter.add.remote(pending[0], pending[1])
            pending[:] = [0, 0, time.monotonic()]

    result = run(job, advance)
    counter.add.remote(pending[0], pending[1])
    return result


def _translate(exc: BaseException, what: str) -> BaseException:
    """A task's error as the CLI shows it: our own errors as they were raised in the task."""
    ray = _ray()
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ShardstreamError | ValueError | OSError):
            return cause
        return ShardstreamError(f"{what} failed on the cluster: {cause!r}")
    if isinstance(exc, ray.exceptions.WorkerCrashedError | ray.exceptions.NodeDiedError):
        return ShardstreamError(
            f"{what}: its worker died {TASK_RETRIES + 1} times ({exc.__class__.__name__}); "
            "run the same command again to resume"
        )
    return ShardstreamError(f"{what} failed on the cluster: {exc!r}")


def run_streams_on_ray(
    jobs: list[Any],
    run: Callable[[Any, Callable[[int, int], None]], Any],
    *,
    progress: bool,
    total_files: int | None = None,
    stall_timeout_s: float = STALL_TIMEOUT_S,
) -> list[Any]:
    """Run each pack stream (``run(job, advance)``, :func:`shardstream.packing.stream.run_stream`)
    as a Ray task (1 CPU, retried ``TASK_RETRIES`` times when its worker dies) and drive one
    progress bar; the results in ``jobs`` order.

    Raises:
        the first task's error (a bad input file under ``on_error="raise"`` as the CLI names it),
        ShardstreamError: a task's worker died on every try, or nothing moved for
            ``stall_timeout_s`` seconds (the tasks are cancelled).
    """
    payload = 0
    with tqdm(
        unit=" files", unit_scale=True, desc="packing on Ray", disable=not progress, file=sys.stderr, total=total_files
    ) as bar:

        def tick(files: int, nbytes: int) -> str:
            nonlocal payload
            payload += nbytes
            bar.update(files)
            return f"{payload / 1e6 / max(bar.format_dict['elapsed'], 1e-9):.1f} MB/s"

        return run_stream_tasks(
            jobs, run, bar, tick, name="pack", stalled="the pack on Ray", stall_timeout_s=stall_timeout_s
        )


def run_stream_tasks(
    jobs: list[Any],
    run: Callable[[Any, Callable[[int, int], None]], Any],
    bar: tqdm,
    tick: Callable[[int, int], str],
    *,
    name: str,
    stalled: str,
    stall_timeout_s: float = STALL_TIMEOUT_S,
) -> list[Any]:
    """Run ``run(job, advance)`` for every job (each with its ``stream`` number) as a Ray task
    named ``shardstream-{name}-stream-N`` (1 CPU, retried ``TASK_RETRIES`` times when its
    worker dies; ``run`` pickled into it) and wait for them all (``pack``, ``pack-text``): every
    0.5 s, ``tick(a, b)`` gets the sums of the tasks' ``advance(a, b)`` since the last (it moves
    ``bar``, and returns its rate, which ``bar`` shows with the streams done); the results in
    ``jobs`` order.

    Raises:
        the first task's error as raised there (:func:`_translate`: ``{name} stream N``);
        ShardstreamError: a task's worker died on every try, or no task advanced its first
            count (nor finished) for ``stall_timeout_s`` (``{stalled} packed nothing for ...``).
            The tasks left are cancelled.
    """
    ray = _ray()
    counter = ray.remote(num_cpus=0)(_Counter).remote()
    task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=False)(_stream_task)
    refs = [task.options(name=f"shardstream-{name}-stream-{job.stream}").remote(job, counter, run) for job in jobs]
    stream_of = {ref: job.stream for ref, job in zip(refs, jobs)}
    moved_at, pending = time.monotonic(), list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - translated for the user
                    raise _translate(exc, f"{name} stream {stream_of[ref]}") from None
            moved, other = ray.get(counter.take.remote(), timeout=60)
            if moved or ready:
                moved_at = time.monotonic()
            elif time.monotonic() - moved_at > stall_timeout_s:
                raise ShardstreamError(
                    f"{stalled} packed nothing for {stall_timeout_s:.0f} s ({len(pending)} streams unfinished); "
                    "look at the cluster (`ray status`), then run the same command again to resume"
                )
            rate = tick(moved, other)
            bar.set_postfix_str(f"{rate}, {len(refs) - len(pending)}/{len(refs)} streams")
        return ray.get(refs)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


def _map_batch(fn: Callable[[T], R], batch: list[T]) -> list[R]:
    return [fn(item) for item in batch]


def map_on_ray(
    fn: Callable[[T], R], items: Iterable[T], *, batch_size: int, max_in_flight: int, what: str
) -> Iterator[tuple[T, R]]:
    """``(item, fn(item))`` for every item, computed in Ray tasks of ``batch_size`` items (at
    most ``max_in_flight`` tasks submitted at once), yielded as tasks finish.

    Raises:
        the first failing task's error (see :func:`run_streams_on_ray`).
    """
    ray = _ray()
    task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=False)(_map_batch)
    batches = iter(_batched(items, batch_size))
    running: dict[Any, list[T]] = {}
    try:
        while True:
            while len(running) < max_in_flight:
                batch = next(batches, None)
                if batch is None:
                    break
                running[task.remote(fn, batch)] = batch
            if not running:
                return
            ready, _ = ray.wait(list(running), num_returns=1, timeout=STALL_TIMEOUT_S)
            if not ready:
                raise ShardstreamError(f"{what}: no Ray task finished for {STALL_TIMEOUT_S:.0f} s")
            batch = running.pop(ready[0])
            try:
                results = ray.get(ready[0])
            except Exception as exc:  # noqa: BLE001 - translated for the user
                raise _translate(exc, what) from None
            yield from zip(batch, results)
    finally:
        for ref in running:
            ray.cancel(ref, force=True)


def _batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
