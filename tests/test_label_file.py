"""``pack --labels-from FILE`` (labels kept beside the files: a flat ImageNet-style validation
folder and a ``filename,label`` CSV, or JSON Lines), ``--classes`` / ``--classes-from`` (a
validation set that keeps the training set's class indices), ``ShardWriter(classes=)`` and
``pack_samples(classes=)``, and what a plain pack leaves out (metadata files, hidden files).

The oracles are written out here: each file's class index from the sorted labels (or the class
list given), its bytes from the file; the shards are read back with Python's tarfile,
webdataset and ``ShardDataset``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

import numpy as np
import pytest
from PIL import Image
from test_labels import SHARDSTREAM, image, read_tar, read_webdataset

from shardstream import ShardDataset, ShardWriter, open_index, pack, pack_samples
from shardstream.errors import SourceError, SourceNotFoundError
from shardstream.testing import make_image_dataset
from shardstream.testing.synth import CLASS_NAMES

NUM_IMAGES = 30
NUM_CLASSES = 3
CLI_TIMEOUT_S = 120


def shardstream(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SHARDSTREAM, *map(str, args)], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )


@pytest.fixture(scope="module")
def train_tree(tmp_path_factory) -> Path:
    """make_image_dataset's class folders: image i is ``CLASS_NAMES[i % 3]/{i:06d}.jpg``."""
    root = tmp_path_factory.mktemp("synth") / "train"
    make_image_dataset(
        root, num_images=NUM_IMAGES, num_classes=NUM_CLASSES, min_side_px=16, max_side_px=40, cls_files=False
    )
    return root


def class_of_image(i: int) -> str:
    return CLASS_NAMES[i % NUM_CLASSES]


def image_path(train: Path, i: int) -> Path:
    return train / class_of_image(i) / f"{i:06d}.jpg"


def sorted_classes() -> list[str]:
    return sorted({class_of_image(i) for i in range(NUM_IMAGES)})


def flat_validation_set(train: Path, root: Path, rename) -> dict[str, str]:
    """Every image of ``train`` copied into ``root`` (one flat folder) as ``rename(i)``;
    returns {file name relative to root: its label}."""
    labels = {}
    for i in range(NUM_IMAGES):
        name = rename(i)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(image_path(train, i), root / name)
        labels[name] = class_of_image(i)
    return labels


def key_of(rel: str) -> str:
    """The path without its last suffix: what ``unquote(key)`` gives back."""
    return str(PurePosixPath(rel).with_suffix(""))


def check_labelled(dest: Path, src: Path, labels: dict[str, str], classes: list[str]) -> None:
    """``dest`` holds one sample per file of ``labels`` (rel path -> label): its bytes under its
    lower-cased suffix and the index of its label in ``classes`` as ``cls``; nothing else."""
    index = {name: i for i, name in enumerate(classes)}
    want = {
        key_of(rel): {
            PurePosixPath(rel).suffix[1:].lower(): (src / rel).read_bytes(),
            "cls": str(index[label]).encode(),
        }
        for rel, label in labels.items()
    }
    for got in (read_tar(dest), read_webdataset(dest)):
        assert {unquote(key): members for key, members in got.items()} == want
        assert all("." not in key.rsplit("/", 1)[-1] for key in got)
    manifest = open_index(dest).manifest
    assert manifest.classes == classes
    assert manifest.class_counts == [sum(label == name for label in labels.values()) for name in classes]
    assert ShardDataset(dest).classes == classes


# -- (1) an ImageNet-style flat validation folder and a filename,label CSV, through the CLI ----------------


def test_a_flat_folder_and_a_filename_label_csv_through_the_command_line(train_tree, tmp_path):
    src = tmp_path / "val"
    labels = flat_validation_set(train_tree, src, lambda i: f"ILSVRC2012_val_{i + 1:08d}.JPEG")
    rows = sorted(labels.items(), key=lambda row: row[0][::-1])  # not in file order: rows are found by name
    csv_path = tmp_path / "LOC_val_solution.csv"
    csv_path.write_text("filename,label\n" + "".join(f"{name},{label}\n" for name, label in rows))
    dest = tmp_path / "out"
    done = shardstream(
        "pack", src, dest, "--labels-from", csv_path, "--no-progress", "--workers", "2", "--max-samples-per-shard", "4"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"packed {NUM_IMAGES} files ({NUM_IMAGES} samples, ")
    classes = sorted_classes()
    assert classes == ["forest", "ocean", "sunset"]
    check_labelled(dest, src, labels, classes)
    assert open_index(dest).manifest.num_samples == NUM_IMAGES
    # through ShardDataset: decoded images (the same pixels as the file) with their label as an int
    seen = {}
    for sample in ShardDataset(dest, shuffle=False, decode="pil", fields={"image": "jpeg", "label": "cls"}):
        name = f"{sample['__key__']}.JPEG"
        with Image.open(src / name) as original:
            assert np.array_equal(np.asarray(sample["image"]), np.asarray(original.convert("RGB")))
        seen[name] = sample["label"]
    assert seen == {name: classes.index(label) for name, label in labels.items()}
    info = shardstream("info", dest)
    assert info.returncode == 0, info.stderr
    assert "3 classes (class index, name, samples)" in info.stdout
    assert [line.split() for line in info.stdout.splitlines() if line.startswith("  ")][-3:] == [
        ["0", "forest", "10"],
        ["1", "ocean", "10"],
        ["2", "sunset", "10"],
    ]


# -- (2) JSON Lines with file_name / label, paths with folders -----------------------------------------


def test_json_lines_with_file_name_and_paths_into_subfolders(train_tree, tmp_path):
    src = tmp_path / "src"

    def rename(i: int) -> str:  # folders, dots in names, a percent sign, upper-case suffixes
        folder = ["images/a", "images/b/deep", "top"][i % 3]
        return f"{folder}/img.{'50%' if i == 8 else ''}v{i}.{'JPG' if i % 2 else 'jpeg'}"

    labels = flat_validation_set(train_tree, src, rename)
    assert "top/img.50%v8.jpeg" in labels
    (src / "images" / "b" / "deep" / "notes.txt").write_text("no row: left out")
    jsonl = tmp_path / "labels.jsonl"
    rows = [{"file_name": name, "label": label, "caption": f"#{n}"} for n, (name, label) in enumerate(labels.items())]
    rows[0]["file_name"] = "./" + rows[0]["file_name"]  # normalised
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows) + "\n")  # a blank line is no row
    report = pack(src, tmp_path / "out", labels_from=jsonl, on_error="skip", progress=False)
    assert [(Path(p.path).name, p.kind.value, p.packed) for p in report.problems] == [
        ("notes.txt", "unlabelled", False)
    ]
    assert report.num_samples == NUM_IMAGES
    check_labelled(tmp_path / "out", src, labels, sorted_classes())
    keys = [sample["__key__"] for sample in ShardDataset(tmp_path / "out", shuffle=False)]
    assert "top/img%2E50%25v8" in keys
    assert sorted(map(unquote, keys)) == sorted(map(key_of, labels))


def test_an_excel_csv_with_a_bom_crlf_and_other_column_names(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    files = {"a.png": "cat", "b.png": "dog", "c.png": "cat"}
    for n, name in enumerate(files):
        (src / name).write_bytes(image(n, "PNG"))
    labels = tmp_path / "labels.csv"
    labels.write_bytes(
        "\ufeffimage,class,extra\r\n".encode() + "".join(f"{k},{v},x\r\n" for k, v in files.items()).encode()
    )
    report = pack(src, tmp_path / "out", labels_from=labels, progress=False)
    assert report.problems == ()
    check_labelled(tmp_path / "out", src, files, ["cat", "dog"])


# -- (3) a validation tree missing a class keeps the training indices --------------------------------------


def test_a_validation_tree_missing_a_class_keeps_the_training_indices(train_tree, tmp_path):
    train = tmp_path / "train"
    done = shardstream("pack", train_tree, train, "--labels-from-dirs", "--no-progress", "--workers", "1")
    assert done.returncode == 0, done.stderr
    train_classes = sorted_classes()
    assert open_index(train).manifest.classes == train_classes
    val_src = tmp_path / "val_src"
    shutil.copytree(train_tree, val_src)
    shutil.rmtree(val_src / "forest")  # index 0 of the training set: the others would shift by one
    val = tmp_path / "val"
    done = shardstream(
        "pack", val_src, val, "--labels-from-dirs", "--classes-from", train, "--no-progress", "--workers", "1"
    )
    assert done.returncode == 0, done.stderr
    manifest = open_index(val).manifest
    assert manifest.classes == open_index(train).manifest.classes == train_classes
    assert manifest.class_counts == [0, 10, 10]
    assert ShardDataset(val).classes == ShardDataset(train).classes
    want = {
        f"{class_of_image(i)}/{i:06d}": train_classes.index(class_of_image(i))
        for i in range(NUM_IMAGES)
        if class_of_image(i) != "forest"
    }
    got = {s["__key__"]: int(s["cls"]) for s in ShardDataset(val, shuffle=False)}
    assert got == want
    assert set(got.values()) == {1, 2}
    # the same validation set without the pinned list: indices shift (what --classes-from prevents)
    pack(val_src, tmp_path / "shifted", labels_from_dirs=True, progress=False)
    assert open_index(tmp_path / "shifted").manifest.classes == ["ocean", "sunset"]


def test_a_labels_file_with_classes_from_and_classes_in_another_order(train_tree, tmp_path):
    train = tmp_path / "train"
    pack(train_tree, train, labels_from_dirs=True, progress=False)
    src = tmp_path / "val"
    labels = flat_validation_set(train_tree, src, lambda i: f"v{i:03d}.jpg")
    for name in [name for name, label in labels.items() if label == "ocean"]:  # no ocean file, no ocean row
        (src / name).unlink()
        del labels[name]
    csv_path = tmp_path / "val.csv"
    csv_path.write_text("file_name,label\n" + "".join(f"{k},{v}\n" for k, v in labels.items()))
    pack(src, tmp_path / "val_out", labels_from=csv_path, classes_from=train, progress=False)
    check_labelled(tmp_path / "val_out", src, labels, ["forest", "ocean", "sunset"])
    # --classes: indices follow the given order, not the sorted one
    order = ["sunset", "ocean", "forest", "unused"]
    done = shardstream(
        "pack",
        src,
        tmp_path / "given",
        "--labels-from",
        csv_path,
        "--classes",
        " sunset, ocean ,forest,unused",
        "--no-progress",
        "--workers",
        "1",
    )
    assert done.returncode == 0, done.stderr
    check_labelled(tmp_path / "given", src, labels, order)


# -- (4) a label not among the classes given ------------------------------------------------------------


@pytest.fixture
def cat_dog_bird(tmp_path) -> tuple[Path, Path, dict[str, str]]:
    src = tmp_path / "src"
    src.mkdir()
    labels = {f"{n}.jpg": label for n, label in enumerate(["cat", "dog", "bird", "cat", "dog"])}
    for n, name in enumerate(labels):
        (src / name).write_bytes(image(n, "JPEG"))
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("filename,label\n" + "".join(f"{k},{v}\n" for k, v in labels.items()))
    return src, csv_path, labels


def test_an_unknown_label_stops_the_pack_naming_the_file_and_the_label(cat_dog_bird, tmp_path):
    src, csv_path, _ = cat_dog_bird
    with pytest.raises(SourceError) as raised:
        pack(src, tmp_path / "out", labels_from=csv_path, classes=["cat", "dog"], progress=False)
    message = str(raised.value)
    assert f"{src}/2.jpg" in message and "'bird'" in message and "not among the 2 classes given" in message
    assert not (tmp_path / "out" / "index.bin").exists()
    assert not list((tmp_path / "out").glob("*.tar"))
    done = shardstream(
        "pack",
        src,
        tmp_path / "cli",
        "--labels-from",
        csv_path,
        "--classes",
        "cat,dog",
        "--no-progress",
        "--workers",
        "1",
    )
    assert done.returncode == 1
    assert f"{src}/2.jpg" in done.stderr and "'bird'" in done.stderr


def test_an_unknown_label_is_left_out_and_reported_under_skip(cat_dog_bird, tmp_path):
    src, csv_path, labels = cat_dog_bird
    dest = tmp_path / "out"
    report = pack(src, dest, labels_from=csv_path, classes=["cat", "dog"], on_error="skip", progress=False)
    (problem,) = report.problems
    assert (problem.path, problem.kind.value, problem.packed) == (f"{src}/2.jpg", "unknown_class", False)
    assert "'bird'" in problem.reason
    assert "1 label not among the classes given" in report.summary()
    lines = [json.loads(line) for line in (dest / "pack-report.jsonl").read_text().splitlines()]
    assert [(line["path"], line["kind"], line["packed"]) for line in lines] == [
        (f"{src}/2.jpg", "unknown_class", False)
    ]
    check_labelled(dest, src, {k: v for k, v in labels.items() if v != "bird"}, ["cat", "dog"])


def test_an_unknown_class_folder_under_fail_and_skip(tmp_path):
    src = tmp_path / "src"
    for n, rel in enumerate(["cat/a.jpg", "dog/b.jpg", "eel/c.jpg", "eel/d.jpg"]):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(image(n, "JPEG"))
    with pytest.raises(SourceError, match=r"eel/c\.jpg': its class folder 'eel' is not among the 2 classes given"):
        pack(src, tmp_path / "out", labels_from_dirs=True, classes=["dog", "cat"], progress=False)
    report = pack(src, tmp_path / "out", labels_from_dirs=True, classes=["dog", "cat"], on_error="skip", progress=False)
    assert sorted((Path(p.path).name, p.kind.value) for p in report.problems) == [
        ("c.jpg", "unknown_class"),
        ("d.jpg", "unknown_class"),
    ]
    check_labelled(tmp_path / "out", src, {"cat/a.jpg": "cat", "dog/b.jpg": "dog"}, ["dog", "cat"])


# -- (5) a file without a row, a row without a file ------------------------------------------------------


def test_a_file_without_a_row_and_a_row_without_a_file(cat_dog_bird, tmp_path):
    src, csv_path, labels = cat_dog_bird
    (src / "stray.jpg").write_bytes(image(9, "JPEG"))
    with pytest.raises(SourceError, match=r"stray\.jpg': has no row in the labels file"):
        pack(src, tmp_path / "out", labels_from=csv_path, progress=False)
    (src / "stray.jpg").unlink()
    with open(csv_path, "a") as f:
        f.write("gone.jpg,eel\n")  # line 7
    with pytest.raises(SourceError, match=r"line 7: names 'gone\.jpg', not a file under SOURCE"):
        pack(src, tmp_path / "out2", labels_from=csv_path, progress=False)
    assert not (tmp_path / "out2" / "index.bin").exists()
    (src / "stray.jpg").write_bytes(image(9, "JPEG"))
    (src / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    report = pack(src, tmp_path / "out3", labels_from=csv_path, on_error="skip", progress=False)
    found = [(Path(p.path).name, p.kind.value, p.packed) for p in report.problems]
    assert sorted(found) == [
        (".DS_Store", "hidden", False),
        ("labels.csv", "metadata", False),
        ("stray.jpg", "unlabelled", False),
    ]
    assert found[-1] == ("labels.csv", "metadata", False)  # after the walk
    # the classes are the distinct labels of the rows: eel (only on the row without a file) counts 0
    check_labelled(tmp_path / "out3", src, labels, ["bird", "cat", "dog", "eel"])
    assert open_index(tmp_path / "out3").manifest.class_counts == [1, 2, 2, 0]


def test_hidden_files_never_stop_a_labels_file_pack(cat_dog_bird, tmp_path):
    src, csv_path, labels = cat_dog_bird
    (src / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (src / "._0.jpg").write_bytes(b"\0\5\26\7 AppleDouble")
    report = pack(src, tmp_path / "out", labels_from=csv_path, progress=False)
    assert sorted((Path(p.path).name, p.kind.value) for p in report.problems) == [
        (".DS_Store", "hidden"),
        ("._0.jpg", "hidden"),
    ]
    check_labelled(tmp_path / "out", src, labels, ["bird", "cat", "dog"])


def test_adding_the_missing_row_and_running_again_finishes_the_pack(cat_dog_bird, tmp_path):
    src, csv_path, labels = cat_dog_bird
    (src / "stray.jpg").write_bytes(image(9, "JPEG"))
    with pytest.raises(SourceError, match="fix it and run the same command again to resume"):
        pack(src, tmp_path / "out", labels_from=csv_path, progress=False)
    with open(csv_path, "a") as f:
        f.write("stray.jpg,dog\n")
    pack(src, tmp_path / "out", labels_from=csv_path, progress=False)
    check_labelled(tmp_path / "out", src, {**labels, "stray.jpg": "dog"}, ["bird", "cat", "dog"])


# -- (6) integer labels ----------------------------------------------------------------------------------


def test_integer_labels_sort_as_numbers(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    ints = [10, 2, 1, 10, -3, 100, 2]
    labels = {f"f{n}.bin": str(label) for n, label in enumerate(ints)}
    for name in labels:
        (src / name).write_bytes(name.encode())
    jsonl = tmp_path / "labels.jsonl"  # JSON numbers, and one label as text
    jsonl.write_text(
        "".join(
            json.dumps({"filename": k, "cls": int(v) if n else v}) + "\n" for n, (k, v) in enumerate(labels.items())
        )
    )
    pack(src, tmp_path / "out", labels_from=jsonl, progress=False)
    numeric = ["-3", "1", "2", "10", "100"]
    check_labelled(tmp_path / "out", src, labels, numeric)
    assert {s["__key__"]: int(s["cls"]) for s in ShardDataset(tmp_path / "out", shuffle=False)}["f0"] == 3
    # one label that is not an integer: every label sorts as text
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text(
        "file,label\n" + "".join(f"{k},{v}\n" for k, v in labels.items()).replace("f6.bin,2", "f6.bin,x")
    )
    pack(src, tmp_path / "text", labels_from=csv_path, progress=False)
    assert open_index(tmp_path / "text").manifest.classes == ["-3", "1", "10", "100", "2", "x"]


def test_integer_labels_equal_as_numbers_get_the_same_indices_on_every_run(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    labels = {"a.bin": "7", "b.bin": "07", "c.bin": "007", "d.bin": "8"}
    for name in labels:
        (src / name).write_bytes(name.encode())
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("file_name,label\n" + "".join(f"{k},{v}\n" for k, v in labels.items()))
    script = (
        "import sys; from shardstream import pack, open_index; "
        "pack(sys.argv[1], sys.argv[2], labels_from=sys.argv[3], progress=False); "
        "print(open_index(sys.argv[2]).manifest.classes)"
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script, src, tmp_path / f"out{seed}", csv_path],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(6)
    ]
    outputs = {run.communicate(timeout=CLI_TIMEOUT_S)[0] for run in runs}
    assert all(run.returncode == 0 for run in runs)
    assert len(outputs) == 1, outputs


# -- (7) ShardWriter and pack_samples with classes= ------------------------------------------------------


def test_shard_writer_takes_class_indices_or_names(tmp_path):
    classes = ["cat", "dog", "eel"]
    values = ["dog", 0, "eel", 2, "cat", 1, "dog"]
    with ShardWriter(tmp_path / "out", classes=classes, max_samples_per_shard=3) as writer:
        for n, value in enumerate(values):
            writer.write({"__key__": f"{n:03d}", "txt": f"sample {n}", "cls": value})
        for bad in (3, -1, "bird", True, 1.0):
            with pytest.raises(ValueError, match=r"sample 'bad': cls .* is neither a class index \(0 to 2\)"):
                writer.write({"__key__": "bad", "txt": "x", "cls": bad})
    want = [value if isinstance(value, int) else classes.index(value) for value in values]
    assert want == [1, 0, 2, 2, 0, 1, 1]
    got = read_tar(tmp_path / "out")
    assert {key: members["cls"] for key, members in got.items()} == {
        f"{n:03d}": str(c).encode() for n, c in enumerate(want)
    }
    assert [
        label for _, label in ShardDataset(tmp_path / "out", shuffle=False, decode="pil", fields=("txt", "cls"))
    ] == want
    manifest = open_index(tmp_path / "out").manifest
    assert (manifest.classes, manifest.class_counts) == (classes, [2, 3, 2])
    assert ShardDataset(tmp_path / "out").classes == classes


def test_shard_writer_records_no_counts_when_a_sample_has_no_class(tmp_path):
    with ShardWriter(tmp_path / "out", classes=["cat", "dog"]) as writer:
        writer.write({"__key__": "a", "txt": "x", "cls": "dog"})
        writer.write({"__key__": "b", "txt": "y"})
    manifest = open_index(tmp_path / "out").manifest
    assert (manifest.classes, manifest.class_counts) == (["cat", "dog"], None)
    with pytest.raises(ValueError, match="distinct"):
        ShardWriter(tmp_path / "other", classes=["cat", "cat"])


def test_a_refused_sample_is_not_counted_in_its_class(tmp_path):
    with ShardWriter(tmp_path / "out", classes=["cat", "dog"]) as writer:
        writer.write({"__key__": "a", "txt": "x", "cls": "dog"})
        with pytest.raises(ValueError, match="repeats the key"):
            writer.write({"__key__": "a", "txt": "y", "cls": "dog"})
        writer.write({"__key__": "b", "txt": "z", "cls": 0})
    assert open_index(tmp_path / "out").manifest.class_counts == [1, 1]


def test_shard_writer_takes_a_numpy_integer_as_a_class_index(tmp_path):
    with ShardWriter(tmp_path / "out", classes=["cat", "dog"]) as writer:
        writer.write({"__key__": "a", "txt": "x", "cls": np.int64(1)})
    assert read_tar(tmp_path / "out")["a"]["cls"] == b"1"


def labelled_sample(n: int) -> dict:
    return {"__key__": f"{n:04d}", "txt": f"input {n}", "cls": n % 3}


def test_pack_samples_records_the_class_names(tmp_path):
    report = pack_samples(labelled_sample, range(10), tmp_path / "out", classes=["a", "b", "c"], progress=False)
    assert report.num_samples == 10
    manifest = open_index(tmp_path / "out").manifest
    assert (manifest.classes, manifest.class_counts) == (["a", "b", "c"], None)
    assert ShardDataset(tmp_path / "out").classes == ["a", "b", "c"]
    got = {s["__key__"]: s["cls"] for s in ShardDataset(tmp_path / "out", shuffle=False)}
    assert got == {f"{n:04d}": str(n % 3).encode() for n in range(10)}
    with pytest.raises(ValueError, match="distinct"):
        pack_samples(labelled_sample, range(3), tmp_path / "dup", classes=["a", "a"], progress=False)


# -- (8) a plain pack leaves out metadata and hidden files, and packs a file without a suffix -------------


def test_a_plain_pack_leaves_out_metadata_and_hidden_files_and_warns_of_no_suffix(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {
        "a.jpg": image(1, "JPEG"),
        "a.txt": b"caption a",
        "README": b"read me",
        "sub/b.png": image(2, "PNG"),
        "metadata.csv": b"file_name,label\na.jpg,cat\n",
        "sub/metadata.jsonl": b'{"file_name": "b.png", "label": "dog"}\n',
        ".DS_Store": b"\0\0\0\1Bud1",
        "sub/._b.png": b"\0\5\26\7 AppleDouble",
    }
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    dest = tmp_path / "out"
    done = shardstream("pack", src, dest, "--no-progress", "--workers", "1")  # on_error fail: never stopped
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("packed 4 files (3 samples, ")
    assert "2 hidden files (.DS_Store ...) left out; 2 metadata files left out; 1 file without a suffix" in done.stdout
    lines = [json.loads(line) for line in (dest / "pack-report.jsonl").read_text().splitlines()]
    assert sorted((str(Path(line["path"]).relative_to(src)), line["kind"], line["packed"]) for line in lines) == [
        (".DS_Store", "hidden", False),
        ("README", "no_suffix", True),
        ("metadata.csv", "not_a_sample", False),
        ("sub/._b.png", "hidden", False),
        ("sub/metadata.jsonl", "not_a_sample", False),
    ]
    with tarfile.open(dest / "data-000000.tar") as tar:
        assert sorted(tar.getnames()) == ["README", "a.jpg", "a.txt", "sub/b.png"]
    assert read_tar(dest) == {
        "README": {"": b"read me"},
        "a": {"jpg": files["a.jpg"], "txt": b"caption a"},
        "sub/b": {"png": files["sub/b.png"]},
    }
    samples = {
        s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in ShardDataset(dest, shuffle=False)
    }
    assert samples == read_tar(dest)
    assert open_index(dest).manifest.classes is None
    report = pack(src, tmp_path / "lib", progress=False)
    assert sorted((Path(p.path).name, p.kind.value, p.packed) for p in report.problems) == [
        (".DS_Store", "hidden", False),
        ("._b.png", "hidden", False),
        ("README", "no_suffix", True),
        ("metadata.csv", "not_a_sample", False),
        ("metadata.jsonl", "not_a_sample", False),
    ]


# -- (9) options that do not go together, labels files that cannot be used --------------------------------


def test_options_that_do_not_go_together_are_usage_errors(cat_dog_bird, tmp_path):
    src, csv_path, _ = cat_dog_bird
    refused = [
        (
            {"labels_from": csv_path, "labels_from_dirs": True},
            ["--labels-from", csv_path, "--labels-from-dirs"],
            "not both",
        ),
        (
            {"labels_from": csv_path, "classes": ["cat"], "classes_from": tmp_path},
            ["--labels-from", csv_path, "--classes", "cat", "--classes-from", tmp_path],
            "give --classes or --classes-from, not both",
        ),
        (
            {"classes": ["cat", "dog"]},
            ["--classes", "cat,dog"],
            "pin the class list of --labels-from-dirs or --labels-from",
        ),
        ({"classes_from": tmp_path}, ["--classes-from", tmp_path], "pin the class list"),
        ({"labels_from": csv_path, "classes": []}, None, "classes must be distinct, non-empty names"),
        (
            {"labels_from": csv_path, "classes": ["cat", "cat"]},
            ["--labels-from", csv_path, "--classes", "cat,cat"],
            "distinct",
        ),
    ]
    for n, (options, argv, match) in enumerate(refused):
        with pytest.raises(ValueError, match=match):
            pack(src, tmp_path / f"out{n}", progress=False, **options)
        if argv is not None:
            done = shardstream("pack", src, tmp_path / f"cli{n}", *argv, "--no-progress")
            assert done.returncode == 2, (argv, done.stderr)
            assert match in done.stderr
        assert not (tmp_path / f"out{n}" / "index.bin").exists()


@pytest.mark.parametrize(
    ("header", "missing", "has"),
    [("name,label", "file", "label, name"), ("file,what", "label", "file, what"), ("a,b", "file", "a, b")],
)
def test_a_labels_file_without_a_file_or_label_column_is_named(cat_dog_bird, tmp_path, header, missing, has):
    src, _, _ = cat_dog_bird
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text(f"{header}\n0.jpg,cat\n")
    looked_for = {"file": "file_name, filename, file, path, image", "label": "label, class, class_name, cls, labels"}
    with pytest.raises(SourceError) as raised:
        pack(src, tmp_path / "out", labels_from=csv_path, progress=False)
    assert str(raised.value) == (
        f"{csv_path}: no {missing} column: looked for {looked_for[missing]}; the file has {has} (rename the column)"
    )


def test_a_missing_labels_file_and_a_dataset_without_classes(cat_dog_bird, tmp_path):
    src, csv_path, _ = cat_dog_bird
    with pytest.raises(SourceNotFoundError, match=r"nope\.csv: no such labels file"):
        pack(src, tmp_path / "out", labels_from=tmp_path / "nope.csv", progress=False)
    done = shardstream("pack", src, tmp_path / "cli", "--labels-from", tmp_path / "nope.csv", "--no-progress")
    assert done.returncode == 1 and "no such labels file" in done.stderr
    pack(src, tmp_path / "plain", progress=False)  # no labels: no classes in its index
    with pytest.raises(SourceError, match="records no classes"):
        pack(src, tmp_path / "out", labels_from=csv_path, classes_from=tmp_path / "plain", progress=False)
    done = shardstream(
        "pack", src, tmp_path / "cli", "--labels-from", csv_path, "--classes-from", tmp_path / "plain", "--no-progress"
    )
    assert done.returncode == 1 and "records no classes" in done.stderr
    not_utf8 = tmp_path / "latin1.csv"
    not_utf8.write_bytes("filename,label\n0.jpg,caf\xe9\n".encode("latin-1"))
    with pytest.raises(SourceError, match="not UTF-8"):
        pack(src, tmp_path / "out", labels_from=not_utf8, progress=False)
