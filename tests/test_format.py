import io
import tarfile

import pytest

from shardstream.format import member_header, split_key
from shardstream.packing.sources import ProblemKind, name_problem


@pytest.mark.parametrize(
    ("name", "key", "ext"),
    [
        ("a/b/000001.jpg", "a/b/000001", "jpg"),
        ("a/b/000001.seg.png", "a/b/000001", "seg.png"),
        ("README", "README", ""),
        ("dir.d/file", "dir.d/file", ""),
        ("dir.d/x.y", "dir.d/x", "y"),
        (".hidden", ".hidden", ""),
        ("d/.config.json", "d/.config", "json"),
        ("caf\u00e9.txt", "caf\u00e9", "txt"),
    ],
)
def test_split_key_follows_the_webdataset_rule(name, key, ext):
    assert split_key(name) == (key, ext)


def test_headers_are_deterministic_and_readable_by_tarfile():
    long_name = "d/" + "x" * 150 + ".bin"
    header = member_header(long_name, 3)
    assert header == member_header(long_name, 3)
    data = header + b"abc" + bytes(509) + bytes(1024)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        (info,) = tar.getmembers()
        assert (info.name, info.size, info.mtime, info.uid, info.gid, info.mode) == (long_name, 3, 0, 0, 0, 0o644)
        assert tar.extractfile(info).read() == b"abc"


def test_names_that_cannot_be_members_are_reported_with_the_file_named():
    for name, reason in [
        ("a.__key__", "reserved sample field"),
        ("a\nb.txt", "line break"),
        ("caf\udce9.txt", "not valid UTF-8"),
    ]:
        problem = name_problem(name, f"/src/{name}")
        assert problem.kind is ProblemKind.BAD_NAME and problem.path == f"/src/{name}" and reason in problem.reason
    assert name_problem("a/b.jpg", "ok") is None


def test_fast_headers_are_byte_identical_to_tarfile():
    import random

    from shardstream.format import _tarfile_header

    rng = random.Random(0)
    alphabet = "abcXYZ019._-/ \u00e9\u4e2d"
    names = ["x", "a" * 99, "a" * 100, "a" * 101, "d/" + "\u00e9" * 49, "d/" + "\u00e9" * 50, "caf\udce9.txt"]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 120))) for _ in range(300)]
    sizes = [0, 1, 511, 512, 513, 8**11 - 1, 8**11, 10**12]
    for name in names:
        for size in sizes:
            assert member_header(name, size) == _tarfile_header(name, size), (name, size)
