import io
import re
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


def _tarfile_oracle(name: str, size: int) -> bytes:
    """What Python's tarfile writes for a regular member with shardstream's fixed fields."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o644, 0, 0, "", ""
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def test_fast_headers_are_byte_identical_to_tarfile_and_read_back_by_tarfile_and_gnu_tar(tmp_path):
    import random
    import shutil
    import subprocess

    rng = random.Random(0)
    alphabet = "abcXYZ019._-/ \u00e9\u4e2d"
    names = ["x", "a" * 99, "a" * 100, "a" * 101, "d/" + "\u00e9" * 49, "d/" + "\u00e9" * 50, "caf\udce9.txt"]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 120))) for _ in range(300)]
    sizes = [0, 1, 511, 512, 513, 8**11 - 1, 8**11, 10**12]
    for name in names:
        for size in sizes:
            header = member_header(name, size)
            assert header == _tarfile_oracle(name, size), (name, size)  # the oracle is the test's own
            with tarfile.open(fileobj=io.BytesIO(header), encoding="utf-8", errors="surrogateescape") as tar:
                info = tar.next()  # reads the header block(s) and checks their checksums
            fields = (info.name, info.size, info.mtime, info.mode, info.uid, info.gid, info.type)
            assert fields == (name, size, 0, 0o644, 0, 0, tarfile.REGTYPE), (name, size)
    # GNU tar lists an archive of these headers with the names and sizes they were made with
    if shutil.which("tar") is None:
        pytest.fail("GNU tar is needed for this test (apt-get install tar)")
    archive = tmp_path / "headers.tar"
    # (GNU tar reads a name ending in "/" as a directory; member names are file paths, never such)
    listed = [n for n in names if "\udce9" not in n and not n.endswith("/")]
    with archive.open("wb") as out:
        for i, name in enumerate(listed):
            size = i % 700
            out.write(member_header(name, size) + bytes(-(-size // 512) * 512))
        out.write(bytes(1024))
    run = subprocess.run(
        ["tar", "--list", "--verbose", "--numeric-owner", "--quoting-style=literal", "-f", str(archive)],
        capture_output=True,
        text=True,
        env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin", "TZ": "UTC"},
        check=True,
    )
    rows = run.stdout.splitlines()
    assert len(rows) == len(listed)
    for i, (row, name) in enumerate(zip(rows, listed)):
        mode, owner, size, _date, _time, member = re.match(r"(\S+) (\S+) +(\d+) (\S+) (\S+) (.*)$", row).groups()
        assert (mode, owner, int(size), member) == ("-rw-r--r--", "0/0", i % 700, name), row
