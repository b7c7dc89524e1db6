"""Writing from code: shardstream's ShardWriter against webdataset's ShardWriter, Mosaic's
MDSWriter and LitData's optimize, in one run; pack_samples over 1 and 2 processes; and
pack_samples' memory over a huge iterator of inputs (issue 26, point 4). About 6 minutes on
2 cores.

1. Writers. The samples are the small-JPEG corpus of bench/corpus.py (``--num-samples``,
   default 50,000, JPEGs of ~17 KB cut from real photos, and a class label each; the first N
   of the smallest cached corpus that has N) or ``--dir``'s ``<key>.jpg`` (+ ``<key>.cls``)
   files. They are read once into a pickle in the scratch directory; every run is a fresh
   subprocess that loads them into memory as bytes, imports its system, and only then starts
   the clock: what is timed is writing all samples into a fresh directory beside the pickle
   (same file system), in shards of ``--shard-mib`` (64) MiB, until the writer returns:
     - shardstream ``ShardWriter(dest, max_shard_bytes=...)`` fed ``{"__key__", "jpg": bytes,
       "cls": int}``; ``close()`` included (sample tables, records and ``index.bin``);
     - webdataset ``ShardWriter(pattern, maxsize=..., maxcount=10**9)``, the same dicts (its
       default encoder writes the int as text, as ours does);
     - Mosaic ``MDSWriter(columns={"jpg": "bytes", "cls": "int"}, size_limit=...,
       compression=None)`` fed ``{"jpg", "cls"}`` (MDS stores no key);
     - LitData ``optimize(fn, range(N), chunk_bytes=..., num_workers=1, start_method="fork")``,
       ``fn(i)`` returning sample ``i`` as ``{"jpg", "cls"}``. One process is one worker for
       LitData: optimize always runs fn, serialisation and chunk writing in worker processes
       it starts, here one, forked so that it shares the samples in memory (LitData's default,
       spawn, would need them sent to it); its time includes starting that worker.
   Each run follows a ``sync`` (not timed); no system fsyncs, so all write into the page
   cache. Runs are repeated ``--repeat`` times, the systems interleaved (in a rotating order),
   after one warm-up run that is not counted (without it, the first run after the samples'
   pickle was written took 3.1-3.7 s against 2.1-2.8 s for the same writer later); best and
   median seconds are shown, the ratios come from the best runs.
   Targets: ShardWriter >= 2x webdataset's ShardWriter; >= the faster of MDSWriter and
   LitData's optimize.

2. pack_samples over processes: ``pack_samples(thumbnail, paths, workers=1)`` against
   ``workers=2`` on the same ``--fn-inputs`` (10,000) JPEG paths of the corpus, each call in a
   fresh subprocess, timed from the call to its return (spawning and stopping the workers
   included). ``thumbnail`` reads the JPEG and its ``.cls``, decodes the JPEG in full, resizes
   it to 224 x 224 (bilinear) and encodes it again at JPEG quality 90 (~14 KB): about 1.1 ms a
   sample on these cores, so writing in the calling process (~1/20 of that) is small beside
   fn. Also shown: fn alone in one process; the CPU seconds of the calling process and of
   the workers (waited for: spawning and imports included); the time of a workers=1 call
   outside fn, per input (encoding, writing, index); the start-up of 2 workers (a
   pack_samples(workers=2) call of 32 inputs); and whether the outputs of workers=1 and
   workers=2 are byte-identical (sha1 of every file but those under ``.shardstream/``).
   Target: workers=2 >= 1.7x workers=1 on 2 cores.

3. Memory: pack_samples over a generator of ``--memory-inputs`` (2,000,000) inputs, a tiny
   fn (a sample of 100 bytes), workers=2, in a subprocess that samples the summed RSS of its
   process tree every 0.1 s; the peak once the generator has given 10% of its inputs, at 50%
   and at the end are printed (about 45 s here; ``--memory`` runs this part alone). Target:
   flat, the end peak within 20% or 50 MB (whichever is larger) of the peak at 10%.

Usage:
    python bench/write.py [--num-samples 50000] [--dir DIR] [--shard-mib 64] [--repeat 3]
                          [--fn-inputs 10000] [--parts writers,pack,memory] [--memory]
                          [--memory-inputs 2000000] [--systems NAME,...] [--profile]

``--profile`` runs shardstream's ShardWriter once more under cProfile (in this process) and
prints where its time goes, per sample. Every target is printed as PASS or FAIL; the exit
status is 0 unless a run crashed.

Dependencies: ``pip install -e '.[bench]'``, then the two peers without their dependencies:

    pip install --no-deps mosaicml-streaming==0.13.0 litdata==0.2.76

(bench/stream.py's docstring says why ``--no-deps``; Mosaic is imported with its
``streaming.vision`` stubbed, as there.) Where the ``bench`` extra would move installed
packages (its ``transformers<5`` downgrades a test set-up's transformers 5), install only
what the peers import: ``brotli catalogue python-snappy zstd obstore`` and ``boto3`` at the
installed botocore's version. A peer that cannot be imported is left out and said so.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import io
import json
import os
import pickle
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from corpus import CACHE, small_corpus
from pack import tree_rss_bytes
from stream import PEER_INSTALL, RESULT_TAG, corpus_samples, import_mosaic, peer_problems, read_member

SYSTEMS = {  # name -> label
    "shardstream": "shardstream ShardWriter",
    "webdataset": "webdataset ShardWriter",
    "mosaic": "Mosaic MDSWriter",
    "litdata": "LitData optimize (1 worker)",
}
PARTS = ("writers", "pack", "memory")
THUMB_PX = 224
STARTUP_INPUTS = 32
TINY_PAYLOAD = bytes(range(100))

# ---------------------------------------------------------------- the samples


def corpus_root(args: argparse.Namespace) -> Path:
    """``--dir``, else the smallest cached small-JPEG corpus with ``--num-samples`` (made if none)."""
    if args.dir:
        return Path(args.dir).resolve()
    sizes = sorted(int(p.name.split("-")[1]) for p in CACHE.glob("small-*-0") if (p / ".complete").exists())
    size = next((s for s in sizes if s >= args.num_samples), None)
    return CACHE / f"small-{size}-0" if size else small_corpus(args.num_samples)


def select_samples(args: argparse.Namespace, root: Path) -> list[tuple[str, dict[str, str]]]:
    """The first ``--num-samples`` samples: by number in the generated corpus (image ``i`` is
    the same whatever the corpus size; classes alternate), in path order in ``--dir``."""
    _, samples, _ = corpus_samples("dir", argparse.Namespace(dir=str(root)))
    if not args.dir:
        samples = sorted(
            (s for s in samples if int(s[0].rsplit("/", 1)[-1]) < args.num_samples),
            key=lambda s: int(s[0].rsplit("/", 1)[-1]),
        )
    return samples[: args.num_samples]


def sample_dict(root: Path, key: str, members: dict[str, str]) -> dict[str, Any]:
    """``{"__key__": key, "jpg": bytes, "cls": int, ...}``: a label as an int, the rest as bytes."""
    values = read_member(str(root), members)
    return {"__key__": key, **{ext: int(v) if ext == "cls" else v for ext, v in values.items()}}


def payload_bytes(sample: dict[str, Any]) -> int:
    """Member bytes of a sample as ours and webdataset's write it (an int as decimal text)."""
    return sum(len(v) if isinstance(v, bytes) else len(str(v)) for k, v in sample.items() if k != "__key__")


# ---------------------------------------------------------------- the writers (in subprocesses)

_SAMPLES: list[dict[str, Any]] = []  # the peers' samples, set before timing; LitData's forked worker reads them


def write_shardstream(samples: list[dict[str, Any]], out: Path, shard_bytes: int) -> None:
    from shardstream import ShardWriter

    with ShardWriter(out, max_shard_bytes=shard_bytes) as writer:
        for sample in samples:
            writer.write(sample)


def write_webdataset(samples: list[dict[str, Any]], out: Path, shard_bytes: int) -> None:
    import webdataset as wds

    with wds.ShardWriter(str(out / "wds-%06d.tar"), maxsize=shard_bytes, maxcount=10**9, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)


def write_mosaic(samples: list[dict[str, Any]], out: Path, shard_bytes: int) -> None:
    columns = {ext: "int" if ext == "cls" else "bytes" for ext in samples[0]}
    with import_mosaic().MDSWriter(out=str(out), columns=columns, size_limit=shard_bytes, compression=None) as sink:
        for sample in samples:
            sink.write(sample)


def litdata_sample(index: int) -> dict[str, Any]:
    """LitData ``optimize`` fn: sample ``index`` of the samples in memory."""
    return _SAMPLES[index]


def write_litdata(samples: list[dict[str, Any]], out: Path, shard_bytes: int) -> None:
    from litdata import optimize

    optimize(
        fn=litdata_sample,
        inputs=list(range(len(samples))),
        output_dir=str(out),
        chunk_bytes=shard_bytes,
        num_workers=1,
        start_method="fork",
        verbose=False,
    )


WRITERS: dict[str, Callable[[list[dict[str, Any]], Path, int], None]] = {
    "shardstream": write_shardstream,
    "webdataset": write_webdataset,
    "mosaic": write_mosaic,
    "litdata": write_litdata,
}
IMPORTS: dict[str, Callable[[], Any]] = {
    "shardstream": lambda: __import__("shardstream"),
    "webdataset": lambda: __import__("webdataset"),
    "mosaic": import_mosaic,
    "litdata": lambda: __import__("litdata"),
}


def load_samples(setup: dict[str, Any], system: str) -> list[dict[str, Any]]:
    """The samples as ``system`` takes them (the peers without a key), outside the GC's sight."""
    with open(setup["blob"], "rb") as f:
        samples: list[dict[str, Any]] = pickle.load(f)
    if system in ("mosaic", "litdata"):
        samples = [{k: v for k, v in s.items() if k != "__key__"} for s in samples]
    gc.collect()
    gc.freeze()  # the harness's 50,000 dicts are not the writers' garbage to walk
    return samples


def output_stats(out: Path) -> dict[str, Any]:
    files = [p for p in out.rglob("*") if p.is_file()]
    return {"files": len(files), "written": sum(p.stat().st_size for p in files)}


def digests(out: Path) -> dict[str, str]:
    """sha1 of every file under ``out`` but those under ``.shardstream/``."""
    return {
        p.relative_to(out).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.relative_to(out).parts[0] != ".shardstream"
    }


def run_writer(system: str, setup: dict[str, Any]) -> dict[str, Any]:
    samples = load_samples(setup, system)
    _SAMPLES[:] = samples
    IMPORTS[system]()
    out = Path(setup["out"])
    started = time.perf_counter()
    WRITERS[system](samples, out, setup["shard_bytes"])
    seconds = time.perf_counter() - started
    return {"seconds": seconds, **output_stats(out)}


# ---------------------------------------------------------------- pack_samples (in subprocesses)


_FN_SECONDS = [0.0]  # time spent in thumbnail by this process


def thumbnail(path: str) -> dict[str, Any]:
    """pack_samples fn: a JPEG file -> its full decode resized to 224 x 224, JPEG quality 90,
    and its ``.cls`` label (~1.1 ms here)."""
    from PIL import Image

    started = time.perf_counter()
    jpg = Path(path)
    with Image.open(io.BytesIO(jpg.read_bytes())) as image:
        small = image.convert("RGB").resize((THUMB_PX, THUMB_PX), Image.Resampling.BILINEAR)
    encoded = io.BytesIO()
    small.save(encoded, format="JPEG", quality=90)
    sample: dict[str, Any] = {"__key__": f"{jpg.parent.name}/{jpg.stem}", "jpg": encoded.getvalue()}
    try:
        sample["cls"] = int(jpg.with_suffix(".cls").read_bytes())
    except FileNotFoundError:
        pass
    _FN_SECONDS[0] += time.perf_counter() - started
    return sample


def tiny_sample(index: int) -> dict[str, Any]:
    """pack_samples fn of the memory run: a sample of 100 bytes."""
    return {"__key__": f"{index:010d}", "bin": TINY_PAYLOAD}


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of its children waited for."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def run_pack(workers: int, setup: dict[str, Any], inputs: list[str]) -> dict[str, Any]:
    from shardstream import pack_samples

    out = Path(setup["out"])
    cpu_before = cpu_seconds()
    started = time.perf_counter()
    report = pack_samples(thumbnail, inputs, out, workers=workers, max_shard_bytes=setup["shard_bytes"], progress=False)
    seconds = time.perf_counter() - started
    cpu_main, cpu_workers = (after - before for after, before in zip(cpu_seconds(), cpu_before))
    return {
        "seconds": seconds,
        "fn_seconds": _FN_SECONDS[0],  # in this process: all of fn's time with workers=1
        "cpu_main": cpu_main,
        "cpu_workers": cpu_workers,
        "samples": report.num_samples,
        "payload": report.payload_bytes,
        "sha1": digests(out),
    }


def run_fn_alone(inputs: list[str]) -> dict[str, Any]:
    thumbnail(inputs[0])  # Pillow's plugins load on first use
    cpu_before = cpu_seconds()[0]
    started = time.perf_counter()
    out_bytes = sum(len(thumbnail(path)["jpg"]) for path in inputs)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "cpu_main": cpu_seconds()[0] - cpu_before, "cpu_workers": 0.0, "out_bytes": out_bytes}


def run_memory(setup: dict[str, Any]) -> dict[str, Any]:
    from shardstream import pack_samples

    total = setup["memory_inputs"]
    peaks = {"now": 0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peaks["now"] = max(peaks["now"], tree_rss_bytes(os.getpid())[0])
            stop.wait(0.1)

    def inputs() -> Any:
        for i in range(total):
            for share in (10, 50):
                if i == total * share // 100:
                    peaks[f"at{share}"] = peaks["now"]
                    peaks[f"at{share}_s"] = time.perf_counter() - started
            yield i

    watcher = threading.Thread(target=watch, daemon=True)
    started = time.perf_counter()
    watcher.start()
    report = pack_samples(tiny_sample, inputs(), setup["out"], workers=2, progress=False)
    seconds = time.perf_counter() - started
    stop.set()
    watcher.join()
    return {"seconds": seconds, "samples": report.num_samples, **peaks}


def child_main(what: str, setup_path: str) -> None:
    """Subprocess mode: one run; its measurements as one JSON line."""
    setup = json.loads(Path(setup_path).read_text())
    if what in WRITERS:
        result = run_writer(what, setup)
    elif what == "memory":
        result = run_memory(setup)
    else:
        inputs = setup["inputs"]
        if what == "fn-alone":
            result = run_fn_alone(inputs)
        elif what == "startup":
            result = run_pack(2, setup, inputs[:STARTUP_INPUTS])
        else:
            result = run_pack(int(what.removeprefix("pack-w")), setup, inputs)
    print(RESULT_TAG + json.dumps(result), flush=True)


# ---------------------------------------------------------------- the parent


class Runs:
    """Fresh-subprocess runs, each writing into its own new directory under ``scratch``."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.failed: list[str] = []
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def run(self, what: str, setup: dict[str, Any], label: str) -> dict[str, Any] | None:
        out = self.scratch / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()  # webdataset's writer needs it there
        subprocess.run(["sync"], check=True)  # the previous run's writeback must not slow this one
        path = self.scratch / "setup.json"
        path.write_text(json.dumps({**setup, "out": str(out)}))
        print(f"  {label} ...", end=" ", flush=True)
        done = subprocess.run(
            [sys.executable, __file__, "--_run", what, "--_setup", str(path)],
            env=self.env,
            capture_output=True,
            text=True,
        )
        shutil.rmtree(out, ignore_errors=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_TAG)]
        if done.returncode != 0 or not lines:
            self.failed.append(label)
            print(f"FAILED ({done.returncode}):\n{(done.stderr or done.stdout)[-3000:]}", flush=True)
            return None
        result = json.loads(lines[-1][len(RESULT_TAG) :])
        print(f"{result['seconds']:.2f} s", flush=True)
        return result


def verdict(value: float, target: float) -> str:
    return f"target >= {target:.2f}  {'PASS' if value >= target else 'FAIL'}"


def seconds_of(runs: list[dict[str, Any]]) -> tuple[float, float]:
    """(best, median) seconds."""
    times = [r["seconds"] for r in runs]
    return min(times), statistics.median(times)


def writers_part(args: argparse.Namespace, runs: Runs, root: Path) -> None:
    samples = select_samples(args, root)
    print(f"\nwriters: reading {len(samples)} samples from {root} into memory ...", flush=True)
    loaded = [sample_dict(root, key, members) for key, members in samples]
    payload = sum(map(payload_bytes, loaded))
    blob = runs.scratch / "samples.pickle"
    with open(blob, "wb") as f:
        pickle.dump(loaded, f, protocol=pickle.HIGHEST_PROTOCOL)
    del loaded
    problems = peer_problems(False)
    wanted = args.systems.split(",") if args.systems else list(SYSTEMS)
    systems = [s for s in SYSTEMS if s in wanted and s not in problems]
    for system, why in problems.items():
        if system in wanted:
            print(f"left out: {system}: {why}")
    setup = {"blob": str(blob), "shard_bytes": args.shard_mib << 20}
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    if systems:  # the first run after the pickle is written is slower (module doc)
        runs.run(systems[-1], setup, f"warm-up, not counted: {SYSTEMS[systems[-1]]}")
    for repeat in range(args.repeat):
        print(f"run {repeat + 1}/{args.repeat}:", flush=True)
        for system in systems[repeat % len(systems) :] + systems[: repeat % len(systems)]:
            result = runs.run(system, setup, SYSTEMS[system])
            if result is not None:
                results[system].append(result)
    blob.unlink()

    n = len(samples)
    print(
        f"\nwriters: {n} samples, {payload / 1e6:.0f} MB of payload ({payload / n / 1e3:.1f} KB a sample), "
        f"shards of {args.shard_mib} MiB, to {runs.scratch} (local disk, page cache); "
        f"best and median of {args.repeat} runs, each in a fresh process, timed after imports"
    )
    print(
        f"{'system':30s} {'best s':>7s} {'median s':>8s} {'samples/s':>10s} {'MB/s':>6s} {'written':>8s} {'files':>6s}"
    )
    best: dict[str, float] = {}
    for system, done in results.items():
        if not done:
            print(f"{SYSTEMS[system]:30s} failed")
            continue
        best[system], median = seconds_of(done)
        print(
            f"{SYSTEMS[system]:30s} {best[system]:7.2f} {median:8.2f} {n / best[system]:10.0f} "
            f"{payload / 1e6 / best[system]:6.0f} {done[0]['written'] / 1e6:6.0f}MB {done[0]['files']:6d}"
        )
    if "litdata" in best:
        print("(LitData: optimize(num_workers=1) runs fn, serialisation and writing in 1 worker process it forks)")
    print("\ntargets:")
    ours = best.get("shardstream")
    rows: list[tuple[str, str | None, float]] = [
        ("webdataset ShardWriter", "webdataset" if "webdataset" in best else None, 2.0)
    ]
    peers = [s for s in ("mosaic", "litdata") if s in best]
    fastest = min(peers, key=best.__getitem__) if peers else None
    rows.append((f"fastest of MDSWriter, LitData ({fastest or 'none ran'})", fastest, 1.0))
    for label, peer, target in rows:
        if ours is None or peer is None:
            print(f"  shardstream / {label:45s}   n/a")
            continue
        medians = seconds_of(results[peer])[1] / seconds_of(results["shardstream"])[1]
        ratio = best[peer] / ours
        print(f"  shardstream / {label:45s} {ratio:5.2f}x (medians {medians:.2f}x)  {verdict(ratio, target)}")


def pack_part(args: argparse.Namespace, runs: Runs, root: Path) -> None:
    samples = select_samples(argparse.Namespace(**{**vars(args), "num_samples": args.fn_inputs}), root)
    inputs = [str(root / members["jpg"]) for _, members in samples]
    print(f"\npack_samples: {len(inputs)} JPEG paths of {root}; warming the page cache ...", flush=True)
    for path in inputs:
        Path(path).read_bytes()
    setup = {"inputs": inputs, "shard_bytes": args.shard_mib << 20}
    plan = {
        "fn-alone": "fn alone, one process",
        "pack-w1": "pack_samples workers=1",
        "pack-w2": "pack_samples workers=2",
        "startup": f"pack_samples workers=2, {STARTUP_INPUTS} inputs",
    }
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in plan}
    for repeat in range(args.repeat):
        print(f"run {repeat + 1}/{args.repeat}:", flush=True)
        for what, label in plan.items():
            result = runs.run(what, setup, label)
            if result is not None:
                results[what].append(result)

    n = len(inputs)
    print(
        f"\npack_samples: {n} inputs; fn = read a JPEG + .cls, full decode, resize to {THUMB_PX} x {THUMB_PX}, "
        f"JPEG q90; shards of {args.shard_mib} MiB; best and median of {args.repeat} runs, each in a fresh process"
    )
    print(f"{'run':38s} {'best s':>7s} {'median s':>8s} {'inputs/s':>9s} {'CPU s: main':>11s} {'workers':>7s}")
    best: dict[str, float] = {}
    for what, label in plan.items():
        if not results[what]:
            print(f"{label:38s} failed")
            continue
        best[what], median = seconds_of(results[what])
        count = STARTUP_INPUTS if what == "startup" else n
        fastest = min(results[what], key=lambda r: r["seconds"])
        print(
            f"{label:38s} {best[what]:7.2f} {median:8.2f} {count / best[what]:9.0f} "
            f"{fastest['cpu_main']:11.2f} {fastest['cpu_workers']:7.2f}"
        )
    if "fn-alone" in best:
        out_bytes = results["fn-alone"][0]["out_bytes"]
        print(f"fn alone: {best['fn-alone'] / n * 1e3:.2f} ms an input, {out_bytes / n / 1e3:.1f} KB out")
    if results["pack-w1"]:
        outside = min(r["seconds"] - r["fn_seconds"] for r in results["pack-w1"]) / n
        print(f"pack_samples workers=1 outside fn (encoding, writing, index): {outside * 1e6:.0f} us an input")
    if "startup" in best:
        print(
            f"start-up and stop of 2 spawned workers: at most {best['startup']:.2f} s (the {STARTUP_INPUTS}-input call)"
        )
    if results["pack-w1"] and results["pack-w2"]:
        one, two = results["pack-w1"][0]["sha1"], results["pack-w2"][0]["sha1"]
        differ = sorted(k for k in one.keys() | two.keys() if one.get(k) != two.get(k))
        same = "byte-identical" if not differ else f"DIFFER in {len(differ)} files: {', '.join(differ[:5])}"
        print(f"outputs of workers=1 and workers=2 (first runs, {len(one)} files but .shardstream/): {same}")
    print("\ntargets:")
    if "pack-w1" in best and "pack-w2" in best:
        ratio = best["pack-w1"] / best["pack-w2"]
        medians = seconds_of(results["pack-w1"])[1] / seconds_of(results["pack-w2"])[1]
        print(f"  pack_samples workers=2 / workers=1 {ratio:5.2f}x (medians {medians:.2f}x)  {verdict(ratio, 1.7)}")
    else:
        print("  pack_samples workers=2 / workers=1   n/a")


def memory_part(args: argparse.Namespace, runs: Runs) -> None:
    print(f"\nmemory: pack_samples over a generator of {args.memory_inputs} inputs, 100-byte samples, workers=2:")
    result = runs.run("memory", {"memory_inputs": args.memory_inputs}, "pack_samples")
    if result is None:
        return
    at10, at50, end = result["at10"], result["at50"], result["now"]
    print(
        f"peak RSS of the process tree (summed): {at10 / 1e6:.0f} MB at 10% ({result['at10_s']:.0f} s), "
        f"{at50 / 1e6:.0f} MB at 50% ({result['at50_s']:.0f} s), {end / 1e6:.0f} MB at the end "
        f"({result['seconds']:.0f} s, {result['samples'] / result['seconds']:.0f} inputs/s)"
    )
    limit = max(at10 * 1.2, at10 + 50e6)
    print("\ntargets:")
    flat = f"{end / 1e6:.0f} MB <= {limit / 1e6:.0f} MB: {'PASS' if end <= limit else 'FAIL'}"
    print(f"  end peak / peak at 10% {end / at10:5.2f}x  target: within 20% or 50 MB, {flat}")


def profile_ours(args: argparse.Namespace, root: Path, scratch: Path) -> None:
    """Our ShardWriter under cProfile, in this process: the functions by own time, per sample."""
    import cProfile
    import pstats

    samples = [sample_dict(root, key, members) for key, members in select_samples(args, root)]
    gc.collect()
    gc.freeze()
    IMPORTS["shardstream"]()
    out = scratch / "profile"
    subprocess.run(["sync"], check=True)
    profiler = cProfile.Profile()
    profiler.enable()
    write_shardstream(samples, out, args.shard_mib << 20)
    profiler.disable()
    shutil.rmtree(out, ignore_errors=True)
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    n = len(samples)
    per_sample = total / n * 1e6
    print(f"\nprofile: ShardWriter, {n} samples: {total:.2f} s under cProfile, {per_sample:.1f} us a sample")
    print(f"{'own us/sample':>13s} {'cum us/sample':>13s} {'calls/sample':>12s}  function")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:25]  # type: ignore[attr-defined]
    for (file, line, name), (_, calls, own, cumulative, _) in rows:
        where = f"{Path(file).name}:{line}" if line else file
        print(f"{own / n * 1e6:13.2f} {cumulative / n * 1e6:13.2f} {calls / n:12.2f}  {name} ({where})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-samples", type=int, default=50_000, help="samples the writers write")
    parser.add_argument("--dir", help="a directory of <key>.jpg (+ <key>.cls) files instead of the corpus")
    parser.add_argument("--shard-mib", type=int, default=64, help="shard / chunk size of every system")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement")
    parser.add_argument("--fn-inputs", type=int, default=10_000, help="inputs of the pack_samples runs")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    parser.add_argument("--systems", help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    parser.add_argument("--memory", action="store_true", help="only the memory run: --parts memory")
    parser.add_argument("--memory-inputs", type=int, default=2_000_000, help="inputs of the memory run")
    parser.add_argument("--profile", action="store_true", help="profile shardstream's ShardWriter at the end")
    parser.add_argument("--_run", help=argparse.SUPPRESS)
    parser.add_argument("--_setup", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._run:
        child_main(args._run, args._setup)
        return

    parts = ["memory"] if args.memory else args.parts.split(",")
    root = corpus_root(args) if {"writers", "pack"} & set(parts) or args.profile else Path()
    print(f"{os.cpu_count()} cores; peers: {PEER_INSTALL}", flush=True)
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-write-") as scratch:
        runs = Runs(Path(scratch))
        if "writers" in parts:
            writers_part(args, runs, root)
        if "pack" in parts:
            pack_part(args, runs, root)
        if "memory" in parts:
            memory_part(args, runs)
        if args.profile:
            profile_ours(args, root, Path(scratch))
    print(f"\ncommand: {shlex.join(['python', *sys.argv])}")
    if runs.failed:
        print(f"failed runs: {', '.join(runs.failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
