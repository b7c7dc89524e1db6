"""TokenBlocks over token datasets, checked against an oracle built with numpy from the
documents written (tests/token_fixtures.py), never read back through shardstream: the block
rule (block k = stream tokens kL .. kL+L, B = (N-1)//L, the tail dropped) across shard ends,
doc_lens and position_ids from the stored boundaries, collate_blocks' cu_seqlens; shuffled
epochs, DataLoader workers, ranks, exact and elastic resume, O(1) checkpoints, mixtures,
random access, S3, and bad input."""

from __future__ import annotations

import collections
import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from resume_check import Checkpoints, as_rank, check_resume, plain, stateful
from token_fixtures import EOD, TokenData, check_batch, check_epoch, check_item, make_docs, write_tokens
from torch.utils.data import DataLoader

from shardstream import FetchConfig, Source, TokenBlocks, collate_blocks, loader_state_dict, pack
from shardstream.errors import CorruptShardError
from shardstream.tokens import TokenIndex

SEQ_LENS = [1, 7, 100, 1500]  # 1500: longer than any shard (at most 1000 tokens)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, TokenData]:
    """``u16``: 130 documents, vocabulary 1000 (uint16 on disk), shards of at most 1000 tokens;
    ``u32``: 90 documents, vocabulary 70000 (uint32), shards of at most 700 tokens. Each holds
    a run of one-token documents, each in a one-token shard of its own (a block of 7 crosses
    several shard ends there), and a long document alone in its shard."""
    root = tmp_path_factory.mktemp("tokens")
    out = {}
    for name, vocab, count, seed, max_shard, tiny in (
        ("u16", 1000, 130, 11, 1000, range(60, 64)),
        ("u32", 70000, 90, 12, 700, range(30, 33)),
    ):
        docs = make_docs(count, vocab_size=vocab, seed=seed)
        for i in tiny:
            docs[i] = np.array([EOD], dtype=np.int64)
        data = write_tokens(root / name, docs, vocab_size=vocab, max_shard_tokens=max_shard, alone=[20, *tiny])
        assert 10 <= data.num_shards <= 40, data.num_shards
        assert min(data.doc_lens) == 1 and max(data.shard_tokens) <= max_shard
        out[name] = data
    assert out["u32"].tokens.max() > 65535  # ids that need 32 bits
    return out


def keys_of(batch) -> list[int]:
    return list(batch["keys"])


def blocks_plain(batch_size: int, num_workers: int = 0, **options) -> Checkpoints:
    """resume_check's plain DataLoader, batching blocks with collate_blocks."""
    return dataclasses.replace(plain(batch_size, num_workers, collate_fn=collate_blocks, **options), ids=keys_of)


def blocks_stateful(batch_size: int, num_workers: int = 0) -> Checkpoints:
    return dataclasses.replace(stateful(batch_size, num_workers, collate_fn=collate_blocks), ids=keys_of)


def check_batches(data: TokenData, batches, seq_len: int) -> list[int]:
    return [k for batch in batches for k in check_batch(data, batch, seq_len)]


# --- the block rule against the oracle ----------------------------------------------------------


@pytest.mark.parametrize("name", ["u16", "u32"])
@pytest.mark.parametrize("seq_len", SEQ_LENS)
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_epoch_holds_each_block_once_as_the_oracle_says(datasets, name, seq_len, shuffle):
    data = datasets[name]
    num_blocks = data.num_blocks(seq_len)
    assert num_blocks * seq_len + 1 <= data.num_tokens < (num_blocks + 1) * seq_len + 1  # only the tail dropped
    assert TokenIndex.open(data.path).dtype == np.dtype("<u2" if name == "u16" else "<u4")
    dataset = TokenBlocks(data.path, seq_len=seq_len, shuffle=shuffle, seed=5, shuffle_buffer=50)
    assert len(dataset) == dataset.num_samples == num_blocks
    if seq_len > 1:
        assert any(data.crosses_shard_ends(k, seq_len) >= 2 for k in range(num_blocks))  # several shard ends
    if seq_len == 1500:
        assert all(n < seq_len for n in data.shard_tokens)
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        items = list(dataset)
        keys = check_epoch(data, items, seq_len)  # range(B), each once, tokens/labels/doc_lens/positions
        if not shuffle:
            assert keys == list(range(num_blocks))
        ordered = sorted(items, key=lambda item: item["__key__"])
        stream = torch.cat([item["input_ids"] for item in ordered]).numpy()
        np.testing.assert_array_equal(stream, data.tokens[: num_blocks * seq_len])
        assert all(int(item["position_ids"][0]) == 0 for item in items)
        assert all(int(item["doc_lens"].sum()) == seq_len for item in items)
        for part in (items[:5], items[5:6], items[-3:]):
            check_batch(data, collate_blocks(part), seq_len)


def test_one_block_of_the_whole_stream_and_none_past_it(datasets):
    data = datasets["u16"]
    n = data.num_tokens
    (only,) = list(TokenBlocks(data.path, seq_len=n - 1, shuffle=False))
    check_item(data, only, n - 1)  # labels end with the stream's last token
    assert len(TokenBlocks(data.path, seq_len=n)) == 0 and list(TokenBlocks(data.path, seq_len=n)) == []


def test_collate_blocks_refuses_no_blocks_and_mixed_lengths(datasets):
    data = datasets["u16"]
    a, b = TokenBlocks(data.path, seq_len=8)[0], TokenBlocks(data.path, seq_len=9)[0]
    with pytest.raises(ValueError, match="at least one block"):
        collate_blocks([])
    with pytest.raises(ValueError, match="different seq_len"):
        collate_blocks([a, b])


@pytest.mark.parametrize("chunk_bytes", [1, 7, 4096])
def test_blocks_are_cut_right_from_reads_of_any_size(datasets, chunk_bytes):
    """Shards read a few bytes at a time: blocks (and tokens) straddle the reads."""
    data = datasets["u32"]
    fetch = FetchConfig(chunk_bytes=chunk_bytes, part_bytes=chunk_bytes, max_buffer_bytes=1 << 20)
    for seq_len in (7, 1500):
        check_epoch(data, list(TokenBlocks(data.path, seq_len=seq_len, fetch=fetch, shuffle_buffer=10)), seq_len)


# --- shuffle --------------------------------------------------------------------------------------


def test_shuffled_order_depends_on_seed_and_epoch_only(datasets):
    data = datasets["u16"]
    num_blocks = data.num_blocks(50)

    def order(seed: int, epoch: int) -> list[int]:
        dataset = TokenBlocks(data.path, seq_len=50, seed=seed, shuffle_buffer=64)
        dataset.set_epoch(epoch)
        return [item["__key__"] for item in dataset]

    e0, e1 = order(0, 0), order(0, 1)
    assert sorted(e0) == sorted(e1) == list(range(num_blocks))
    assert e0 != list(range(num_blocks)) and e1 != list(range(num_blocks))
    assert e0 != e1
    assert order(0, 0) == e0 and order(0, 1) == e1  # the same seed, the same order
    assert order(1, 0) != e0
    passes = TokenBlocks(data.path, seq_len=50, seed=0, shuffle_buffer=64)  # no set_epoch: each pass the next
    assert [item["__key__"] for item in passes] == e0
    assert [item["__key__"] for item in passes] == e1


# --- DataLoader workers ---------------------------------------------------------------------------


@pytest.mark.parametrize("dataset_batches", [False, True])
def test_persistent_workers_read_each_epoch_exactly(datasets, dataset_batches):
    data, seq_len = datasets["u32"], 100
    num_blocks = data.num_blocks(seq_len)
    if dataset_batches:  # the dataset makes the batches: DataLoader(batch_size=None)
        dataset = TokenBlocks(data.path, seq_len=seq_len, batch_size=4, collate=collate_blocks, shuffle_buffer=20)
        loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
    else:
        dataset = TokenBlocks(data.path, seq_len=seq_len, batch_size=4, shuffle_buffer=20)
        loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True, collate_fn=collate_blocks)
    orders = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(loader) == -(-num_blocks // 4)
        keys = check_batches(data, batches, seq_len)
        assert sorted(keys) == list(range(num_blocks))
        orders.append(keys)
    assert orders[0] != orders[1]


# --- ranks ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_ranks_get_equal_counts_and_cover_the_epoch(datasets, world_size, drop_last, num_workers):
    data = datasets["u16"]
    seq_len = next(L for L in range(60, 200) if data.num_blocks(L) % 6 in (1, 5))  # divides by neither 2 nor 3
    num_blocks = data.num_blocks(seq_len)
    per_rank = num_blocks // world_size if drop_last else -(-num_blocks // world_size)
    read = []
    for rank in range(world_size):
        with as_rank(rank, world_size):
            dataset = TokenBlocks(data.path, seq_len=seq_len, drop_last=drop_last, batch_size=5, seed=2)
            dataset.set_epoch(1)
            assert len(dataset) == per_rank
            loader = DataLoader(dataset, batch_size=5, num_workers=num_workers, collate_fn=collate_blocks)
            read.append(check_batches(data, list(loader), seq_len))
    assert [len(keys) for keys in read] == [per_rank] * world_size
    every = [k for keys in read for k in keys]
    if drop_last:
        assert len(set(every)) == len(every) == per_rank * world_size  # floor: the fewest left out
    else:
        assert set(every) == set(range(num_blocks))
        assert len(every) - num_blocks == per_rank * world_size - num_blocks > 0  # the pad, repeats only


# --- resume -----------------------------------------------------------------------------------------


@pytest.fixture
def resumable(datasets):
    data, seq_len = datasets["u16"], 64

    def make(**options):
        return TokenBlocks(data.path, seq_len=seq_len, shuffle_buffer=30, seed=7, batch_size=4, **options)

    return data, seq_len, make


def check_run(data: TokenData, run, seq_len: int) -> None:
    """Every batch read before and after the checkpoints holds the blocks it names."""
    for stage in run.batches_before:
        for batches in stage:
            check_batches(data, batches, seq_len)
    for batches in run.batches_after:
        check_batches(data, batches, seq_len)


@pytest.mark.parametrize(("num_workers", "stop"), [(0, 5), (2, 7), (2, 1)])
def test_plain_dataloader_resumes_mid_epoch_exactly(resumable, num_workers, stop):
    data, seq_len, make = resumable
    num_blocks = data.num_blocks(seq_len)
    run = check_resume(
        make, blocks_plain(4, num_workers), stop_after=stop, epoch=2, expected=range(num_blocks)
    )  # none lost, none repeated
    check_run(data, run, seq_len)
    assert run.epochs == [2] and run.lengths == [num_blocks - len(run.taken)]
    assert len(run.taken) == 4 * stop


def test_stateful_dataloader_resumes_mid_epoch_exactly(resumable):
    data, seq_len, make = resumable
    run = check_resume(make, blocks_stateful(4, 2), stop_after=6, expected=range(data.num_blocks(seq_len)))
    check_run(data, run, seq_len)


def test_elastic_resume_from_4_to_2_to_3_ranks(resumable):
    data, seq_len, make = resumable
    run = check_resume(
        make,
        blocks_plain(4, 2),
        stop_after=[2, 3],
        world_size=[4, 2, 3],
        expected=range(data.num_blocks(seq_len)),
        pads=(4 - 1) + (2 - 1) + (3 - 1),
    )
    check_run(data, run, seq_len)
    assert len(set(run.lengths)) == 1  # the resumed ranks' counts are equal
    assert [len(ids) for ids in run.after] == [run.lengths[0]] * 3


@pytest.mark.parametrize(("before", "after"), [((4, 2), (4, 0)), ((4, 0), (4, 2)), ((4, 2), (6, 1)), ((4, 2), (3, 2))])
def test_resume_with_other_workers_or_batch_size(resumable, before, after):
    """The job saves with (batch size, workers) ``before`` and resumes with ``after``."""
    data, seq_len, make = resumable
    num_blocks = data.num_blocks(seq_len)
    first = blocks_plain(*before)
    lengths: list[int] = []

    def resume(_dataset, state):  # a fresh dataset of the new batch size (it must match its DataLoader's)
        dataset = TokenBlocks(data.path, seq_len=seq_len, shuffle_buffer=30, seed=7, batch_size=after[0])
        loader = blocks_plain(*after).resume(dataset, state)
        lengths.append(len(dataset))
        return loader

    how = dataclasses.replace(first, resume=resume)
    run = check_resume(make, how, stop_after=5, expected=range(num_blocks))
    check_run(data, run, seq_len)
    left = num_blocks - len(run.taken)
    assert lengths == [left] and len(run.rest) == left
    assert [len(b["keys"]) for b in run.batches_after[0][:-1]] == [after[0]] * (len(run.batches_after[0]) - 1)


def test_a_checkpoint_resumes_only_the_same_blocks_of_the_same_data(datasets):
    state = TokenBlocks(datasets["u16"].path, seq_len=64).state_dict(0)
    with pytest.raises(ValueError, match="unit: checkpoint 'token_block:64', dataset 'token_block:32'"):
        TokenBlocks(datasets["u16"].path, seq_len=32).load_state_dict(state)
    with pytest.raises(ValueError, match="another dataset or settings"):
        TokenBlocks(datasets["u32"].path, seq_len=64).load_state_dict(state)


# --- checkpoints are O(1) --------------------------------------------------------------------------


def test_a_checkpoint_does_not_grow_with_the_shards(tmp_path):
    docs = make_docs(80, vocab_size=1000, seed=21)
    few = write_tokens(tmp_path / "few", docs, vocab_size=1000, max_shard_tokens=1 << 20, docs_per_shard=8)
    many = write_tokens(tmp_path / "many", docs, vocab_size=1000, max_shard_tokens=1 << 20, docs_per_shard=2)
    assert (few.num_shards, many.num_shards) == (10, 40)
    sizes = {}
    for data in (few, many):
        with as_rank(1, 2):
            dataset = TokenBlocks(data.path, seq_len=32, batch_size=4, shuffle_buffer=16)
            loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate_blocks)
            it = iter(loader)
            for _ in range(3):
                next(it)
            state = loader_state_dict(loader, samples_consumed=12)
            del it
            dataset.load_state_dict(state)
            again = loader_state_dict(loader, samples_consumed=0)  # a second segment
        assert state["num_shards"] == data.num_shards
        sizes[data.num_shards] = (len(json.dumps(state)), len(json.dumps(again)))
    assert sizes[40][0] <= sizes[10][0] and sizes[40][1] <= sizes[10][1], sizes
    assert max(sizes[40]) < 1000


# --- mixtures -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("epoch_blocks", [400, 1200])  # 1200: both sources read more than once
def test_a_mixture_reads_each_source_by_its_weight(datasets, epoch_blocks):
    a, b = datasets["u16"], datasets["u32"]
    seq_len = 64
    sizes = {"a": a.num_blocks(seq_len), "b": b.num_blocks(seq_len)}
    dataset = TokenBlocks(
        [Source(a.path, weight=0.75, name="a"), Source(b.path, weight=0.25, name="b")],
        seq_len=seq_len,
        epoch_blocks=epoch_blocks,
        batch_size=8,
        shuffle_buffer=40,
    )
    assert len(dataset) == epoch_blocks
    share = {"a": 0.75 * epoch_blocks, "b": 0.25 * epoch_blocks}
    assert all(abs(n - share[s]) < 1 for s, n in dataset.samples_per_source.items())
    for epoch in range(2):
        dataset.set_epoch(epoch)
        items = list(dataset)
        assert len(items) == epoch_blocks
        got = collections.Counter(item["__source__"] for item in items)
        assert all(abs(got[s] - share[s]) <= 1 for s in share), got
        for item in items:
            check_item(a if item["__source__"] == "a" else b, item, seq_len)  # each block from its own dataset
        for s in ("a", "b"):
            counts = collections.Counter(item["__key__"] for item in items if item["__source__"] == s)
            if got[s] <= sizes[s]:
                assert max(counts.values()) == 1  # sub-sampled: none twice
            else:
                assert len(counts) == sizes[s] and max(counts.values()) - min(counts.values()) <= 1


def test_a_mixture_through_collate_blocks_names_each_blocks_source(datasets):
    a, b = datasets["u16"], datasets["u32"]
    dataset = TokenBlocks(
        [Source(a.path, weight=0.75, name="a"), Source(b.path, weight=0.25, name="b")],
        seq_len=32,
        epoch_blocks=240,
        batch_size=8,
        collate=collate_blocks,
    )
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    batches = list(loader)
    assert len(batches) == len(dataset) == 30
    total = collections.Counter()
    for batch in batches:
        sources = batch["sources"]
        assert collections.Counter(sources) == {"a": 6, "b": 2}  # stratified: each batch its share
        total.update(sources)
        for row, (source, key) in enumerate(zip(sources, batch["keys"])):
            data = a if source == "a" else b
            np.testing.assert_array_equal(batch["input_ids"][row].numpy(), data.input_ids(key, 32))
            np.testing.assert_array_equal(batch["labels"][row].numpy(), data.labels(key, 32))
    assert total == {"a": 180, "b": 60}
    with pytest.raises(TypeError, match="random access reads one token dataset"):
        dataset[0]


def test_a_mixture_resumes_elastically(datasets):
    a, b = datasets["u16"], datasets["u32"]
    seq_len = 32

    def make():
        return TokenBlocks(
            [Source(a.path, weight=0.75, name="a"), Source(b.path, weight=0.25, name="b")],
            seq_len=seq_len,
            epoch_blocks=500,
            batch_size=4,
            shuffle_buffer=20,
        )

    def ids(batch):
        return list(zip(batch["sources"], batch["keys"]))

    how = dataclasses.replace(plain(4, 2, collate_fn=collate_blocks), ids=ids)
    expected = [(item["__source__"], item["__key__"]) for item in make()]
    assert collections.Counter(s for s, _ in expected) == {"a": 375, "b": 125}
    run = check_resume(make, how, stop_after=[2, 3], world_size=[4, 2, 3], expected=expected, pads=6)
    for batches in [*(x for stage in run.batches_before for x in stage), *run.batches_after]:
        for batch in batches:
            for row, (source, key) in enumerate(ids(batch)):
                data = a if source == "a" else b
                np.testing.assert_array_equal(batch["input_ids"][row].numpy(), data.input_ids(key, seq_len))
                np.testing.assert_array_equal(batch["labels"][row].numpy(), data.labels(key, seq_len))


# --- random access ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["u16", "u32"])
@pytest.mark.parametrize("seq_len", [7, 100, 1500])
def test_random_access_gives_the_blocks_iteration_gives(datasets, name, seq_len):
    data = datasets[name]
    dataset = TokenBlocks(data.path, seq_len=seq_len, shuffle=False)
    num_blocks = len(dataset)
    streamed = list(dataset)
    looked_up = [dataset[i] for i in range(num_blocks)]
    assert [item["__key__"] for item in looked_up] == list(range(num_blocks))
    check_epoch(data, looked_up, seq_len)
    for got, want in zip(looked_up, streamed):
        assert got.keys() == want.keys()
        for field in ("input_ids", "labels", "position_ids", "doc_lens"):
            assert torch.equal(got[field], want[field]), (want["__key__"], field)
    for i in (-1, -2, -num_blocks):
        check_item(data, dataset[i], seq_len)
        assert dataset[i]["__key__"] == num_blocks + i
    assert [item["__key__"] for item in dataset[-3:]] == list(range(num_blocks - 3, num_blocks))
    for i in (num_blocks, num_blocks + 5, -num_blocks - 1):
        with pytest.raises(IndexError):
            dataset[i]


# --- S3 ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_token_blocks_read_from_s3_equal_the_local_read(datasets, s3_bucket, s3_config):
    data = datasets["u16"]
    url = f"s3://{s3_bucket}/tokens"
    # the same documents, written straight to S3 by the writer, and a byte-for-byte copy of the local dataset
    docs = np.split(data.tokens, np.cumsum(data.doc_lens)[:-1])
    written = write_tokens(url, docs, vocab_size=1000, max_shard_tokens=1000, alone=[20, *range(60, 64)], s3=s3_config)
    assert written.shard_tokens == data.shard_tokens
    from shardstream.storage import open_store

    copy = open_store(f"s3://{s3_bucket}/copy", s3=s3_config)
    for path in sorted(p for p in data.path.rglob("*") if p.is_file()):  # docids/ too
        copy.write_bytes(path.relative_to(data.path).as_posix(), path.read_bytes())
    for location in (url, f"s3://{s3_bucket}/copy"):
        for seq_len in (7, 1500):
            local = TokenBlocks(data.path, seq_len=seq_len, seed=3, shuffle_buffer=40)
            remote = TokenBlocks(location, seq_len=seq_len, seed=3, shuffle_buffer=40, s3=s3_config)
            want, got = list(local), list(remote)
            assert [x["__key__"] for x in got] == [x["__key__"] for x in want]
            check_epoch(data, got, seq_len)
            for g, w in zip(got, want):
                assert all(torch.equal(g[f], w[f]) for f in ("input_ids", "labels", "position_ids", "doc_lens"))
        remote = TokenBlocks(location, seq_len=100, batch_size=4, s3=s3_config)
        loader = DataLoader(remote, batch_size=4, num_workers=2, collate_fn=collate_blocks)
        assert sorted(check_batches(data, list(loader), 100)) == list(range(data.num_blocks(100)))
        crossing = next(k for k in range(data.num_blocks(7)) if data.crosses_shard_ends(k, 7) >= 2)
        check_item(data, TokenBlocks(location, seq_len=7, s3=s3_config)[crossing], 7)
    small_gets = FetchConfig(part_bytes=300, max_buffer_bytes=1 << 20)  # ranged GETs that end mid-token
    remote = TokenBlocks(url, seq_len=100, s3=s3_config, fetch=small_gets, shuffle_buffer=10)
    check_epoch(data, list(remote), 100)


# --- bad input ---------------------------------------------------------------------------------------


def test_a_dataset_of_samples_is_refused_naming_pack_text(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"{i:03d}.txt").write_text(f"sample {i}")
    pack(src, tmp_path / "samples", max_samples_per_shard=4, progress=False)
    with pytest.raises(ValueError, match="pack-text"):
        TokenBlocks(tmp_path / "samples", seq_len=8)


@pytest.mark.parametrize("seq_len", [0, -3])
def test_a_block_length_below_one_is_refused(datasets, seq_len):
    with pytest.raises(ValueError, match="seq_len"):
        TokenBlocks(datasets["u16"].path, seq_len=seq_len)


@pytest.mark.parametrize("cut", ["tokens", "doclens"])
def test_a_truncated_token_shard_is_named_when_read(datasets, tmp_path, cut):
    data = datasets["u16"]
    dest = tmp_path / "ds"
    shutil.copytree(data.path, dest)
    index = TokenIndex.open(dest)
    shard = 5
    name = index.index.manifest.name(shard)
    if cut == "tokens":  # half its tokens gone
        at = index.column("tokens_offset", shard) + index.column("num_tokens", shard)  # (uint16: 2 bytes a token)
    else:  # its tokens whole, its document lengths cut short
        at = index.column("doclens_offset", shard) + 2
    path = dest / name
    path.write_bytes(path.read_bytes()[:at])
    seq_len = 10
    with pytest.raises(CorruptShardError, match=name):
        list(TokenBlocks(dest, seq_len=seq_len, shuffle=False))
    with pytest.raises(CorruptShardError, match=name):
        list(DataLoader(TokenBlocks(dest, seq_len=seq_len), batch_size=None, num_workers=1))
    block = int(data.shard_ends[shard - 1] // seq_len) + 1  # one that starts in the shard
    with pytest.raises(CorruptShardError, match=name):
        TokenBlocks(dest, seq_len=seq_len)[block]


# --- arguments and indices of other types ----------------------------------------------------------


def test_epoch_blocks_without_a_mixture_is_refused_by_its_own_name(datasets):
    with pytest.raises(ValueError, match="epoch_blocks"):
        TokenBlocks(datasets["u16"].path, seq_len=64, epoch_blocks=100)


def test_a_bool_seq_len_is_refused(datasets):
    with pytest.raises(ValueError, match="seq_len"):
        TokenBlocks(datasets["u16"].path, seq_len=True)


def test_random_access_by_a_numpy_index_keys_the_block_as_iteration_does(datasets):
    dataset = TokenBlocks(datasets["u16"].path, seq_len=64, shuffle=False)
    key = dataset[np.int64(3)]["__key__"]
    assert key == 3 and type(key) is int  # iteration's keys are ints (json.dumps takes them)
