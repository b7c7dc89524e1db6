"""Shuffle quality of shardstream against WebDataset, Mosaic Streaming and LitData, on the same
data (the streaming benchmark's photo corpus and its peers' conversions, read from local disk:
shuffle quality does not depend on where the bytes come from).

Each system reads ``--epochs`` epochs (metrics are their mean) with shuffling on (shardstream
and WebDataset: a shuffle buffer of ``--shuffle-buffer`` samples, WebDataset also shuffling
shard order; Mosaic Streaming: ``shuffle=True``, its default algorithm; LitData: ``shuffle=True``), in one process. Each
output sample is mapped back to its position in the index order (by the SHA-1 of its image
bytes, since not every format keeps the key). Two references: "no shuffle" (index order) and
"ideal" (a uniform random permutation). Metrics, for N samples:

- ``|spearman|``: rank correlation of output position with index position (ideal ~0);
- ``mean gap``: mean |index distance| between consecutive outputs, as a fraction of N (ideal ~1/3);
- ``same shard``: fraction of consecutive outputs from the same shard of the index (ideal ~1/shards);
- ``shards/100``: distinct shards in each window of 100 consecutive outputs, averaged;
- ``first 1% span``: index range covered by the first 1% of the output, as a fraction of N
  (how far from "the start of the dataset" training begins; ideal ~1);
- ``epoch overlap``: the fraction of positions holding the same sample in epochs 0 and 1
  (ideal ~0);
- ``lost``: samples missing or repeated in an epoch (must be 0).

With ``--mixture`` the corpus is also packed as three sources (its first 60%, next 30% and
last 10% in index order) and read as one ShardDataset mixture, each source whole once an
epoch; each source's samples, in the order the mixture yields them, are scored against that
source's own index order (rows ``mixture: A`` ...), to compare with shardstream reading one
dataset: mixing sources must not shuffle any of them worse.

Usage:
    python bench/shuffle.py [--num-images 10000] [--shuffle-buffer 1000] [--skip-peers] [--mixture]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import stream as S  # the streaming benchmark: corpus, peers' writers and readers


def image_digest(data: Any) -> bytes:
    return hashlib.sha1(bytes(data)).digest()


def spearman(order: np.ndarray) -> float:
    """Rank correlation of output position with index position (``order`` is a permutation)."""
    return float(np.corrcoef(np.arange(len(order)), order)[0, 1]) if len(order) > 1 else 0.0


def metrics(order: np.ndarray, shard_of: np.ndarray) -> dict[str, float]:
    n = len(order)
    shards = shard_of[order]
    windows = [len(set(shards[i : i + 100].tolist())) for i in range(0, n - 99, 100)]
    head = order[: max(2, n // 100)]
    return {
        "|spearman|": abs(spearman(order)),
        "mean gap": float(np.abs(np.diff(order)).mean() / n),
        "same shard": float(np.mean(shards[1:] == shards[:-1])),
        "shards/100": float(np.mean(windows)) if windows else 0.0,
        "first 1% span": float((head.max() - head.min()) / n),
    }


def positions(samples: Iterable[Any], where: dict[bytes, int], pick: Callable[[Any], Any]) -> tuple[np.ndarray, int]:
    """Index positions of the samples in output order, and how many did not map (or repeated)."""
    out, bad, seen = [], 0, set()
    for sample in samples:
        position = where.get(image_digest(pick(sample)))
        if position is None or position in seen:
            bad += 1
            continue
        seen.add(position)
        out.append(position)
    return np.asarray(out, dtype=np.int64), bad


def readers(setup: S.Setup, ss_dir: str, buffer: int) -> dict[str, Callable[[int], Iterable[Any]]]:
    """System -> read(epoch) yielding its samples of one shuffled epoch."""
    from shardstream import ShardDataset

    def shardstream(epoch: int) -> Iterable[Any]:
        dataset = ShardDataset(ss_dir, shuffle=True, shuffle_buffer=buffer, seed=0)
        dataset.set_epoch(epoch)
        return dataset

    def webdataset(epoch: int) -> Iterable[Any]:
        import webdataset as wds

        urls = [str(Path(setup.local["wds"], n)) for n in setup.shard_names("wds", ".tar")]
        return wds.WebDataset(urls, shardshuffle=len(urls), seed=epoch, empty_check=False).shuffle(buffer)

    held: dict[str, Any] = {}

    def mosaic(epoch: int) -> Iterable[Any]:
        if epoch == 0:  # one dataset object: Mosaic moves to its next epoch after each full pass
            S.import_mosaic()  # its torchvision-free import shim, before any streaming module
            S.clean_mosaic_shm(setup)
            held["mosaic"] = S.mosaic_dataset(setup, "local", shuffle=True, batch_size=S.BATCH)
        return held["mosaic"]

    def litdata(epoch: int) -> Iterable[Any]:
        dataset = S.litdata_dataset(setup, "local", shuffle=True, seed=42)
        dataset.set_epoch(epoch + 1)
        return dataset

    return {"shardstream": shardstream, "webdataset": webdataset, "mosaic": mosaic, "litdata": litdata}


def mixture_rows(root: Path, samples: list, tmp: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Each source's shuffle metrics in a three-source mixture of the corpus (module doc)."""
    from shardstream import ShardDataset, Source, open_index, pack

    n = len(samples)
    cuts = {"A": (0, int(0.6 * n)), "B": (int(0.6 * n), int(0.9 * n)), "C": (int(0.9 * n), n)}
    where: dict[str, dict[bytes, int]] = {}
    shard_of: dict[str, np.ndarray] = {}
    paths = {}
    for name, (a, b) in cuts.items():
        part = samples[a:b]
        files = Path(tmp, f"files-{name}.txt")
        files.write_text("".join(f"{rel}\n" for _, members in part for rel in sorted(members.values())))
        paths[name] = f"{tmp}/mixture-{name}"
        pack(root, paths[name], max_shard_bytes=args.shard_mib << 20, files_from=files, progress=False)
        index = open_index(paths[name])
        shard_of[name] = np.repeat(np.arange(index.num_shards), index.manifest.shard_samples)
        where[name] = {
            image_digest(Path(root, members[S.IMAGE_EXT]).read_bytes()): i for i, (_, members) in enumerate(part)
        }
    dataset = ShardDataset(
        [Source(paths[name], name=name) for name in cuts], shuffle_buffer=args.shuffle_buffer, seed=0, batch_size=64
    )
    started = time.perf_counter()
    orders: dict[str, list[tuple[np.ndarray, int]]] = {name: [] for name in cuts}
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)
        read = list(dataset)
        for name in cuts:
            mine = [x for x in read if x["__source__"] == name]
            orders[name].append(positions(mine, where[name], lambda x: x[S.IMAGE_EXT]))
    print(f"mixture: {args.epochs} epochs in {time.perf_counter() - started:.1f} s", flush=True)
    rows = {}
    rng = np.random.default_rng(1)
    for name, (a, b) in cuts.items():
        rows[f"ideal for {name} ({shard_of[name][-1] + 1} shards)"] = {
            **metrics(rng.permutation(b - a), shard_of[name]),
            "epoch overlap": float(np.mean(rng.permutation(b - a) == rng.permutation(b - a))),
            "lost": 0,
        }
        per_epoch = [metrics(order, shard_of[name]) for order, _ in orders[name]]
        first, second = orders[name][0][0], orders[name][1][0]
        rows[f"mixture: {name} ({100 * (b - a) // n}%)"] = {
            **{k: float(np.mean([m[k] for m in per_epoch])) for k in per_epoch[0]},
            "epoch overlap": float(np.mean(first == second)) if len(first) == len(second) else float("nan"),
            "lost": max((b - a) - len(order) + bad for order, bad in orders[name]),
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", type=int, default=10000)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--shuffle-buffer", type=int, default=1000)
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4, help="epochs read per system; metrics are their mean")
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--mixture", action="store_true", help="also score each source of a three-source mixture")
    args = parser.parse_args()
    root, samples, tag = S.corpus_samples("dir" if args.dir else "photos", args)
    n = len(samples)
    print(f"{n} samples from {root}; shards of {args.shard_mib} MiB; shuffle buffer {args.shuffle_buffer}", flush=True)
    where = {image_digest(Path(root, members[S.IMAGE_EXT]).read_bytes()): i for i, (_, members) in enumerate(samples)}
    with tempfile.TemporaryDirectory(prefix="shardstream-bench-shuffle-") as tmp:
        from shardstream import open_index, pack

        files = Path(tmp, "files.txt")
        files.write_text("".join(f"{rel}\n" for _, members in samples for rel in sorted(members.values())))
        ss_dir = f"{tmp}/shardstream"
        pack(root, ss_dir, max_shard_bytes=args.shard_mib << 20, files_from=files, progress=False)
        index = open_index(ss_dir)
        shard_of = np.repeat(np.arange(index.num_shards), index.manifest.shard_samples)
        peer_root = S.CACHE / f"stream-{tag}-{args.shard_mib}MiB"
        setup = S.Setup(
            root=str(root),
            samples=samples,
            local={
                "shardstream": ss_dir,
                "wds": str(peer_root / "wds"),
                "mds": str(peer_root / "mds"),
                "litdata": str(peer_root / "litdata"),
            },
            endpoint_url="",
            access_key_id="",
            secret_access_key="",
            region_name="",
            scratch=tmp,
            cap_s=600,
        )
        systems = readers(setup, ss_dir, args.shuffle_buffer)
        if args.skip_peers:
            systems = {"shardstream": systems["shardstream"]}
        else:
            for system in ("wds", "mds", "litdata"):
                S.convert_peer(setup, system, peer_root / system, args.shard_mib << 20)
        rng = np.random.default_rng(0)
        rows: dict[str, dict[str, float]] = {
            "no shuffle (index order)": {**metrics(np.arange(n), shard_of), "epoch overlap": 1.0, "lost": 0},
            "ideal (uniform permutation)": {
                **metrics(rng.permutation(n), shard_of),
                "epoch overlap": float(np.mean(rng.permutation(n) == rng.permutation(n))),
                "lost": 0,
            },
        }
        for name, read in systems.items():
            started = time.perf_counter()
            try:
                orders = [positions(read(epoch), where, lambda s: s[S.IMAGE_EXT]) for epoch in range(args.epochs)]
            except Exception as exc:  # noqa: BLE001 - a peer that cannot run here is reported, not fatal
                print(f"{name}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            first, second = orders[0][0], orders[1][0]
            same = len(first) == len(second) and len(first) > 0
            per_epoch = [metrics(order, shard_of) for order, _ in orders]
            rows[name] = {
                **{k: float(np.mean([m[k] for m in per_epoch])) for k in per_epoch[0]},
                "epoch overlap": float(np.mean(first == second)) if same else float("nan"),
                "lost": max(n - len(order) + bad for order, bad in orders),
            }
            print(f"{name}: {args.epochs} epochs in {time.perf_counter() - started:.1f} s", flush=True)
        if args.mixture:
            rows.update(mixture_rows(root, samples, tmp, args))
    columns = ["|spearman|", "mean gap", "same shard", "shards/100", "first 1% span", "epoch overlap", "lost"]
    print(f"\n{'system':30s}" + "".join(f"{c:>15s}" for c in columns))
    for name, row in rows.items():
        print(f"{name:30s}" + "".join(f"{row[c]:15.0f}" if c == "lost" else f"{row[c]:15.3f}" for c in columns))
    peers = [
        r
        for r in rows
        if r not in ("shardstream", "no shuffle (index order)", "ideal (uniform permutation)")
        and not r.startswith(("mixture", "ideal for"))
    ]
    if "shardstream" in rows and peers:
        ss = rows["shardstream"]
        print(
            f"\nshardstream vs peers: first 1% span {ss['first 1% span']:.3f} (peers "
            + ", ".join(f"{p} {rows[p]['first 1% span']:.3f}" for p in peers)
            + f"); same-shard neighbours {ss['same shard']:.3f} (peers "
            + ", ".join(f"{p} {rows[p]['same shard']:.3f}" for p in peers)
            + ")"
        )
    out = S.CACHE / f"shuffle-{n}.json"
    out.write_text(json.dumps(rows, indent=1))
    print(f"results: {out}\ncommand: python bench/shuffle.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
