"""``pack_tokens`` / ``shardstream pack-text``: documents -> token shards + index.bin + tokens.bin,
checked against independent oracles: the tokenizer's own ``encode(text).ids + [eod]`` per
document, read back both through ``TokenIndex`` and through plain ``tarfile`` + ``numpy.load``
on the shards; every input format gives the same tokens; bad records are reported by file and
line and nothing else is lost; a killed run resumes byte-identical; parallel streams and parts
are deterministic; foreign files are refused; S3 sources; Ray; the format's overhead."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from text_fixtures import (
    EOD,
    make_docs,
    train_tokenizer,
    write_gz,
    write_hf,
    write_jsonl,
    write_parquet,
    write_zst,
)

from shardstream import S3Config
from shardstream.errors import DestinationError, SourceError, UnreadableFileError
from shardstream.index import open_index
from shardstream.storage import open_store
from shardstream.tokens import TokenIndex, pack_tokens

SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "bpe" / "tokenizer.json")


@pytest.fixture(scope="module")
def tokenizer(tokenizer_path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_path))


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return make_docs(600, seed=5)


def expected(tokenizer, docs, eod: int | None = 0) -> list[list[int]]:
    """The oracle: each document's ``encode(text).ids`` and the end token."""
    return [tokenizer.encode(d["text"]).ids + ([] if eod is None else [eod]) for d in docs]


def read_tar(dest: Path) -> list[tuple[str, list[int]]]:
    """``(id, tokens)`` of every document, from the shards (index order: by name) with tarfile
    and numpy alone."""
    out = []
    for shard in sorted(dest.glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = {m.name.split(".", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}
        assert list(members) == ["tokens.npy", "doclens.npy", "docids.json.gz"]
        tokens = np.load(io.BytesIO(members["tokens.npy"]))
        lengths = np.load(io.BytesIO(members["doclens.npy"]))
        ids = json.loads(gzip.decompress(members["docids.json.gz"]))
        assert lengths.dtype == np.uint32 and int(lengths.sum()) == len(tokens) == len(tokens.ravel())
        starts = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
        out += [(i, tokens[a:b].tolist()) for i, a, b in zip(ids, starts[:-1], starts[1:])]
    return out


def read_index(dest: Path | str, s3=None) -> list[tuple[str, list[int]]]:
    """The same through TokenIndex: the stream, cut by each shard's lengths table."""
    index = TokenIndex.open(dest, s3=s3)
    stream = index.stream_tokens(0, index.num_tokens)
    out, at = [], 0
    for shard in range(index.num_shards):
        for doc_id, n in zip(index.docids(shard), index.doclens(shard).tolist()):
            out.append((doc_id, stream[at : at + n].tolist()))
            at += n
    assert at == index.num_tokens == len(stream)
    return out


def dataset_bytes(dest: Path) -> dict[str, bytes]:
    """Every file of a dataset (shards, tables, index.bin, tokens.bin, the report, docids/), not
    its pack state."""
    files = {p.relative_to(dest).as_posix(): p for p in sorted(dest.rglob("*")) if p.is_file()}
    return {name: p.read_bytes() for name, p in files.items() if not name.startswith(".shardstream/")}


def report_lines(dest: Path) -> list[dict]:
    return [json.loads(line) for line in (dest / "pack-report.jsonl").read_text().splitlines()]


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHARDSTREAM, *args], capture_output=True, text=True, env=env, timeout=timeout)


# ------------------------------------------------------------------------------------------ round trip


def test_every_document_comes_back_as_the_tokenizer_encodes_it(tmp_path, tokenizer_path, tokenizer, docs):
    src = write_jsonl(tmp_path / "src" / "part.jsonl", docs)
    report = pack_tokens(src, tmp_path / "out", tokenizer=tokenizer_path, max_shard_tokens=20_000, progress=False)
    want = expected(tokenizer, docs)
    ids = [f"part.jsonl:{i + 1}" for i in range(len(docs))]  # RELPATH:LINE, lines from 1
    assert read_tar(tmp_path / "out") == list(zip(ids, want))
    assert read_index(tmp_path / "out") == list(zip(ids, want))

    index = TokenIndex.open(tmp_path / "out")
    assert index.num_docs == len(docs) == report.num_docs and index.num_tokens == sum(map(len, want))
    assert report.num_tokens == index.num_tokens and report.num_shards == index.num_shards > 3
    lengths = np.concatenate([index.doclens(s) for s in range(index.num_shards)])
    assert lengths.tolist() == [len(w) for w in want]
    assert all(index.column("num_tokens", s) <= 20_000 for s in range(index.num_shards))
    fields = index.tokens.fields
    assert fields["dtype"] == "uint16" and fields["vocab_size"] == 1000 and fields["eod_id"] == 0
    import hashlib

    sha = hashlib.sha256(tokenizer_path.read_bytes()).hexdigest()
    assert fields["tokenizer"] == {"name": "bpe", "sha256": sha, "eod": EOD}
    assert fields["source"] == str(src)
    assert report.skipped == 0 and (tmp_path / "out" / "pack-report.jsonl").read_bytes() == b""
    assert "600 documents" in report.summary() and "index" in report.summary()
    assert open_index(tmp_path / "out").num_shards == index.num_shards  # a plain shardstream dataset too

    again = pack_tokens(src, tmp_path / "out", tokenizer=tokenizer_path, max_shard_tokens=20_000, progress=False)
    assert again.already_complete and "nothing to do" in again.summary()

    # batches of any size make the same bytes; a document longer than a shard gets one of its own
    pack_tokens(src, tmp_path / "b7", tokenizer=tokenizer_path, max_shard_tokens=20_000, batch_size=7, progress=False)
    assert dataset_bytes(tmp_path / "b7") == dataset_bytes(tmp_path / "out")
    pack_tokens(src, tmp_path / "tiny", tokenizer=tokenizer_path, max_shard_tokens=150, progress=False)
    tiny = TokenIndex.open(tmp_path / "tiny")
    counts = [(tiny.column("num_docs", s), tiny.column("num_tokens", s)) for s in range(tiny.num_shards)]
    assert all(n == 1 or t <= 150 for n, t in counts) and any(t > 150 for _, t in counts)
    assert read_index(tmp_path / "tiny") == list(zip(ids, want))


def test_every_format_gives_the_same_tokens(tmp_path, tokenizer_path, tokenizer, docs):
    few = docs[:150]
    want = expected(tokenizer, few)
    sources = {
        "jsonl": write_jsonl(tmp_path / "jsonl" / "d.jsonl", few),
        "gz": write_gz(tmp_path / "gz" / "d.jsonl.gz", few),
        "zst": write_zst(tmp_path / "zst" / "d.jsonl.zst", few),
        "parquet": write_parquet(tmp_path / "parquet" / "d.parquet", few, row_group_size=40),
        "hf": write_hf(tmp_path / "hf", few, num_shards=2),
    }
    for kind, src in sources.items():
        out = tmp_path / f"out-{kind}"
        pack_tokens(src, out, tokenizer=tokenizer_path, id_field="id", max_shard_tokens=9_000, progress=False)
        assert read_tar(out) == [(d["id"], w) for d, w in zip(few, want)], kind
        assert read_index(out) == read_tar(out), kind
        assert (out / "pack-report.jsonl").read_bytes() == b"", kind  # HF's state.json etc. are no problem
    # default ids: RELPATH:LINE (from 1) for JSON Lines, RELPATH:ROW (from 0) for Parquet and Arrow
    pack_tokens(sources["parquet"], tmp_path / "rows", tokenizer=tokenizer_path, progress=False)
    assert [i for i, _ in read_tar(tmp_path / "rows")] == [f"d.parquet:{r}" for r in range(150)]
    pack_tokens(tmp_path / "hf", tmp_path / "hf-rows", tokenizer=tokenizer_path, progress=False)
    arrow = sorted(p.name for p in (tmp_path / "hf").glob("*.arrow"))
    assert len(arrow) == 2
    ids = [i for i, _ in read_tar(tmp_path / "hf-rows")]
    assert ids == [f"{arrow[0]}:{r}" for r in range(75)] + [f"{arrow[1]}:{r}" for r in range(75)]

    # a folder of them all, walked recursively in sorted order (a folder's files, then its subfolders)
    tree = tmp_path / "tree"
    write_zst(tree / "b.jsonl.zst", few[:50])
    write_jsonl(tree / "a.jsonl", few[50:100])
    write_parquet(tree / "sub" / "c.parquet", few[100:], row_group_size=16)
    (tree / "README.md").write_text("not text")
    report = pack_tokens(tree, tmp_path / "out-tree", tokenizer=tokenizer_path, id_field="id", progress=False)
    order = few[50:100] + few[:50] + few[100:]
    assert read_index(tmp_path / "out-tree") == [(d["id"], w) for d, w in zip(order, expected(tokenizer, order))]
    assert report_lines(tmp_path / "out-tree") == [
        {"file": str(tree / "README.md"), "kind": "not_text", "reason": report.problems[0].reason}
    ]


# ------------------------------------------------------------------------------------------ problems


BAD = [
    {"id": "ok.1", "text": "alpha beta gamma"},
    "not json at all",
    {"id": "ok.2", "text": "delta"},
    {"id": "no.text"},
    {"id": "int.text", "text": 7},
    "",  # a blank line: no document, no problem
    {"text": "no id here"},
    {"id": "empty", "text": ""},
    {"id": "surrogate", "text": "bad \\ud800 text"},  # valid JSON, text the tokenizer refuses
    {"id": "ok.3", "text": "epsilon zeta"},
    "[1, 2]",
    {"id": "bad \\udc80 id", "text": "fine text"},  # an id that is no valid Unicode
]


def write_bad(path: Path) -> Path:
    lines = [d if isinstance(d, str) else json.dumps(d) for d in BAD]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).replace("\\\\ud800", "\\ud800").replace("\\\\udc80", "\\udc80") + "\n")
    return path


def test_bad_records_are_reported_by_file_and_line_and_nothing_else_is_lost(tmp_path, tokenizer_path, tokenizer):
    bad = write_bad(tmp_path / "src" / "bad.jsonl")
    assert "\\ud800" in bad.read_text()
    good = make_docs(30, seed=8)
    write_jsonl(tmp_path / "src" / "good.jsonl", good)
    report = pack_tokens(
        tmp_path / "src", tmp_path / "out", tokenizer=tokenizer_path, id_field="id", batch_size=4, progress=False
    )
    kept = [BAD[0], BAD[2], BAD[9], *good]
    assert read_index(tmp_path / "out") == [(d["id"], w) for d, w in zip(kept, expected(tokenizer, kept))]
    found = [(p["file"], p["line"], p["kind"]) for p in report_lines(tmp_path / "out")]
    assert found == [
        (str(bad), 2, "bad_json"),
        (str(bad), 4, "no_text"),
        (str(bad), 5, "no_text"),
        (str(bad), 7, "no_id"),
        (str(bad), 8, "empty"),
        (str(bad), 9, "tokenizer_error"),
        (str(bad), 11, "bad_json"),
        (str(bad), 12, "bad_id"),
    ]
    assert report.skipped == 8 and "8 skipped" in report.summary()

    # raise (and its older word fail): the first bad record stops the pack, named by file and line
    for word in ("raise", "fail"):
        with pytest.raises(SourceError, match=rf"{bad}:2: not JSON"):
            pack_tokens(bad, tmp_path / f"stop-{word}", tokenizer=tokenizer_path, on_error=word, progress=False)
    # empty documents never stop a pack
    write_jsonl(tmp_path / "e" / "e.jsonl", [{"text": ""}, {"text": "word"}])
    done = pack_tokens(tmp_path / "e", tmp_path / "out-e", tokenizer=tokenizer_path, on_error="raise", progress=False)
    assert done.num_docs == 1 and [p.kind for p in done.problems] == ["empty"]


def test_parquet_nulls_and_damaged_files_are_reported_by_row(tmp_path, tokenizer_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"text": ["one two", None, "three"]}), src / "a.parquet")
    pq.write_table(pa.table({"body": ["x"]}), src / "b.parquet")  # no text column
    (src / "c.parquet").write_bytes(b"PAR1 not really")
    docs = make_docs(40, seed=2)
    write_gz(src / "d.jsonl.gz", docs)
    more = make_docs(60, seed=4)
    (src / "e.jsonl.gz").write_bytes(write_gz(tmp_path / "e.jsonl.gz", more).read_bytes()[:-300])  # cut short
    report = pack_tokens(src, tmp_path / "out", tokenizer=tokenizer_path, progress=False)
    got = read_index(tmp_path / "out")
    assert got[:2] == [
        ("a.parquet:0", tokenizer.encode("one two").ids + [0]),
        ("a.parquet:2", tokenizer.encode("three").ids + [0]),
    ]
    assert got[2 : 2 + len(docs)] == [(f"d.jsonl.gz:{i + 1}", w) for i, w in enumerate(expected(tokenizer, docs))]
    rest = got[2 + len(docs) :]  # the lines of e.jsonl.gz before it breaks off
    assert 10 < len(rest) < len(more)
    assert rest == [(f"e.jsonl.gz:{i + 1}", w) for i, w in enumerate(expected(tokenizer, more[: len(rest)]))]
    problems = {
        (p["file"].rsplit("/", 1)[-1], p.get("row", p.get("line")), p["kind"]) for p in report_lines(tmp_path / "out")
    }
    truncated = len(got) - 2 - len(docs) + 1  # the line where e.jsonl.gz breaks off
    assert problems == {
        ("a.parquet", 1, "no_text"),
        ("b.parquet", None, "no_text"),
        ("c.parquet", None, "unreadable"),
        ("e.jsonl.gz", truncated, "unreadable"),
    }
    assert report.skipped == 4
    with pytest.raises(UnreadableFileError, match="c.parquet"):
        pack_tokens(src / "c.parquet", tmp_path / "stop", tokenizer=tokenizer_path, on_error="raise", progress=False)


class OneText:
    """A callable tokenizer: one text -> its ids; raises on a text holding BOOM."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path))

    def __call__(self, text: str) -> list[int]:
        if "BOOM" in text:
            raise RuntimeError("cannot take BOOM")
        return self.tokenizer.encode(text).ids


class BatchText(OneText):
    """A callable tokenizer: a list of texts -> their ids."""

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return [super(BatchText, self).__call__(t) for t in texts]


def test_a_callable_tokenizer_and_one_that_fails_on_a_document(tmp_path, tokenizer_path, tokenizer):
    docs = make_docs(40, seed=3)
    docs[17]["text"] += " BOOM"
    src = write_jsonl(tmp_path / "c.jsonl", docs)
    kept = docs[:17] + docs[18:]
    want = [(f"c.jsonl:{i + 1}", w) for i, w in zip([*range(17), *range(18, 40)], expected(tokenizer, kept, eod=0))]
    for kind, fn, batched in (("one", OneText(tokenizer_path), False), ("batch", BatchText(tokenizer_path), True)):
        out = tmp_path / kind
        report = pack_tokens(
            src, out, tokenizer=fn, batched=batched, vocab_size=1000, eod_id=0, batch_size=8, progress=False
        )
        assert read_index(out) == want, kind
        assert [(p.line, p.kind) for p in report.problems] == [(18, "tokenizer_error")]
        assert "cannot take BOOM" in report.problems[0].reason
        assert TokenIndex.open(out).tokens.fields["tokenizer"] == {
            "name": type(fn).__qualname__,
            "sha256": None,
            "eod": None,
        }
    with pytest.raises(ValueError, match="vocab_size"):
        pack_tokens(src, tmp_path / "x", tokenizer=OneText(tokenizer_path), eod_id=0, progress=False)
    # no end token: documents end without one
    pack_tokens(src, tmp_path / "no-eod", tokenizer=tokenizer_path, append_eod=False, progress=False)
    index = TokenIndex.open(tmp_path / "no-eod")
    assert index.eod_id is None and read_index(tmp_path / "no-eod")[0][1] == tokenizer.encode(docs[0]["text"]).ids


# ------------------------------------------------------------------------------------------ parallel, parts


def test_two_workers_are_complete_and_deterministic(tmp_path, tokenizer_path, tokenizer, docs, monkeypatch):
    src = write_jsonl(tmp_path / "big.jsonl", docs)
    assert src.stat().st_size > 10 * 40_000  # cut into runs of lines that the workers share
    runs = []
    for run in ("a", "b"):
        out = tmp_path / run
        pack_tokens(
            src, out, tokenizer=tokenizer_path, workers=2, chunk_bytes=40_000, max_shard_tokens=15_000, progress=False
        )
        runs.append(dataset_bytes(out))
    assert runs[0] == runs[1]
    got = read_tar(tmp_path / "a")
    want = {f"big.jsonl:{i + 1}": w for i, w in enumerate(expected(tokenizer, docs))}
    assert len(got) == len(want) and dict(got) == want  # every document once, ids from the right lines
    streams = {int(n.split("-")[1].split(".")[0]) % 2 for n in runs[0] if n.endswith(".tar")}
    assert streams == {0, 1}

    # parts 0/2 and 1/2 (one worker each; the second from torchrun's variables) make the very
    # dataset two workers make
    from shardstream.packing import Part

    options = {"tokenizer": tokenizer_path, "chunk_bytes": 40_000, "max_shard_tokens": 15_000, "progress": False}
    first = pack_tokens(src, tmp_path / "parts", part=Part(0, 2), **options)
    assert first.dataset is None and "other parts unfinished" in first.summary()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    second = pack_tokens(src, tmp_path / "parts", **options)
    assert second.dataset is not None and second.dataset["num_docs"] == len(docs)
    assert dataset_bytes(tmp_path / "parts") == runs[0]


def worker_processes(parent: int) -> list[int]:
    """The spawned worker processes of ``parent`` (from /proc)."""
    pids = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    pids.append(int(child))
            except OSError:
                pass
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_killed_pack_resumes_byte_identical(tmp_path, tokenizer_path, docs):
    src = write_jsonl(tmp_path / "src" / "d.jsonl", docs * 2)
    args = ["pack-text", str(src), "--tokenizer", str(tokenizer_path), "--max-shard-tokens", "4000", "--workers", "2"]
    args += ["--chunk-size", "100000", "--batch-size", "50", "--no-progress"]
    options = {"max_shard_tokens": 4000, "workers": 2, "chunk_bytes": 100_000, "progress": False}
    pack_tokens(src, tmp_path / "clean", tokenizer=tokenizer_path, **options)  # the same run, uninterrupted

    dest = tmp_path / "killed"
    proc = subprocess.Popen([SHARDSTREAM, *args, str(dest)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not any((dest / ".shardstream").glob("s0000*-0000000.json")):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no shard recorded in 60 s"
            time.sleep(0.01)
        workers = worker_processes(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in workers):  # the workers die with it (PR_SET_PDEATHSIG)
            assert time.monotonic() < deadline, "a worker outlived its killed parent"
            time.sleep(0.05)
    finally:
        proc.kill()
    assert not (dest / "index.bin").exists(), "killed after the pack finished: nothing to resume"
    shards_before = len(list(dest.glob("*.tar")))
    resumed = cli(*args, str(dest))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "(resumed)" in resumed.stdout
    assert shards_before >= 1
    assert dataset_bytes(dest) == dataset_bytes(tmp_path / "clean")


def test_resuming_after_any_record_is_byte_identical(tmp_path, tokenizer_path, tokenizer, docs):
    """A crash after shard k was recorded (and shard k + 1 published, not recorded), at several
    k, in runs of lines of compressed and plain files, Parquet row groups and Arrow files."""
    src = tmp_path / "src"
    write_zst(src / "a.jsonl.zst", docs[:200])  # about 200 KB of text: runs of lines
    write_gz(src / "b.jsonl.gz", docs[200:300])
    write_jsonl(src / "c.jsonl", docs[300:400])
    write_parquet(src / "d.parquet", docs[400:500], row_group_size=30)
    write_hf(src / "e", docs[500:], num_shards=1)
    options = {"tokenizer": tokenizer_path, "chunk_bytes": 30_000, "max_shard_tokens": 5_000, "progress": False}
    whole = tmp_path / "whole"
    pack_tokens(src, whole, **options)
    plan = json.loads((whole / ".shardstream" / "text.json").read_text())["plan"]
    runs = [c for c in plan["chunks"] if plan["files"][c[0]][0] == "a.jsonl.zst"]
    assert len(runs) > 3 and [c[1] for c in runs][:2] == [0, runs[0][5]]  # (file, first line, ..., lines)
    want = expected(tokenizer, docs)
    assert [w for _, w in read_index(whole)] == want
    assert [i for i, _ in read_index(whole)][:201] == [f"a.jsonl.zst:{n + 1}" for n in range(200)] + ["b.jsonl.gz:1"]
    expected_bytes = dataset_bytes(whole)
    records = sorted((whole / ".shardstream").glob("s00000-0*.json"))
    for k in (0, len(records) // 3, len(records) // 2, len(records) - 2):
        crashed = tmp_path / f"crashed-{k}"
        shutil.copytree(whole, crashed)
        for name in (
            "index.bin",
            "tokens.bin",
            "pack-report.jsonl",
            ".shardstream/merged.json",
            ".shardstream/s00000-done.json",
        ):
            (crashed / name).unlink()
        shutil.rmtree(crashed / "docids")
        for record in records[k + 1 :]:
            (crashed / ".shardstream" / record.name).unlink()
        for shard in sorted(crashed.glob("tokens-*.tar*")):
            if int(shard.name.split("-")[1].split(".")[0]) > k + 1:
                shard.unlink()  # shard k + 1 stays: published, its record not yet written
        report = pack_tokens(src, crashed, **options)
        assert report.resumed and report.num_shards == len(records) - k - 1
        assert dataset_bytes(crashed) == expected_bytes, k


# ------------------------------------------------------------------------------------------ destination


def test_foreign_files_are_refused_and_overwrite_deletes_only_its_own(tmp_path, tokenizer_path, docs):
    src = write_jsonl(tmp_path / "src" / "d.jsonl", docs[:50])
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "tokens-000000.tar").write_bytes(b"another tool's shard")
    with pytest.raises(DestinationError, match="tokens-000000.tar"):
        pack_tokens(src, dest, tokenizer=tokenizer_path, progress=False)
    assert (dest / "tokens-000000.tar").read_bytes() == b"another tool's shard"
    (dest / "tokens-000000.tar").unlink()
    (dest / "tokens.bin").write_bytes(b"someone's file")
    with pytest.raises(DestinationError, match="tokens.bin"):
        pack_tokens(src, dest, tokenizer=tokenizer_path, progress=False)
    assert (dest / "tokens.bin").read_bytes() == b"someone's file"
    (dest / "docids").mkdir()
    (dest / "docids" / "header.bin").write_bytes(b"someone's index")
    with pytest.raises(DestinationError, match="docids/header.bin"):
        pack_tokens(src, dest, tokenizer=tokenizer_path, progress=False)
    pack_tokens(src, dest, tokenizer=tokenizer_path, clobber=True, progress=False)  # allowed to write over it
    assert TokenIndex.open(dest).num_docs == 50

    (dest / "notes.txt").write_text("mine")
    with pytest.raises(DestinationError, match="other options"):
        pack_tokens(src, dest, tokenizer=tokenizer_path, id_field="id", progress=False)
    with pytest.raises(DestinationError, match="inside SOURCE"):
        pack_tokens(tmp_path / "src", tmp_path / "src" / "out", tokenizer=tokenizer_path, progress=False)
    report = pack_tokens(
        src, dest, tokenizer=tokenizer_path, id_field="id", max_shard_tokens=3000, overwrite=True, progress=False
    )
    assert report.kept == ("notes.txt",) and (dest / "notes.txt").read_text() == "mine"
    assert [i for i, _ in read_index(dest)] == [d["id"] for d in docs[:50]]

    write_jsonl(tmp_path / "src" / "d.jsonl", docs[:60])  # SOURCE changed under an unfinished pack
    (dest / ".shardstream" / "s00000-done.json").unlink()
    (dest / "index.bin").unlink()
    with pytest.raises(DestinationError, match="SOURCE changed"):
        pack_tokens(src, dest, tokenizer=tokenizer_path, id_field="id", max_shard_tokens=3000, progress=False)


def test_no_document_at_all_is_an_error_that_leaves_nothing(tmp_path, tokenizer_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"body": "x"}\n{"body": "y"}\n')
    with pytest.raises(SourceError, match=r"no document.*a.jsonl:1: no field 'text'"):
        pack_tokens(src, tmp_path / "out", tokenizer=tokenizer_path, progress=False)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    (src / "a.jsonl").write_text('{"text": "now it has one"}\n')
    assert pack_tokens(src, tmp_path / "out", tokenizer=tokenizer_path, progress=False).num_docs == 1


def test_the_cli(tmp_path, tokenizer_path, tokenizer, docs):
    src = write_bad(tmp_path / "src" / "bad.jsonl")
    done = cli(
        "pack-text",
        str(src),
        str(tmp_path / "out"),
        "--tokenizer",
        str(tokenizer_path),
        "--id-field",
        "id",
        "--eod-id",
        "0",
    )
    assert done.returncode == 0, done.stderr
    assert f"skipped: {src}:2: not JSON" in done.stderr and "3 documents" in done.stdout and "8 skipped" in done.stdout
    assert len(report_lines(tmp_path / "out")) == 8
    stop = cli("pack-text", str(src), str(tmp_path / "stop"), "--tokenizer", str(tokenizer_path), "--on-error", "raise")
    assert stop.returncode == 1 and f"{src}:2: not JSON" in stop.stderr
    missing = cli(
        "pack-text", str(src), str(tmp_path / "x"), "--tokenizer", str(tokenizer_path), "--eod-token", "<nope>"
    )
    assert missing.returncode == 2 and "'<nope>' is not in its vocabulary" in missing.stderr
    assert "--eod-token" in cli("pack-text", "--help").stdout


# ------------------------------------------------------------------------------------------ overhead


def test_the_format_costs_under_2_percent_of_the_tokens(tmp_path, tokenizer_path, tokenizer):
    """Documents of 200-400 tokens with short ids: every byte of the dataset (shards, tables,
    index.bin, tokens.bin) over the tokens' own bytes."""
    pool = make_docs(2500, seed=11, min_words=60, max_words=200)
    sized = [d for d in pool if 200 <= len(tokenizer.encode(d["text"]).ids) + 1 <= 400]
    assert len(sized) > 1000
    for i, d in enumerate(sized):
        d["id"] = f"en.wiki.{i}"
    src = write_jsonl(tmp_path / "d.jsonl", sized)
    pack_tokens(src, tmp_path / "out", tokenizer=tokenizer_path, id_field="id", progress=False)
    index = TokenIndex.open(tmp_path / "out")
    files = dataset_bytes(tmp_path / "out")
    shards = [n for n in files if n.endswith((".tar", ".tar.samples"))]
    total = sum(len(files[n]) for n in [*shards, "index.bin", "tokens.bin"])
    ratio = total / (index.num_tokens * index.dtype.itemsize)
    docids = sum(len(b) for n, b in files.items() if n.startswith("docids/"))
    print(
        f"overhead: {ratio:.4f} of the token bytes ({index.num_docs} documents, {index.num_tokens} tokens); "
        f"the document-id index docids/ adds {docids / (index.num_tokens * index.dtype.itemsize):.4f}"
    )
    assert ratio <= 1.02, ratio


# ------------------------------------------------------------------------------------------ S3, Ray


def upload(src: Path, url: str, s3: S3Config) -> None:
    store = open_store(url, s3=s3)
    for path in sorted(src.rglob("*")):
        if path.is_file():
            store.write_bytes(path.relative_to(src).as_posix(), path.read_bytes())


@pytest.mark.slow
def test_an_s3_source_and_destination(tmp_path, tokenizer_path, tokenizer, docs, s3_bucket, s3_config):
    tree = tmp_path / "tree"
    write_zst(tree / "a" / "x.jsonl.zst", docs[:100])
    write_parquet(tree / "b.parquet", docs[100:200], row_group_size=30)
    write_jsonl(tree / "c.jsonl", docs[200:300])
    upload(tree, f"s3://{s3_bucket}/src", s3_config)
    local = tmp_path / "local"
    pack_tokens(tree, local, tokenizer=tokenizer_path, max_shard_tokens=10_000, progress=False)
    dest = f"s3://{s3_bucket}/out"
    report = pack_tokens(
        f"s3://{s3_bucket}/src/", dest, tokenizer=tokenizer_path, max_shard_tokens=10_000, s3=s3_config, progress=False
    )
    assert report.num_docs == 300
    order = docs[100:200] + docs[200:300] + docs[:100]  # b.parquet, c.jsonl, then folder a/
    got = read_index(dest, s3=s3_config)
    assert [w for _, w in got] == expected(tokenizer, order)
    assert got == read_index(local)  # ids are relative paths: the same as from local disk
    single = pack_tokens(
        f"s3://{s3_bucket}/src/b.parquet", tmp_path / "single", tokenizer=tokenizer_path, s3=s3_config, progress=False
    )
    assert single.num_docs == 100 and read_index(tmp_path / "single")[0][0] == "b.parquet:0"


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_ray_pack_is_the_same_as_one_machines(tmp_path, tokenizer_path, docs, ray_cluster):
    src = tmp_path / "src"
    for i in range(4):
        write_jsonl(src / f"f{i}.jsonl", docs[i * 100 : (i + 1) * 100])
    common = ["--tokenizer", str(tokenizer_path), "--max-shard-tokens", "8000", "--no-progress"]
    pack_tokens(src, tmp_path / "local", tokenizer=tokenizer_path, max_shard_tokens=8000, workers=2, progress=False)
    done = cli(
        "pack-text",
        str(src),
        str(tmp_path / "ray"),
        "--ray",
        ray_cluster.address,
        *common,
        env=ray_cluster.env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "index" in done.stdout
    assert dataset_bytes(tmp_path / "ray") == dataset_bytes(tmp_path / "local")
