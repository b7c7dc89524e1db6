"""Documents of a token dataset by id (``docids/``, :mod:`shardstream.tokens.docids`): every
document of a few-shard dataset found by its id (dots, colons, spaces, unicode), checked
against the shards' own ids; absent ids a KeyError naming id and dataset; no index or a stale
one named with the way out; forced hash collisions and repeated ids told apart by the shards'
ids; one small ranged read per lookup; ``shardstream tokens-get``."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from shardstream.cli import main
from shardstream.errors import IndexFormatError, ShardNotFoundError
from shardstream.index import keys
from shardstream.index.keys import KeyIndex
from shardstream.tokens import DOCIDS_DIR, TokenIds, TokenIndex, build_docid_index, get_document
from shardstream.tokens.writer import TokenDatasetWriter

ODD_IDS = [
    "plain",
    "with.dots.in.it",
    "a:b:c",
    "spaces in id",
    "naïve-café",
    "日本語の文書",
    "emoji-🦀",
    'quote"and\\backslash',
    "tab\tnewline\n",
    "",
    "0",
    "corpus.jsonl:17",
]


def write_dataset(
    dest: Path, doc_ids: list[str], *, seed: int = 0, max_shard_tokens: int = 60
) -> dict[str, np.ndarray]:
    """A token dataset of one document per id (random lengths 1..40) in several shards; returns id -> tokens."""
    rng = np.random.default_rng(seed)
    docs = {}
    with TokenDatasetWriter(dest, vocab_size=1000, eod_id=0, max_shard_tokens=max_shard_tokens, docids=False) as writer:
        for doc_id in doc_ids:
            tokens = np.append(rng.integers(1, 1000, int(rng.integers(1, 40))), 0).astype(np.uint16)
            writer.add(tokens, doc_id)
            docs[doc_id] = tokens
    return docs


def many_ids(n: int) -> list[str]:
    return [f"doc.{i}/{'é' * (i % 3)}:{i * 7}" for i in range(n)] + ODD_IDS


@pytest.fixture
def dataset(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    docs = write_dataset(tmp_path / "ds", many_ids(150))
    build_docid_index(tmp_path / "ds")
    return tmp_path / "ds", docs


def test_every_document_is_found_by_its_id(dataset):
    dest, docs = dataset
    tokens = TokenIndex.open(dest)
    assert tokens.num_shards >= 5  # a few shards
    ids = TokenIds.open(dest)
    assert ids.num_docs == len(docs) == tokens.num_docs
    for shard in range(tokens.num_shards):  # the reference: the shards' own ids, in order
        for doc, doc_id in enumerate(tokens.docids(shard)):
            assert ids.lookup(doc_id) == (shard, doc)
            assert ids.lookup(doc_id, verify=True) == (shard, doc)
            got = ids.get(doc_id)
            assert got.dtype == np.uint16 and np.array_equal(got, docs[doc_id])
    for doc_id in ODD_IDS:
        assert np.array_equal(get_document(dest, doc_id), docs[doc_id])
        assert np.array_equal(get_document(tokens, doc_id), docs[doc_id])


def test_an_absent_id_is_a_key_error_naming_it_and_the_dataset(dataset):
    dest, _ = dataset
    ids = TokenIds.open(dest)
    for absent in ("no-such-doc", "plain ", "PLAIN", "doc.1/é:8"):
        with pytest.raises(KeyError) as caught:
            ids.lookup(absent)
        assert repr(absent) in caught.value.args[0] and str(dest) in caught.value.args[0]
    with pytest.raises(KeyError, match="no-such-doc"):
        get_document(dest, "no-such-doc")


def test_a_dataset_without_docids_says_how_to_build_it(tmp_path):
    write_dataset(tmp_path / "ds", ["a", "b"])
    with pytest.raises(ShardNotFoundError) as caught:
        get_document(tmp_path / "ds", "a")
    message = str(caught.value)
    assert "no document-id index" in message and "tokens-get" in message and "--build-index" in message
    assert "import-tokens and pack-text build it" in message
    build_docid_index(TokenIndex.open(tmp_path / "ds"))  # an opened TokenIndex works too
    assert get_document(tmp_path / "ds", "b").tolist()[-1] == 0


def test_a_stale_index_is_refused(tmp_path):
    write_dataset(tmp_path / "a", ["x", "y", "z"])
    write_dataset(tmp_path / "b", ["x", "y", "z", "w"], seed=1)
    build_docid_index(tmp_path / "a")
    shutil.copytree(tmp_path / "a" / DOCIDS_DIR, tmp_path / "b" / DOCIDS_DIR)
    with pytest.raises(IndexFormatError, match="stale"):
        TokenIds.open(tmp_path / "b")


def test_a_sample_dataset_is_not_a_token_dataset(tmp_path):
    from shardstream import pack

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    pack(tmp_path / "src", tmp_path / "ds", progress=False)
    with pytest.raises(ValueError, match="not of tokens"):
        TokenIds.open(tmp_path / "ds")


def tiny_hash(values: list[bytes]) -> np.ndarray:
    """A test-only hash with 4 values: most ids collide."""
    import hashlib

    return np.array([(hashlib.md5(v).digest()[0] % 4) << 62 for v in values], dtype=np.uint64)


def test_colliding_hashes_are_told_apart_by_the_shards_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(keys, "hash_keys", tiny_hash)
    docs = write_dataset(tmp_path / "ds", many_ids(40))
    build_docid_index(tmp_path / "ds")
    ids = TokenIds.open(tmp_path / "ds")
    assert max(len(ids.candidates(doc_id)) for doc_id in docs) > 5
    for doc_id, tokens in docs.items():
        assert np.array_equal(ids.get(doc_id), tokens)
    with pytest.raises(KeyError):
        ids.lookup("absent")  # its hash is one of the 4: candidates, none of them it


def test_an_id_given_twice_finds_the_first(tmp_path):
    rng = np.random.default_rng(3)
    with TokenDatasetWriter(tmp_path / "ds", vocab_size=100, max_shard_tokens=10, docids=False) as writer:
        first = rng.integers(0, 100, 8)
        writer.add(first, "twice")
        for i in range(5):
            writer.add(rng.integers(0, 100, 8), f"other{i}")
        writer.add(rng.integers(0, 100, 8), "twice")
    build_docid_index(tmp_path / "ds")
    ids = TokenIds.open(tmp_path / "ds")
    assert len(ids.candidates("twice")) == 2
    assert ids.lookup("twice") == (0, 0)
    assert np.array_equal(ids.get("twice"), first)


def test_many_partitions_and_spills_keep_every_id(tmp_path, monkeypatch):
    monkeypatch.setattr(keys, "_PARTITION_KEYS", 16)
    monkeypatch.setattr(keys, "_BUCKET_KEYS", 4)
    monkeypatch.setattr(keys, "_BUFFER_KEYS", 10)
    docs = write_dataset(tmp_path / "ds", many_ids(300), max_shard_tokens=200)
    report = build_docid_index(tmp_path / "ds")
    assert report.num_keys == len(docs) and report.num_partitions >= 16
    assert len(os.listdir(tmp_path / "ds" / DOCIDS_DIR)) == report.num_partitions + 1
    ids = TokenIds.open(tmp_path / "ds")
    for doc_id, tokens in docs.items():
        assert np.array_equal(ids.get(doc_id), tokens)
    monkeypatch.undo()  # a smaller rebuild drops the old partitions
    assert build_docid_index(tmp_path / "ds").num_partitions == 1
    assert sorted(os.listdir(tmp_path / "ds" / DOCIDS_DIR)) == ["header.bin", "part-000000.bin"]
    assert np.array_equal(TokenIds.open(tmp_path / "ds").get(ODD_IDS[5]), docs[ODD_IDS[5]])


def test_one_small_ranged_read_per_lookup(dataset, monkeypatch):
    dest, docs = dataset
    calls = []
    real = KeyIndex._read

    def spy(self, name, start, end):
        calls.append((name, start, end))
        return real(self, name, start, end)

    monkeypatch.setattr(KeyIndex, "_read", spy)
    ids = TokenIds.open(dest)
    assert calls == []  # opening reads the header only
    for n, doc_id in enumerate(list(docs)[:40], start=1):
        ids.lookup(doc_id)
        assert len(calls) == n
        name, start, end = calls[-1]
        assert name.startswith(f"{DOCIDS_DIR}/part-") and end - start <= 8192


def test_token_ids_pickle(dataset):
    dest, docs = dataset
    ids = pickle.loads(pickle.dumps(TokenIds.open(dest)))
    assert np.array_equal(ids.get("日本語の文書"), docs["日本語の文書"])


def test_the_keys_of_sample_datasets_still_work(tmp_path):
    """keys.py's writer, generalised for docids/, still writes and reads sample keys."""
    from shardstream import open_index
    from shardstream.packing.from_code import pack_samples

    pack_samples(lambda i: {"__key__": f"k{i:04d}", "txt": b"x"}, range(30), tmp_path / "ds", progress=False)
    found = KeyIndex.open(open_index(tmp_path / "ds"))
    assert found is not None and found.num_keys == 30
    assert found.lookup("k0007") and found.lookup(b"k0007") == found.lookup("k0007")
    assert found.lookup("absent") == []


# the command


def test_tokens_get_prints_the_tokens_or_the_text(dataset, capsys, tmp_path):
    dest, docs = dataset
    assert main(["tokens-get", str(dest), "naïve-café", "with.dots.in.it"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [" ".join(map(str, docs[i].tolist())) for i in ("naïve-café", "with.dots.in.it")]
    assert main(["tokens-get", str(dest), "absent-id"]) == 1
    err = capsys.readouterr().err
    assert err == f"shardstream: error: no document has the id 'absent-id' in {dest}\n"

    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"t{i}": i for i in range(1000)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()
    tok.save(str(tmp_path / "tok.json"))
    assert main(["tokens-get", str(dest), "plain", "--decode", str(tmp_path / "tok.json")]) == 0
    text = capsys.readouterr().out
    assert text == " ".join(f"t{i}" for i in docs["plain"].tolist()) + "\n"
    assert main(["tokens-get", str(dest), "plain", "--decode", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_tokens_get_builds_the_index(tmp_path, capsys):
    docs = write_dataset(tmp_path / "ds", ["a.b", "ç"])
    assert main(["tokens-get", str(tmp_path / "ds"), "a.b"]) == 1
    assert "--build-index" in capsys.readouterr().err
    assert main(["tokens-get", str(tmp_path / "ds"), "--build-index"]) == 0
    assert "2 document ids" in capsys.readouterr().out
    assert main(["tokens-get", str(tmp_path / "ds"), "ç"]) == 0
    assert capsys.readouterr().out == " ".join(map(str, docs["ç"].tolist())) + "\n"
    assert main(["tokens-get", str(tmp_path / "nowhere"), "ç"]) == 2


def test_an_import_to_s3_and_one_ranged_get_per_lookup(s3_config, s3_bucket, tmp_path):
    """An import into s3:// builds docids/ there; each lookup is one ranged GET of one bucket."""
    from shardstream.tokens import import_datatrove

    rng = np.random.default_rng(4)
    docs = [rng.integers(0, 60_000, int(rng.integers(1, 50))).astype(np.uint16) for _ in range(60)]
    (tmp_path / "f.ds").write_bytes(b"".join(d.tobytes() for d in docs))
    (tmp_path / "f.ds.index").write_bytes(np.cumsum([len(d) for d in docs]).astype("<u8").tobytes())
    url = f"s3://{s3_bucket}/ds"
    import_datatrove(tmp_path / "f.ds", url, max_shard_tokens=300, s3=s3_config)
    ids = TokenIds.open(url, s3=s3_config)
    store = ids.keys._get_store()
    calls = []
    real = store.get_range

    async def counted(name, start, end, **kwargs):
        calls.append((name, start, end))
        return await real(name, start, end, **kwargs)

    store.get_range = counted
    for n in range(20):
        assert ids.lookup(f"f:{n}")[0] >= 0
        assert len(calls) == n + 1 and calls[-1][0].startswith(f"{DOCIDS_DIR}/part-")
        assert calls[-1][2] - calls[-1][1] <= 8192
    for n, want in enumerate(docs):
        assert np.array_equal(ids.get(f"f:{n}"), want)
