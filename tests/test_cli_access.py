"""`shardstream ls`, `head`, `cat`, `get` and `info --members` (issue 40, point 5) on a small
dataset with odd keys: a key holding a newline, one holding a terminal escape sequence, and one
with a `..` component. Bytes are checked against Python's tarfile reading the shards, the tar
stream of `cat` against tarfile and GNU tar, and `get` against the whole tmp tree."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from shardstream.cli import escape, unsafe_path

SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))

# Two shards, keys sorted within and across them (so a key is found without a key index).
# "zz/escape" is written in place of "../escape" (shardstream index build refuses `..` names),
# then swapped in the table and the shard, as a hostile shard and index would hold it.
SHARDS = [
    [
        ("zz/escape.txt", b"dotdot key"),
        ("a/000.jpg", b"\xff\xd8jpeg\x00\x01\n"),
        ("a/000.cls", b"0"),
        ("a/001.jpg", b"\xff\xd8other"),
        ("a/001.cls", b"1"),
        ("a/001.seg.PNG", b"\x89PNG\r\n"),
    ],
    [
        ("b/002.jpg", b"x" * 1000),
        ("esc\x1b[31mred.txt", b"escape key"),
        ("evil\nkey.txt", b"newline key"),
    ],
]
KEYS = ["../escape", "a/000", "a/001", "b/002", "esc\x1b[31mred", "evil\nkey"]


def run(*args: str, cwd: Path | None = None, env: dict | None = None, text: bool = True):
    return subprocess.run(
        [SHARDSTREAM, *args],
        capture_output=True,
        text=text,
        timeout=120,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
    )


def write_shard(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def make_dataset(ds: Path) -> None:
    ds.mkdir()
    for n, members in enumerate(SHARDS):
        write_shard(ds / f"data-{n:06d}.tar", members)
    done = run("index", "build", str(ds), "--no-progress")
    assert done.returncode == 0, done.stderr
    for path in ds.iterdir():
        if path.name.endswith((".samples", ".bin")):
            path.write_bytes(path.read_bytes().replace(b"zz/escape", b"../escape"))
    write_shard(ds / "data-000000.tar", [(n.replace("zz/", "../"), d) for n, d in SHARDS[0]])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli-access")
    make_dataset(root / "ds")
    return root


def shard_members(ds: Path) -> list[tuple[str, str, bytes]]:
    """(key, extension, bytes) of every member, read from the shards by tarfile (the reference)."""
    out = []
    for n in range(len(SHARDS)):
        with tarfile.open(ds / f"data-{n:06d}.tar") as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)
                dot = base[-1].index(".")
                key = member.name[: len(member.name) - len(base[-1]) + dot]
                out.append((key, member.name[len(key) + 1 :], tar.extractfile(member).read()))
    return out


def test_ls_lists_every_key_in_index_order_escaped(workdir):
    done = run("ls", "ds", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "../escape\na/000\na/001\nb/002\nesc\\x1b[31mred\nevil\\nkey\n"
    assert "\x1b" not in done.stdout


LS_LONG_HEADER = "# key\tmembers: extension and size in bytes (B), one a column"


def test_ls_long_shard_and_limit(workdir):
    done = run("ls", "ds", "--long", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        LS_LONG_HEADER,
        "../escape\ttxt 10 B",
        "a/000\tjpg 9 B\tcls 1 B",
        "a/001\tjpg 7 B\tcls 1 B\tseg.PNG 6 B",
        "b/002\tjpg 1000 B",
        "esc\\x1b[31mred\ttxt 10 B",
        "evil\\nkey\ttxt 11 B",
    ]
    assert run("ls", "ds", "--shard", "1", cwd=workdir).stdout == "b/002\nesc\\x1b[31mred\nevil\\nkey\n"
    assert run("ls", "ds", "--limit", "4", cwd=workdir).stdout == "../escape\na/000\na/001\nb/002\n"
    assert run("ls", "ds", "--shard", "1", "--limit", "1", cwd=workdir).stdout == "b/002\n"
    done = run("ls", "ds", "--shard", "2", cwd=workdir)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "shardstream: error: shard 2 is out of range: ds has 2 shards (0 to 1)\n"


def test_ls_sizes_match_the_shards(workdir):
    expected: dict[str, list[str]] = {}
    for key, ext, data in shard_members(workdir / "ds"):
        expected.setdefault(escape(key), []).append(f"{ext} {len(data)} B")
    lines = run("ls", "ds", "--long", cwd=workdir).stdout.splitlines()
    assert lines == [LS_LONG_HEADER, *("\t".join([key, *members]) for key, members in expected.items())]


def test_ls_cut_short_by_its_reader_ends_quietly(workdir):
    process = subprocess.Popen([SHARDSTREAM, "ls", str(workdir / "ds")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader is gone before ls writes
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, stderr
    assert stderr == ""
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {SHARDSTREAM} ls ds | head -1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=workdir,
    )
    assert (done.stdout, done.stderr) == ("../escape\n", "")
    assert done.returncode in (0, 141)


def test_head_shows_keys_members_and_sizes(workdir):
    done = run("head", "ds", "-n", "5", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "6 samples in 2 shards; the first 5:\n"
        "#  shard            key             members (bytes)\n"
        "0  data-000000.tar  ../escape       txt 10\n"
        "1  data-000000.tar  a/000           jpg 9, cls 1\n"
        "2  data-000000.tar  a/001           jpg 7, cls 1, seg.PNG 6\n"
        "3  data-000001.tar  b/002           jpg 1000\n"
        "4  data-000001.tar  esc\\x1b[31mred  txt 10\n"
    )
    assert len(run("head", "ds", cwd=workdir).stdout.splitlines()) == 2 + 6


def test_info_members_counts_each_extension(workdir):
    plain = run("info", "ds", cwd=workdir)
    assert plain.returncode == 0 and "extension" not in plain.stdout
    done = run("info", "ds", "--members", "--no-progress", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout + (
        "members by extension:\n"
        "  extension  samples  members  bytes\n"
        "  cls              2        2      2\n"
        "  jpg              3        3   1016\n"
        "  png              1        1      6\n"
        "  txt              3        3     31\n"
    )


def test_cat_writes_each_member_byte_for_byte(workdir):
    members = shard_members(workdir / "ds")[1:]  # not '../escape': the tar reader refuses `..` names
    row = {key: i for i, key in enumerate(KEYS)}
    for key, ext, data in members:
        by_index = run("cat", "ds", "--index", str(row[key]), "--member", ext, cwd=workdir, text=False)
        assert (by_index.returncode, by_index.stdout) == (0, data), by_index.stderr
    for key, ext, data in members[1:4]:  # by key too (the others hold characters a test shell mangles)
        by_key = run("cat", "ds", key, "--member", ext, cwd=workdir, text=False)
        assert (by_key.returncode, by_key.stdout) == (0, data), by_key.stderr


def test_cat_without_member_is_a_tar_stream_tarfile_and_gnu_tar_read(workdir):
    done = run("cat", "ds", "a/001", cwd=workdir, text=False)
    assert done.returncode == 0, done.stderr
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        got = [(m.name, tar.extractfile(m).read()) for m in tar]
    assert got == [(name, data) for name, data in SHARDS[0] if name.startswith("a/001.")]
    odd = run("cat", "ds", "--index", "5", cwd=workdir, text=False)
    with tarfile.open(fileobj=io.BytesIO(odd.stdout)) as tar:
        assert [(m.name, tar.extractfile(m).read()) for m in tar] == [("evil\nkey.txt", b"newline key")]
    if shutil.which("tar") is None:
        pytest.skip("no GNU tar here")
    listing = subprocess.run(["tar", "-tvf", "-"], input=done.stdout, capture_output=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    names = [line.split()[-1] for line in listing.stdout.decode().splitlines()]
    assert names == ["a/001.jpg", "a/001.cls", "a/001.seg.PNG"]
    extracted = subprocess.run(
        ["tar", "-xOf", "-", "a/001.seg.PNG"], input=done.stdout, capture_output=True, timeout=60
    )
    assert extracted.stdout == b"\x89PNG\r\n"


@pytest.mark.parametrize("command", [["cat", "ds", "no/such"], ["get", "ds", "no/such", "-o", "out"]])
def test_an_absent_key_is_exit_1_naming_key_and_dataset(workdir, command):
    done = run(*command, cwd=workdir)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "shardstream: error: no sample with key 'no/such' in ds (shardstream ls ds lists the keys)\n"
    assert not (workdir / "out").exists()


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("a/001.jpg", "key 'a/001' with --member jpg"), ("a/001.seg.PNG", "key 'a/001' with --member seg.PNG")],
)
@pytest.mark.parametrize("command", ["cat", "get"])
def test_a_key_typed_with_its_file_suffix_gets_the_key_and_member_meant(workdir, command, typed, meant):
    done = run(command, "ds", typed, *(["-o", "out"] if command == "get" else []), cwd=workdir)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(f"shardstream: error: no sample with key {typed!r} in ds; did you mean {meant}?")


def test_a_file_path_of_a_labelled_pack_finds_its_escaped_key(tmp_path):
    src = tmp_path / "src"
    (src / "n01484850").mkdir(parents=True)
    (src / "n01484850" / "猫 2.b.JPEG").write_bytes(b"\xff\xd8 not decoded here")
    assert run("pack", str(src), str(tmp_path / "ds"), "--labels-from-dirs", "--no-progress").returncode == 0
    done = run("cat", str(tmp_path / "ds"), "n01484850/猫 2.b.JPEG")
    assert done.returncode == 1
    assert "did you mean key 'n01484850/猫 2%2Eb' with --member JPEG?" in done.stderr
    got = run("cat", str(tmp_path / "ds"), "n01484850/猫 2%2Eb", "--member", "jpeg", text=False)
    assert got.stdout == b"\xff\xd8 not decoded here"


@pytest.mark.parametrize("command", [["cat", "ds", "--index", "6"], ["get", "ds", "--index", "6", "-o", "out"]])
def test_an_index_out_of_range_is_exit_1(workdir, command):
    done = run(*command, cwd=workdir)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "shardstream: error: index 6 is out of range: ds has 6 samples (0 to 5)\n"


def test_cat_of_an_absent_member_names_the_members(workdir):
    done = run("cat", "ds", "a/000", "--member", "png", cwd=workdir)
    assert done.returncode == 1
    assert done.stderr == "shardstream: error: sample 'a/000' of ds has no member 'png'; its members: jpg, cls\n"


@pytest.mark.parametrize("command", ["ls", "head", "cat", "get"])
def test_not_a_dataset_is_the_one_line_of_info(workdir, command):
    (workdir / "files").mkdir(exist_ok=True)
    extra = {"cat": ["k"], "get": ["k", "-o", "out"]}.get(command, [])
    done = run(command, "files", *extra, cwd=workdir)
    assert done.returncode == 2
    assert done.stderr == (
        "shardstream: error: files holds no index.bin, so it is not a dataset; pass a dataset's directory "
        "(what shardstream pack wrote) or its index.bin\n"
    )


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_get_writes_key_ext_files_under_dir_only(workdir, tmp_path):
    shutil.copytree(workdir / "ds", tmp_path / "ds")
    before = tree(tmp_path)
    done = run("get", "ds", "a/000", "--index", "2", "3", "-o", "out/x", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "wrote 6 files (1024 bytes) of 3 samples to out/x\n"
    after = tree(tmp_path)
    new = {name: data for name, data in after.items() if name not in before}
    assert {name: after[name] for name in before} == before
    reference = {f"out/x/{name}": data for shard in SHARDS for name, data in shard if name.startswith(("a/", "b/"))}
    assert new == reference


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--index", "0"],
            "refusing to write sample '../escape' of ds: its key '../escape' has a .. component, which "
            "could land outside out or mislead a terminal; nothing was written (shardstream cat ds --index 0 "
            "--member EXT > FILE writes it to a name you choose)",
        ),
        (
            ["a/000", "--index", "4"],  # the good sample is not written either
            "refusing to write sample 'esc\\x1b[31mred' of ds: its key 'esc\\x1b[31mred' holds a NUL, "
            "control or other non-printable character, which could land outside out or mislead a terminal; nothing "
            "was written (shardstream cat ds --index 4 --member EXT > FILE writes it to a name you choose)",
        ),
        (
            ["--index", "5"],
            "refusing to write sample 'evil\\nkey' of ds: its key 'evil\\nkey' holds a NUL, control or "
            "other non-printable character, which could land outside out or mislead a terminal; nothing was "
            "written (shardstream cat ds --index 5 --member EXT > FILE writes it to a name you choose)",
        ),
    ],
)
def test_get_refuses_an_unsafe_key_and_writes_nothing(workdir, tmp_path, args, line):
    shutil.copytree(workdir / "ds", tmp_path / "ds")
    before = tree(tmp_path)
    done = run("get", "ds", *args, "-o", "out", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"shardstream: error: {line}\n")
    assert tree(tmp_path) == before
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.parent.iterdir() if p.name == "escape.txt") == []


def test_get_does_not_follow_a_link_out_of_dir(tmp_path, workdir):
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out" / "a").symlink_to(tmp_path / "elsewhere")
    done = run("get", str(workdir / "ds"), "a/000", "-o", "out", cwd=tmp_path)
    assert done.returncode == 2
    assert "leads outside out (a symbolic link); not written" in done.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a/b.jpg", None),
        ("x..y.jpg", None),
        ("/etc/passwd.jpg", "is an absolute path"),
        ("a/../../b.jpg", "has a .. component"),
        ("..", "has a .. component"),
        ("a//b.jpg", "has an empty or . component"),
        ("./a.jpg", "has an empty or . component"),
        ("a\x00b.jpg", "holds a NUL, control or other non-printable character"),
        ("a\u202eb.jpg", "holds a NUL, control or other non-printable character"),
    ],
)
def test_unsafe_path(name, why):
    assert unsafe_path(name) == why


def test_escape_leaves_printable_keys_as_they_are():
    assert escape("a/b c\\d é") == "a/b c\\d é"
    assert escape("a\nb\tc\x1b[0m\u202e\\") == "a\\nb\\tc\\x1b[0m\\u202e\\\\"


def test_cat_get_and_ls_on_s3(workdir, s3_server, s3_config, s3_bucket, tmp_path):
    from shardstream.storage import open_store

    url = f"s3://{s3_bucket}/ds"
    store = open_store(url, s3=s3_config)
    for name, data in tree(workdir / "ds").items():
        store.write_bytes(name, data)
    env = s3_server.info.env()
    done = run("ls", url, "--long", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == run("ls", "ds", "--long", cwd=workdir).stdout
    done = run("cat", url, "a/001", "--member", "seg.PNG", env=env, text=False)
    assert (done.returncode, done.stdout) == (0, b"\x89PNG\r\n"), done.stderr
    done = run("cat", url, "--index", "3", env=env, text=False)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        assert [(m.name, tar.extractfile(m).read()) for m in tar] == [("b/002.jpg", b"x" * 1000)]
    done = run("get", url, "a/000", "b/002", "-o", str(tmp_path / "out"), env=env)
    assert done.returncode == 0, done.stderr
    assert tree(tmp_path) == {
        "out/a/000.jpg": b"\xff\xd8jpeg\x00\x01\n",
        "out/a/000.cls": b"0",
        "out/b/002.jpg": b"x" * 1000,
    }
    done = run("cat", url, "no/such", env=env)
    assert (done.returncode, done.stderr) == (
        1,
        f"shardstream: error: no sample with key 'no/such' in {url} (shardstream ls {url} lists the keys)\n",
    )


def test_cat_of_a_key_with_dotdot_names_the_refused_member_not_a_changed_shard(workdir):
    """The tar reader refuses a member named '../escape.txt' (a path out of any folder); reading
    that sample says so, naming the member, instead of calling the shard changed."""
    done = run("cat", "ds", "--index", "0", "--member", "txt", cwd=workdir)
    assert done.returncode == 1 and done.stdout == ""
    assert "member '../escape.txt' at byte 0 has an absolute path or '..'; refused" in done.stderr, done.stderr
    assert "changed since it was indexed" not in done.stderr
