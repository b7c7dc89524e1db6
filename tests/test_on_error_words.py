"""Writers' two words for one choice: ``on_error="raise"`` (the readers' word) and ``"fail"``
(the writers' older one, still taken) make the same bytes, on disk and in the pack state, so an
unfinished pack started under one word is finished under the other; the command line takes
both."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_unfinished_pack import SHARD_BYTES, fix, image_tree

from shardstream import pack, pack_samples
from shardstream.cli import main
from shardstream.errors import DecodeError
from shardstream.packing import OnError

pytestmark = pytest.mark.timeout(180)


def all_files(dest: Path) -> dict[str, bytes]:
    """Every file under ``dest`` (the pack state under ``.shardstream/`` too), by its path there."""
    return {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}


def text_tree(root: Path, count: int = 9) -> Path:
    root.mkdir()
    for i in range(count):
        (root / f"{i:03d}.txt").write_text(f"sample {i}")
    return root


def _sample(i):
    return {"__key__": f"k{i:03d}", "txt": f"sample {i}"}


def test_every_spelling_of_raise_packs_the_same_bytes(tmp_path):
    src = text_tree(tmp_path / "src")
    packed = {}
    for word in ("raise", "fail", OnError.FAIL, OnError.RAISE):
        dest = tmp_path / f"out-{word}"
        pack(src, dest, max_samples_per_shard=4, on_error=word, progress=False)
        packed[str(word)] = all_files(dest)
    first = packed["raise"]
    assert "index.bin" in first and all(files == first for files in packed.values())


def test_pack_samples_packs_the_same_bytes_under_either_word(tmp_path):
    raised = tmp_path / "raise"
    failed = tmp_path / "fail"
    pack_samples(_sample, range(9), raised, max_samples_per_shard=4, on_error="raise", progress=False)
    pack_samples(_sample, range(9), failed, max_samples_per_shard=4, on_error="fail", progress=False)
    assert all_files(raised) == all_files(failed)


def test_an_unfinished_pack_left_under_one_word_is_finished_under_the_other(tmp_path):
    src = image_tree(tmp_path / "src")  # its last image is cut short: --check-images stops the pack there
    options = dict(labels_from_dirs=True, check_images=True, workers=1, max_shard_bytes=SHARD_BYTES, progress=False)
    for word in ("fail", "raise"):
        with pytest.raises(DecodeError, match="zz.jpg"):
            pack(src, tmp_path / word, on_error=word, **options)
    unfinished = all_files(tmp_path / "fail")
    assert any(name.endswith(".tar") for name in unfinished) and "index.bin" not in unfinished
    assert all_files(tmp_path / "raise") == unfinished  # the same pack state, whichever word stopped it

    fix(src)
    crossed = {"fail": "raise", "raise": "fail"}  # each finished under the other word
    for started, finishing in crossed.items():
        report = pack(src, tmp_path / started, on_error=finishing, **options)
        assert report.resumed
    finished = all_files(tmp_path / "fail")
    assert "index.bin" in finished and all_files(tmp_path / "raise") == finished


@pytest.mark.parametrize("word", ["raise", "fail", "skip"])
def test_the_command_line_takes_each_word(tmp_path, word, capsys):
    src = text_tree(tmp_path / "src")
    command = ["pack", str(src), str(tmp_path / "out"), "--on-error", word, "--workers", "1", "--no-progress"]
    assert main(command) == 0
    assert "9 samples" in capsys.readouterr().out


def test_the_command_line_refuses_another_word_naming_the_choices(tmp_path, capsys):
    src = text_tree(tmp_path / "src")
    with pytest.raises(SystemExit) as exit_:
        main(["pack", str(src), str(tmp_path / "out"), "--on-error", "ignore"])
    assert exit_.value.code == 2
    assert "--on-error: invalid choice: 'ignore'" in capsys.readouterr().err


def test_a_word_that_is_none_of_them_is_refused(tmp_path):
    with pytest.raises(ValueError, match="ignore"):
        pack(text_tree(tmp_path / "src"), tmp_path / "out", on_error="ignore", progress=False)
