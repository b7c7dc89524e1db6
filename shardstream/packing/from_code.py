"""``pack_samples(fn, inputs, dest)``: a dataset made by a function over inputs, in parallel
processes, deterministic whatever their number, resumable after a crash, split across machines.

How it runs: this process walks ``inputs`` lazily (this part's share: input ``k`` goes to
part ``k mod N``) and hands runs of them (tasks of one input at first, then as many as
``fn`` gets through in about 50 ms, or ``inputs_per_task``) to ``workers`` spawned
processes, at most ``4 x workers`` tasks ahead. Each worker calls ``fn`` and encodes the
samples (:mod:`.encode`); this process takes the results back in input order and writes
them through one journaled stream per part (:mod:`.journal`), so the shards do not depend on
the number of workers. Each record after a published shard says how many of the part's
inputs were done and how many samples of the next one were written; a rerun skips those
inputs without calling ``fn`` and calls it again on the one in progress, dropping the
samples already written.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import multiprocessing
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

from tqdm import tqdm

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import DestinationError, SampleFnError, ShardstreamError
from ..storage import Store
from .destination import (
    DEFAULT_MAX_SHARD_BYTES,
    PackReport,
    check_options,
    merge_when_done,
    open_destination,
    prepare_state,
)
from .encode import JPEG_QUALITY, encode_sample
from .journal import STATE_DIR, JournaledWriter, PackSpec, read_stream_state, remove_stream_partials
from .labels import write_classes
from .parts import Part, part_from_env
from .sources import Problem, ProblemKind
from .stream import OnError
from .workers import die_with_parent

__all__ = ["pack_samples"]

EncodedSample = tuple[str, list[tuple[str, bytes]]]
# Per input: its samples, or the error (its type, message and the end of its traceback).
InputResult = list[EncodedSample] | tuple[str, str]

_MAX_REPR = 300
_TASK_S = 0.05  # automatic task size: inputs that take fn about this long
_MAX_TASK_INPUTS = 1024


def pack_samples(
    fn: Callable[[Any], Any],
    inputs: Iterable[Any],
    dest: str | os.PathLike[str],
    *,
    workers: int | None = 1,
    part: Part | None = None,
    name: str = "data",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    max_samples_per_shard: int | None = None,
    on_error: OnError | str = OnError.FAIL,
    overwrite: bool = False,
    clobber: bool = False,
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    fetch: FetchConfig | None = None,
    progress: bool = True,
    inputs_per_task: int | None = None,
    jpeg_quality: int = JPEG_QUALITY,
    classes: Sequence[str] | None = None,
) -> PackReport:
    """Call ``fn(input)`` for each of ``inputs`` and pack the samples it returns into tar
    shards and an index at ``dest`` (a dataset like ``pack``'s: module doc of
    :mod:`shardstream.packing.from_code`).

    ``fn`` returns a sample (a dict, as :meth:`shardstream.ShardWriter.write` takes), a list
    or a generator of samples (all of one input's samples are held in memory together), or
    None for none. It must be deterministic, and ``inputs`` must give the same inputs in the
    same order on every run: then the shards are byte-identical whatever ``workers``, and a
    run killed at any point (SIGKILL of a worker or of the whole job) and run again with the
    same arguments finishes the dataset it would have made, reusing the published shards.

    Args:
        fn: the function; with ``workers > 1`` it is pickled to spawned processes, so it must
            be a module-level function (or a picklable callable) and the calling script
            needs the ``if __name__ == "__main__":`` guard.
        inputs: anything iterable (a list, a range, a generator, a Hugging Face dataset).
            Read lazily, a task at a time: a billion inputs from an iterator take no memory,
            and only each task's inputs are pickled to a worker.
        dest: a local directory (created if needed) or a writable store URL (``s3://``,
            ``gs://``, ``az://``).
        workers: processes calling ``fn`` (None: the CPU count; 1: this process calls it).
            Any number gives the same dataset, and a rerun may use another.
        part: pack only part ``I`` of ``N`` (input ``k`` when ``k mod N = I``); another
            machine packs the others and the last to finish writes the index. Default from
            ``RANK`` / ``WORLD_SIZE`` or a job array's variables, else the whole input.
        name, max_shard_bytes, max_samples_per_shard: as for ``pack``.
        on_error: ``"raise"`` (or ``"fail"``, its older word): an input on which ``fn`` raises
            (or gives a sample that cannot be written) stops the pack with
            :class:`SampleFnError` naming it; fix it and run again to resume. ``"skip"``: it is skipped and listed in
            ``dest/pack-report.jsonl`` (``path`` holds the input's repr, ``reason`` the error).
        overwrite: replace what ``dest`` holds: only what its index and pack state record.
        clobber: write over files at ``dest`` with the names this pack writes (shards and
            tables, ``index.bin``, ``keys/``, the report, ``.shardstream/``) that no index or
            pack state there records; without it such a ``dest`` is refused, naming them.
        s3, fetch: endpoint, credentials and multipart settings for ``s3://``.
        requests: timeouts, attempts and connections of the store's requests
            (:class:`~shardstream.config.RequestConfig`; None: its defaults).
        progress: a tqdm bar on stderr: inputs/s, samples/s and MB/s.
        inputs_per_task: inputs sent to a worker at a time; None: one at first, then as
            many as ``fn`` gets through in about 50 ms (so a few slow inputs, such as
            Parquet row groups, spread over the workers, and fast ones go in batches).
        jpeg_quality: quality of PIL images saved as JPEG.
        classes: the class names, in class-index order, recorded in the index
            (``ShardDataset(dest).classes``, ``shardstream info``, without per-class counts);
            ``fn``'s samples then hold their class index as ``cls``.

    Returns:
        A :class:`PackReport` (``num_files`` counts inputs).

    Raises:
        SampleFnError: ``fn`` failed on an input, with ``on_error="raise"``.
        TypeError: ``fn`` cannot be pickled for ``workers > 1``.
        DestinationError: ``dest`` holds a dataset or an unfinished pack made with other
            options (or another ``fn``), or ``inputs`` end before the position an
            interrupted run recorded, or ``fn`` gives other samples than it did then.
        SourceError: no input gave a sample.
        ShardstreamError: a worker died (run the same call again to resume).
        StorageError: the store failed.
    """
    started = time.perf_counter()
    on_error = OnError(on_error)
    part = part or part_from_env() or Part(0, 1)
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"{workers=} must be >= 1")
    if inputs_per_task is not None and inputs_per_task < 1:
        raise ValueError(f"{inputs_per_task=} must be >= 1")
    if overwrite and part.count > 1:
        raise ValueError("overwrite=True with several parts would let one part wipe another's; empty DEST first")
    check_options(name, max_shard_bytes, max_samples_per_shard)
    fn_bytes = _pickled(fn) if workers > 1 else b""
    store = open_destination(dest, s3=s3, fetch=fetch, requests=requests)
    spec = PackSpec.of_code(
        f"pack_samples:{_qualified_name(fn)}",
        name=name,
        max_shard_bytes=max_shard_bytes,
        max_samples_per_shard=max_samples_per_shard,
        num_parts=part.count,
    )
    fix = "call pack_samples again with the same fn and options to finish it, pass overwrite=True to replace it"
    claim = prepare_state(
        store, spec, overwrite=overwrite, clobber=clobber, fix=fix, clobber_option="clobber=True", what="pack_samples"
    )
    if claim.complete:
        return PackReport.nothing_to_do(store, started=started, unit="inputs")
    if classes is not None:
        names = [str(c) for c in classes]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"classes must be distinct names; got {names[:5]}")
        write_classes(store, names, None)
    report = _Report()
    state = read_stream_state(store, spec, part.index)
    if state.done is None:
        remove_stream_partials(store, spec, part.index)
        report.resumed = state.num_shards > 0
        journal = JournaledWriter(store, spec, part.index, state)
        mine = itertools.islice(iter(inputs), part.index, None, part.count)
        if state.consumed and next(itertools.islice(mine, state.consumed - 1, None), _END) is _END:
            raise DestinationError(
                f"{store.url_of(STATE_DIR)}: the inputs end before input {state.consumed} of part "
                f"{part.index}, where the interrupted pack stopped; give the same inputs, or pass overwrite=True"
            )
        results = (
            _inline(fn, mine, jpeg_quality)
            if workers == 1
            else _in_processes(fn_bytes, mine, workers, inputs_per_task, jpeg_quality)
        )
        try:
            with journal:
                _write(results, journal, state.within, on_error, report, progress, store.url)
                journal.finish()
        finally:
            results.close()  # stops the workers now, not when the generator is collected
        report.num_shards = journal.num_shards
    else:
        report.resumed = True
    totals = merge_when_done(store, spec, empty=f"{store.url}: no input gave a sample (fn returned None for all?)")
    return report.finish(store, totals, started, claim.kept)


_END = object()


class _Report:
    """What this run did, gathered for a :class:`PackReport`."""

    def __init__(self) -> None:
        self.num_inputs = self.num_samples = self.num_shards = self.payload_bytes = 0
        self.resumed = False
        self.problems: list[Problem] = []

    def finish(
        self, store: Store, totals: dict[str, int] | None, started: float, kept: tuple[str, ...] = ()
    ) -> PackReport:
        return PackReport.of(
            store,
            totals,
            started=started,
            num_files=self.num_inputs,
            num_samples=self.num_samples,
            num_shards=self.num_shards,
            payload_bytes=self.payload_bytes,
            resumed=self.resumed,
            problems=tuple(self.problems),
            unit="inputs",
            kept=kept,
        )


def _write(
    results: Iterator[tuple[Any, InputResult]],
    journal: JournaledWriter,
    drop_first: int,
    on_error: OnError,
    report: _Report,
    progress: bool,
    url: str,
) -> None:
    """Write each input's samples in order, the first ``drop_first`` of the first input's
    excepted (written before an interruption); problems per ``on_error``."""
    bar = tqdm(unit=" inputs", desc="pack_samples", disable=not progress, file=sys.stderr, mininterval=0.5)
    shown_at = time.monotonic()
    try:
        for item, result in results:
            report.num_inputs += 1
            bar.update(1)
            if drop_first and isinstance(result, list):  # the input in progress when interrupted
                _check_resumed(result, drop_first, journal.last_key, url)
                result = result[drop_first:]
            drop_first = 0
            problem = _problem_of(item, result, journal.last_key)
            if problem is not None:
                if on_error is OnError.FAIL:
                    first, _, trace = problem.reason.partition("\n")
                    raise SampleFnError(
                        f"{first}; fix fn or the input and run the same call again to resume, "
                        f"or pass on_error='skip' to pack the rest and report it\n{trace}".rstrip()
                    )
                journal.pending.append(problem)
                report.problems.append(problem)
                samples: list[EncodedSample] = []
            else:
                assert isinstance(result, list)  # internal: _problem_of took the errors
                samples = result
            for key, members in samples:
                journal.write_sample(key, members)
                report.num_samples += 1
                report.payload_bytes += sum(len(payload) for _, payload in members)
            journal.input_done()
            if progress and time.monotonic() - shown_at > 0.5:
                shown_at = time.monotonic()
                seconds = max(bar.format_dict["elapsed"], 1e-9)
                bar.set_postfix_str(
                    f"{report.num_samples / seconds:.0f} samples/s, {report.payload_bytes / 1e6 / seconds:.1f} MB/s",
                    refresh=False,
                )
    finally:
        bar.close()


def _problem_of(item: Any, result: InputResult, last_key: str | None) -> Problem | None:
    """Why an input's result cannot be written (naming the input), or None."""
    if isinstance(result, tuple):
        error, trace = result
        shown = _short_repr(item)
        return Problem(shown, ProblemKind.FN_ERROR, f"input {shown}: {error}\n{trace}".rstrip())
    previous = last_key
    for key, _ in result:
        if key == previous:
            shown = _short_repr(item)
            return Problem(
                shown,
                ProblemKind.FN_ERROR,
                f"input {shown}: sample key {key!r} repeats the key of the sample before it (readers would "
                "join the two); give every sample its own key",
            )
        previous = key
    return None


def _check_resumed(samples: list[EncodedSample], written: int, last_key: str | None, url: str) -> None:
    if len(samples) < written or samples[written - 1][0] != last_key:
        found = f"{len(samples)} samples" if len(samples) < written else f"key {samples[written - 1][0]!r}"
        raise DestinationError(
            f"{url}: fn gives other samples than before the interruption (sample {written} of the input "
            f"in progress was {last_key!r}, now {found}); fn must be deterministic: restore it, or pass overwrite=True"
        )


# ------------------------------------------------------------------------------------- running fn


def _run_one(fn: Callable[[Any], Any], item: Any, jpeg_quality: int) -> InputResult:
    """``fn(item)``, encoded; any error (fn's or a bad sample's) as an error result."""
    try:
        out = fn(item)
        if out is None:
            return []
        if isinstance(out, Mapping):
            return [encode_sample(out, jpeg_quality=jpeg_quality)]
        if isinstance(out, (str, bytes)) or not isinstance(out, Iterable):
            raise TypeError(
                f"fn returned a {type(out).__name__}; return a sample dict, a list or generator of them, or None"
            )
        return [encode_sample(sample, jpeg_quality=jpeg_quality) for sample in out]
    except Exception as exc:  # noqa: BLE001 - reported per on_error, naming the input
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3))
        return (f"{type(exc).__name__}: {exc}", trace.strip())


def _inline(fn: Callable[[Any], Any], inputs: Iterator[Any], jpeg_quality: int) -> Generator[tuple[Any, InputResult]]:
    for item in inputs:
        yield item, _run_one(fn, item, jpeg_quality)


_worker_fn: Callable[[Any], Any] | None = None
_worker_quality = JPEG_QUALITY


def _init_worker(fn_bytes: bytes, jpeg_quality: int) -> None:
    global _worker_fn, _worker_quality
    die_with_parent()
    _worker_fn, _worker_quality = pickle.loads(fn_bytes), jpeg_quality


def _run_task(items: list[Any]) -> tuple[list[InputResult], float]:
    """The results of a task, and the seconds it took."""
    assert _worker_fn is not None  # internal: set by _init_worker
    started = time.perf_counter()
    return [_run_one(_worker_fn, item, _worker_quality) for item in items], time.perf_counter() - started


def _in_processes(
    fn_bytes: bytes, inputs: Iterator[Any], workers: int, inputs_per_task: int | None, jpeg_quality: int
) -> Generator[tuple[Any, InputResult]]:
    """The results of ``fn`` over ``inputs`` in their order, from ``workers`` spawned
    processes, with at most ``4 x workers`` tasks under way, each of ``inputs_per_task``
    inputs (None: sized to take about ``_TASK_S``)."""
    pool = concurrent.futures.ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(fn_bytes, jpeg_quality),
    )
    ahead: collections.deque[tuple[list[Any], concurrent.futures.Future[Any]]] = collections.deque()
    clean = False
    size = inputs_per_task or 1
    per_input_s: float | None = None  # fn's seconds per input, averaged over recent tasks

    def take() -> Iterator[tuple[Any, InputResult]]:
        nonlocal size, per_input_s
        task, future = ahead.popleft()
        results, seconds = future.result()
        if inputs_per_task is None:
            measured = seconds / len(task)
            per_input_s = measured if per_input_s is None else 0.8 * per_input_s + 0.2 * measured
            size = max(1, min(_MAX_TASK_INPUTS, round(_TASK_S / max(per_input_s, 1e-7))))
        return zip(task, results)

    try:
        while task := list(itertools.islice(inputs, size)):
            ahead.append((task, pool.submit(_run_task, task)))
            while len(ahead) >= 4 * workers:
                yield from take()
        while ahead:
            yield from take()
        clean = True
    except concurrent.futures.process.BrokenProcessPool as exc:
        raise ShardstreamError(
            f"a pack_samples worker died ({exc}); run the same call again to resume after the last published shard"
        ) from exc
    finally:
        for _, future in ahead:
            future.cancel()
        if not clean:  # stop now: a worker may be deep in a long fn call
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
        pool.shutdown(wait=True, cancel_futures=True)


def _pickled(fn: Callable[[Any], Any]) -> bytes:
    try:
        return pickle.dumps(fn)
    except Exception as exc:
        raise TypeError(
            f"fn {fn!r} cannot be pickled to worker processes ({exc}); with workers > 1 pass a "
            "module-level function (not a lambda or a nested function), or use workers=1"
        ) from exc


def _qualified_name(fn: Callable[[Any], Any]) -> str:
    """fn's name without its module (a script's fn is ``__main__.fn`` run as a script, and
    ``script.fn`` when imported: both are the same pack)."""
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _short_repr(item: Any) -> str:
    try:
        text = repr(item)
    except Exception as exc:  # noqa: BLE001 - a repr that fails must not hide the error
        text = f"<{type(item).__name__} whose repr failed: {exc!r}>"
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."
