"""``pack --labels-from-dirs``: a tree of class folders with the names users have, packed one
sample per file with a ``cls`` member and a ``json`` member from metadata files, read back with
tarfile and webdataset and compared with torchvision's class rule written out here; the classes
in the index through parts, a resumed pack, ``index merge``, a reshard; ``--check-images``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from shardstream import Part, open_index, pack
from shardstream.errors import DecodeError, MemberNameError, SourceError, UnreadableFileError

SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))
METADATA = ("metadata.jsonl", "metadata.csv")


def image(seed: int, fmt: str, side_px: int = 24) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (side_px, side_px, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


def odd_tree(root: Path) -> Path:
    """Class folders with the names users have: upper- and mixed-case suffixes, a multi-dot
    name, an empty file, a truncated JPEG (Pillow-written, cut in half), PNG and WebP beside
    JPEG, a class of one file, nested folders, a metadata.jsonl at the top and a metadata.csv
    deeper down."""
    files = {
        "ant/UPPER_0001.JPG": image(1, "JPEG"),
        "ant/b.Png": image(2, "PNG"),
        "ant/c.webp": image(3, "WEBP"),
        "bee/only.jpeg": image(4, "JPEG"),  # a class of one file
        "zebra/a.JPEG": image(5, "JPEG"),
        "zebra/a.b.JPEG": image(6, "JPEG"),  # key zebra/a.b, not a member of zebra/a
        "zebra/empty.jpg": b"",
        "zebra/trunc.jpg": image(7, "JPEG")[: len(image(7, "JPEG")) // 2],
        "zebra/deep/er/n.PNG": image(8, "PNG"),  # nested: still class zebra
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    rows = [
        {"file_name": "zebra/a.JPEG", "caption": "a zebra", "n": 1},
        {"file_name": "ant/UPPER_0001.JPG", "caption": "upper", "tags": ["x", "y"]},
        {"file_name": "bee/only.jpeg", "caption": None},
    ]
    (root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "zebra" / "deep" / "metadata.csv").write_text("file_name,score,label\ner/n.PNG,0.5,x\n")
    return root


def pillow_error(data: bytes) -> str:
    """What Pillow says when it decodes ``data`` whole."""
    with pytest.raises(Exception) as raised:  # whatever Pillow raises
        with Image.open(io.BytesIO(data)) as decoded:
            decoded.load()
    return str(raised.value)


def torchvision_classes(root: Path) -> list[str]:
    """torchvision's ImageFolder rule: the sorted names of the folders directly under root."""
    return sorted(entry.name for entry in os.scandir(root) if entry.is_dir())


def expected(root: Path, *, left_out: tuple[str, ...] = ()) -> dict[str, dict[str, object]]:
    """Per file (not a metadata file) under a class folder: its key as a path without the last
    suffix, its class index by torchvision's rule, its member name and bytes, its metadata."""
    class_to_idx = {name: i for i, name in enumerate(torchvision_classes(root))}
    rows = {
        r["file_name"]: {k: v for k, v in r.items() if k != "file_name"}
        for r in map(json.loads, (root / "metadata.jsonl").read_text().splitlines())
    }
    rows["zebra/deep/er/n.PNG"] = {"score": 0.5, "label": "x"}
    out = {}
    for path in sorted(root.rglob("*")):
        rel = PurePosixPath(path.relative_to(root).as_posix())
        if not path.is_file() or rel.name in METADATA or len(rel.parts) < 2 or str(rel) in left_out:
            continue
        out[str(rel.with_suffix(""))] = {
            "cls": class_to_idx[rel.parts[0]],
            "ext": rel.suffix[1:].lower(),
            "data": path.read_bytes(),
            "json": rows.get(str(rel)),
        }
    return out


def read_tar(dest: Path) -> dict[str, dict[str, bytes]]:
    """Every sample of the shards by Python's tarfile, grouped by WebDataset's key rule (the
    name up to the first dot of its file name)."""
    samples: dict[str, dict[str, bytes]] = {}
    for shard in sorted(dest.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                folder, _, name = member.name.rpartition("/")
                stem, _, ext = name.partition(".")
                key = f"{folder}/{stem}" if folder else stem
                samples.setdefault(key, {})[ext] = tar.extractfile(member).read()
    return samples


def read_webdataset(dest: Path) -> dict[str, dict[str, bytes]]:
    urls = [str(p) for p in sorted(dest.glob("*.tar"))]
    return {
        s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
        for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    }


def check_samples(got: dict[str, dict[str, bytes]], want: dict[str, dict[str, object]]) -> None:
    """``got`` (key -> member -> bytes) holds exactly the samples ``want`` describes."""
    assert sorted(unquote(key) for key in got) == sorted(want)
    for key, members in got.items():
        assert "." not in key.rsplit("/", 1)[-1], key  # readers split a name at its file name's first dot
        w = want[unquote(key)]
        names = {w["ext"], "cls"} | ({"json"} if w["json"] is not None else set())
        assert set(members) == names, key
        assert members[w["ext"]] == w["data"]
        assert members["cls"] == str(w["cls"]).encode()
        if w["json"] is not None:
            assert json.loads(members["json"]) == w["json"]


def class_counts(want: dict[str, dict[str, object]], classes: list[str]) -> list[int]:
    return [sum(w["cls"] == i for w in want.values()) for i in range(len(classes))]


@pytest.fixture
def tree(tmp_path) -> Path:
    return odd_tree(tmp_path / "src")


def test_each_file_is_a_sample_labelled_by_torchvisions_rule(tree, tmp_path):
    dest = tmp_path / "out"
    report = pack(tree, dest, labels_from_dirs=True, max_samples_per_shard=3, progress=False)
    want = expected(tree)
    assert (report.num_files, report.num_samples) == (len(want), len(want)) == (9, 9)
    check_samples(read_tar(dest), want)
    check_samples(read_webdataset(dest), want)
    manifest = open_index(dest).manifest
    classes = torchvision_classes(tree)
    assert manifest.classes == classes == ["ant", "bee", "zebra"]
    assert manifest.class_counts == class_counts(want, classes) == [3, 1, 5]
    assert sum(manifest.class_counts) == manifest.num_samples
    warned = {(Path(p.path).relative_to(tree).as_posix(), p.kind.value) for p in report.problems}
    uncovered = {"ant/b.Png", "ant/c.webp", "zebra/a.b.JPEG", "zebra/empty.jpg", "zebra/trunc.jpg"}
    assert warned == {(n, "no_metadata") for n in uncovered} | {("zebra/empty.jpg", "empty")}
    assert all(p.packed for p in report.problems)


def test_the_command_line_packs_the_same_and_info_lists_the_classes(tree, tmp_path):
    pack(tree, tmp_path / "lib", labels_from_dirs=True, progress=False)
    dest = tmp_path / "cli"
    done = subprocess.run(
        [SHARDSTREAM, "pack", str(tree), str(dest), "--labels-from-dirs", "--no-progress", "--workers", "1"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    for name in ("data-000000.tar", "data-000000.tar.samples", "index.bin"):
        assert (dest / name).read_bytes() == (tmp_path / "lib" / name).read_bytes()
    assert done.stdout.startswith("packed 9 files (9 samples, ")
    assert "; 0 skipped, 6 warnings (see " in done.stdout
    assert (
        f"warning: {tree}/ant/b.Png: the metadata file covering its folder has no row for it: packed without a "
        "json member\n" in done.stderr
    )
    info = subprocess.run([SHARDSTREAM, "info", str(dest)], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert info.stdout.splitlines()[3:] == [
        "3 classes (class index, name, samples); samples per class: min 1, median 3, max 5",
        "  0  ant    3",
        "  1  bee    1",
        "  2  zebra  5",
    ]


def test_two_files_with_one_key_fail_the_pack_or_are_both_left_out(tree, tmp_path):
    (tree / "zebra" / "a.jpg").write_bytes(image(9, "JPEG"))
    with pytest.raises(MemberNameError) as raised:
        pack(tree, tmp_path / "out", labels_from_dirs=True, progress=False)
    assert str(raised.value) == (
        f"'{tree}/zebra/a.JPEG': same sample key 'zebra/a' as '{tree}/zebra/a.jpg' (--labels-from-dirs keys a "
        "file by its path without the last suffix); neither is packed: rename one; fix it and run the same "
        "command again to resume, or pass --on-error skip to pack the rest and report it"
    )
    assert not (tmp_path / "out" / "index.bin").exists()
    report = pack(tree, tmp_path / "out", labels_from_dirs=True, on_error="skip", progress=False)
    collisions = sorted(p.path for p in report.problems if p.kind.value == "collision")
    assert collisions == [f"{tree}/zebra/a.JPEG", f"{tree}/zebra/a.jpg"]
    want = expected(tree, left_out=("zebra/a.JPEG", "zebra/a.jpg"))
    check_samples(read_tar(tmp_path / "out"), want)
    assert open_index(tmp_path / "out").manifest.class_counts == [3, 1, 4]
    assert "; 2 skipped, 6 warnings: 2 files collide with others (same sample and member" in report.summary()
    lines = [json.loads(line) for line in (tmp_path / "out" / "pack-report.jsonl").read_text().splitlines()]
    assert sorted(line["path"] for line in lines if line["kind"] == "collision") == collisions


def test_files_that_do_not_fit_the_tree_are_named(tree, tmp_path):
    (tree / "stray.jpg").write_bytes(image(10, "JPEG"))
    with pytest.raises(SourceError, match=r"stray\.jpg': a file directly under SOURCE is in no class folder"):
        pack(tree, tmp_path / "out", labels_from_dirs=True, progress=False)
    (tree / "stray.jpg").unlink()
    (tree / "ant" / "README").write_text("no suffix")
    (tree / "ant" / "x.cls").write_text("3")
    with open(tree / "metadata.jsonl", "a") as f:
        f.write(json.dumps({"file_name": "ant/gone.jpg", "caption": "?"}) + "\n")
    report = pack(tree, tmp_path / "out", labels_from_dirs=True, on_error="skip", progress=False)
    found = {(Path(p.path).name, p.kind.value, p.reason) for p in report.problems if not p.packed}
    assert found == {
        ("README", "bad_name", "has no suffix (such as .jpg) to name its member; rename it"),
        (
            "x.cls",
            "bad_name",
            "suffix 'cls' names the member pack writes for the class index (--labels-from-dirs); rename the file",
        ),
        (
            "metadata.jsonl",
            "metadata",
            "line 4: file_name 'ant/gone.jpg' names no file under ./ (check the name, or remove the row)",
        ),
    }
    check_samples(read_tar(tmp_path / "out"), expected(tree, left_out=("ant/README", "ant/x.cls")))


def test_files_from_and_from_shards_are_refused_with_labels(tree, tmp_path):
    (tmp_path / "list.txt").write_text("ant/b.Png\n")
    with pytest.raises(ValueError, match="does not take --files-from"):
        pack(tree, tmp_path / "out", labels_from_dirs=True, files_from=tmp_path / "list.txt", progress=False)
    with pytest.raises(ValueError, match="--from-shards repacks shards and keeps the classes"):
        pack(tree, tmp_path / "out", labels_from_dirs=True, from_shards=True, progress=False)


def test_two_parts_and_index_merge_keep_the_classes(tree, tmp_path):
    one, split = tmp_path / "one", tmp_path / "split"
    pack(tree, one, labels_from_dirs=True, max_samples_per_shard=2, progress=False)
    for index in range(2):
        pack(tree, split, labels_from_dirs=True, max_samples_per_shard=2, part=Part(index, 2), progress=False)
    (split / "index.bin").unlink()
    merged = subprocess.run([SHARDSTREAM, "index", "merge", str(split)], capture_output=True, text=True)
    assert merged.returncode == 0, merged.stderr
    assert (split / "index.bin").read_bytes() == (one / "index.bin").read_bytes()
    manifest = open_index(split).manifest
    assert (manifest.classes, manifest.class_counts) == (["ant", "bee", "zebra"], [3, 1, 5])
    check_samples(read_tar(split), expected(tree))


def test_a_pack_stopped_by_a_bad_file_resumes_with_its_classes(tree, tmp_path):
    """The empty file is listed as a link to /proc/self/mem (0 bytes, fails when read): the pack
    stops after 3 of its 5 shards; the file fixed (0 bytes again), the same call finishes."""
    dest = tmp_path / "out"
    (tree / "zebra" / "empty.jpg").unlink()
    (tree / "zebra" / "empty.jpg").symlink_to("/proc/self/mem")
    with pytest.raises(UnreadableFileError, match=r"zebra/empty\.jpg"):
        pack(tree, dest, labels_from_dirs=True, max_samples_per_shard=2, progress=False)
    assert (dest / "data-000002.tar").exists() and not (dest / "data-000003.tar").exists()
    assert not (dest / "index.bin").exists()
    (tree / "zebra" / "empty.jpg").unlink()
    (tree / "zebra" / "empty.jpg").write_bytes(b"")
    report = pack(tree, dest, labels_from_dirs=True, max_samples_per_shard=2, progress=False)
    assert report.resumed and (report.num_samples, report.num_shards) == (3, 2)
    manifest = open_index(dest).manifest
    assert (manifest.classes, manifest.class_counts) == (["ant", "bee", "zebra"], [3, 1, 5])
    check_samples(read_tar(dest), expected(tree))


def test_a_resumed_pack_that_skips_the_bad_file_counts_its_class_one_less(tree, tmp_path):
    dest = tmp_path / "out"
    (tree / "zebra" / "empty.jpg").unlink()
    (tree / "zebra" / "empty.jpg").symlink_to("/proc/self/mem")
    with pytest.raises(UnreadableFileError):
        pack(tree, dest, labels_from_dirs=True, max_samples_per_shard=2, progress=False)
    report = pack(tree, dest, labels_from_dirs=True, max_samples_per_shard=2, on_error="skip", progress=False)
    (skipped,) = [p for p in report.problems if not p.packed]
    assert (skipped.path, skipped.kind.value, skipped.cls) == (f"{tree}/zebra/empty.jpg", "unreadable", 2)
    assert open_index(dest).manifest.class_counts == [3, 1, 4]
    check_samples(read_tar(dest), expected(tree, left_out=("zebra/empty.jpg",)))


def test_a_reshard_keeps_the_classes(tree, tmp_path):
    pack(tree, tmp_path / "labelled", labels_from_dirs=True, max_samples_per_shard=2, progress=False)
    report = pack(
        tmp_path / "labelled", tmp_path / "resharded", from_shards=True, max_samples_per_shard=4, progress=False
    )
    assert report.num_samples == 9
    manifest = open_index(tmp_path / "resharded").manifest
    assert (manifest.classes, manifest.class_counts) == (["ant", "bee", "zebra"], [3, 1, 5])
    check_samples(read_tar(tmp_path / "resharded"), expected(tree))
    # with --check-images, the samples left out leave their class's count
    report = pack(
        tmp_path / "labelled",
        tmp_path / "checked",
        from_shards=True,
        check_images=True,
        on_error="skip",
        progress=False,
    )
    assert sorted((p.path.rsplit(":", 1)[-1], p.cls) for p in report.problems) == [
        ("zebra/empty.jpg", 2),
        ("zebra/trunc.jpg", 2),
    ]
    assert open_index(tmp_path / "checked").manifest.class_counts == [3, 1, 3]


def test_check_images_leaves_out_what_does_not_decode_under_skip(tree, tmp_path):
    report = pack(tree, tmp_path / "out", labels_from_dirs=True, check_images=True, on_error="skip", progress=False)
    undecodable = sorted((Path(p.path).name, p.cls) for p in report.problems if p.kind.value == "undecodable")
    assert undecodable == [("empty.jpg", 2), ("trunc.jpg", 2)]
    (trunc,) = [p for p in report.problems if p.path.endswith("trunc.jpg") and not p.packed]
    why = pillow_error((tree / "zebra" / "trunc.jpg").read_bytes())
    assert (
        trunc.reason
        == f"does not decode as an image: {why}; its sample 'zebra/trunc' (with 'zebra/trunc.cls') is not packed"
    )
    want = expected(tree, left_out=("zebra/empty.jpg", "zebra/trunc.jpg"))
    check_samples(read_tar(tmp_path / "out"), want)
    assert (
        open_index(tmp_path / "out").manifest.class_counts == [3, 1, 3] == class_counts(want, ["ant", "bee", "zebra"])
    )
    assert "; 2 skipped, 5 warnings: 2 images do not decode (see " in report.summary()


def test_check_images_fails_the_pack_naming_the_file_and_why(tree, tmp_path):
    (tree / "zebra" / "empty.jpg").unlink()
    with pytest.raises(DecodeError) as raised:
        pack(tree, tmp_path / "out", labels_from_dirs=True, check_images=True, progress=False)
    why = pillow_error((tree / "zebra" / "trunc.jpg").read_bytes())
    assert str(raised.value) == (
        f"'{tree}/zebra/trunc.jpg': does not decode as an image: {why}; its sample 'zebra/trunc' (with "
        "'zebra/trunc.cls') is not packed; fix it and run the same command again to resume, or pass --on-error "
        "skip to pack the rest and report it"
    )
    assert not (tmp_path / "out" / "index.bin").exists()
    # without --check-images the same tree packs, the truncated JPEG in it
    pack(tree, tmp_path / "plain", labels_from_dirs=True, progress=False)
    check_samples(read_tar(tmp_path / "plain"), expected(tree))


def test_csv_cells_are_typed_per_column(tmp_path):
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (src / "cat" / f"{name}.jpg").write_bytes(name.encode())
    (src / "cat" / "metadata.csv").write_text(
        "file_name,who,n,f,ok,mixed\na.jpg,inner,1,0.5,true,1\nb.jpg,inner,-2,,False,x\nc.jpg,,3,1e3,TRUE,\n"
    )
    report = pack(src, tmp_path / "out", labels_from_dirs=True, progress=False)
    assert report.problems == ()
    got = {key: json.loads(members["json"]) for key, members in read_tar(tmp_path / "out").items()}
    assert got == {
        "cat/a": {"who": "inner", "n": 1, "f": 0.5, "ok": True, "mixed": "1"},
        "cat/b": {"who": "inner", "n": -2, "f": None, "ok": False, "mixed": "x"},
        "cat/c": {"who": None, "n": 3, "f": 1000.0, "ok": True, "mixed": None},
    }


def test_the_nearest_metadata_file_with_a_row_wins_and_the_other_row_is_reported(tmp_path):
    src = tmp_path / "src"
    for name in ("cat/a.jpg", "cat/b.jpg", "dog/d.jpg"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode())
    (src / "metadata.jsonl").write_text(
        '{"file_name": "cat/a.jpg", "who": "outer"}\n{"file_name": "dog/d.jpg", "who": "outer", "x": {"y": [1]}}\n'
    )
    (src / "cat" / "metadata.jsonl").write_text('{"file_name": "a.jpg", "who": "inner"}\n')
    (src / "cat" / "metadata.csv").write_text("file_name,who\nb.jpg,csv\n")
    with pytest.raises(SourceError, match=r"cat/metadata\.csv': cat/ holds both metadata\.jsonl and metadata\.csv"):
        pack(src, tmp_path / "out", labels_from_dirs=True, progress=False)
    report = pack(src, tmp_path / "out", labels_from_dirs=True, on_error="skip", progress=False)
    no_row = "the metadata file covering its folder has no row for it: packed without a json member"
    assert [(Path(p.path).relative_to(src).as_posix(), p.kind.value, p.reason) for p in report.problems] == [
        (
            "cat/metadata.csv",
            "metadata",
            "cat/ holds both metadata.jsonl and metadata.csv; only metadata.jsonl is used: merge them into one",
        ),
        (
            "metadata.jsonl",
            "metadata",
            f"line 1: the row for 'cat/a.jpg' is not used, {src}/cat/metadata.jsonl has one for the same file "
            "(the nearest metadata file wins); remove one of them",
        ),
        ("cat/b.jpg", "no_metadata", no_row),
    ]
    got = read_tar(tmp_path / "out")
    assert json.loads(got["cat/a"]["json"]) == {"who": "inner"}
    assert json.loads(got["dog/d"]["json"]) == {"who": "outer", "x": {"y": [1]}}
    assert set(got["cat/b"]) == {"cls", "jpg"}


def test_check_images_in_the_default_grouping_leaves_out_the_whole_sample(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    whole = image(11, "JPEG")
    (src / "a.jpg").write_bytes(whole[: len(whole) // 2])
    (src / "a.cls").write_text("3")
    (src / "b.jpg").write_bytes(whole)
    (src / "b.cls").write_text("4")
    report = pack(src, tmp_path / "out", check_images=True, on_error="skip", progress=False)
    why = pillow_error(whole[: len(whole) // 2])
    assert [(p.path, p.kind.value, p.reason, p.cls) for p in report.problems] == [
        (
            f"{src}/a.jpg",
            "undecodable",
            f"does not decode as an image: {why}; its sample 'a' (with 'a.cls') is not packed",
            None,
        )
    ]
    assert read_tar(tmp_path / "out") == {"b": {"cls": b"4", "jpg": whole}}
    assert open_index(tmp_path / "out").manifest.classes is None


def test_index_build_over_a_labelled_dataset_keeps_its_classes(tree, tmp_path):
    from shardstream.packing.build import build_index

    pack(tree, tmp_path / "out", labels_from_dirs=True, max_samples_per_shard=4, progress=False)
    manifest = build_index([str(tmp_path / "out")], overwrite=True, workers=1)
    assert (manifest.classes, manifest.class_counts) == (["ant", "bee", "zebra"], [3, 1, 5])
    reopened = open_index(tmp_path / "out").manifest
    assert (reopened.foreign, reopened.classes, reopened.class_counts) == (True, ["ant", "bee", "zebra"], [3, 1, 5])
    # into another folder, the shards' own index is where the classes come from
    elsewhere = build_index([str(tmp_path / "out")], output=str(tmp_path / "idx"), workers=1)
    assert (elsewhere.classes, elsewhere.class_counts) == (["ant", "bee", "zebra"], [3, 1, 5])


def test_keys_give_the_path_back_whatever_its_dots_and_percent_signs(tmp_path):
    src = tmp_path / "src"
    names = ["50%off/.hidden.JPEG", "50%off/x%2Ey.jpg", "50%off/v1.2/a..b.PNG", "b.c/d.e.f.WebP"]
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode())
    report = pack(src, tmp_path / "out", labels_from_dirs=True, progress=False)
    assert [(Path(p.path).name, p.kind.value) for p in report.problems] == [(".hidden.JPEG", "hidden")]
    got = read_tar(tmp_path / "out")
    assert sorted(unquote(key) for key in got) == sorted(str(PurePosixPath(n).with_suffix("")) for n in names[1:])
    assert {unquote(key): members["cls"] for key, members in got.items()} == {
        "50%off/x%2Ey": b"0",
        "50%off/v1.2/a..b": b"0",
        "b.c/d.e.f": b"1",
    }
    assert read_webdataset(tmp_path / "out") == got


def test_hidden_files_are_listed_but_never_stop_a_labelled_pack(tree, tmp_path):
    """A macOS copy leaves .DS_Store in folders and ._x beside files, the root included: under
    the default on_error="fail" the pack goes on, reports each as hidden, and packs the rest."""
    (tree / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (tree / "ant" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (tree / "ant" / "._UPPER_0001.JPG").write_bytes(b"\0\5\26\7 AppleDouble")
    report = pack(tree, tmp_path / "out", labels_from_dirs=True, progress=False)
    assert "3 skipped, 6 warnings: 3 hidden files (.DS_Store ...) left out (see " in report.summary()
    hidden = sorted(str(Path(p.path).relative_to(tree)) for p in report.problems if p.kind.value == "hidden")
    assert hidden == [".DS_Store", "ant/.DS_Store", "ant/._UPPER_0001.JPG"]
    assert all(
        not p.packed and p.reason == "a hidden file (such as .DS_Store): not packed"
        for p in report.problems
        if p.kind.value == "hidden"
    )
    check_samples(
        read_tar(tmp_path / "out"), expected(tree, left_out=(".DS_Store", "ant/.DS_Store", "ant/._UPPER_0001.JPG"))
    )
