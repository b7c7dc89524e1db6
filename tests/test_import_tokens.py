"""Importing Megatron and datatrove token files (:mod:`shardstream.tokens.imports`), checked
against independent oracles: Megatron's ``.bin``/``.idx`` written by megatron-core's own
``IndexedDatasetBuilder`` (several sequences a document, uint16 and int32) and read back by its
``IndexedDataset``; datatrove's ``.ds`` files written by its own ``DocumentTokenizer`` (a BPE
tokenizer trained here) and ``TokenizedFile``, read back with numpy per datatrove's format.
Token for token, boundary for boundary, every document by its id; bad inputs named;
``shardstream import-tokens`` and ``shardstream info`` on the result."""

from __future__ import annotations

import itertools
import os
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from shardstream.cli import main
from shardstream.errors import DestinationError, SourceError, SourceNotFoundError
from shardstream.tokens import TokenIds, TokenIndex, import_datatrove, import_megatron
from shardstream.tokens import imports as imports_module


@pytest.fixture(scope="module")
def megatron():
    """megatron-core's indexed_dataset module (slow to import: once a module)."""
    return pytest.importorskip("megatron.core.datasets.indexed_dataset")


def write_megatron(
    megatron, prefix: Path, *, dtype, high: int, docs: int = 120, seed: int = 0, empty_docs=(), trailing: int = 0
) -> None:
    """``PREFIX.bin``/``.idx`` by Megatron's builder: ``docs`` documents of 1-4 sequences (a
    sequence of 0 tokens now and then), ids below ``high``; documents ``empty_docs`` of no
    token; ``trailing`` sequences after the last document end."""
    import torch

    rng = np.random.default_rng(seed)
    builder = megatron.IndexedDatasetBuilder(str(prefix) + ".bin", dtype=dtype)
    for d in range(docs):
        if d not in empty_docs:
            for s in range(int(rng.integers(1, 5))):
                n = 0 if s and rng.random() < 0.1 else int(rng.integers(1, 60))
                builder.add_item(torch.from_numpy(rng.integers(0, high, n).astype(np.int64)))
        builder.end_document()
    for _ in range(trailing):
        builder.add_item(torch.from_numpy(rng.integers(0, high, 5).astype(np.int64)))
    builder.finalize(str(prefix) + ".idx")


def megatron_documents(megatron, prefix: Path) -> list[np.ndarray]:
    """The oracle: each Megatron document (its sequences joined), read by megatron-core's IndexedDataset."""
    ds = megatron.IndexedDataset(str(prefix))
    bounds = [int(b) for b in ds.document_indices]
    docs = []
    for a, b in itertools.pairwise(bounds):
        pieces = [np.asarray(ds[s]) for s in range(a, b)]
        docs.append(np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64))
    return docs


def imported_documents(dest: Path) -> list[tuple[str, np.ndarray]]:
    """Every document of a token dataset, in order: (id, tokens), read shard by shard."""
    tokens = TokenIndex.open(dest)
    out = []
    for shard in range(tokens.num_shards):
        ids, lengths = tokens.docids(shard), tokens.doclens(shard)
        data = tokens.read_tokens(shard, 0, tokens.column("num_tokens", shard))
        for doc_id, piece in zip(ids, np.split(data, np.cumsum(lengths)[:-1])):
            assert np.array_equal(piece, tokens.document(shard, len(out) - int(tokens.doc_starts[shard])))
            out.append((doc_id, piece))
    return out


def check_documents(dest: Path, expected: list[tuple[str, np.ndarray]]) -> None:
    """The dataset holds exactly ``expected`` (id, tokens), in order, and finds each by id."""
    got = imported_documents(dest)
    assert [i for i, _ in got] == [i for i, _ in expected]
    for (doc_id, piece), (_, want) in zip(got, expected):
        assert np.array_equal(piece.astype(np.int64), want.astype(np.int64)), doc_id
    ids = TokenIds.open(dest)
    for doc_id, want in expected:
        assert np.array_equal(ids.get(doc_id).astype(np.int64), want.astype(np.int64)), doc_id


# Megatron


@pytest.mark.parametrize(
    ("dtype", "high", "stored"),
    [(np.uint16, 50_000, "uint16"), (np.int32, 100_000, "uint32"), (np.int32, 30_000, "uint16")],
    ids=["uint16", "int32-wide", "int32-narrow"],
)
def test_megatron_documents_match_indexed_dataset(megatron, tmp_path, dtype, high, stored):
    write_megatron(megatron, tmp_path / "corpus_text_document", dtype=dtype, high=high)
    oracle = megatron_documents(megatron, tmp_path / "corpus_text_document")
    report = import_megatron(tmp_path / "corpus_text_document", tmp_path / "ds", max_shard_tokens=500, eod_id=7)
    check_documents(tmp_path / "ds", [(f"corpus_text_document:{d}", doc) for d, doc in enumerate(oracle)])
    tokens = TokenIndex.open(tmp_path / "ds")
    largest = max(int(doc.max()) for doc in oracle)
    assert report.dtype == stored == tokens.tokens.fields["dtype"]
    assert report.vocab_size == tokens.tokens.fields["vocab_size"] == -(-(largest + 1) // 128) * 128
    assert report.num_docs == len(oracle) and report.num_tokens == sum(len(d) for d in oracle)
    assert report.num_shards == tokens.num_shards > 10 and tokens.tokens.columns["num_tokens"].max() <= 500
    assert report.docs_ending_with_eod == sum(int(d[-1] == 7) for d in oracle)
    assert tokens.eod_id == 7 and report.empty_docs == 0
    whole = np.fromfile(str(tmp_path / "corpus_text_document.bin"), dtype=dtype)
    assert np.array_equal(tokens.stream_tokens(0, tokens.num_tokens).astype(np.int64), whole.astype(np.int64))


def test_megatron_several_prefixes_and_empty_documents(megatron, tmp_path, monkeypatch):
    monkeypatch.setattr(imports_module, "_DOC_WINDOW", 7)  # windows of document boundaries, and index chunks
    monkeypatch.setattr(imports_module, "_CHUNK", 5)
    monkeypatch.setattr(imports_module, "_SCAN", 11)
    write_megatron(megatron, tmp_path / "a", dtype=np.int32, high=70_000, docs=40, empty_docs=(0, 13, 14))
    write_megatron(megatron, tmp_path / "b", dtype=np.int32, high=500, docs=30, seed=1)
    expected = []
    for name in ("a", "b"):
        docs = megatron_documents(megatron, tmp_path / name)
        expected += [(f"{name}:{d}", doc) for d, doc in enumerate(docs) if len(doc)]
    report = import_megatron([tmp_path / "a.bin", str(tmp_path / "b.idx")], tmp_path / "ds", max_shard_tokens=300)
    check_documents(tmp_path / "ds", expected)
    assert report.empty_docs == 3 and report.dtype == "uint32" and report.docs_ending_with_eod is None
    assert report.sources == (str(tmp_path / "a.bin"), str(tmp_path / "b.bin"))


def test_megatron_a_directory_of_pairs(megatron, tmp_path):
    (tmp_path / "in").mkdir()
    write_megatron(megatron, tmp_path / "in" / "y", dtype=np.uint16, high=1000, docs=10)
    write_megatron(megatron, tmp_path / "in" / "x", dtype=np.uint16, high=1000, docs=10, seed=2)
    import_megatron(tmp_path / "in", tmp_path / "ds")
    got = [i for i, _ in imported_documents(tmp_path / "ds")]
    assert got == [f"x:{d}" for d in range(10)] + [f"y:{d}" for d in range(10)]


def test_megatron_a_given_vocab_size_is_checked(megatron, tmp_path):
    write_megatron(megatron, tmp_path / "m", dtype=np.uint16, high=60_000, docs=20)
    with pytest.raises(SourceError, match=r"m\.bin: document m:\d+ holds the token id \d+, not below vocab_size 100"):
        import_megatron(tmp_path / "m", tmp_path / "ds", vocab_size=100)
    report = import_megatron(tmp_path / "m", tmp_path / "ds2", vocab_size=100_000)
    assert report.dtype == "uint32" and report.vocab_size == 100_000  # the vocabulary decides the dtype


def test_megatron_bad_inputs_are_named(megatron, tmp_path):
    write_megatron(megatron, tmp_path / "m", dtype=np.int32, high=1000, docs=20)
    base = tmp_path / "m"
    (tmp_path / "lone").mkdir()
    shutil.copy(f"{base}.bin", tmp_path / "lone" / "m.bin")
    with pytest.raises(SourceNotFoundError) as caught:
        import_megatron(tmp_path / "lone" / "m.bin", tmp_path / "ds")
    assert f"{tmp_path}/lone/m.idx: no such file (the index of {tmp_path}/lone/m.bin)" in str(caught.value)
    with pytest.raises(SourceNotFoundError, match=r"nothing\.bin: no such file"):
        import_megatron(tmp_path / "nothing", tmp_path / "ds")

    data = (tmp_path / "m.bin").read_bytes()
    (tmp_path / "short").mkdir()
    shutil.copy(f"{base}.idx", tmp_path / "short" / "m.idx")
    (tmp_path / "short" / "m.bin").write_bytes(data[:-8])
    with pytest.raises(SourceError, match=r"short/m\.bin: \d+ bytes, where .*short/m\.idx makes \d+ int32 .*truncated"):
        import_megatron(tmp_path / "short" / "m", tmp_path / "ds")
    (tmp_path / "short" / "m.bin").write_bytes(data + b"\0\0\0\0")
    with pytest.raises(SourceError, match="longer than its index says"):
        import_megatron(tmp_path / "short" / "m", tmp_path / "ds")
    shutil.copy(f"{base}.bin", tmp_path / "short" / "m.bin")
    (tmp_path / "short" / "m.idx").write_bytes((tmp_path / "m.idx").read_bytes()[:-4])
    with pytest.raises(SourceError, match=r"short/m\.idx: \d+ bytes, where its header .* truncated or damaged"):
        import_megatron(tmp_path / "short" / "m", tmp_path / "ds")
    (tmp_path / "short" / "m.idx").write_bytes(b"not an index at all, not at all")
    with pytest.raises(SourceError, match="not a Megatron index"):
        import_megatron(tmp_path / "short" / "m", tmp_path / "ds")
    write_megatron(megatron, tmp_path / "trailing", dtype=np.uint16, high=100, docs=3, trailing=2)
    with pytest.raises(SourceError, match=r"trailing\.idx: 2 sequences after the last document end"):
        import_megatron(tmp_path / "trailing", tmp_path / "ds")

    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "x").write_text("x")
    with pytest.raises(DestinationError, match="holds 1 files already"):
        import_megatron(base, tmp_path / "ds")
    (tmp_path / "other").mkdir()
    shutil.copy(f"{base}.bin", tmp_path / "other" / "m.bin")
    shutil.copy(f"{base}.idx", tmp_path / "other" / "m.idx")
    with pytest.raises(SourceError, match="both named 'm'"):
        import_megatron([base, tmp_path / "other" / "m"], tmp_path / "ds2")
    assert not (tmp_path / "ds2").exists() or not os.listdir(tmp_path / "ds2")


def test_megatron_multimodal_modes(megatron, tmp_path):
    import torch

    builder = megatron.IndexedDatasetBuilder(str(tmp_path / "t.bin"), dtype=np.uint16, multimodal=True)
    builder.add_item(torch.tensor([1, 2, 3]), mode=0)
    builder.end_document()
    builder.finalize(str(tmp_path / "t.idx"))
    assert import_megatron(tmp_path / "t", tmp_path / "ok").num_tokens == 3  # every mode 0: text
    builder = megatron.IndexedDatasetBuilder(str(tmp_path / "v.bin"), dtype=np.uint16, multimodal=True)
    builder.add_item(torch.tensor([1, 2, 3]), mode=1)
    builder.end_document()
    builder.finalize(str(tmp_path / "v.idx"))
    with pytest.raises(SourceError, match=r"v\.idx: a multimodal Megatron dataset"):
        import_megatron(tmp_path / "v", tmp_path / "no")


# datatrove

TEXTS_WORDS = ["alpha", "beta", "gamma", "delta", "naïve", "日本語", "x.y", "zeta", "ε"]


@pytest.fixture(scope="module")
def bpe_tokenizer(tmp_path_factory) -> tuple[Path, list[str]]:
    """A byte-level BPE tokenizer trained here on random texts (nothing downloaded), and the texts."""
    tokenizers = pytest.importorskip("tokenizers")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(TEXTS_WORDS, int(rng.integers(1, 40)))) for _ in range(300)]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<unk>", "<eos>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path, texts


def datatrove_documents(path: Path) -> list[tuple[str, np.ndarray]]:
    """The oracle: a .ds read with numpy per datatrove's format (tokens back to back, uint64 ends)."""
    size = int(open(f"{path}.metadata").readline().strip().rsplit("|", 1)[1])
    tokens = np.fromfile(path, dtype=np.uint16 if size == 2 else np.uint32)
    ends = np.fromfile(f"{path}.index", dtype=np.uint64).astype(np.int64)
    assert ends[-1] == len(tokens)
    name = path.name.removesuffix(".ds")
    return [(f"{name}:{d}", piece) for d, piece in enumerate(np.split(tokens, ends[:-1]))]


def test_datatrove_tokenizer_output_matches_the_files(bpe_tokenizer, tmp_path, capsys):
    pytest.importorskip("datatrove")
    from datatrove.data import Document
    from datatrove.pipeline.tokens.tokenizer import DocumentTokenizer

    path, texts = bpe_tokenizer
    step = DocumentTokenizer(
        str(tmp_path / "dt"),
        tokenizer_name_or_path=str(path),
        eos_token="<eos>",
        save_filename="web",
        seed=1,
        max_tokens_per_file=3000,  # shuffled, then split in several files
    )
    step.run(iter([Document(text=t, id=str(i)) for i, t in enumerate(texts)]), rank=0, world_size=1)
    files = sorted((tmp_path / "dt").glob("*.ds"))
    assert len(files) >= 3
    expected = [doc for f in files for doc in datatrove_documents(f)]
    eos = 1  # "<eos>", the second special token
    report = import_datatrove(tmp_path / "dt", tmp_path / "ds", eod_id=eos, max_shard_tokens=1000)
    check_documents(tmp_path / "ds", expected)
    tokens = TokenIndex.open(tmp_path / "ds")
    assert report.num_docs == len(texts) == report.docs_ending_with_eod
    assert report.dtype == "uint16" and report.vocab_size == 384  # largest id 319 + 1, rounded up to 128
    assert tokens.tokens.fields["tokenizer"]["name"] == str(path)
    assert len(tokens.tokens.fields["tokenizer"]["sha256"]) == 64

    doc_id = expected[5][0]
    assert main(["tokens-get", str(tmp_path / "ds"), doc_id, "--decode", str(path)]) == 0
    text = capsys.readouterr().out[:-1]
    assert text.endswith("<eos>") and text.removesuffix("<eos>") in texts


def test_datatrove_four_byte_tokens(tmp_path):
    pytest.importorskip("datatrove")
    from datatrove.pipeline.tokens.tokenizer import TokenizedFile

    rng = np.random.default_rng(5)
    out = TokenizedFile(str(tmp_path / "dt"), "big.ds", token_size=4, save_final_metadata=True)
    written = []
    for _ in range(50):
        doc = rng.integers(0, 200_000, int(rng.integers(1, 90))).tolist()
        out.write(doc, None)
        written.append(doc)
    out.close()
    assert open(tmp_path / "dt" / "big.ds.metadata").readline().strip() == "Unknown Tokenizer|4|4"
    expected = datatrove_documents(tmp_path / "dt" / "big.ds")
    assert [d.tolist() for _, d in expected] == written
    report = import_datatrove(tmp_path / "dt" / "big.ds", tmp_path / "ds", max_shard_tokens=700)
    check_documents(tmp_path / "ds", expected)
    assert report.dtype == "uint32" and TokenIndex.open(tmp_path / "ds").tokens.fields["tokenizer"] is None


def test_datatrove_bad_inputs_are_named(tmp_path):
    pytest.importorskip("datatrove")
    from datatrove.pipeline.tokens.tokenizer import TokenizedFile

    out = TokenizedFile(str(tmp_path / "dt"), "f.ds", save_final_metadata=True, tokenizer_name_or_path="gpt2")
    for n in (3, 5, 7):
        out.write(list(range(n)), None)
    out.close()
    f = tmp_path / "dt" / "f.ds"
    (tmp_path / "noindex").mkdir()
    shutil.copy(f, tmp_path / "noindex" / "f.ds")
    with pytest.raises(SourceNotFoundError, match=r"noindex/f\.ds\.index: no such file .*save_index=True"):
        import_datatrove(tmp_path / "noindex" / "f.ds", tmp_path / "ds")
    (tmp_path / "short").mkdir()
    shutil.copy(f"{f}.index", tmp_path / "short" / "f.ds.index")
    shutil.copy(f"{f}.metadata", tmp_path / "short" / "f.ds.metadata")
    (tmp_path / "short" / "f.ds").write_bytes(f.read_bytes()[:-2])
    with pytest.raises(SourceError, match=r"short/f\.ds: 28 bytes, where .*f\.ds\.index makes 15 tokens .*truncated"):
        import_datatrove(tmp_path / "short" / "f.ds", tmp_path / "ds")
    (tmp_path / "short" / "f.ds.metadata").write_text("gpt2|4\n15\n15 T")
    shutil.copy(f, tmp_path / "short" / "f.ds")
    with pytest.raises(SourceError, match="makes 15 tokens of 4 bytes"):
        import_datatrove(tmp_path / "short" / "f.ds", tmp_path / "ds")
    (tmp_path / "short" / "f.ds.metadata").unlink()  # no metadata: the token size from the sizes
    report = import_datatrove(tmp_path / "short", tmp_path / "ds")
    assert (report.num_docs, report.num_tokens) == (3, 15)
    assert TokenIndex.open(tmp_path / "ds").tokens.fields["tokenizer"] is None
    report = import_datatrove(f, tmp_path / "ds2")
    assert TokenIndex.open(tmp_path / "ds2").tokens.fields["tokenizer"] == {"name": "gpt2", "sha256": None}


# the commands


def test_import_tokens_command_and_info(megatron, tmp_path, capsys):
    write_megatron(megatron, tmp_path / "m", dtype=np.uint16, high=5000, docs=30)
    oracle = megatron_documents(megatron, tmp_path / "m")
    dest = tmp_path / "ds"
    argv = ["import-tokens", str(tmp_path / "m.bin"), str(dest), "--eod-id", "3", "--max-shard-tokens", "400"]
    assert main([*argv, "--no-progress", "--tokenizer", "gpt2"]) == 0
    out = capsys.readouterr().out
    tokens = sum(len(d) for d in oracle)
    assert out.startswith(f"imported 1 Megatron file into {dest}: ")
    assert f"30 documents, {tokens:,} tokens (uint16, vocab_size 5120, eod id 3: " in out
    assert out.count("\n") == 1
    check_documents(dest, [(f"m:{d}", doc) for d, doc in enumerate(oracle)])

    assert main(["info", str(dest)]) == 0
    info = capsys.readouterr().out
    num_shards = TokenIndex.open(dest).num_shards
    assert info.startswith(f"{dest}: {num_shards} shards, {num_shards} samples")  # the samples' lines, unchanged
    assert f"tokens: {tokens:,} in 30 documents, uint16, vocab_size 5120, eod id 3\n" in info
    assert "tokenizer: gpt2\n" in info
    assert "document length in tokens: p1 " in info and ", max " in info
    assert "tokens per shard: min " in info
    assert f"source: megatron: {tmp_path / 'm.bin'}" in info and "document ids: docids/" in info

    assert main(["tokens-get", str(dest), "m:4"]) == 0
    assert capsys.readouterr().out.split() == [str(t) for t in oracle[4].tolist()]


def test_import_tokens_command_errors(megatron, tmp_path, capsys):
    write_megatron(megatron, tmp_path / "m", dtype=np.uint16, high=5000, docs=5)
    os.unlink(tmp_path / "m.idx")
    assert main(["import-tokens", str(tmp_path / "m.bin"), str(tmp_path / "ds"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"shardstream: error: {tmp_path}/m.idx: no such file (the index of {tmp_path}/m.bin)")
    assert err.count("\n") == 1
    (tmp_path / "x.txt").write_text("x")
    assert main(["import-tokens", str(tmp_path / "x.txt"), str(tmp_path / "ds"), "--no-progress"]) == 2
    assert "--from megatron|datatrove" in capsys.readouterr().err
    assert main(["import-tokens", str(tmp_path / "a.ds"), str(tmp_path / "m.bin"), str(tmp_path / "ds")]) == 2
    assert "mix Megatron and datatrove" in capsys.readouterr().err


# bounded memory


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_large_import_holds_a_shard_not_the_file(megatron, tmp_path):
    """32 Mi int32 tokens (128 MB on disk), shards of 1 Mi: the import's numpy memory stays
    near a shard's (tracemalloc sees numpy's buffers; the memory-mapped input is not the heap)."""
    rng = np.random.default_rng(9)
    builder = megatron.IndexedDatasetBuilder(str(tmp_path / "big.bin"), dtype=np.int32)
    num_docs = 0
    for _ in range(32):
        lengths = rng.integers(1, 4000, 1200)
        lengths = lengths[np.cumsum(lengths) <= 1 << 20]
        builder.add_document(rng.integers(0, 100_000, int(lengths.sum())), lengths.tolist())
        num_docs += 1
    builder.finalize(str(tmp_path / "big.idx"))
    whole = np.memmap(tmp_path / "big.bin", dtype=np.int32, mode="r")
    tracemalloc.start()
    try:
        report = import_megatron(tmp_path / "big", tmp_path / "ds", max_shard_tokens=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.num_tokens == len(whole) and report.num_docs == num_docs and report.dtype == "uint32"
    assert peak < 40 * 2**20, (
        f"peak {peak / 2**20:.0f} MiB for shards of 4 MiB and an input of {whole.nbytes >> 20} MiB"
    )
    tokens = TokenIndex.open(tmp_path / "ds")
    for start in range(0, len(whole), 7_777_777):
        assert np.array_equal(tokens.stream_tokens(start, start + 1000), whole[start : start + 1000])
