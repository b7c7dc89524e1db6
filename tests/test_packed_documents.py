"""PackedDocuments (shardstream/tokens/packed.py): documents packed whole, best-fit, into bins
of seq_len; checked against the documents as written (numpy), not as read back: every
document (or, longer than a bin, each seq_len piece of it) exactly once an epoch, labels
only within a document, padding masked, positions restarting per document; bins fill most of
each block; ranks, workers and resume as for blocks."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import torch
from resume_check import check_resume, plain
from token_fixtures import make_docs, write_tokens

from shardstream import PackedDocuments, collate_blocks
from shardstream.tokens.packed import pack_bins

SEQ_LEN = 96


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # no document of the end token alone: padding (pad_id 0) is then told apart by its first token
    docs = [doc for doc in make_docs(1200, vocab_size=1000, seed=5, max_len=SEQ_LEN - 2) if len(doc) > 1]
    docs[10] = np.append(np.arange(1, 2 * SEQ_LEN + 30), 0)  # longer than a bin: cut into pieces
    return write_tokens(tmp_path_factory.mktemp("packed") / "ds", docs, vocab_size=1000, max_shard_tokens=6000), docs


def pieces_of(docs):
    """Each document, or each seq_len piece of a longer one, as a tuple: what bins must hold."""
    out = collections.Counter()
    for doc in docs:
        for start in range(0, len(doc), SEQ_LEN):
            out[tuple(doc[start : start + SEQ_LEN].tolist())] += 1
    return out


def unpack(item):
    """The documents of a packed item (its padding left out), checking its labels and positions."""
    ids, labels, positions = item["input_ids"].numpy(), item["labels"].numpy(), item["position_ids"].numpy()
    lens = item["doc_lens"].numpy()
    assert len(ids) == SEQ_LEN and lens.sum() == SEQ_LEN and (lens > 0).all()
    out, at = [], 0
    ends = np.cumsum(lens)
    for n, end in zip(lens.tolist(), ends.tolist()):
        assert (positions[at:end] == np.arange(n)).all()  # positions restart at each document
        out.append((at, end))
        at = end
    return ids, labels, out


def test_every_document_is_in_exactly_one_bin_an_epoch(data):
    dataset, docs = data
    packed = PackedDocuments(dataset.path, seq_len=SEQ_LEN, window=100, seed=3)
    items = list(packed)
    assert sorted(item["__key__"] for item in items) == list(range(len(packed)))
    got = collections.Counter()
    padded = 0
    for item in items:
        ids, labels, spans = unpack(item)
        for a, b in spans:
            segment = ids[a:b]
            if (labels[a:b] == -100).all() and b == SEQ_LEN and a > 0 and (segment == 0).all():
                padded += b - a  # the padding: the last span, masked, pad_id 0
                continue
            # labels: the next token within the document, -100 at its last token
            assert (labels[a : b - 1] == segment[1:]).all() and labels[b - 1] == -100
            got[tuple(segment.tolist())] += 1
    assert got == pieces_of(docs)
    total = sum(len(d) for d in docs)
    assert total + padded == len(items) * SEQ_LEN
    assert total / (len(items) * SEQ_LEN) > 0.9  # best-fit packs tight


def test_the_bins_depend_on_the_lengths_alone_and_fit(data):
    dataset, docs = data
    lengths = np.array([len(d) for d in docs])
    bins = pack_bins(lengths, SEQ_LEN, window=50)
    assert bins == pack_bins(lengths, SEQ_LEN, window=50)
    assert all(sum(n for _, _, n in b) <= SEQ_LEN for b in bins)
    covered = collections.Counter((d, s) for b in bins for d, s, _ in b)
    assert covered == collections.Counter((d, s) for d, n in enumerate(lengths) for s in range(0, n, SEQ_LEN))
    # first-fit in order would need more bins than best-fit decreasing
    assert len(bins) <= len(pack_bins(lengths, SEQ_LEN, window=1))


def test_packed_items_batch_with_their_cu_seqlens(data):
    dataset, _ = data
    packed = PackedDocuments(dataset.path, seq_len=SEQ_LEN, shuffle=False)
    batch = collate_blocks([packed_item for packed_item, _ in zip(packed, range(4))])
    assert batch["input_ids"].shape == (4, SEQ_LEN) and batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"][-1] == 4 * SEQ_LEN and batch["cu_seqlens"][0] == 0


def test_ranks_get_equal_bins_and_a_resume_is_exact(data, monkeypatch):
    dataset, _ = data

    def make():
        return PackedDocuments(dataset.path, seq_len=SEQ_LEN, batch_size=4, seed=1)

    keys = dataclasses.replace(plain(4, 2, collate_fn=collate_blocks), ids=lambda batch: batch["keys"])
    num_bins = len(make())
    run = check_resume(make, keys, stop_after=[3, 2], world_size=[2, 3, 2], expected=range(num_bins), pads=1 + 2 + 1)
    assert run is not None


def test_random_access_is_refused_with_the_way_out(data):
    dataset, _ = data
    with pytest.raises(TypeError, match="TokenBlocks"):
        PackedDocuments(dataset.path, seq_len=SEQ_LEN)[0]
    with pytest.raises(ValueError, match="window"):
        PackedDocuments(dataset.path, seq_len=SEQ_LEN, window=0)
