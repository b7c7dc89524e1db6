"""What a multi-machine pack costs before it packs a byte, and after (issue 27): listing the
source and merging the index, on a local SeaweedFS S3 server started here.

Listing. A source of ``--files`` objects in ``--dirs`` "directories" is walked
- as every pack stream walked it before the listing existed: one directory after another
  (``threads=1``), once **per stream**;
- as the listing walks it now: once per pack, 16 directories at a time.
LIST requests are counted at a proxy in front of the server (:class:`FaultProxy` of tests/servers with no
fault); times are taken without the proxy. A local tree of the same shape is walked both ways too.

Merge. The records of a finished pack of ``--shards`` shards over ``--streams`` streams are
written to S3 in both layouts and merged:
- one record per shard, read one after another (the merge before issue 27);
- the same, read 32 at a time;
- one done record per stream holding its rows (what ``pack`` writes now), read 32 at a time.

The old layout is merged at ``--before-shards`` records (its time grows linearly: 10^5 records
one at a time take ~5.5 min here).

Run: ``python bench/pack_scale.py`` (10^5 objects, 10^5 shard records; ~6 min on 2 cores).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # servers.faultproxy

from servers.faultproxy import FaultProxy

from shardstream import S3Config
from shardstream.packing import merge as merging
from shardstream.packing.journal import SPEC_NAME, PackSpec, StreamRecord
from shardstream.packing.merge import merge
from shardstream.packing.sources import iter_source_samples
from shardstream.storage import open_store
from shardstream.testing import SeaweedS3Server


def put_many(store, items, threads: int = 32) -> None:
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda item: store.write_bytes(*item), items))


def walk(source: str, *, s3: S3Config | None, threads: int) -> tuple[float, int]:
    started = time.perf_counter()
    count = sum(
        len(s.files) for s in iter_source_samples(source, list_path=None, on_problem=print, s3=s3, threads=threads)
    )
    return time.perf_counter() - started, count


def listing_part(args: argparse.Namespace, server: SeaweedS3Server, s3: S3Config, scratch: Path) -> dict:
    server.create_bucket("listbench")
    source = "s3://listbench/src"
    names = [f"d{d:04d}/{i:07d}.jpg" for d in range(args.dirs) for i in range(args.files // args.dirs)]
    started = time.perf_counter()
    put_many(open_store(source, s3=s3), ((name, b"x") for name in names))
    print(f"uploaded {len(names)} objects in {time.perf_counter() - started:.0f} s")
    lists: list[str] = []

    def count(method: str, path: str) -> bool:
        if method == "GET" and path.rstrip("/") == "/listbench":
            lists.append(path)
        return False

    with FaultProxy(server.info.endpoint_url, rates={}, match=count) as proxy:
        via = S3Config(**{**s3.__dict__, "endpoint_url": proxy.endpoint_url})
        walk(source, s3=via, threads=1)
    list_requests = len(lists)
    results = {"objects": len(names), "dirs": args.dirs, "list_requests_per_walk": list_requests}
    if args.list_latency_ms:  # a remote store's round trip, added to every LIST at a proxy
        delay_s = args.list_latency_ms / 1000

        def lists_only(method: str, path: str) -> bool:
            return method == "GET" and path.rstrip("/") == "/listbench"

        with FaultProxy(server.info.endpoint_url, rates={"delay": 1.0}, delay_s=delay_s, match=lists_only) as proxy:
            via = S3Config(**{**s3.__dict__, "endpoint_url": proxy.endpoint_url})
            for label, threads in (("sequential walk", 1), ("listing, 16 at once", 16)):
                seconds, _ = min(walk(source, s3=via, threads=threads) for _ in range(args.repeats))
                results[f"{label}, +{args.list_latency_ms:g} ms a LIST"] = seconds
                print(f"s3 {label} with {args.list_latency_ms:g} ms added to each LIST: {seconds:.2f} s")
    for label, threads in (("sequential walk (one stream, before)", 1), ("listing, 16 directories at once", 16)):
        seconds, found = min(walk(source, s3=s3, threads=threads) for _ in range(args.repeats))
        assert found == len(names), (found, len(names))
        results[label] = seconds
        print(f"s3 {label}: {seconds:.2f} s, {found / seconds:,.0f} objects/s, {list_requests} LISTs")
    tree = scratch / "tree"
    for name in names:
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    for label, threads in (("local sequential walk", 1), ("local listing, 4 at once (its default)", 4)):
        seconds, found = min(walk(str(tree), s3=None, threads=threads) for _ in range(args.repeats))
        results[label] = seconds
        print(f"{label}: {seconds:.2f} s, {found / seconds:,.0f} files/s (stat included)")
    shutil.rmtree(tree)
    return results


def merge_part(args: argparse.Namespace, server: SeaweedS3Server, s3: S3Config) -> dict:
    results = {}
    for listed in (False, True):
        shards = args.shards if listed else args.before_shards
        per_stream = shards // args.streams
        bucket = f"mergebench{int(listed)}"
        server.create_bucket(bucket)
        store = open_store(f"s3://{bucket}/ds", s3=s3)
        spec = PackSpec(
            source="/src",
            files_from=False,
            name="data",
            max_shard_bytes=256 << 20,
            max_samples_per_shard=None,
            num_parts=args.streams,
            workers=1,
            shuffle=False,
            seed=0,
            listed=listed,
        )
        store.write_bytes(SPEC_NAME, spec.to_json())

        def row(stream: int, seq: int, spec: PackSpec = spec, per_stream: int = per_stream) -> dict:
            number = spec.shard_number(stream * per_stream if spec.listed else stream, seq)
            return {
                "name": f"data-{number:06d}.tar",
                "bytes": 268_000_000,
                "num_samples": 2700,
                "num_members": 5400,
                "crc32": "0badf00d",
            }

        records = []
        for stream in range(args.streams):
            rows = []
            for seq in range(per_stream):
                record = StreamRecord(
                    stream=stream, seq=seq, consumed=0, problems=(), spec_digest=spec.digest, shard=row(stream, seq)
                )
                rows.append({"shard": record.shard, "problems": []})
                if not listed:
                    records.append((StreamRecord.name(stream, seq), record.header()))
            done = StreamRecord(
                stream=stream,
                seq=per_stream,
                consumed=0,
                problems=(),
                spec_digest=spec.digest,
                rows=tuple(rows) if listed else None,
            )
            records.append((StreamRecord.name(stream, None), done.header()))
        started = time.perf_counter()
        put_many(store, records)
        kind = "done records with rows" if listed else "one per shard"
        print(f"wrote {len(records)} records ({kind}) in {time.perf_counter() - started:.0f} s")
        settings = (
            [("one record per stream, 32 at once (now)", 32)]
            if listed
            else [
                ("one record per shard, one at a time (before)", 1),
                ("one record per shard, 32 at once", 32),
            ]
        )
        for label, in_flight in settings:
            merging.MERGE_READS_IN_FLIGHT = in_flight
            started = time.perf_counter()
            totals, _ = merge(store, spec)
            seconds = time.perf_counter() - started
            merging.MERGE_READS_IN_FLIGHT = 32
            assert totals["num_shards"] == shards, totals
            results[label] = {"shards": shards, "seconds": seconds}
            print(f"merge of {shards} shards, {label}: {seconds:.1f} s ({shards / seconds:,.0f} shards/s)")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000, help="objects in the source (default 10^5)")
    parser.add_argument("--dirs", type=int, default=100, help="directories they lie in (default 100)")
    parser.add_argument("--shards", type=int, default=100_000, help="shard records to merge (default 10^5)")
    parser.add_argument(
        "--before-shards", type=int, default=10_000, help="shard records of the old layout (default 10^4: minutes each)"
    )
    parser.add_argument("--streams", type=int, default=100, help="streams that wrote them (default 100)")
    parser.add_argument(
        "--list-latency-ms", type=float, default=30.0, help="also walk with this added to every LIST (0: no)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="walks of each kind; the best is shown")
    parser.add_argument("--skip", choices=["listing", "merge"], action="append", default=[])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="pack-scale-"))
    results = {}
    try:
        with SeaweedS3Server(data_dir=scratch / "weed") as server:
            info = server.info
            s3 = S3Config(
                endpoint_url=info.endpoint_url,
                access_key_id=info.access_key_id,
                secret_access_key=info.secret_access_key,
                region_name=info.region_name,
            )
            if "listing" not in args.skip:
                results["listing"] = listing_part(args, server, s3, scratch)
            if "merge" not in args.skip:
                results["merge"] = merge_part(args, server, s3)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if "listing" in results:
        r = results["listing"]
        for streams in (4, 1600):
            before = streams * r["sequential walk (one stream, before)"]
            now = r["listing, 16 directories at once"]
            lists = r["list_requests_per_walk"]
            print(
                f"{streams} streams: LISTs {streams * lists} before, {lists} now; "
                f"listing time {before:.1f} s of stream time before, {now:.2f} s now"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
