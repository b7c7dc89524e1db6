"""shardstream plan (issue 41): the model of a job's loading speed, egress, requests and cost,
on real small datasets (ShardWriter) and synthetic arrays; one test checks it against the
requests a real ShardDataset makes to an http server."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import re
import time

import numpy as np
import pytest

import shardstream
from shardstream import FetchConfig, ShardWriter, Source
from shardstream.cli import main
from shardstream.planner import gets, plan_counts, selftest_scale
from shardstream.storage.producer import part_ranges

SHARDS, PER_SHARD = 10, 10


def _write(dest, shards=SHARDS, per_shard=PER_SHARD, size=1000):
    with ShardWriter(dest, max_samples_per_shard=per_shard) as writer:
        for i in range(shards * per_shard):
            writer.write({"__key__": f"{i:06d}", "bin": bytes(size + i)})
    return shardstream.open_index(dest)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    dest = tmp_path_factory.mktemp("planner") / "ds"
    index = _write(dest)
    return str(dest), index


def test_without_a_cache_each_epoch_reads_every_shard_once(dataset):
    location, index = dataset
    total = int(index.manifest.shard_bytes.sum())
    job = shardstream.plan(location, workers=1, epochs=3)
    assert job.egress_bytes_per_epoch == [total] * 3  # no cut shard: each read whole
    assert job.cache_hit_rate == [0.0] * 3
    # cut shards (rank and worker boundaries) are read as byte ranges: their tar tails stay unread
    job = shardstream.plan(location, nodes=2, gpus_per_node=2, workers=2, batch_size=8, epochs=2)
    assert job.byte_ranges == "exact"
    for egress in job.egress_bytes_per_epoch:
        assert total - 8 * 10240 <= egress < total


def test_a_node_cache_serves_later_epochs_only_with_node_affinity(dataset):
    location, index = dataset
    total = int(index.manifest.shard_bytes.sum())
    common = dict(nodes=2, gpus_per_node=2, workers=2, batch_size=8, epochs=3, cache_bytes=total)
    affine = shardstream.plan(location, shard_affinity="node", **common)
    assert affine.egress_bytes_per_epoch[0] >= total  # every shard once, the one split at the node boundary twice
    assert affine.egress_bytes_per_epoch[1:] == [0, 0]
    assert affine.requests_per_epoch[1:] == [0, 0]  # tables come from the node cache too
    assert affine.cache_hit_rate[1:] == [1.0, 1.0]
    assert affine.min_cache_bytes_per_node < total
    plain = shardstream.plan(location, **common)
    assert plain.egress_bytes_per_epoch[1] > total / 4  # each epoch gives a node other shards
    assert plain.min_cache_bytes_per_node == total
    assert "whole dataset" in plain.min_cache_note
    # a cache of the node's share, no more, is enough under affinity
    fits = shardstream.plan(location, shard_affinity="node", **{**common, "cache_bytes": 2 * total // 3})
    assert affine.min_cache_bytes_per_node <= 2 * total // 3
    assert fits.egress_bytes_per_epoch[1:] == [0, 0]


def _parts(length, part, ramp):
    """Ranged GETs counted by hand: ramping from part/64 (at least 64 KiB, at most part), doubling up to part."""
    n, size, done = 0, (max(min(part, 64 << 10), part // 64) if ramp else part), 0
    while done < length:
        done += size
        n += 1
        size = min(2 * size, part)
    return n


def test_requests_follow_the_count_rule_on_a_case_counted_by_hand(dataset):
    location, index = dataset
    sizes = [int(x) for x in index.manifest.shard_bytes]
    # one rank, one worker, index order: one lane reads the 10 shards whole, one after another
    big = dict(workers=1, shuffle=False, epochs=2, fetch=FetchConfig(part_bytes=1 << 20))
    job = shardstream.plan(location, **big)
    assert job.requests_detail == [{"index": 1, "tables": 10, "data": 10}, {"index": 0, "tables": 10, "data": 10}]
    assert job.requests_per_epoch == [21, 20]
    # a persistent worker keeps its tables (an LRU of 64): the second epoch fetches shards only
    assert shardstream.plan(location, persistent_workers=True, **big).requests_per_epoch == [21, 10]
    # parts of 4 KiB: the lane's first shard ramps from 256 B, the others are cut in 4 KiB GETs
    small = shardstream.plan(location, workers=1, shuffle=False, epochs=1, fetch=FetchConfig(part_bytes=4096))
    by_hand = _parts(sizes[0], 4096, True) + sum(_parts(z, 4096, False) for z in sizes[1:])
    assert small.requests_detail[0] == {"index": 1, "tables": 10, "data": by_hand}
    # two ranks: each opens the index; the shard cut between them is a table GET on each side
    two = shardstream.plan(location, gpus_per_node=2, workers=1, shuffle=False, epochs=1, **{"fetch": big["fetch"]})
    assert two.requests_detail[0] == {"index": 2, "tables": 10, "data": 10}  # 100 samples: no shard is cut
    three = shardstream.plan(location, gpus_per_node=3, workers=1, shuffle=False, epochs=1, fetch=big["fetch"])
    # 34 samples each (the last rank padded with shard 0's first two): 4 + 4 + 5 runs, shards 3 and 6 cut
    assert three.requests_detail[0] == {"index": 3, "tables": 13, "data": 13}


def test_gets_cuts_ranges_as_the_producer_does():
    rng = np.random.default_rng(1)
    parts = rng.choice([1, 7, 4096, 1 << 20, 3_000_000, 16 << 20], 400)
    lengths = rng.integers(0, np.minimum(parts * 40, 50_000_000))  # up to 40 parts a read
    ramps = rng.random(400) < 0.5
    expected = [len(list(part_ranges(0, int(n), int(p), ramp=bool(r)))) for n, p, r in zip(lengths, parts, ramps)]
    assert gets(lengths, parts, ramps).tolist() == expected


def test_bound_by_moves_from_the_network_to_the_step():
    counts = np.full(1000, 1000, np.int64)
    nbytes = counts * 100_000
    common = dict(nodes=2, gpus_per_node=4, workers=4, batch_size=64, epochs=1, request_rate_limit=1e9)
    slow_link = plan_counts(counts, nbytes, bandwidth_per_node=1e8, step_time_s=0.01, **common)
    assert slow_link.bound_by == "network" and slow_link.input_bound
    assert slow_link.samples_per_s == pytest.approx(2 * 1e8 / 100_000, rel=0.01)
    slow_step = plan_counts(counts, nbytes, bandwidth_per_node=1e11, step_time_s=10.0, **common)
    assert slow_step.bound_by == "step" and not slow_step.input_bound
    assert slow_step.samples_per_s == pytest.approx(8 * 64 / 10.0, rel=0.01)
    few_gets = plan_counts(counts, nbytes, **{**common, "request_rate_limit": 10.0}, bandwidth_per_node=1e11)
    assert few_gets.bound_by == "requests"
    cpu = plan_counts(counts, nbytes, bandwidth_per_node=1e11, cpu_s_per_sample=0.1, **common)
    assert cpu.bound_by == "cpu"
    priced = plan_counts(counts, nbytes, price_per_gb=0.09, price_per_1000_gets=0.0004, **common)
    detail = priced.egress_detail[0]
    expected = sum(detail.values()) / 1e9 * 0.09 + priced.requests_per_epoch[0] / 1000 * 0.0004
    assert priced.cost_per_epoch == [pytest.approx(expected)]
    assert slow_link.cost_per_epoch is None


def test_the_json_holds_every_key(dataset):
    location, _ = dataset
    job = shardstream.plan(location, nodes=2, gpus_per_node=2, cache_bytes=10**6, price_per_gb=0.02)
    d = json.loads(json.dumps(job.to_dict()))
    for key in (
        "time_to_first_batch_s",
        "samples_per_s",
        "input_bound",
        "bound_by",
        "egress_bytes_per_epoch",
        "requests_per_epoch",
        "cache_hit_rate",
        "min_cache_bytes_per_node",
        "cost_per_epoch",
        "recommendations",
        "inputs",
        "timings",
        "assumptions",
    ):
        assert key in d, key
    assert d["bound_by"] in ("network", "requests", "cpu", "cache", "step")
    assert len(d["egress_bytes_per_epoch"]) == len(d["requests_per_epoch"]) == len(d["cache_hit_rate"]) == 2
    assert {r["setting"] for r in d["recommendations"]} >= {
        "workers",
        "FetchConfig.max_inflight_requests",
        "shard size (pack --shard-size)",
    }
    assert d["inputs"]["nodes"] == 2 and d["time_to_first_batch_s"] > 0
    assert d["timings"]["steps"] and len(d["timings"]["cache"]) == 2
    assert {a["name"] for a in d["assumptions"]} >= {"latency_ms", "bandwidth_per_node"}
    assert "samples/s" in str(job) and "recommendations:" in job.table()


def test_the_cli_prints_the_plan_as_json_and_draws_it(dataset, tmp_path):
    location, index = dataset
    out = io.StringIO()
    png = tmp_path / "plan.png"
    with contextlib.redirect_stdout(out):
        code = main(["plan", location, "--json", "--workers", "1", "--epochs", "3", "--cache-bytes", "1M"])
    assert code == 0
    d = json.loads(out.getvalue())
    assert d["egress_bytes_per_epoch"] == [int(index.manifest.shard_bytes.sum()), 0, 0]
    assert d["inputs"]["cache_bytes"] == 10**6
    with contextlib.redirect_stdout(io.StringIO()) as text:
        assert main(["plan", location, "--nodes", "2", "--bandwidth-per-node", "1.25G", "--plot", str(png)]) == 0
    assert "bound by" in text.getvalue()
    pytest.importorskip("matplotlib")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_are_named(dataset):
    location, _ = dataset
    for kwargs, name in (
        ({"nodes": 0}, "nodes"),
        ({"step_time_s": 1.0, "samples_per_s_per_gpu": 5.0}, "step_time_s"),
        ({"shard_affinity": "rack"}, "shard_affinity"),
        ({"cache_bytes": -1}, "cache_bytes"),
        ({"latency_ms": 0}, "latency_ms"),
    ):
        with pytest.raises(ValueError, match=name):
            shardstream.plan(location, **kwargs)
    with pytest.raises(ValueError, match="mixture"):
        shardstream.plan([Source(location, repeat=0.5), Source(location, name="b")], shard_affinity="node")
    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert main(["plan", location, "--workers", "-1"]) == 2
    assert "workers" in err.getvalue()


def test_a_mixture_reads_each_source_by_its_count(tmp_path, dataset):
    location, index = dataset
    other = _write(tmp_path / "other", shards=4, per_shard=5, size=3000)
    job = shardstream.plan(
        [Source(location, repeat=0.5, name="a"), Source(str(tmp_path / "other"), repeat=2.0, name="b")],
        workers=1,
        epochs=2,
    )
    assert job.samples_per_epoch == 50 + 40
    total_b = int(other.manifest.shard_bytes.sum())
    half_a = int(index.manifest.shard_bytes.sum()) / 2
    for egress in job.egress_bytes_per_epoch:
        assert egress == pytest.approx(half_a + 2 * total_b, rel=0.2)
    assert job.requests_detail[0]["index"] == 2  # one index.bin per source


def test_a_million_shards_plan_in_bounded_time():
    job, seconds = selftest_scale()  # 10^6 shards, 10^10 samples, 128 nodes x 8 GPUs x 8 workers
    assert seconds < 60, seconds
    assert job.dataset["num_shards"] == 1_000_000 and job.world_size == 1024
    assert job.samples_per_epoch == 1024 * -(-(10**10) // 1024)
    total = job.dataset["bytes"]
    pad = job.samples_per_epoch - 10**10  # padding repeats the first samples
    for egress in job.egress_bytes_per_epoch:
        assert total <= egress <= total + pad * 150_000
    detail = job.requests_detail[0]
    assert detail["index"] == 1024
    assert 1_000_000 <= detail["tables"] <= 1_000_000 + 2 * 1024 * 8
    assert job.bound_by in ("network", "requests")


@pytest.mark.slow
def test_the_counts_match_a_real_read_over_http(dataset, tmp_path):
    """The planned requests and bytes are those a ShardDataset with two DataLoader workers
    sends to an http server, epoch by epoch."""
    import shutil

    from servers.faultserver import FaultServer
    from torch.utils.data import DataLoader

    location, _ = dataset
    shutil.copytree(location, tmp_path / "www" / "ds")
    fetch = FetchConfig(part_bytes=4096)
    with FaultServer(tmp_path / "www") as server:
        url = f"{server.url}/ds"
        data = shardstream.ShardDataset(url, batch_size=8, fetch=fetch)
        loader = DataLoader(data, batch_size=8, num_workers=2)
        measured, seen = [], 0
        for epoch in range(2):
            data.set_epoch(epoch)
            assert sum(len(b["__key__"]) for b in loader) == SHARDS * PER_SHARD
            time.sleep(0.2)
            log = server.requests()
            kinds = collections.Counter(
                "index" if r["path"].endswith("index.bin") else "tables" if r["path"].endswith(".samples") else "data"
                for r in log[seen:]
            )
            shard_bytes = sum(r["body_bytes"] or 0 for r in log[seen:] if r["path"].endswith(".tar"))
            measured.append(({"index": kinds["index"], "tables": kinds["tables"], "data": kinds["data"]}, shard_bytes))
            seen = len(log)
        job = shardstream.plan(url, workers=2, batch_size=8, epochs=2, fetch=fetch)
        probed = shardstream.plan(url, probe=True, latency_ms=12.0)
    assert [(d, b) for d, b in zip(job.requests_detail, job.egress_bytes_per_epoch)] == measured
    assert job.dataset["store"] == "http"
    # probed over the same server: given figures win over probed ones
    assert probed.figures["latency_ms"] == {"value": 12.0, "source": "given"}
    assert probed.figures["bandwidth_per_stream"]["source"] == "probed"
    assert probed.figures["cpu_s_per_sample"]["source"] == "probed"
    assert probed.probe["latency_ms"] > 0 and probed.probe["samples_timed"] > 0


def test_probe_measures_the_local_store(dataset):
    location, _ = dataset
    job = shardstream.plan(location, probe=True)
    for name in ("latency_ms", "bandwidth_per_node", "bandwidth_per_stream", "cpu_s_per_sample"):
        assert job.figures[name]["source"] == "probed", name
        assert job.figures[name]["value"] > 0
    assert "latency_ms" not in {a["name"] for a in job.assumptions}
    with pytest.raises(ValueError, match="location"):
        plan_counts([10], [1000], probe=True)


_SCIENTIFIC = re.compile(r"\d[eE][+-]?\d")


def _figure_line(table: str, name: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(f"  {name} "))


def test_the_table_gives_every_figure_its_unit_and_no_scientific_notation(dataset):
    location, _ = dataset
    table = shardstream.plan(location, nodes=2, price_per_1000_gets=0.0004).table()
    assert not _SCIENTIFIC.search(table), table
    for name, shown in (
        ("bandwidth_per_node", "2.0 GB/s"),
        ("bandwidth_per_stream", "2.0 GB/s"),
        ("latency_ms", "100 us"),
        ("cpu_s_per_sample", "50 us"),
        ("worker_start_s", "50 ms"),
        ("client_s", "0 s"),
        ("request_rate_limit", "none (unlimited)"),
    ):
        assert re.search(rf"\s{re.escape(shown)}  \(assumed\)$", _figure_line(table, name)), (name, table)
    assert re.search(r" \d+ us  \(assumed\)$", _figure_line(table, "open_s"))
    assert "FetchConfig.max_buffer_bytes = 268.4 MB (268,435,456 bytes)" in table
    # given figures, large and small, and a tiny cost
    job = plan_counts(
        np.full(1000, 10**6),
        np.full(1000, 10**11),
        nodes=16,
        gpus_per_node=8,
        bandwidth_per_node=1.25e9,
        request_rate_limit=5500,
        cpu_s_per_sample=2e-7,
        latency_ms=30,
        price_per_1000_gets=1e-9,
    )
    table = job.table()
    assert not _SCIENTIFIC.search(table), table
    assert _figure_line(table, "bandwidth_per_node").endswith("1.25 GB/s  (given)")
    assert _figure_line(table, "request_rate_limit").endswith("5,500 GETs/s  (given)")
    assert _figure_line(table, "cpu_s_per_sample").endswith("200 ns  (given)")
    assert _figure_line(table, "latency_ms").endswith("30 ms  (given)")
    assert "1,000,000,000 samples/epoch" in table
    # --json keeps the numbers
    assert job.to_dict()["figures"]["bandwidth_per_node"] == {"value": 1.25e9, "source": "given"}
    assert job.to_dict()["figures"]["cpu_s_per_sample"]["value"] == 2e-7


def test_a_job_wider_than_its_data_is_warned_about(tmp_path):
    location = tmp_path / "small"
    _write(location, shards=5, per_shard=50)  # 250 samples
    for drop_last, per_rank, how in ((False, 4, "6 of them repeats"), (True, 3, "58 left out")):
        job = shardstream.plan(location, nodes=8, gpus_per_node=8, batch_size=256, drop_last=drop_last)
        assert len(job.warnings) == 2, job.warnings
        wide = "250 samples are fewer than one global batch (64 ranks x batch_size 256 = 16,384 samples)"
        assert wide in job.warnings[0]
        assert f"each rank gets {per_rank} samples an epoch (drop_last={drop_last}" in job.warnings[1]
        assert how in job.warnings[1] and f"one short batch of {per_rank} samples" in job.warnings[1]
        assert f"use batch_size <= {per_rank} or fewer ranks, or more data" in job.warnings[1]
        assert [f"warning: {w}" for w in job.warnings] == job.notes[:2]
        table = job.table()
        notes = table[table.index("notes:") :]
        assert all(w in notes for w in job.warnings)
        assert json.loads(job.to_json())["warnings"] == job.warnings
    # fewer samples than ranks with drop_last: every epoch empty, planned and said
    job = shardstream.plan(location, nodes=64, gpus_per_node=8, batch_size=4, drop_last=True)
    assert job.samples_per_epoch == 0
    assert "each rank gets no sample an epoch" in job.warnings[1] and "use at most 250 ranks" in job.warnings[1]
    # enough data for every rank's batch: no warning; one global batch short only by padding: the first alone
    assert shardstream.plan(location, nodes=2, batch_size=64).warnings == []
    (only,) = shardstream.plan(location, gpus_per_node=3, batch_size=84).warnings  # ceil(250 / 3) = 84
    assert "fewer than one global batch" in only


def test_the_plot_leaves_out_panels_with_nothing_to_show(dataset, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from shardstream.planner.chart import figure

    def curves(ax):  # lines of data (3 points or more here), not the axhline / axvline guides (2 points)
        return [line for line in ax.get_lines() if isinstance(line, Line2D) and len(line.get_xdata()) > 2]

    location, _ = dataset
    # one step per rank, one epoch, no cache: the egress bar alone, and a note for the step
    tiny = shardstream.plan(location, nodes=8, gpus_per_node=8, batch_size=256, epochs=1)
    assert len(tiny.timings["steps"]) == 1
    fig = figure(tiny)
    try:
        (ax,) = fig.axes
        assert "egress" in ax.get_title() and len(ax.patches) == 1
        assert not ax.get_lines()
        assert any("no step curve" in t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)
    # many steps, 3 epochs, a cache: the step curve, the egress bars and the cache hits
    full = shardstream.plan(location, batch_size=4, epochs=3, cache_bytes=10**6)
    fig = figure(full)
    try:
        steps, egress, hits = fig.axes
        assert len(curves(steps)) == 1 and len(curves(steps)[0].get_xdata()) == len(full.timings["steps"]) > 1
        assert len(egress.patches) == 3 and hits.get_ylabel() == "node cache hits (%)"
        assert len(curves(hits)) == 1
        assert not any("no step" in t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)
    # one epoch with a cache: its hit rate as a marker, no line
    fig = figure(shardstream.plan(location, batch_size=4, epochs=1, cache_bytes=10**6))
    try:
        _, _, hits = fig.axes
        (marker,) = hits.get_lines()
        assert marker.get_linestyle() == "None" and marker.get_marker() == "o"
    finally:
        plt.close(fig)
    for name in ("a.png", "b.png"):  # twice: the package's plot stays the function
        png = shardstream.planner.plot(tiny, str(tmp_path / name))
        assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
