"""Write a Hugging Face ``datasets.Dataset`` of images into tar shards, two ways.

    python examples/pack_from_hf_dataset.py                       # 200 rows, in a temporary directory
    python examples/pack_from_hf_dataset.py --dest ./shards --rows 2000 --workers 4

The script builds a ``datasets.Dataset`` in memory (``Dataset.from_dict``, no Hub access): an
``image`` column of PIL images (the ``datasets.Image`` feature), a ``label`` (``ClassLabel``)
and a ``text`` caption. A dataset from ``datasets.load_dataset(...)`` is used the same way.

1. :class:`shardstream.ShardWriter`, row by row in this process: each row becomes
   ``{"__key__": f"{i:08d}", "jpg": row["image"], "cls": row["label"], "txt": row["text"]}``;
   the writer saves the PIL image as a JPEG (quality 90), the label as decimal text and the
   caption as UTF-8. Written to ``DEST/shard_writer``.
2. :func:`shardstream.pack_samples` over ranges of row numbers in ``--workers`` spawned
   processes: ``samples_of_rows`` (module-level, so the workers can unpickle it) is bound
   to the dataset with ``functools.partial``, so each worker receives the dataset once (a
   dataset loaded from disk pickles as a reference to its memory-mapped Arrow files) and
   decodes and encodes its own rows; only the ranges travel per task. The result does not
   depend on the number of workers, and a killed pack resumes when run again. Written to
   ``DEST/pack_samples``.

Then it reads both datasets back with ``ShardDataset(..., decode="pil")`` and checks that
they hold the same samples (keys, decoded pixels, labels, captions) and that these match
the source rows (label, caption, image size); it exits with an error when they do not.
``--dest`` defaults to a temporary directory (removed at exit). Needs ``datasets`` and Pillow.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import tempfile
from typing import Any

import datasets
import numpy as np
from PIL import Image

from shardstream import ShardDataset, ShardWriter, pack_samples

CLASS_NAMES = ("circle", "square", "cross")
ROWS_PER_TASK = 50

# key -> (SHA-1 of the decoded pixels, image size, label, caption)
Contents = dict[str, tuple[str, tuple[int, int], int, str]]


def make_dataset(num_rows: int) -> datasets.Dataset:
    """``num_rows`` rows of (image, label, text); the same every run."""
    rng = np.random.default_rng(0)
    images, labels, texts = [], [], []
    for i in range(num_rows):
        label = i % len(CLASS_NAMES)
        width, height = (int(v) for v in rng.integers(40, 81, 2))
        y, x = np.ogrid[-1 : 1 : height * 1j, -1 : 1 : width * 1j]
        inside = [x**2 + y**2 < 0.5, np.maximum(abs(x), abs(y)) < 0.6, np.minimum(abs(x), abs(y)) < 0.2][label]
        background = rng.uniform(0, 255, 3)
        pixels = np.where(inside[..., None], 255 - background, background) + rng.normal(0, 10, (height, width, 3))
        images.append(Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)))
        labels.append(label)
        texts.append(f"a {CLASS_NAMES[label]} on a plain background, picture {i}")
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASS_NAMES), "text": datasets.Value("string")}
    )
    return datasets.Dataset.from_dict({"image": images, "label": labels, "text": texts}, features=features)


def to_sample(i: int, row: dict[str, Any]) -> dict[str, Any]:
    """Row ``i`` as a sample: a PIL image under ``jpg`` is saved as a JPEG by the writer."""
    return {"__key__": f"{i:08d}", "jpg": row["image"], "cls": row["label"], "txt": row["text"]}


def samples_of_rows(dataset: datasets.Dataset, rows: range) -> list[dict[str, Any]]:
    """The samples of some rows of ``dataset`` (runs in a pack_samples worker)."""
    return [to_sample(i, dataset[i]) for i in rows]


def read_back(dest: str) -> Contents:
    """One epoch of the dataset at ``dest``, decoded, by key."""
    contents: Contents = {}
    for sample in ShardDataset(dest, decode="pil", shuffle=False):
        image = sample["jpg"]
        digest = hashlib.sha1(image.tobytes()).hexdigest()
        contents[sample["__key__"]] = (digest, image.size, sample["cls"], sample["txt"])
    return contents


def check(written: Contents, packed: Contents, dataset: datasets.Dataset) -> None:
    """Exit with an error unless both datasets hold the same samples, one per source row."""
    source = {
        f"{i:08d}": (image.size, label, text)
        for i, (image, label, text) in enumerate(zip(dataset["image"], dataset["label"], dataset["text"]))
    }
    differ = sorted(key for key in written.keys() | packed.keys() if written.get(key) != packed.get(key))
    unlike_source = sorted(
        key for key, (_, size, label, text) in written.items() if source.get(key) != (size, label, text)
    )
    if len(written) != len(source) or len(packed) != len(source) or differ or unlike_source:
        raise SystemExit(
            f"MISMATCH: {len(source)} rows; ShardWriter's dataset holds {len(written)} samples, "
            f"pack_samples' {len(packed)}; {len(differ)} keys differ between them (e.g. {differ[:3]}), "
            f"{len(unlike_source)} unlike their source row (e.g. {unlike_source[:3]})"
        )
    print(f"both datasets hold the same {len(source)} samples, equal to the source rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", help="local directory for the two datasets (default: a temporary one)")
    parser.add_argument("--rows", type=int, default=200, help="rows of the dataset made")
    parser.add_argument("--workers", type=int, default=2, help="processes of pack_samples")
    parser.add_argument("--samples-per-shard", type=int, default=64)
    parser.add_argument("--overwrite", action="store_true", help="replace the datasets under --dest")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        dest = args.dest or tmp
        dataset = make_dataset(args.rows)
        print(f"made a datasets.Dataset of {len(dataset)} rows: {dataset.features}")

        with ShardWriter(
            f"{dest}/shard_writer", max_samples_per_shard=args.samples_per_shard, overwrite=args.overwrite
        ) as writer:
            for i, row in enumerate(dataset):
                writer.write(to_sample(i, row))
        report = writer.close()  # the block's end closed it: this returns its report
        print(f"ShardWriter: {report.summary()}")

        report = pack_samples(
            functools.partial(samples_of_rows, dataset),
            [range(start, min(start + ROWS_PER_TASK, len(dataset))) for start in range(0, len(dataset), ROWS_PER_TASK)],
            f"{dest}/pack_samples",
            workers=args.workers,
            inputs_per_task=1,
            max_samples_per_shard=args.samples_per_shard,
            overwrite=args.overwrite,
            progress=False,
        )
        print(f"pack_samples: {report.summary()}")

        written, packed = read_back(f"{dest}/shard_writer"), read_back(f"{dest}/pack_samples")
        print(f"read back {len(written)} samples written by ShardWriter and {len(packed)} by pack_samples")
        check(written, packed, dataset)


if __name__ == "__main__":
    main()
