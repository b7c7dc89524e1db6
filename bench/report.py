"""The streaming benchmark's results: :class:`Result` keeps each reader's best runs,
:func:`print_targets` judges them against the targets (docs/benchmarks.md), and :func:`print_table`
shows them. Used by bench/stream.py's parent process."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stream import Reader


@dataclass
class Result:
    """One reader's best runs; ``error`` says why it has none."""

    reader: Reader
    corpus: str = "photos"
    samples: int = 0
    bytes: int = 0
    seconds: float = math.inf
    first_s: float | None = None
    capped: bool = False
    vm_hwm: int = 0
    tree_peak: int = 0
    damaged: int = 0  # most damaged samples seen in one run
    server_cpu_s: float = 0.0  # the S3 server's CPU seconds during the best run (imports and set-up included)
    # The reader's own CPU seconds (user + system, its DataLoader workers too) after its first
    # sample (a limit: first bytes), and the samples and bytes it read after it, in the run
    # with the least of them a byte (a sample): like the first sample, at its best on its own,
    # not the fastest run's, whose CPU moves as much as another run's on these shared cores.
    cpu_s: float = 0.0
    steady_samples: int = 0
    steady_bytes: int = 0
    startup_cpu_s: float | None = None  # its CPU seconds up to its first sample, the least of the runs
    error: str = ""  # why the last failed run failed
    runs: int = 0
    failures: int = 0
    # each round's (--repeat's) steady CPU s/GB, by round: the readers of a round run one after
    # another, so a ratio within a round sees the same state of the machine
    round_cpu_s_per_gb: dict[int, float] = dataclasses.field(default_factory=dict)

    def add(self, run: dict[str, Any]) -> None:
        """Keep the best of the runs: throughput, steady CPU and first sample each at their best,
        memory at its worst."""
        self.runs += 1
        if self.runs == 1 or run["seconds"] / max(run["samples"], 1) < self.seconds / max(self.samples, 1):
            self.samples, self.bytes, self.seconds, self.capped = (
                run["samples"],
                run["bytes"],
                run["seconds"],
                run["capped"],
            )
            self.server_cpu_s = run.get("server_cpu_s", 0.0)
        if self.runs == 1 or _cpu_per_unit(run) < _cpu_per_unit(vars(self)):
            self.cpu_s, self.steady_samples, self.steady_bytes = (
                run["cpu_s"],
                run["steady_samples"],
                run["steady_bytes"],
            )
        if run["first_s"] is not None and (self.first_s is None or run["first_s"] < self.first_s):
            self.first_s = run["first_s"]
        if self.startup_cpu_s is None or run["startup_cpu_s"] < self.startup_cpu_s:
            self.startup_cpu_s = run["startup_cpu_s"]
        self.vm_hwm, self.tree_peak = max(self.vm_hwm, run["vm_hwm"]), max(self.tree_peak, run["tree_peak"])
        self.damaged = max(self.damaged, run["damaged"])

    def samples_per_s(self, num_samples: int) -> float:
        """Samples/s; for the limits (which read bytes, not samples), the whole dataset's samples."""
        return (self.samples or num_samples) / self.seconds if self.runs else 0.0

    def cpu_s_per_gb(self, num_samples: int, payload_bytes: int) -> float:
        """The reader's steady CPU seconds per GB it read after its first sample (the MB/s
        column's bytes; readers that count no bytes: their samples at the corpus's mean
        payload); NaN if it read nothing after it."""
        return run_cpu_s_per_gb(vars(self), num_samples, payload_bytes)

    def cpu_s_per_1k(self) -> float:
        """The reader's steady CPU seconds per 1,000 samples read after its first; NaN for
        readers of bytes (the limits)."""
        return self.cpu_s / self.steady_samples * 1000 if self.steady_samples else math.nan

    def mb_per_s(self, num_samples: int, payload_bytes: int) -> float:
        if self.bytes:
            return self.bytes / self.seconds / 1e6
        return self.samples_per_s(num_samples) * payload_bytes / num_samples / 1e6


def run_cpu_s_per_gb(run: dict[str, Any], num_samples: int, payload_bytes: int) -> float:
    """One run's steady CPU seconds per GB (:meth:`Result.cpu_s_per_gb`; ``run`` holds
    ``cpu_s``, ``steady_bytes`` and ``steady_samples``)."""
    steady = run["steady_bytes"] or run["steady_samples"] * payload_bytes / max(num_samples, 1)
    return run["cpu_s"] / (steady / 1e9) if steady else math.nan


def _cpu_per_unit(run: dict[str, Any]) -> float:
    """A run's steady CPU seconds per byte read after its first sample (per sample where it
    counts no bytes); infinite where it read nothing after it."""
    steady = run["steady_bytes"] or run["steady_samples"]
    return run["cpu_s"] / steady if steady else math.inf


def print_targets(results: dict[str, Result], sizes: dict[str, tuple[int, int]]) -> None:
    """Each target as met / NOT met, or n/a with the readers it lacks (readers are named
    ``corpus:reader``)."""
    from shardstream import FetchConfig

    measured = {n: r for n, r in results.items() if r.runs}
    rate = {n: r.samples_per_s(sizes[r.corpus][0]) for n, r in measured.items()}
    main = "dir" if "dir" in sizes else "photos"

    def best_peer(group: str, source: str) -> str:
        peers = [
            n
            for n, r in measured.items()
            if r.reader.system not in ("shardstream", "limit")
            and (r.corpus, r.reader.group, r.reader.source) == (main, group, source)
        ]
        return max(peers, key=rate.__getitem__, default=f"{main}:any {group}-{source} peer")

    def ratio(a: str, b: str) -> Callable[[], float]:
        return lambda: rate[a] / rate[b]

    def best_limit(corpus: str) -> str:
        """The fastest of the plain-GET sweep (8x16, 16x8, 32x4 MiB in flight; 8x16 with reads
        growing to 2 MiB) on ``corpus``."""
        sweep = [n for n in measured if n.startswith(f"{corpus}:s3-limit")]
        return max(sweep, key=rate.__getitem__, default=f"{corpus}:s3-limit")

    def cpu_per_gb(name: str) -> float:
        corpus_name = measured[name].corpus
        return measured[name].cpu_s_per_gb(*sizes[corpus_name])

    def cpu_ratio(a: str, b: str) -> Callable[[], float]:
        return lambda: cpu_per_gb(a) / cpu_per_gb(b)

    def round_cpu_ratio(a: str, b: str) -> Callable[[], float]:
        """The median over the rounds both ran in of ``a``'s steady CPU per GB over ``b``'s."""

        def median() -> float:
            ra, rb = measured[a].round_cpu_s_per_gb, measured[b].round_cpu_s_per_gb
            both = ra.keys() & rb.keys()
            return statistics.median(ra[k] / rb[k] for k in both) if both else math.nan

        return median

    m = f"{main}:"
    limit_main, limit_small = best_limit(main), best_limit("small")
    s3_peer, decode_peer = best_peer("raw", "s3"), best_peer("decode", "s3")
    budget = FetchConfig().max_buffer_bytes
    rss_of = (m + "s3-shardstream", m + "local-shardstream")
    rows: list[tuple[str, tuple[str, ...], Callable[[], float | None], float, bool, str]] = [
        (
            f"S3 raw: shardstream / S3 limit ({limit_main}, best of the sweep)",
            (m + "s3-shardstream", limit_main),
            ratio(m + "s3-shardstream", limit_main),
            0.9,
            True,
            "x",
        ),
        (
            f"S3 raw: shardstream / best peer ({s3_peer})",
            (m + "s3-shardstream", s3_peer),
            ratio(m + "s3-shardstream", s3_peer),
            2.0,
            True,
            "x",
        ),
        (
            f"local raw, {main}: shardstream / webdataset",
            (m + "local-shardstream", m + "local-wds"),
            ratio(m + "local-shardstream", m + "local-wds"),
            4.0,
            True,
            "x",
        ),
        (
            f"local raw, {main}: shardstream / cat",
            (m + "local-shardstream", m + "local-cat"),
            ratio(m + "local-shardstream", m + "local-cat"),
            0.3,
            True,
            "x",
        ),
        (
            "local raw, small: shardstream / webdataset",
            ("small:local-shardstream", "small:local-wds"),
            ratio("small:local-shardstream", "small:local-wds"),
            12.0,
            True,
            "x",
        ),
        (
            "local raw, tiny: shardstream samples/s",
            ("tiny:local-shardstream",),
            lambda: rate["tiny:local-shardstream"],
            100_000,
            True,
            "/s",
        ),
        (
            "local raw, tiny: shardstream / webdataset (no target)",
            ("tiny:local-shardstream", "tiny:local-wds"),
            ratio("tiny:local-shardstream", "tiny:local-wds"),
            0.0,
            True,
            "x",
        ),
        (
            "small, DataLoader: batch_size=64 / batch_size=None (no target)",
            ("small:loader-batched", "small:loader-unbatched"),
            ratio("small:loader-batched", "small:loader-unbatched"),
            0.0,
            True,
            "x",
        ),
        (
            f"S3 raw, small (18 KB samples): shardstream / S3 limit ({limit_small}), same objects",
            ("small:s3-shardstream", limit_small),
            ratio("small:s3-shardstream", limit_small),
            0.9,
            True,
            "x",
        ),
        *(
            row
            for corpus, limit in {"small": limit_small, main: limit_main}.items()  # each corpus once
            for row in (
                (
                    f"S3 raw, {corpus}: shardstream's steady CPU s/GB / the keep floor's (s3-keep)",
                    (f"{corpus}:s3-shardstream", f"{corpus}:s3-keep"),
                    cpu_ratio(f"{corpus}:s3-shardstream", f"{corpus}:s3-keep"),
                    1.15,
                    False,
                    "x",
                ),
                (
                    f"S3 raw, {corpus}: the same, the median of the rounds' ratios (no target)",
                    (f"{corpus}:s3-shardstream", f"{corpus}:s3-keep"),
                    round_cpu_ratio(f"{corpus}:s3-shardstream", f"{corpus}:s3-keep"),
                    0.0,
                    False,
                    "x",
                ),
                (
                    f"S3 raw, {corpus}: shardstream's steady CPU s/GB / the limit's ({limit}) (no target)",
                    (f"{corpus}:s3-shardstream", limit),
                    cpu_ratio(f"{corpus}:s3-shardstream", limit),
                    0.0,
                    False,
                    "x",
                ),
            )
        ),
        *(
            (
                f"S3 raw, {corpus}: shardstream's CPU s/GB, socket reads to 2 MiB / of 256 KiB (no target)",
                (f"{corpus}:s3-shardstream", f"{corpus}:s3-shardstream-256k"),
                cpu_ratio(f"{corpus}:s3-shardstream", f"{corpus}:s3-shardstream-256k"),
                0.0,
                True,
                "x",
            )
            for corpus in dict.fromkeys(("small", main))
        ),
        (
            "S3 raw, small: threaded readinto, payloads copied: CPU s/GB / the limit's (no target)",
            ("small:s3-threads-keep", limit_small),
            lambda: cpu_per_gb("small:s3-threads-keep") / cpu_per_gb(limit_small),
            0.0,
            True,
            "x",
        ),
        (
            "S3 raw, small: payload MB/s / the limit's MB/s of tar bytes (no target)",
            ("small:s3-shardstream", limit_small),
            lambda: (
                measured["small:s3-shardstream"].mb_per_s(*sizes["small"])
                / measured[limit_small].mb_per_s(*sizes["small"])
            ),
            0.0,
            True,
            "x",
        ),
        (
            "first sample from S3, small",
            ("small:s3-shardstream",),
            lambda: measured["small:s3-shardstream"].first_s,
            0.25,
            False,
            " s",
        ),
        (
            "small, 2 workers: ByteCollate / default, once running (no target)",
            ("small:loader-bytes-epochs", "small:loader-batched-epochs"),
            ratio("small:loader-bytes-epochs", "small:loader-batched-epochs"),
            0.0,
            True,
            "x",
        ),
        (
            "small, 2 workers: the same from construction (no target)",
            ("small:loader-bytes", "small:loader-batched"),
            ratio("small:loader-bytes", "small:loader-batched"),
            0.0,
            True,
            "x",
        ),
        (
            "first sample from S3",
            (m + "s3-shardstream",),
            lambda: measured[m + "s3-shardstream"].first_s,
            0.5,
            False,
            " s",
        ),
        (
            "first sample from local disk",
            (m + "local-shardstream",),
            lambda: measured[m + "local-shardstream"].first_s,
            0.1,
            False,
            " s",
        ),
        (
            f"decode: shardstream / best peer ({decode_peer})",
            (m + "decode-shardstream", decode_peer),
            ratio(m + "decode-shardstream", decode_peer),
            1.5,
            True,
            "x",
        ),
        (
            "decode: loader overhead vs in-memory",
            (m + "decode-shardstream", m + "decode-memory"),
            lambda: 1 - rate[m + "decode-shardstream"] / rate[m + "decode-memory"],
            0.15,
            False,
            "%",
        ),
        (
            "decode: of which the DataLoader alone (no target)",
            (m + "decode-memory-loader", m + "decode-memory"),
            lambda: 1 - rate[m + "decode-memory-loader"] / rate[m + "decode-memory"],
            1.0,
            False,
            "%",
        ),
        (
            "decode: shardstream + S3 server vs DataLoader from memory (no target)",
            (m + "decode-shardstream", m + "decode-memory-loader"),
            lambda: 1 - rate[m + "decode-shardstream"] / rate[m + "decode-memory-loader"],
            1.0,
            False,
            "%",
        ),
        (
            "decode: draft mode / full-size decode, in memory (no target)",
            (m + "decode-memory", m + "decode-memory-full"),
            ratio(m + "decode-memory", m + "decode-memory-full"),
            0.0,
            True,
            "x",
        ),
        (
            f"peak RSS of a shardstream reader (max_buffer_bytes {budget / 1e6:.0f} MB + 300)",
            rss_of,
            lambda: max(measured[n].vm_hwm for n in rss_of) / 1e6,
            budget / 1e6 + 300,
            False,
            " MB",
        ),
    ]
    print("\ntargets:")

    def show(value: float, unit: str) -> str:
        if unit == "/s":
            return f"{value:,.0f}/s"
        return f"{value:.1%}" if unit == "%" else f"{value:.0f} MB" if unit == " MB" else f"{value:.2f}{unit}"

    for label, needs, compute, target, at_least, unit in rows:
        missing = [f"{n} {'failed' if n in results else 'not run'}" for n in needs if n not in measured]
        value = None if missing else compute()
        if value is None:
            outcome = f"n/a ({', '.join(missing) or 'no sample read'})"
        elif "(no target)" in label:
            print(f"  {label:66s} {show(value, unit):>9s}")
            continue
        else:
            outcome = "met" if (value >= target if at_least else value <= target) else "NOT met"
        print(
            f"  {label:66s} {'-' if value is None else show(value, unit):>9s}  target "
            f"{'>=' if at_least else '<='} {show(target, unit):9s} {outcome}"
        )


def print_table(results: dict[str, Result], sizes: dict[str, tuple[int, int]]) -> None:
    for corpus, (num_samples, payload_bytes) in sizes.items():
        print(
            f"\n{corpus}: {num_samples} samples, {payload_bytes / 1e6:.0f} MB of payload "
            f"({payload_bytes / max(num_samples, 1) / 1e3:.1f} KB a sample)"
        )
        print(
            "first: first sample (limits: first bytes) from construction (limits: client creation); "
            "start CPU: CPU s from the process's start to it;\n"
            "CPU s/GB, CPU s/1k: steady CPU s after it, per GB read and per 1,000 samples after it"
        )
        print(
            f"{'group':6s} {'from':6s} {'reader':40s} {'samples/s':>10s} {'MB/s':>7s} {'first':>8s} "
            f"{'RSS main':>9s} {'RSS tree':>9s} {'S3 srv cores':>12s} {'start CPU':>9s} {'CPU s/GB':>8s} "
            f"{'CPU s/1k':>8s}"
        )
        for r in results.values():
            if r.corpus != corpus:
                continue
            head = f"{r.reader.group:6s} {r.reader.source:6s} {r.reader.label:40s}"
            if not r.runs:
                print(f"{head} failed: {r.error}")
                continue
            first = f"{r.first_s:7.3f}s" if r.first_s is not None else f"{'-':>8s}"
            srv = f"{r.server_cpu_s / r.seconds:.2f}" if r.reader.source == "s3" else "-"
            note = f"  (capped after {r.samples} samples)" if r.capped else ""
            note += f"  ({r.damaged} damaged JPEGs in a run)" if r.damaged else ""
            note += f"  ({r.failures} run(s) failed: {r.error})" if r.failures else ""
            gb, k = r.cpu_s_per_gb(num_samples, payload_bytes), r.cpu_s_per_1k()
            per_gb = f"{'-':>8s}" if math.isnan(gb) else f"{gb:8.2f}"
            per_k = f"{'-':>8s}" if math.isnan(k) else f"{k:8.3f}"
            startup = f"{r.startup_cpu_s:8.2f}s" if r.startup_cpu_s is not None else f"{'-':>9s}"
            print(
                f"{head} {r.samples_per_s(num_samples):10.0f} {r.mb_per_s(num_samples, payload_bytes):7.0f} {first} "
                f"{r.vm_hwm / 1e6:7.0f}MB {r.tree_peak / 1e6:7.0f}MB {srv:>12s} {startup} {per_gb} {per_k}{note}"
            )
