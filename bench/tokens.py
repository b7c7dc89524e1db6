"""Token blocks (shardstream.tokens): packing text, reading blocks locally and from S3, the first
block, memory at scale, resume, and what each reader loses or repeats, against a bare
``np.memmap`` slicer, plain ranged GETs, LitData's ``TokensLoader`` and Mosaic's MDS text
samples. One run prints one table (``--json PATH`` writes it as JSON too), then the goals.

Scenarios (``--scenarios``, all by default):

1. ``pack``: a synthetic JSON Lines corpus (8 files; documents of ~200-2,000 tokens drawn from
   Zipf-distributed pseudo-words), a byte-level BPE tokenizer trained here with ``tokenizers``
   (``BpeTrainer``, vocabulary 8,000, special ``<|endoftext|>``; nothing downloaded). Rows:
   bare ``Tokenizer.encode_batch`` and ``encode_batch_fast`` (no offsets: what ``pack_tokens``
   calls) over the texts held in memory (batches of 1,000; the end token counted) in one
   thread (``RAYON_NUM_THREADS=1``, ``TOKENIZERS_PARALLELISM=false``) and with their own
   threads; ``pack_tokens`` (``shardstream.tokens.pack``, JSON Lines in, shards out) with 1
   worker held to one thread, with 1 worker and the tokenizer's threads, and with 2 workers.
   Each run is its own process, timed whole (a pack's start and its workers' spawn included);
   CPU seconds include its workers. Goals: 1 worker (one thread) >= 0.8x the faster bare
   call in one thread (``*``); 2 workers >= 1.6x 1 worker (one thread).
2. ``local``: ``--tokens`` (2e8) synthetic tokens (documents of 200-2,000 tokens, uint16,
   ``--vocab`` 50,257) written once with ``TokenDatasetWriter`` in shards of
   ``--shard-tokens`` (2**24), and the same tokens as one flat ``.bin`` file, as LitData chunks
   (``litdata.optimize`` of the documents with ``TokensLoader``, ``chunk_bytes`` = the shard
   size) and as Mosaic MDS (``MDSWriter``, a ``bytes`` column of 2,049 tokens a sample, as
   llm-foundry's ``concat_tokens`` writes; the last partial sample dropped, as it does).
   Read from the page cache in this process at ``--seq-len`` 2048, int64 out (input and label
   views of the block), in order and shuffled:
     - the floor: ``mm[k*L : k*L+L+1].astype(np.int64)`` -> ``torch.from_numpy``, inputs and
       labels as views, blocks in order or in a seeded permutation; and, no goal, the same
       plus ``position_ids`` and ``doc_lens`` from the documents' ends (what TokenBlocks adds);
     - ``TokenBlocks`` iterated directly; through ``DataLoader(num_workers=0, batch_size=8,
       collate_fn=collate_blocks)``; and with ``collate=collate_blocks`` (batches made by the
       dataset, ``DataLoader(batch_size=None)``);
     - LitData ``StreamingDataset(item_loader=TokensLoader(block_size=L + 1))``, swept over its
       POSIX in-place mode (``LITDATA_POSIX_FAST``: on, its default for a local directory, and
       off: chunks copied to a fresh cache) and ``max_pre_download`` (2, its default, and 8);
     - Mosaic ``StreamingDataset(local=...)``, ``np.frombuffer`` of each sample -> int64,
       swept over ``predownload`` (its default and 1,024) and, shuffled, ``shuffle_algo``
       (``py1e``, its default, and ``py1s``).
   Every run is timed from the dataset's construction to its last block (peer runs stop at
   ``--peer-cap-s`` and are marked capped: rate over what they read); best of ``--repeat``
   rounds, interleaved. The best of each peer's sweep (``*``) is what the goals use. Goals:
   TokenBlocks >= 2x the better peer, >= 0.8x the floor, >= 50 M tokens/s, in each order.
   If one is missed, ``TokenBlocks`` is profiled (cProfile over 2 s of iteration, the top 15
   functions by tottime are printed and written to the JSON).
3. ``s3``: the same shardstream dataset uploaded to a SeaweedFS server on 127.0.0.1 (started
   here): ``TokenBlocks`` from ``s3://`` (in order, and shuffled) against plain ranged GETs of
   the same bytes (the shards' token members, boto3 ``get_object(Range=...)`` of 8 MiB, 1, 4
   and 8 at a time in threads; the best is the floor), both timed from the client's or
   dataset's creation. GETs and bytes moved are counted at the client (shardstream's S3
   requests, wrapped; ``stats().bytes`` is the block bytes it handed out). Goal: >= 0.9x.
4. ``first``: seconds from ``TokenBlocks(...)`` to its first block, from S3, on 10**9 tokens:
   one real shard of 10**7 tokens, indexed 100 times (``index.bin`` and ``tokens.bin`` rows
   repeating its name and columns, which the reader accepts), in a fresh process (imports
   done first, aiobotocore's included; its client is made in the timed part), median of 3;
   shuffled (the default: the goal, < 0.3 s) and in order.
5. ``memory``: a fresh process opens TokenBlocks from S3 (shuffled) and reads 1,000 blocks,
   at 10**9 and at ``--big-tokens`` (10**11) tokens: one shard of 10**5 tokens indexed 10**4
   and 10**6 times. Printed: its peak and final RSS (``VmHWM``, ``VmRSS``), the RSS after
   imports, the time to open and to the first block. Goals: peak RSS <= 150 MB +
   ``FetchConfig().max_buffer_bytes`` (the read-ahead budget); the same (within 10%) at both
   sizes.
6. ``resume``: a checkpoint taken mid-epoch (``state_dict(samples_consumed=half the epoch)``),
   loaded in a fresh process that has opened the dataset from S3: seconds from
   ``load_state_dict`` to the first block, at 10**9 tokens (shuffled; and in order, where the
   block must be the epoch's middle one) and at ``--big-tokens`` (shuffled: the goal, < 1 s).
   ``--profile-scale`` profiles a miss at ``--big-tokens`` (its main thread; slow).
7. ``epoch``: one whole epoch of each system from S3, in order, through a counting proxy
   (tests/servers/faultproxy.py, in this process): TokenBlocks, LitData (its defaults) and
   Mosaic (its defaults). Each block's inputs are hashed: tokens delivered as inputs, lost
   (the corpus's tokens that are no block's input) and repeated; GETs and bytes moved, as
   the proxy saw them. LitData drops each chunk's tail (fewer than L + 1 tokens); Mosaic and
   LitData samples do not overlap, so one token in L + 1 is only ever a label. The local
   runs of scenario 2 print the bytes each read through ``read`` calls (``/proc/self/io``
   rchar; memory-mapped reads do not count there) and the size of its files.

Data are written once under ``--workdir`` (default ~/.cache/shardstream-bench/tokens) and
reused; the S3 server starts fresh each run. On a 2-core machine the S3 server, the proxy and
the reader share the cores: compare ratios, which come from one run.

Usage:
    python bench/tokens.py [--quick] [--scenarios pack,local,s3,first,memory,resume,epoch]
        [--tokens 2e8] [--shard-tokens 16777216] [--seq-len 2048] [--big-tokens 1e11]
        [--corpus-mb 30] [--repeat 2] [--peer-cap-s 5] [--skip-peers] [--workdir DIR]
        [--json PATH] [--profile-scale]

``--quick``: 2e7 tokens in shards of 2**22, a corpus of 8 MB, 10**10 tokens for memory and
resume, one round, peers capped at 3 s (about 2 minutes on 2 cores).

Peers: ``pip install -e '.[bench]'``, then ``pip install --no-deps mosaicml-streaming==0.13.0
litdata==0.2.76`` (bench/stream.py says why ``--no-deps`` and what is patched to run them:
an empty ``streaming.vision``, LitData's ``allow_http``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import gc
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import CACHE, boto3_client, import_mosaic, upload_tree, write_once
from procs import process_cpu_s

HERE = Path(__file__).resolve().parent

BUCKET = "bench"
EOD_TEXT = "<|endoftext|>"
BIG_SHARD_TOKENS = 10**5  # the shard repeated in the memory and resume indexes
FIRST_SHARD_TOKENS = 10**7  # the shard repeated for the first-block latency
FIRST_TOKENS = 10**9
GET_PART = 8 << 20
GOAL = {
    "pack_one": 0.8,
    "pack_two": 1.6,
    "peer": 2.0,
    "floor": 0.8,
    "rate": 50e6,
    "s3": 0.9,
    "first_s": 0.3,
    "rss_mb": 150.0,
    "rss_same": 0.10,
    "resume_s": 1.0,
}


# ---------------------------------------------------------------- results


@dataclass
class Row:
    """One line of the table. ``rate`` in tokens/s; ``seconds`` for latencies; ``mb`` for memory."""

    group: str
    reader: str
    settings: str = ""
    rate: float | None = None
    seconds: float | None = None
    mb: float | None = None
    cpu_s: float | None = None
    tokens: int | None = None  # tokens the run counted (inputs), for tokens per CPU second
    ratio: str = ""
    gets: int | None = None
    moved: int | None = None  # bytes
    note: str = ""
    best: bool = False
    capped: bool = False

    def result(self) -> str:
        if self.rate is not None:
            return f"{self.rate / 1e6:8.1f} M/s"
        if self.seconds is not None:
            return f"{self.seconds:8.3f} s"
        if self.mb is not None:
            return f"{self.mb:8.0f} MB"
        return "-"

    def per_cpu(self) -> str:
        if self.tokens and self.cpu_s:
            return f"{self.tokens / self.cpu_s / 1e6:.1f}"
        return "-"

    def line(self) -> str:
        cpu = f"{self.cpu_s:.2f}" if self.cpu_s is not None else "-"
        gets = f"{self.gets:,}" if self.gets is not None else "-"
        moved = f"{self.moved / 1e6:,.1f}" if self.moved is not None else "-"
        name = ("* " if self.best else "  ") + self.reader
        note = ("capped; " if self.capped else "") + self.note
        return (
            f"{self.group:7s} {name:34s} {self.settings[:40]:40s} {self.result():>12s} {cpu:>7s} "
            f"{self.per_cpu():>9s} {self.ratio:>16s} {gets:>6s} {moved:>9s}  {note}"
        ).rstrip()


HEADER = (
    f"{'group':7s} {'  reader':34s} {'settings':40s} {'result':>12s} {'CPU s':>7s} {'M tok/CPUs':>9s} "
    f"{'ratio':>16s} {'GETs':>6s} {'moved MB':>9s}  note"
)


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    goals: list[tuple[str, str, str, bool | None]] = field(default_factory=list)  # (name, measured, target, met)
    profiles: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        print(row.line(), flush=True)
        return row

    def goal(self, name: str, measured: str, target: str, met: bool | None) -> None:
        """A goal's line; ``met`` None: no target (shown for context)."""
        self.goals.append((name, measured, target, met))

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [dataclasses.asdict(r) for r in self.rows],
            "goals": [{"goal": g, "measured": m, "target": t, "met": ok} for g, m, t, ok in self.goals],
            "profiles": self.profiles,
            "info": self.info,
        }


def rss_mb() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MB."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                values[line.split(":")[0]] = int(line.split()[1]) * 1024 / 1e6
    return values["VmRSS"], values["VmHWM"]


def rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file() and p.name != ".complete")


def top_functions(profile: cProfile.Profile, n: int = 15) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(n)
    text = out.getvalue()
    return text[text.find("   ncalls") :] if "   ncalls" in text else text


# ---------------------------------------------------------------- the token datasets


def synthetic_docs(num_tokens: int, vocab: int, seed: int) -> Iterator[np.ndarray]:
    """Documents of 200-2,000 tokens (uniform ids below ``vocab - 1``, the last one the end
    token ``vocab - 1``), ``num_tokens`` in all (the last document cut short)."""
    rng = np.random.default_rng(seed)
    eod, left = vocab - 1, num_tokens
    while left > 0:
        lens = rng.integers(200, 2001, size=4096)
        tokens = rng.integers(0, eod, size=int(lens.sum()), dtype=np.uint16)
        ends = np.cumsum(lens)
        tokens[ends - 1] = eod
        start = 0
        for end in ends.tolist():
            doc = tokens[start : min(end, start + left)]
            start = end
            left -= len(doc)
            yield doc
            if left <= 0:
                return


def write_token_dataset(out: Path, num_tokens: int, shard_tokens: int, vocab: int) -> None:
    from shardstream.tokens.writer import TokenDatasetWriter

    with TokenDatasetWriter(out, vocab_size=vocab, eod_id=vocab - 1, max_shard_tokens=shard_tokens) as writer:
        for i, doc in enumerate(synthetic_docs(num_tokens, vocab, seed=0)):
            writer.add(doc, f"doc-{i:09d}")


def stream_of(ss: Path) -> Iterator[np.ndarray]:
    """The dataset's token stream, shard by shard (uint16)."""
    from shardstream.tokens.format import TokenIndex

    tokens = TokenIndex.open(ss)
    for shard in range(tokens.num_shards):
        yield tokens.read_tokens(shard, 0, tokens.column("num_tokens", shard))


def write_flat(ss: Path, out: Path) -> None:
    with open(out / "tokens.bin", "wb") as f:
        for part in stream_of(ss):
            f.write(part.tobytes())


def doc_ends(ss: Path) -> np.ndarray:
    """int64: where each document of the stream ends (exclusive)."""
    from shardstream.tokens.format import TokenIndex

    tokens = TokenIndex.open(ss)
    ends = [tokens.token_starts[s] + np.cumsum(tokens.doclens(s), dtype=np.int64) for s in range(tokens.num_shards)]
    return np.concatenate(ends)


def litdata_docs(shard: int) -> Iterator[np.ndarray]:
    """LitData ``optimize`` fn (module level, for its workers): shard ``shard``'s documents."""
    from shardstream.tokens.format import TokenIndex

    tokens = TokenIndex.open(os.environ["BENCH_TOKENS_SOURCE"])
    data = tokens.read_tokens(shard, 0, tokens.column("num_tokens", shard))
    start = 0
    for end in np.cumsum(tokens.doclens(shard), dtype=np.int64).tolist():
        yield data[start:end]
        start = end


def write_litdata(ss: Path, out: Path, chunk_bytes: int) -> None:
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    from shardstream.tokens.format import TokenIndex

    os.environ["BENCH_TOKENS_SOURCE"] = str(ss)
    shards = list(range(TokenIndex.open(ss).num_shards))
    litdata.optimize(
        fn=litdata_docs,
        inputs=shards,
        output_dir=str(out),
        chunk_bytes=chunk_bytes,
        item_loader=TokensLoader(),
        num_workers=1,  # its 2 workers took 3x longer here than 1
        verbose=False,
    )


def write_mds(ss: Path, out: Path, seq_len: int, size_limit: int) -> None:
    """As llm-foundry's concat_tokens: the stream cut into samples of ``seq_len + 1`` tokens
    (bytes), the last partial one dropped."""
    streaming = import_mosaic()
    size = seq_len + 1
    held = np.zeros(0, np.uint16)
    with streaming.MDSWriter(out=str(out), columns={"tokens": "bytes"}, size_limit=size_limit) as sink:
        for part in stream_of(ss):
            held = np.concatenate((held, part))
            whole = len(held) // size
            for k in range(whole):
                sink.write({"tokens": held[k * size : (k + 1) * size].tobytes()})
            held = held[whole * size :]


@dataclass
class Data:
    """Where each system's copy of the same tokens lies, and their counts."""

    ss: Path
    flat: Path
    litdata: Path | None
    mds: Path | None
    num_tokens: int
    num_shards: int
    seq_len: int


def prepare_data(args: argparse.Namespace, peers: bool) -> Data:
    tag = f"{args.tokens}-{args.shard_tokens}-{args.vocab}"
    root = Path(args.workdir) / f"data-{tag}"
    made = []

    def once(name: str, write: Callable[[Path], None]) -> Path:
        folder = root / name
        seconds = write_once(folder, write)
        made.append(f"{name} " + (f"written in {seconds:.1f} s" if seconds else "kept"))
        return folder

    def write_ss(p: Path) -> None:
        shutil.rmtree(p)  # the writer wants a new destination
        write_token_dataset(p, args.tokens, args.shard_tokens, args.vocab)

    ss = once("shardstream", write_ss)
    flat = once("flat", lambda p: write_flat(ss, p))
    chunk = args.shard_tokens * 2
    litdata = once(f"litdata-{args.seq_len}", lambda p: write_litdata(ss, p, chunk)) if peers else None
    mds = once(f"mds-{args.seq_len}", lambda p: write_mds(ss, p, args.seq_len, chunk)) if peers else None
    from shardstream.tokens.format import TokenIndex

    tokens = TokenIndex.open(ss)
    print(f"data under {root}: " + "; ".join(made), flush=True)
    return Data(ss, flat, litdata, mds, tokens.num_tokens, tokens.num_shards, args.seq_len)


def write_synthetic(out: Path, shard_tokens: int, rows: int, vocab: int) -> None:
    """A token dataset of ``rows`` x ``shard_tokens`` tokens: one real shard, its name and
    columns repeated ``rows`` times in ``index.bin`` and ``tokens.bin``."""
    from shardstream.index import MANIFEST_NAME, Manifest
    from shardstream.storage import open_store
    from shardstream.storage.base import write_pieces
    from shardstream.tokens.format import TOKENS_INDEX_NAME, TokenManifest
    from shardstream.tokens.writer import write_token_shard

    docs = list(synthetic_docs(shard_tokens, vocab, seed=1))
    store = open_store(str(out))
    name = "tokens-000000.tar"
    row = write_token_shard(
        store, name, np.concatenate(docs), [len(d) for d in docs], [f"d{i}" for i in range(len(docs))]
    )
    manifest = TokenManifest.from_rows([row.columns()] * rows, dtype=np.uint16, vocab_size=vocab, eod_id=vocab - 1)
    write_pieces(store, TOKENS_INDEX_NAME, manifest.pieces())
    index = Manifest.from_columns(
        names=[name] * rows,
        shard_bytes=np.full(rows, row.bytes, np.int64),
        shard_samples=np.ones(rows, np.int64),
        shard_members=np.full(rows, len(row.members), np.int64),
        crc32=np.full(rows, row.crc32, np.uint32),
    )
    write_pieces(store, MANIFEST_NAME, index.pieces())


# ---------------------------------------------------------------- timing in this process


@dataclass
class Run:
    tokens: int  # inputs delivered
    blocks: int
    seconds: float
    cpu_s: float
    read_bytes: int
    capped: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def timed(epoch: Callable[[], Iterator[int]], cap_s: float | None) -> Run:
    """Run ``epoch`` (it yields the input tokens of each block or batch; made, and so timed,
    from the dataset's construction), stopping after ``cap_s``."""
    gc.collect()
    read0, cpu0 = rchar(), time.process_time()
    started = time.perf_counter()
    deadline = started + cap_s if cap_s else float("inf")
    tokens = blocks = 0
    capped = False
    for n in epoch():
        tokens += n
        blocks += 1
        if not blocks & 63 and time.perf_counter() > deadline:
            capped = True
            break
    seconds = time.perf_counter() - started
    return Run(tokens, blocks, seconds, time.process_time() - cpu0, rchar() - read0, capped)


def best_of(runs: list[Run]) -> Run:
    return max(runs, key=lambda r: r.rate)


# ---------------------------------------------------------------- readers: local


def floor_epoch(data: Data, shuffle: bool, ends: np.ndarray | None = None) -> Callable[[], Iterator[int]]:
    import torch

    length = data.seq_len
    count = (data.num_tokens - 1) // length

    def epoch() -> Iterator[int]:
        mm = np.memmap(data.flat / "tokens.bin", dtype=np.uint16, mode="r")
        order = np.random.default_rng(0).permutation(count).tolist() if shuffle else range(count)
        if ends is None:
            for k in order:
                x = torch.from_numpy(mm[k * length : k * length + length + 1].astype(np.int64))
                _inputs, _labels = x[:-1], x[1:]
                yield length
            return
        import bisect

        stops = ends.tolist()
        arange = np.arange(length, dtype=np.int64)
        for k in order:
            a = k * length
            b = a + length
            x = torch.from_numpy(mm[a : b + 1].astype(np.int64))
            _inputs, _labels = x[:-1], x[1:]
            inner = stops[bisect.bisect_right(stops, a) : bisect.bisect_left(stops, b)]
            lens = np.diff([a, *inner, b]).astype(np.int32) if inner else np.array([length], np.int32)
            positions = arange - np.repeat(np.cumsum(lens) - lens, lens) if inner else arange.copy()
            _pos, _docs = torch.from_numpy(positions), torch.from_numpy(lens)
            yield length

    return epoch


def tokenblocks_epoch(location: str, data: Data, shuffle: bool, how: str, **kwargs: Any) -> Callable[[], Iterator[int]]:
    from torch.utils.data import DataLoader

    from shardstream.tokens.dataset import TokenBlocks, collate_blocks

    def epoch() -> Iterator[int]:
        if how == "direct":
            ds = TokenBlocks(location, seq_len=data.seq_len, shuffle=shuffle, **kwargs)
            for item in ds:
                yield len(item["input_ids"])
        elif how == "loader":
            ds = TokenBlocks(location, seq_len=data.seq_len, shuffle=shuffle, batch_size=8, **kwargs)
            for batch in DataLoader(ds, batch_size=8, num_workers=0, collate_fn=collate_blocks):
                yield batch["input_ids"].numel()
        else:  # batches made by the dataset
            ds = TokenBlocks(location, seq_len=data.seq_len, shuffle=shuffle, batch_size=8, collate=collate_blocks)
            for batch in DataLoader(ds, batch_size=None, num_workers=0):
                yield batch["input_ids"].numel()

    return epoch


def litdata_patch() -> None:
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # module doc (bench/stream.py)


def litdata_epoch(data: Data, shuffle: bool, posix: str, pre: int, scratch: Path) -> Callable[[], Iterator[int]]:
    import torch

    def epoch() -> Iterator[int]:
        import litdata
        from litdata.streaming.item_loader import TokensLoader

        litdata_patch()
        if posix == "default":
            os.environ.pop("LITDATA_POSIX_FAST", None)
        else:
            os.environ["LITDATA_POSIX_FAST"] = posix
        cache = tempfile.mkdtemp(prefix="litdata-", dir=scratch)
        try:
            ds = litdata.StreamingDataset(
                str(data.litdata),
                cache_dir=cache,
                item_loader=TokensLoader(block_size=data.seq_len + 1),
                shuffle=shuffle,
                max_pre_download=pre,
            )
            for x in ds:
                t = torch.from_numpy(np.asarray(x).astype(np.int64))
                _inputs, _labels = t[:-1], t[1:]
                yield len(t) - 1
            del ds
        finally:
            os.environ.pop("LITDATA_POSIX_FAST", None)
            shutil.rmtree(cache, ignore_errors=True)

    return epoch


def mosaic_epoch(data: Data, shuffle: bool, predownload: int | None, algo: str) -> Callable[[], Iterator[int]]:
    import torch

    def epoch() -> Iterator[int]:
        streaming = import_mosaic()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        kwargs: dict[str, Any] = {"shuffle": shuffle, "batch_size": 8, "predownload": predownload}
        if shuffle:
            kwargs["shuffle_algo"] = algo
        try:
            ds = streaming.StreamingDataset(local=str(data.mds), **kwargs)
            for sample in ds:
                t = torch.from_numpy(np.frombuffer(sample["tokens"], dtype=np.uint16).astype(np.int64))
                _inputs, _labels = t[:-1], t[1:]
                yield len(t) - 1
            del ds
        finally:
            gc.collect()

    return epoch


def profile_tokenblocks(data: Data, seconds: float = 2.0) -> str:
    """cProfile over ``seconds`` of TokenBlocks iteration (in order; epochs repeated), after
    one untimed block: the top 15 functions by tottime."""
    from shardstream.tokens.dataset import TokenBlocks

    ds = TokenBlocks(str(data.ss), seq_len=data.seq_len, shuffle=False)
    next(iter(ds))
    profile = cProfile.Profile()
    blocks = 0
    started = time.perf_counter()
    profile.enable()
    while time.perf_counter() - started < seconds:
        for _item in ds:
            blocks += 1
            if not blocks & 255 and time.perf_counter() - started >= seconds:
                break
    profile.disable()
    return f"{blocks} blocks in {seconds:.0f} s under cProfile\n" + top_functions(profile)


def run_local(args: argparse.Namespace, data: Data, results: Results, scratch: Path, peers: bool) -> None:
    size = {
        "floor": tree_bytes(data.flat),
        "ss": tree_bytes(data.ss),
        "litdata": tree_bytes(data.litdata) if data.litdata else 0,
        "mds": tree_bytes(data.mds) if data.mds else 0,
    }
    ends = doc_ends(data.ss)
    cap = args.peer_cap_s
    for shuffle in (False, True):
        order = "shuffled" if shuffle else "in order"
        readers: list[tuple[str, str, str, Callable[[], Iterator[int]], float | None]] = [
            ("floor", "memmap slicer", order, floor_epoch(data, shuffle), None),
            ("floor+", "memmap + position_ids, doc_lens", order, floor_epoch(data, shuffle, ends), None),
            ("ss", "TokenBlocks", order, tokenblocks_epoch(str(data.ss), data, shuffle, "direct"), None),
            (
                "ss",
                "TokenBlocks DataLoader bs=8",
                f"{order}, collate_fn",
                tokenblocks_epoch(str(data.ss), data, shuffle, "loader"),
                None,
            ),
            (
                "ss",
                "TokenBlocks collate=",
                f"{order}, batch_size=None",
                tokenblocks_epoch(str(data.ss), data, shuffle, "collate"),
                None,
            ),
        ]
        if peers:
            for posix in ("default", "0"):
                for pre in (2, 8):
                    what = f"{order}, posix {'on' if posix == 'default' else 'off'}, pre_download {pre}"
                    readers.append(
                        (
                            "litdata",
                            "LitData TokensLoader",
                            what,
                            litdata_epoch(data, shuffle, posix, pre, scratch),
                            cap,
                        )
                    )
            algos = ("py1e", "py1s") if shuffle else ("-",)
            for algo in algos:
                for pre in (None, 1024):
                    what = f"{order}, predownload {pre or 'default'}" + (f", {algo}" if shuffle else "")
                    readers.append(("mds", "Mosaic MDS", what, mosaic_epoch(data, shuffle, pre, algo), cap))
        runs: list[list[Run]] = [[] for _ in readers]
        for r in range(args.repeat):
            for i in [(r + k) % len(readers) for k in range(len(readers))]:
                runs[i].append(timed(readers[i][3], readers[i][4]))
        best = [best_of(rs) for rs in runs]
        floor = best[0]
        peer_best: dict[str, int] = {}
        for i, (kind, _, _, _, _) in enumerate(readers):
            if kind in ("litdata", "mds") and (kind not in peer_best or best[i].rate > best[peer_best[kind]].rate):
                peer_best[kind] = i
        for i, (kind, name, what, _, _) in enumerate(readers):
            run = best[i]
            key = {"floor+": "floor"}.get(kind, kind)
            results.add(
                Row(
                    "local",
                    name,
                    what,
                    rate=run.rate,
                    cpu_s=run.cpu_s,
                    tokens=run.tokens,
                    ratio="" if i == 0 else f"{run.rate / floor.rate:.2f}x floor",
                    note=f"read() {run.read_bytes / 1e6:,.0f} MB of {size[key] / 1e6:,.0f} MB on disk"
                    + ("" if run.capped else f"; inputs {run.tokens:,}"),
                    best=peer_best.get(kind) == i,
                    capped=run.capped,
                )
            )
        ours = best[2]
        results.info[f"local_{'shuffled' if shuffle else 'in_order'}"] = {
            "floor": floor.rate,
            "tokenblocks": ours.rate,
            "peers": {k: best[i].rate for k, i in peer_best.items()},
        }
        missed = False
        if peer_best:
            kind, i = max(peer_best.items(), key=lambda kv: best[kv[1]].rate)
            ratio = ours.rate / best[i].rate
            name = {"litdata": "LitData", "mds": "Mosaic"}[kind]
            results.goal(
                f"local {order}: TokenBlocks / best peer ({name})",
                f"{ratio:.2f}x",
                f">= {GOAL['peer']:.1f}x",
                ratio >= GOAL["peer"],
            )
            missed |= ratio < GOAL["peer"]
        ratio = ours.rate / floor.rate
        by_cpu = (ours.tokens / ours.cpu_s) / (floor.tokens / floor.cpu_s)
        results.goal(
            f"local {order}: TokenBlocks / memmap floor",
            f"{ratio:.2f}x",
            f">= {GOAL['floor']}x",
            ratio >= GOAL["floor"],
        )
        results.goal(f"local {order}: the same, by tokens per CPU second", f"{by_cpu:.2f}x", "-", None)
        results.goal(
            f"local {order}: TokenBlocks tokens/s, one process",
            f"{ours.rate / 1e6:.1f} M/s",
            f">= {GOAL['rate'] / 1e6:.0f} M/s",
            ours.rate >= GOAL["rate"],
        )
        missed |= ratio < GOAL["floor"] or ours.rate < GOAL["rate"]
        if missed and "tokenblocks" not in results.profiles:
            results.profiles["tokenblocks"] = profile_tokenblocks(data)


# ---------------------------------------------------------------- S3


@dataclass
class S3Env:
    server: Any
    info: Any
    s3: Any  # shardstream S3Config
    client: Any  # boto3

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def storage_options(self, endpoint: str | None = None) -> dict[str, str]:
        return {
            "endpoint_url": endpoint or self.info.endpoint_url,
            "aws_access_key_id": self.info.access_key_id,
            "aws_secret_access_key": self.info.secret_access_key,
            "region_name": self.info.region_name,
        }

    def upload(self, folder: Path, prefix: str) -> None:
        started = time.perf_counter()
        upload_tree(self.client, folder, BUCKET, prefix)
        print(
            f"uploaded {prefix} ({tree_bytes(folder) / 1e6:,.0f} MB) in {time.perf_counter() - started:.1f} s",
            flush=True,
        )


class RequestCount:
    """shardstream's S3 requests in this process (``S3Store.open_range`` and ``head`` wrapped):
    GETs and the body bytes received."""

    def __init__(self) -> None:
        self.gets = self.heads = self.bytes = 0
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def counting(self) -> Iterator[RequestCount]:
        from shardstream.storage.s3 import S3Store

        open_range, head = S3Store.open_range, S3Store.head
        counter = self

        async def counted_range(store: Any, name: str, at: int, end: int | None, version: str | None) -> Any:
            answer = await open_range(store, name, at, end, version)
            with counter.lock:
                counter.gets += 1

            async def pieces(source: Any = answer.pieces) -> Any:
                async for piece in source:
                    with counter.lock:
                        counter.bytes += len(piece)
                    yield piece

            return dataclasses.replace(answer, pieces=pieces())

        async def counted_head(store: Any, name: str) -> Any:
            with counter.lock:
                counter.heads += 1
            return await head(store, name)

        S3Store.open_range, S3Store.head = counted_range, counted_head  # type: ignore[method-assign]
        try:
            yield self
        finally:
            S3Store.open_range, S3Store.head = open_range, head  # type: ignore[method-assign]


def plain_gets(env: S3Env, ranges: list[tuple[str, int, int]], concurrency: int) -> tuple[float, float, int, int]:
    """(seconds, CPU s, GETs, bytes) of ranged GETs of ``GET_PART`` over ``ranges`` (key, start,
    end), ``concurrency`` at a time, timed from the client's creation."""
    cpu0 = time.process_time()
    started = time.perf_counter()
    client = boto3_client(env.info, max_pool_connections=concurrency)
    parts = [(key, a, min(a + GET_PART, end)) for key, start, end in ranges for a in range(start, end, GET_PART)]

    def get(part: tuple[str, int, int]) -> int:
        key, a, b = part
        return len(client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={a}-{b - 1}")["Body"].read())

    with ThreadPoolExecutor(concurrency) as pool:
        received = sum(pool.map(get, parts))
    return time.perf_counter() - started, time.process_time() - cpu0, len(parts), received


def run_s3(args: argparse.Namespace, data: Data, env: S3Env, results: Results) -> None:
    from shardstream.tokens.dataset import TokenBlocks
    from shardstream.tokens.format import TokenIndex

    tokens = TokenIndex.open(data.ss)
    names = list(tokens.index.manifest.names())
    ranges = []
    for s in range(tokens.num_shards):
        at = tokens.column("tokens_offset", s)
        ranges.append((f"ss/{names[s]}", at, at + 2 * tokens.column("num_tokens", s)))
    token_bytes = sum(b - a for _, a, b in ranges)
    blocks = (data.num_tokens - 1) // data.seq_len
    inputs = blocks * data.seq_len
    floors: list[tuple[int, float, float, int, int, float]] = []
    ours: dict[bool, tuple[Run, RequestCount, Any, float]] = {}
    for _ in range(args.repeat):
        for c in (1, 4, 8):
            srv0 = process_cpu_s(env.server.pid)
            seconds, cpu, gets, received = plain_gets(env, ranges, c)
            floors.append((c, seconds, cpu, gets, received, process_cpu_s(env.server.pid) - srv0))
        for shuffle in (False, True):
            count = RequestCount()
            holder: list[Any] = []

            def epoch(shuffle: bool = shuffle, holder: list[Any] = holder) -> Iterator[int]:
                ds = TokenBlocks(env.url("ss"), seq_len=data.seq_len, shuffle=shuffle, s3=env.s3)
                holder.append(ds)
                for item in ds:
                    yield len(item["input_ids"])

            srv0 = process_cpu_s(env.server.pid)
            with count.counting():
                run = timed(epoch, None)
            server = process_cpu_s(env.server.pid) - srv0
            if shuffle not in ours or run.rate > ours[shuffle][0].rate:
                ours[shuffle] = (run, count, holder[0].stats(), server)
    # plain GET rate in input tokens/s: the same bytes, counted as the blocks' inputs they hold
    best_floor = max(floors, key=lambda f: token_bytes / f[1])
    floor_rate = inputs / best_floor[1]
    for c in (1, 4, 8):
        c_best = min((f for f in floors if f[0] == c), key=lambda f: f[1])
        _, seconds, cpu, gets, received, server = c_best
        results.add(
            Row(
                "s3",
                "plain ranged GETs (boto3)",
                f"8 MiB ranges, {c} at a time",
                rate=inputs / seconds,
                cpu_s=cpu,
                tokens=inputs,
                ratio="" if c_best is best_floor else f"{seconds and best_floor[1] / seconds:.2f}x best",
                gets=gets,
                moved=received,
                note=f"{received / seconds / 1e6:,.0f} MB/s of token bytes; S3 server CPU {server:.1f} s",
                best=c_best is best_floor,
            )
        )
    for shuffle in (False, True):
        run, count, stats, server = ours[shuffle]
        ratio = run.rate / floor_rate
        results.add(
            Row(
                "s3",
                "TokenBlocks s3://",
                "shuffled" if shuffle else "in order",
                rate=run.rate,
                cpu_s=run.cpu_s,
                tokens=run.tokens,
                ratio=f"{ratio:.2f}x GETs",
                gets=count.gets,
                moved=count.bytes,
                note=f"stats().bytes {stats.bytes / 1e6:,.1f} MB; HEADs {count.heads}; S3 server CPU {server:.1f} s; "
                f"inputs {run.tokens:,}",
            )
        )
        if not shuffle:
            results.goal(
                "S3 in order: TokenBlocks / plain ranged GETs",
                f"{ratio:.2f}x",
                f">= {GOAL['s3']}x",
                ratio >= GOAL["s3"],
            )
    results.info["s3_token_bytes"] = token_bytes
    local = results.info.get("local_in_order", {}).get("tokenblocks")
    if local:
        ratio = ours[False][0].rate / local
        results.goal("S3 in order: TokenBlocks from S3 / from local disk", f"{ratio:.2f}x", "-", None)


# ---------------------------------------------------------------- fresh processes: first block, memory, resume


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Run in a fresh process: imports first, then what ``spec["kind"]`` measures."""
    kind = spec["kind"]
    if kind in ("encode", "pack"):
        return child_pack(spec)
    import aiobotocore.session  # noqa: F401  (the S3 library, imported before the clock starts)
    import torch

    from shardstream.config import S3Config
    from shardstream.tokens.dataset import TokenBlocks

    torch.set_num_threads(1)
    s3 = S3Config(**spec["s3"]) if spec.get("s3") else None
    out: dict[str, Any] = {"rss_imports_mb": rss_mb()[0]}
    profile = cProfile.Profile() if spec.get("profile") else None
    started = time.perf_counter()
    if kind == "resume":
        ds = TokenBlocks(spec["url"], seq_len=spec["seq_len"], shuffle=spec["shuffle"], s3=s3)
        out["open_s"] = time.perf_counter() - started
        with open(spec["state"]) as f:
            state = json.load(f)
        if profile:
            profile.enable()
        started = time.perf_counter()
        ds.load_state_dict(state)
        out["load_s"] = time.perf_counter() - started
        item = next(iter(ds))
        out["first_s"] = time.perf_counter() - started
        out["key"] = int(item["__key__"])
    else:  # "first", "memory"
        if profile:
            profile.enable()
        ds = TokenBlocks(spec["url"], seq_len=spec["seq_len"], shuffle=spec.get("shuffle", True), s3=s3)
        out["open_s"] = time.perf_counter() - started
        it = iter(ds)
        next(it)
        out["first_s"] = time.perf_counter() - started
        out["rss_first_mb"] = rss_mb()[0]
        for n, _ in enumerate(it, start=2):
            if n >= spec.get("blocks", 1):
                break
        out["blocks_s"] = time.perf_counter() - started
        out["num_blocks"] = len(ds)
    if profile:
        profile.disable()
        out["profile"] = top_functions(profile)
    out["rss_mb"], out["hwm_mb"] = rss_mb()
    return out


def run_child(spec: dict[str, Any], env_extra: dict[str, str] | None = None, timeout: float = 600) -> dict[str, Any]:
    env = {**os.environ, **(env_extra or {})}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--_child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"child {spec['kind']} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def s3_spec(env: S3Env) -> dict[str, str]:
    info = env.info
    return {
        "endpoint_url": info.endpoint_url,
        "access_key_id": info.access_key_id,
        "secret_access_key": info.secret_access_key,
        "region_name": info.region_name,
    }


def synthetic(args: argparse.Namespace, shard_tokens: int, rows: int) -> Path:
    folder = Path(args.workdir) / f"synthetic-{shard_tokens}x{rows}-{args.vocab}"
    write_once(folder, lambda p: write_synthetic(p, shard_tokens, rows, args.vocab))
    return folder


def run_first(args: argparse.Namespace, env: S3Env, results: Results) -> None:
    rows = FIRST_TOKENS // FIRST_SHARD_TOKENS
    env.upload(synthetic(args, FIRST_SHARD_TOKENS, rows), "first")
    for shuffle in (True, False):
        spec = {"kind": "first", "url": env.url("first"), "seq_len": args.seq_len, "s3": s3_spec(env), "blocks": 1}
        outs = [run_child({**spec, "shuffle": shuffle}) for _ in range(3)]
        first = statistics.median(o["first_s"] for o in outs)
        opened = statistics.median(o["open_s"] for o in outs)
        results.add(
            Row(
                "first",
                "TokenBlocks s3:// first block",
                f"1e9 tokens, {rows} shards, {'shuffled' if shuffle else 'in order'}",
                seconds=first,
                note=f"median of 3 fresh processes ({', '.join(str(round(o['first_s'], 3)) for o in outs)} s); "
                f"of which TokenBlocks(...) {opened:.3f} s",
            )
        )
        if shuffle:
            results.goal(
                "first block from S3, 1e9 tokens (shuffled)",
                f"{first:.3f} s",
                f"< {GOAL['first_s']} s",
                first < GOAL["first_s"],
            )


def run_memory(args: argparse.Namespace, env: S3Env, results: Results) -> dict[int, Path]:
    from shardstream.config import FetchConfig

    budget = FetchConfig().max_buffer_bytes / 1e6
    limit = GOAL["rss_mb"] + budget
    sizes = {10**9: None, args.big_tokens: None}
    folders: dict[int, Path] = {}
    peaks: dict[int, float] = {}
    for total in sizes:
        rows = total // BIG_SHARD_TOKENS
        folders[total] = synthetic(args, BIG_SHARD_TOKENS, rows)
        prefix = f"big-{rows}"
        env.upload(folders[total], prefix)
        spec = {"kind": "memory", "url": env.url(prefix), "seq_len": args.seq_len, "s3": s3_spec(env), "blocks": 1000}
        out = run_child(spec)
        peaks[total] = out["hwm_mb"]
        results.add(
            Row(
                "memory",
                "TokenBlocks s3://, 1,000 blocks",
                f"{total:.0e} tokens, {rows:,} shards",
                mb=out["hwm_mb"],
                ratio=f"{out['hwm_mb'] / limit:.2f}x limit",
                note=f"peak RSS; RSS after {out['rss_mb']:.0f} MB, after imports {out['rss_imports_mb']:.0f} MB, "
                f"after first block {out['rss_first_mb']:.0f} MB; open {out['open_s']:.3f} s, first block "
                f"{out['first_s']:.2f} s, 1,000 blocks {out['blocks_s']:.2f} s",
            )
        )
        results.add(
            Row("open", "TokenBlocks(s3://...) open", f"{total:.0e} tokens, {rows:,} shards", seconds=out["open_s"])
        )
        results.goal(
            f"peak RSS at {total:.0e} tokens <= {GOAL['rss_mb']:.0f} MB + read-ahead {budget:.0f} MB",
            f"{out['hwm_mb']:.0f} MB",
            f"<= {limit:.0f} MB",
            out["hwm_mb"] <= limit,
        )
    small, big = peaks[10**9], peaks[args.big_tokens]
    growth = big / small - 1
    results.goal(
        f"peak RSS the same at 1e9 and {args.big_tokens:.0e} tokens",
        f"{small:.0f} -> {big:.0f} MB ({growth:+.0%})",
        f"within {GOAL['rss_same']:.0%}",
        abs(growth) <= GOAL["rss_same"],
    )
    return folders


def run_resume(args: argparse.Namespace, env: S3Env, results: Results, scratch: Path) -> None:
    """At 1e9 tokens (shuffled, and in order: the block must be the epoch's middle one) and at
    ``--big-tokens`` (shuffled: the goal)."""
    from shardstream.tokens.dataset import TokenBlocks

    cases = [(10**9, True), (10**9, False), (args.big_tokens, True)]
    for total, shuffle in cases:
        rows = total // BIG_SHARD_TOKENS
        prefix = f"big-{rows}"
        folder = synthetic(args, BIG_SHARD_TOKENS, rows)
        if not env.client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/index.bin").get("KeyCount"):
            env.upload(folder, prefix)
        started = time.perf_counter()
        ds = TokenBlocks(env.url(prefix), seq_len=args.seq_len, shuffle=shuffle, s3=env.s3)
        half = len(ds) // 2
        state = ds.state_dict(samples_consumed=half)
        taken = time.perf_counter() - started
        path = scratch / f"state-{rows}-{shuffle}.json"
        path.write_text(json.dumps(state))
        del ds
        spec = {"kind": "resume", "url": env.url(prefix), "seq_len": args.seq_len, "s3": s3_spec(env)}
        spec.update(state=str(path), shuffle=shuffle)
        out = run_child(spec)
        where = "the" if out["key"] == half else "NOT the"
        check = "" if shuffle else f"; first block {out['key']:,} ({where} epoch's middle, {half:,})"
        results.add(
            Row(
                "resume",
                "TokenBlocks load_state_dict -> block",
                f"{total:.0e} tokens, {rows:,} shards, {'shuffled' if shuffle else 'in order'}",
                seconds=out["first_s"],
                note=f"checkpoint at block {half:,} of {2 * half:,}; load_state_dict {out['load_s']:.3f} s; "
                f"open {out['open_s']:.2f} s; state_dict taken in {taken:.2f} s (open included), "
                f"{len(json.dumps(state))} bytes{check}",
            )
        )
        if not shuffle:
            results.goal(
                "resume in order lands on the epoch's middle block",
                f"block {out['key']:,}",
                f"block {half:,}",
                out["key"] == half,
            )
        if total == args.big_tokens:
            first = out["first_s"]
            results.goal(
                f"resume at {total:.0e} tokens: load_state_dict -> first block",
                f"{first:.2f} s",
                f"< {GOAL['resume_s']:.0f} s",
                first < GOAL["resume_s"],
            )
            if first >= GOAL["resume_s"] and args.profile_scale:
                out = run_child({**spec, "profile": True})
                results.profiles["resume"] = (
                    f"load_state_dict -> first block at {total:.0e} tokens, {out['first_s']:.2f} s under cProfile "
                    "(the main thread)\n" + out["profile"]
                )


# ---------------------------------------------------------------- the epoch through a counting proxy


class Traffic:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.bytes = 0

    def on_response(self, method: str, path: str, headers: Any, status: int, sent: int, *_: Any) -> None:
        kind = method if method != "GET" else ("GET range" if "range" in {h.lower() for h in headers} else "GET")
        with self.lock:
            self.requests[kind] += 1
            self.bytes += sent


def accounted(epoch: Callable[[], Iterator[Any]], corpus_tokens: int) -> dict[str, int]:
    """Inputs delivered, their distinct blocks (hashes), lost and repeated tokens: ``epoch``
    yields each block's inputs as a numpy array."""
    seen: set[int] = set()
    inputs = repeated = blocks = 0
    for x in epoch():
        blocks += 1
        inputs += len(x)
        h = hash(x.tobytes())
        if h in seen:
            repeated += len(x)
        seen.add(h)
    return {"blocks": blocks, "inputs": inputs, "repeated": repeated, "lost": corpus_tokens - (inputs - repeated)}


def run_epochs(args: argparse.Namespace, data: Data, env: S3Env, results: Results, scratch: Path, peers: bool) -> None:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from servers.faultproxy import FaultProxy

    from shardstream.config import S3Config
    from shardstream.tokens.dataset import TokenBlocks

    length = data.seq_len
    if peers:
        env.upload(data.litdata, "litdata")
        env.upload(data.mds, "mds")

    def ours(endpoint: str) -> Iterator[np.ndarray]:
        s3 = S3Config(**{**s3_spec(env), "endpoint_url": endpoint})
        for item in TokenBlocks(env.url("ss"), seq_len=length, shuffle=False, s3=s3):
            yield item["input_ids"].numpy()

    def litdata(endpoint: str) -> Iterator[np.ndarray]:
        import litdata
        from litdata.streaming.item_loader import TokensLoader

        litdata_patch()
        cache = tempfile.mkdtemp(prefix="litdata-", dir=scratch)
        ds = litdata.StreamingDataset(
            env.url("litdata"),
            cache_dir=cache,
            item_loader=TokensLoader(block_size=length + 1),
            shuffle=False,
            storage_options=env.storage_options(endpoint),
        )
        for x in ds:
            yield np.asarray(x)[:-1]
        shutil.rmtree(cache, ignore_errors=True)

    def mosaic(endpoint: str) -> Iterator[np.ndarray]:
        streaming = import_mosaic()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        os.environ["S3_ENDPOINT_URL"] = endpoint
        local = tempfile.mkdtemp(prefix="mosaic-", dir=scratch)
        ds = streaming.StreamingDataset(remote=env.url("mds"), local=local, shuffle=False, batch_size=8)
        for sample in ds:
            yield np.frombuffer(sample["tokens"], dtype=np.uint16)[:-1]
        del ds
        gc.collect()
        shutil.rmtree(local, ignore_errors=True)

    systems: list[tuple[str, str, Callable[[str], Iterator[np.ndarray]]]] = [("TokenBlocks", "s3://, in order", ours)]
    if peers:
        systems += [
            ("LitData TokensLoader", "s3://, in order, defaults", litdata),
            ("Mosaic MDS", "s3://, in order, defaults", mosaic),
        ]
    for name, what, make in systems:
        traffic = Traffic()
        with FaultProxy(env.info.endpoint_url, rates={}, on_response=traffic.on_response) as proxy:
            started = time.perf_counter()
            counts = accounted(lambda make=make, proxy=proxy: make(proxy.endpoint_url), data.num_tokens)
            seconds = time.perf_counter() - started
        gets = sum(n for kind, n in traffic.requests.items() if kind.startswith("GET"))
        lost, repeated = counts["lost"], counts["repeated"]
        results.add(
            Row(
                "epoch",
                name,
                what,
                gets=gets,
                moved=traffic.bytes,
                note=f"inputs {counts['inputs']:,} of {data.num_tokens:,} tokens in {counts['blocks']:,} blocks: "
                f"lost {lost:,} ({lost / data.num_tokens:.3%}), repeated {repeated:,}; "
                + ", ".join(f"{k} {v}" for k, v in sorted(traffic.requests.items()))
                + f"; {seconds:.1f} s through the proxy",
            )
        )
        results.info.setdefault("epoch", {})[name] = {
            **counts,
            "requests": dict(traffic.requests),
            "bytes": traffic.bytes,
        }
        if name == "TokenBlocks":
            ok = repeated == 0 and lost == data.num_tokens - (data.num_tokens - 1) // length * length
            results.goal(
                "TokenBlocks epoch: only the last partial block's tokens lost, none repeated",
                f"lost {lost:,}, repeated {repeated:,}",
                f"lost {data.num_tokens - (data.num_tokens - 1) // length * length}, repeated 0",
                ok,
            )


# ---------------------------------------------------------------- packing


WORDS_SEED = 7


def write_corpus(out: Path, total_mb: float, files: int = 8) -> None:
    """JSON Lines, ``files`` files of ``{"id", "text"}``: documents of 150-1,500 pseudo-words
    (Zipf-distributed over 30,000 words of 2-10 letters), ``total_mb`` MB in all."""
    rng = np.random.default_rng(WORDS_SEED)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    weights = 1 / np.arange(1, 27) ** 0.8
    lengths = rng.integers(2, 11, size=30_000)
    words = np.array(["".join(rng.choice(letters, size=n, p=weights / weights.sum())) for n in lengths])
    zipf = 1 / np.arange(1, len(words) + 1) ** 1.05
    zipf /= zipf.sum()
    per_file = total_mb * 1e6 / files
    doc = 0
    for f in range(files):
        written = 0
        with open(out / f"part-{f:02d}.jsonl", "w") as sink:
            while written < per_file:
                n = int(rng.integers(150, 1501))
                picks = words[rng.choice(len(words), size=n, p=zipf)]
                text = " ".join(picks.tolist())
                if doc % 7 == 0:
                    text = text.capitalize() + "."
                line = json.dumps({"id": f"doc-{doc}", "text": text}) + "\n"
                sink.write(line)
                written += len(line)
                doc += 1


def train_tokenizer(corpus: Path, out: Path, train_mb: float = 8.0) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def texts() -> Iterator[str]:
        taken = 0
        for path in sorted(corpus.glob("*.jsonl")):
            with open(path) as f:
                for line in f:
                    taken += len(line)
                    yield json.loads(line)["text"]
                    if taken > train_mb * 1e6:
                        return

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8000,
        special_tokens=[EOD_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts(), trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))


def child_pack(spec: dict[str, Any]) -> dict[str, Any]:
    import resource

    from tokenizers import Tokenizer

    tokenizer_path = spec["tokenizer"]
    if spec["kind"] == "encode":
        tokenizer = Tokenizer.from_file(tokenizer_path)
        texts = []
        for path in sorted(Path(spec["corpus"]).glob("*.jsonl")):
            with open(path) as f:
                texts += [json.loads(line)["text"] for line in f]
        encode = getattr(tokenizer, spec["method"])
        encode(texts[:100])  # the thread pool started before the clock
        cpu0, started = time.process_time(), time.perf_counter()
        tokens = 0
        for i in range(0, len(texts), 1000):
            tokens += sum(len(e.ids) + 1 for e in encode(texts[i : i + 1000]))  # + the end token
        return {
            "seconds": time.perf_counter() - started,
            "cpu_s": time.process_time() - cpu0,
            "tokens": tokens,
            "docs": len(texts),
        }
    from shardstream.tokens.pack import pack_tokens

    dest = Path(spec["dest"])
    shutil.rmtree(dest, ignore_errors=True)
    cpu0, started = time.process_time(), time.perf_counter()
    report = pack_tokens(
        spec["corpus"], dest, tokenizer=tokenizer_path, id_field="id", workers=spec["workers"], progress=False
    )
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu0 + usage.ru_utime + usage.ru_stime
    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "tokens": report.num_tokens,
        "docs": report.num_docs,
        "shards": report.num_shards,
    }


def run_pack(args: argparse.Namespace, results: Results, scratch: Path) -> None:
    try:
        from shardstream.tokens import pack as pack_module
    except ImportError:
        pack_module = None
    if pack_module is None or not hasattr(pack_module, "pack_tokens"):
        print("pack: shardstream.tokens.pack.pack_tokens not found; skipped", flush=True)
        return
    corpus = Path(args.workdir) / f"corpus-{args.corpus_mb}mb"
    seconds = write_once(corpus, lambda p: write_corpus(p, args.corpus_mb))
    tok_dir = Path(args.workdir) / f"tokenizer-{args.corpus_mb}mb"
    trained = write_once(tok_dir, lambda p: train_tokenizer(corpus, p))
    print(
        f"corpus {tree_bytes(corpus) / 1e6:.1f} MB (" + (f"written in {seconds:.1f} s" if seconds else "kept") + "); "
        "tokenizer (" + (f"trained in {trained:.1f} s" if trained else "kept") + ")",
        flush=True,
    )
    one = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    base = {"corpus": str(corpus), "tokenizer": str(tok_dir / "tokenizer.json")}
    cases: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
        ("bare encode_batch", "one thread", {"kind": "encode", "method": "encode_batch"}, one),
        ("bare encode_batch_fast", "one thread", {"kind": "encode", "method": "encode_batch_fast"}, one),
        ("bare encode_batch", "its threads", {"kind": "encode", "method": "encode_batch"}, {}),
        ("bare encode_batch_fast", "its threads", {"kind": "encode", "method": "encode_batch_fast"}, {}),
        ("pack_tokens 1 worker", "one thread", {"kind": "pack", "workers": 1}, one),
        ("pack_tokens 1 worker", "the tokenizer's threads", {"kind": "pack", "workers": 1}, {}),
        ("pack_tokens 2 workers", "one thread each (its default)", {"kind": "pack", "workers": 2}, {}),
    ]
    outs: list[list[dict[str, Any]]] = [[] for _ in cases]
    goal_cases = {0, 1, 4, 6}  # the bare one-thread calls and the packs the goals compare: every round
    for r in range(args.repeat):
        for i in [(r + k) % len(cases) for k in range(len(cases))]:
            if r and i not in goal_cases:
                continue
            _, _, spec, env = cases[i]
            outs[i].append(run_child({**base, **spec, "dest": str(scratch / f"pack-{i}")}, env))
    best = [max(o, key=lambda x: x["tokens"] / x["seconds"]) for o in outs]
    rate = [b["tokens"] / b["seconds"] for b in best]
    bare = 0 if rate[0] >= rate[1] else 1  # the faster bare call, one thread: the floor
    ratios = [
        "" if bare == 0 else f"{rate[0] / rate[1]:.2f}x best bare",
        "" if bare == 1 else f"{rate[1] / rate[0]:.2f}x best bare",
        f"{rate[2] / rate[0]:.2f}x 1 thread",
        f"{rate[3] / rate[1]:.2f}x 1 thread",
        f"{rate[4] / rate[bare]:.2f}x best bare",
        f"{rate[5] / rate[bare]:.2f}x best bare",
        f"{rate[6] / rate[4]:.2f}x 1 worker",
    ]
    for i, ((name, what, _, _), b, r, ratio) in enumerate(zip(cases, best, rate, ratios)):
        extra = f"; {b['shards']} shards" if "shards" in b else ""
        results.add(
            Row(
                "pack",
                name,
                what,
                rate=r,
                cpu_s=b["cpu_s"],
                tokens=b["tokens"],
                ratio=ratio,
                note=f"{b['docs']:,} docs, {b['tokens']:,} tokens{extra}; {b['seconds']:.1f} s",
                best=i == bare,
            )
        )
    one_worker, two_workers = rate[4] / rate[bare], rate[6] / rate[4]
    results.goal(
        f"pack: 1 worker (one thread) / bare {cases[bare][0][5:]} (one thread)",
        f"{one_worker:.2f}x",
        f">= {GOAL['pack_one']}x",
        one_worker >= GOAL["pack_one"],
    )
    results.goal(
        "pack: 2 workers / 1 worker (one thread)",
        f"{two_workers:.2f}x",
        f">= {GOAL['pack_two']}x",
        two_workers >= GOAL["pack_two"],
    )


# ---------------------------------------------------------------- main


SCENARIOS = ("pack", "local", "s3", "first", "memory", "resume", "epoch")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smaller run (module doc)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of " + ",".join(SCENARIOS))
    parser.add_argument("--tokens", type=float, help="tokens of the reading dataset (default 2e8; --quick 2e7)")
    parser.add_argument("--shard-tokens", type=int, help="tokens a shard at most (default 2**24; --quick 2**22)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=50257, help="vocabulary of the synthetic tokens (uint16)")
    parser.add_argument("--big-tokens", type=float, help="tokens for memory and resume (default 1e11; --quick 1e10)")
    parser.add_argument("--corpus-mb", type=float, help="text to pack, MB (default 30; --quick 8)")
    parser.add_argument("--repeat", type=int, help="rounds, best kept (default 2; --quick 1)")
    parser.add_argument("--peer-cap-s", type=float, help="stop each peer run here (default 5; --quick 3)")
    parser.add_argument("--skip-peers", action="store_true", help="no LitData and Mosaic")
    parser.add_argument("--workdir", default=str(CACHE / "tokens"), help="where the data are written once")
    parser.add_argument("--json", help="also write the results as JSON to this path")
    parser.add_argument(
        "--profile-scale", action="store_true", help="profile a resume at --big-tokens that misses its goal (slow)"
    )
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        print(json.dumps(child_main(json.loads(args._child))), flush=True)
        return 0
    quick = args.quick
    args.tokens = int(args.tokens or (2e7 if quick else 2e8))
    args.shard_tokens = args.shard_tokens or (1 << 22 if quick else 1 << 24)
    args.big_tokens = int(args.big_tokens or (1e10 if quick else 1e11))
    args.corpus_mb = args.corpus_mb or (8 if quick else 30)
    args.corpus_mb = int(args.corpus_mb) if float(args.corpus_mb).is_integer() else args.corpus_mb
    args.repeat = args.repeat or (1 if quick else 2)
    args.peer_cap_s = args.peer_cap_s or (3.0 if quick else 5.0)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}")
    peers = not args.skip_peers
    if peers:
        try:
            import_mosaic()
            import litdata  # noqa: F401
        except ImportError as exc:
            print(f"peers skipped ({exc}); pip install --no-deps mosaicml-streaming==0.13.0 litdata==0.2.76")
            peers = False

    import torch

    torch.set_num_threads(1)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    results = Results()
    results.info["args"] = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    started = time.perf_counter()
    print(
        f"bench/tokens.py: {os.cpu_count()} cores; seq_len {args.seq_len}; {time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-tokens-") as tmp:
        scratch = Path(tmp)
        data = None
        if {"local", "s3", "epoch"} & set(scenarios):
            data = prepare_data(args, peers)
            print(
                f"reading dataset: {data.num_tokens:,} tokens (uint16) in {data.num_shards} shards; "
                f"{(data.num_tokens - 1) // args.seq_len:,} blocks of {args.seq_len}",
                flush=True,
            )
        print(HEADER, flush=True)
        if "pack" in scenarios:
            run_pack(args, results, scratch)
        if "local" in scenarios and data is not None:
            run_local(args, data, results, scratch, peers)
        needs_s3 = {"s3", "first", "memory", "resume", "epoch"} & set(scenarios)
        if needs_s3:
            from shardstream.testing import SeaweedS3Server

            with SeaweedS3Server() as server:
                server.create_bucket(BUCKET)
                info = server.info
                os.environ.update(info.env())
                os.environ.update(S3_ENDPOINT_URL=info.endpoint_url, AWS_EC2_METADATA_DISABLED="true")
                env = S3Env(server, info, info.s3_config(), boto3_client(info))
                if data is not None and {"s3", "epoch"} & set(scenarios):
                    env.upload(data.ss, "ss")
                if "s3" in scenarios and data is not None:
                    run_s3(args, data, env, results)
                if "first" in scenarios:
                    run_first(args, env, results)
                if "memory" in scenarios:
                    run_memory(args, env, results)
                if "resume" in scenarios:
                    run_resume(args, env, results, scratch)
                if "epoch" in scenarios and data is not None:
                    run_epochs(args, data, env, results, scratch, peers)

    print(f"\n(total {time.perf_counter() - started:.0f} s)\n{HEADER}")
    for row in results.rows:
        print(row.line())
    print("\ngoals:")
    width = max((len(g[0]) for g in results.goals), default=40)
    for name, measured, target, ok in results.goals:
        verdict = "(no target)" if ok is None else "met" if ok else "NOT met"
        print(f"  {name:{width}s} {measured:>22s}  target {target:14s} {verdict}")
    for name, text in results.profiles.items():
        print(f"\nprofile ({name}):\n{text}")
    if args.json:
        Path(args.json).write_text(json.dumps(results.to_json(), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
