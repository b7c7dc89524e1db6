"""S3 shards of a dataset with an index are read by slicing members at the offsets of each
shard's sample table (``data-NNNNNN.tar.samples``, fetched by its own GET beside the shard's
ranged GETs), against a real SeaweedFS server: every exactness and fault case on that path.

- Exactness: the samples are those tarfile reads from the same shard objects (in order without
  shuffle, the same multiset with it), also with ranged GET parts that cut headers and
  payloads, and each table is fetched once per shard read (the sliced path is the one used).
- What disagrees is named: a stale shard (another shard's bytes at the same size), a damaged
  header, a truncated object, a table that belongs to another shard (same counts: the header
  check; other counts: the table's own check); ``on_error="skip"`` keeps the count.
- Faults: a cut body (of a shard or of a table) is resumed and loses nothing; a shard
  overwritten between a cut and its resume is named.
- A missing table: whole shards are parsed instead; a byte range of that shard (a rank
  boundary, a resume) needs the table and says to re-run pack.
- DataLoader workers (forked, each fetching its tables) and a mid-epoch resume on S3.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import itertools
import os
import random
import tarfile

import pytest
from servers.faultproxy import FaultProxy
from torch.utils.data import DataLoader

from shardstream import FetchConfig, ShardDataset, open_index, pack
from shardstream.dataset import loader_state_dict
from shardstream.errors import CorruptShardError, IndexFormatError, ShardNotFoundError
from shardstream.storage import open_store

pytestmark = pytest.mark.timeout(120)

SIZES = [0, 1, 511, 512, 513, 3000, 70000]  # .jpg payloads: empty, one byte, around a block, spanning parts
NUM_SAMPLES = 56  # shards of 16, 16, 16 and 8 samples
NUM_SHARDS = 4
SMALL = FetchConfig(part_bytes=64 << 10, max_buffer_bytes=1 << 20)
TINY = FetchConfig(part_bytes=700, max_buffer_bytes=64 << 10, max_inflight_requests=4)  # parts cut headers
_copies = itertools.count()


def shard_name(i: int) -> str:
    return f"data-{i:06d}.tar"


def key(i: int) -> str:
    return f"d{i // 7}/{i:05d}"


@pytest.fixture(scope="module")
def packed(s3_server, tmp_path_factory) -> str:
    """The dataset, packed once to its own bucket: 56 samples of a .jpg (random bytes of the
    sizes above) and a .cls, in 4 shards."""
    src = tmp_path_factory.mktemp("sliced") / "src"
    rng = random.Random(11)
    for i in range(NUM_SAMPLES):
        path = src / f"{key(i)}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(SIZES[i % len(SIZES)]))
        (src / f"{key(i)}.cls").write_bytes(str(i % 5).encode())
    bucket = f"sliced-{os.getpid()}"
    s3_server.create_bucket(bucket)
    url = f"s3://{bucket}/packed"
    report = pack(src, url, max_samples_per_shard=16, s3=s3_server.info.s3_config(), progress=False)
    assert report.num_shards == NUM_SHARDS and report.num_samples == NUM_SAMPLES
    return url


@pytest.fixture
def copy(packed, s3_bucket, s3_config):
    """A fresh copy of the packed dataset in this test's own bucket (free to damage): its URL
    and its store."""
    source = open_store(packed, s3=s3_config)
    url = f"s3://{s3_bucket}/copy-{next(_copies)}"
    store = open_store(url, s3=s3_config)
    names = source.list_names()
    assert {shard_name(i) for i in range(NUM_SHARDS)} | {f"{shard_name(i)}.samples" for i in range(NUM_SHARDS)} <= set(
        names
    )
    for name in names:
        store.write_bytes(name, source.read_bytes(name))
    return url, store


def reference(url: str, s3) -> list[dict]:
    """Every sample of the dataset's shards, in order, as tarfile reads the objects' bytes
    (the key is the name up to its extension's dot)."""
    store = open_store(url, s3=s3)
    out: list[dict] = []
    for i in range(NUM_SHARDS):
        data = store.read_bytes(shard_name(i))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for info in tar:
                assert info.isreg()
                name, ext = info.name.rsplit(".", 1)
                if not out or out[-1]["__key__"] != name or out[-1]["__shard__"] != f"{url}/{shard_name(i)}":
                    out.append({"__key__": name, "__shard__": f"{url}/{shard_name(i)}"})
                out[-1][ext] = tar.extractfile(info).read()
    return out


def rows(samples) -> list[tuple]:
    """Samples as comparable tuples; every sample holds exactly its key, shard, .cls and .jpg."""
    out = []
    for s in samples:
        assert set(s) == {"__key__", "__shard__", "cls", "jpg"}, set(s)
        out.append((s["__key__"], s["__shard__"], bytes(s["cls"]), bytes(s["jpg"])))
    return out


def via(proxy: FaultProxy, s3_config):
    return dataclasses.replace(s3_config, endpoint_url=proxy.endpoint_url, read_timeout_s=5.0)


def recorder(log: list[tuple[str, str]], wanted=lambda method, path: False):
    """A FaultProxy ``match`` that records every request's (method, path) (the proxy asks it
    of each request) and lets faults fall on the ``wanted`` ones."""

    def match(method: str, path: str) -> bool:
        log.append((method, path))
        return wanted(method, path)

    return match


def table_gets(log: list[tuple[str, str]]) -> collections.Counter[str]:
    """GETs of each shard's table, by shard name."""
    return collections.Counter(
        path.rsplit("/", 1)[1].removesuffix(".samples")
        for method, path in log
        if method == "GET" and path.endswith(".tar.samples")
    )


def shard_gets(method: str, path: str) -> bool:
    return method == "GET" and path.endswith(".tar")


def table_gets_only(method: str, path: str) -> bool:
    return method == "GET" and path.endswith(".tar.samples")


# 1. Exactness


def test_the_reference_is_the_source_files(packed, s3_config):
    """The reference reader sees the 56 samples packed, in key order (so it is a fair judge)."""
    expected = reference(packed, s3_config)
    assert [s["__key__"] for s in expected] == [key(i) for i in range(NUM_SAMPLES)]
    assert [len(s["jpg"]) for s in expected] == [SIZES[i % len(SIZES)] for i in range(NUM_SAMPLES)]
    assert [s["cls"] for s in expected] == [str(i % 5).encode() for i in range(NUM_SAMPLES)]


@pytest.mark.parametrize("fetch", [None, SMALL, TINY], ids=["default", "64KiB-parts", "700B-parts"])
def test_sliced_samples_are_what_tarfile_reads(packed, s3_config, fetch):
    expected = rows(reference(packed, s3_config))
    in_order = ShardDataset(packed, s3=s3_config, shuffle=False, fetch=fetch)
    assert rows(in_order) == expected
    assert in_order.stats().samples == NUM_SAMPLES
    shuffled = rows(ShardDataset(packed, s3=s3_config, shuffle=True, seed=3, shuffle_buffer=20, fetch=fetch))
    assert shuffled != expected  # shuffled: not the index's order ...
    assert sorted(shuffled) == sorted(expected)  # ... but the same samples, each once


@pytest.mark.parametrize("shuffle", [False, True])
def test_each_shards_table_is_fetched_once_per_read(packed, s3_config, shuffle):
    """Through a proxy that only counts: every shard is read with its table (one GET of each
    ``.tar.samples`` per read, beside the shard's GETs), so the sliced path is the one used."""
    expected = rows(reference(packed, s3_config))
    log: list[tuple[str, str]] = []
    with FaultProxy(s3_config.endpoint_url, rates={}, match=recorder(log)) as proxy:
        dataset = ShardDataset(packed, s3=via(proxy, s3_config), shuffle=shuffle, seed=5, fetch=SMALL)
        got = rows(dataset)
        assert table_gets(log) == {shard_name(i): 1 for i in range(NUM_SHARDS)}
        shards = collections.Counter(path.rsplit("/", 1)[1] for method, path in log if shard_gets(method, path))
        assert set(shards) == {shard_name(i) for i in range(NUM_SHARDS)}
        log.clear()
        again = rows(dataset)  # the next epoch: tables are kept in memory, not fetched again
        assert table_gets(log) == {}
    assert sum(proxy.counts.values()) == 0 and proxy.requests > 0
    assert (got if not shuffle else sorted(got)) == expected
    assert sorted(again) == expected


# 2.-4. What disagrees with the index is named


def test_a_stale_shard_names_shard_member_and_byte(copy, s3_config):
    """Shard 1's object replaced by shard 2's bytes, cut or padded to shard 1's size (so its
    size still agrees with the index): its first header disagrees with shard 1's table."""
    url, store = copy
    expected = reference(url, s3_config)
    size = len(store.read_bytes(shard_name(1)))
    store.write_bytes(shard_name(1), store.read_bytes(shard_name(2))[:size].ljust(size, b"\0"))
    with pytest.raises(
        CorruptShardError,
        match=rf"^{url}/data-000001\.tar: the tar header at byte 0 gives member 'd4/00032\.cls' of 1 bytes, "
        r"but the index says 'd2/00016\.cls' of 1 bytes; the shard or its index is stale",
    ):
        list(ShardDataset(url, s3=s3_config, shuffle=False))
    samples = list(ShardDataset(url, s3=s3_config, shuffle=False, on_error="skip"))
    assert len(samples) == NUM_SAMPLES
    assert rows(samples[:16]) == rows(expected[:16])
    assert [s["__key__"] for s in samples[16:32]] == [key(15)] * 16  # the lost run: repeats of the last good one
    assert rows(samples[32:]) == rows(expected[32:])


def test_a_damaged_header_and_a_truncated_shard_are_named(copy, s3_config):
    url, store = copy
    table = open_index(url, s3=s3_config).table(1)
    whole = store.read_bytes(shard_name(1))
    data = bytearray(whole)
    header = int(table.offsets[5]) - 512  # sample d2/00018's .jpg
    data[header + 130] = ord("7") if data[header + 130] != ord("7") else ord("6")  # a size digit
    store.write_bytes(shard_name(1), bytes(data))
    with pytest.raises(
        CorruptShardError, match=rf"^{url}/data-000001\.tar: tar header checksum mismatch at byte {header}"
    ):
        list(ShardDataset(url, s3=s3_config, shuffle=False))
    with pytest.raises(
        CorruptShardError, match=rf"^{url}/data-000001\.tar: tar header checksum mismatch at byte {header}"
    ):
        list(ShardDataset(url, s3=s3_config, shuffle=False, fetch=TINY))  # the header split between parts
    samples = list(ShardDataset(url, s3=s3_config, shuffle=False, on_error="skip"))
    assert len(samples) == NUM_SAMPLES
    assert [s["__key__"] for s in samples[16:18]] == [key(16), key(17)]  # before the damaged member
    assert [s["__key__"] for s in samples[18:32]] == [key(17)] * 14
    assert [s["__key__"] for s in samples[32:]] == [key(i) for i in range(32, NUM_SAMPLES)]

    store.write_bytes(shard_name(1), whole[: len(whole) // 2])  # an interrupted upload
    with pytest.raises(
        CorruptShardError, match=rf"^{url}/data-000001\.tar: is {len(whole) // 2} bytes but the index says {len(whole)}"
    ):
        list(ShardDataset(url, s3=s3_config, shuffle=False))


def test_another_shards_table_with_the_same_counts_is_named(copy, s3_config):
    """Shard 1's table uploaded as shard 2's (both 16 samples of 2 members, so the table's own
    checks pass): the table names the shard it was written for, and that is refused, naming
    the table; were that name unreadable, shard 2's first header would still disagree."""
    url, store = copy
    store.write_bytes(f"{shard_name(2)}.samples", store.read_bytes(f"{shard_name(1)}.samples"))
    with pytest.raises(
        IndexFormatError,
        match=rf"^{url}/data-000002\.tar\.samples: is the sample table of shard 'data-000001\.tar', "
        r"not of 'data-000002\.tar'",
    ):
        list(ShardDataset(url, s3=s3_config, shuffle=False))


def test_another_shards_table_with_other_counts_is_refused(copy, s3_config):
    """Shard 3's table (8 samples) uploaded as shard 2's (16): the table's check against the
    manifest names the table."""
    url, store = copy
    store.write_bytes(f"{shard_name(2)}.samples", store.read_bytes(f"{shard_name(3)}.samples"))
    with pytest.raises(
        IndexFormatError,
        match=rf"^{url}/data-000002\.tar\.samples: 8 samples and 16 members, but the index says 16 and 32",
    ):
        list(ShardDataset(url, s3=s3_config, shuffle=False))


# 5.-6. Faults on the wire


@pytest.mark.parametrize(("what", "cut_after"), [("shards", 2000), ("tables", 200)])
def test_a_cut_body_is_resumed_and_loses_nothing(packed, s3_config, what, cut_after):
    expected = rows(reference(packed, s3_config))
    log: list[tuple[str, str]] = []
    wanted = shard_gets if what == "shards" else table_gets_only
    with FaultProxy(
        s3_config.endpoint_url, rates={"cut": 1.0}, match=recorder(log, wanted), max_faults=2, cut_after_bytes=cut_after
    ) as proxy:
        dataset = ShardDataset(packed, s3=via(proxy, s3_config), shuffle=False, fetch=SMALL)
        got = rows(dataset)
    assert proxy.counts["cut"] == 2
    assert got == expected
    resumed = 2 if what == "tables" else 0  # a cut table's rest is asked for once more
    assert sum(table_gets(log).values()) == NUM_SHARDS + resumed
    assert dataset.stats().retries == 2  # each cut body resumed once, from where it stopped


def test_a_shard_replaced_between_a_cut_and_its_resume_is_named(copy, s3_config):
    """The resume asks for the rest with IfMatch on the first response's ETag: a shard
    overwritten meanwhile (same size, other bytes) is an error naming it, never a mix of the
    two, on the sliced path (the shard's table was fetched)."""
    url, store = copy
    shard = store.read_bytes(shard_name(0))
    table = open_index(url, s3=s3_config).table(0)
    big = int(table.offsets[13])  # d1/00006.jpg: 70000 bytes, within which the cut falls
    assert int(table.sizes[13]) == 70000 and big < 30_000 < big + 70000
    changed = bytearray(shard)
    changed[big + 40_000] ^= 0xFF  # after the cut: only a resume would read it

    def overwrite(fault: str, method: str, path: str) -> None:
        store.write_bytes(shard_name(0), bytes(changed))

    log: list[tuple[str, str]] = []
    with FaultProxy(
        s3_config.endpoint_url,
        rates={"cut": 1.0},
        match=recorder(log, lambda method, path: shard_gets(method, path) and path.endswith(shard_name(0))),
        max_faults=1,
        cut_after_bytes=30_000,
        on_fault=overwrite,
    ) as proxy:
        dataset = ShardDataset(url, s3=via(proxy, s3_config), shuffle=False)
        with pytest.raises(CorruptShardError, match=rf"^{url}/data-000000\.tar: changed while it was being read"):
            list(dataset)
    assert proxy.counts["cut"] == 1
    assert table_gets(log)[shard_name(0)] == 1


# 7. A missing table


def test_a_missing_table_reads_whole_shards_by_parsing_and_refuses_a_byte_range(copy, s3_config, monkeypatch):
    url, store = copy
    store.delete(f"{shard_name(1)}.samples")
    expected = rows(reference(url, s3_config))
    assert rows(ShardDataset(url, s3=s3_config, shuffle=False)) == expected  # shard 1 parsed
    assert sorted(rows(ShardDataset(url, s3=s3_config, shuffle=True, seed=1))) == expected
    assert sorted(rows(ShardDataset(url, s3=s3_config, shuffle=False, fetch=TINY))) == expected

    missing = (
        rf"^{url}/data-000001\.tar\.samples: the sample table of shard data-000001\.tar is missing; "
        r"re-run shardstream pack"
    )
    # A resume after 20 samples: the rest of shard 1 (samples 4 to 15) is a byte range of it.
    dataset = ShardDataset(url, s3=s3_config, shuffle=False)
    first = list(itertools.islice(dataset, 20))
    assert [s["__key__"] for s in first] == [key(i) for i in range(20)]
    state = dataset.state_dict(20)
    fresh = ShardDataset(url, s3=s3_config, shuffle=False)
    fresh.load_state_dict(state)
    with pytest.raises(ShardNotFoundError, match=missing):
        list(fresh)

    # Two ranks of 28 samples: the boundary cuts shard 1 (rank 0: 0-11 of it, rank 1: 12-15).
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(ShardNotFoundError, match=missing):
            list(ShardDataset(url, s3=s3_config, shuffle=False))


def test_a_rank_boundary_inside_a_shard_reads_its_byte_ranges(packed, s3_config, monkeypatch):
    """The same two ranks with the table: each reads its byte range of shard 1, exactly."""
    expected = rows(reference(packed, s3_config))
    got = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        dataset = ShardDataset(packed, s3=s3_config, shuffle=False, fetch=TINY)
        assert len(dataset) == NUM_SAMPLES // 2
        got.append(rows(dataset))
    assert got == [expected[:28], expected[28:]]


# 8. DataLoader workers and a resume


def test_dataloader_workers_fetch_their_tables_and_give_the_in_process_samples(packed, s3_config):
    in_process = rows(ShardDataset(packed, s3=s3_config, seed=7, shuffle_buffer=10))
    log: list[tuple[str, str]] = []
    with FaultProxy(s3_config.endpoint_url, rates={}, match=recorder(log)) as proxy:
        dataset = ShardDataset(packed, s3=via(proxy, s3_config), seed=7, shuffle_buffer=10, fetch=SMALL)
        got = rows(DataLoader(dataset, batch_size=None, num_workers=2, timeout=60))
    assert sorted(got) == sorted(in_process) == rows(reference(packed, s3_config))
    gets = table_gets(log)
    assert set(gets) == {shard_name(i) for i in range(NUM_SHARDS)}  # fetched by the workers themselves
    assert all(1 <= n <= 2 for n in gets.values()), gets  # at most once per worker
    assert dataset.stats().readers == 2 and dataset.stats().samples == NUM_SAMPLES


@pytest.mark.parametrize("consumed", [1, 21, 40])
def test_a_mid_epoch_resume_gives_exactly_the_rest(packed, s3_config, consumed):
    kwargs = dict(s3=s3_config, seed=4, shuffle_buffer=10, fetch=SMALL)
    dataset = ShardDataset(packed, **kwargs)
    dataset.set_epoch(2)
    full = rows(dataset)
    dataset.set_epoch(2)
    before = rows(itertools.islice(dataset, consumed))
    assert before == full[:consumed]
    state = dataset.state_dict(consumed)
    fresh = ShardDataset(packed, **kwargs)
    fresh.load_state_dict(state)
    assert fresh.epoch == 2 and len(fresh) == NUM_SAMPLES - consumed
    assert rows(fresh) == full[consumed:]


def test_a_resume_through_dataloader_workers_loses_and_repeats_nothing(packed, s3_config):
    kwargs = dict(s3=s3_config, seed=4, shuffle_buffer=10, fetch=SMALL, batch_size=4)
    expected = sorted(rows(reference(packed, s3_config)))
    dataset = ShardDataset(packed, **kwargs)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=list, timeout=60)
    it = iter(loader)
    before = [s for _ in range(5) for s in next(it)]
    state = loader_state_dict(loader, samples_consumed=len(before))
    del it
    fresh = ShardDataset(packed, **kwargs)
    fresh.load_state_dict(state)
    after = [s for batch in DataLoader(fresh, batch_size=4, num_workers=2, collate_fn=list, timeout=60) for s in batch]
    assert sorted(rows(before) + rows(after)) == expected
