"""README.md runs as written (issue 51, point 6) and stays a front page (issue 52).

Every ```bash / ```sh and ```python block of README.md runs in the README's order, exactly as
written, in one fresh empty working directory: shell blocks with ``bash -euo pipefail -c``,
Python blocks with this interpreter, with the venv's ``bin`` first on ``PATH`` (so
``shardstream`` and ``python`` are the venv's) and the ``AWS_*`` variables pointing at the
session's SeaweedFS server (the ``s3_server`` fixture). That server stands in for the one the
README starts in "one terminal" with ``shardstream s3-server --bucket NAME``: the test creates
the buckets that line names. A block right after ``<!-- readme-test: skip (why) -->`` is left
out (that server's start, ``tools/demo`` and ``tools/test``); blocks in any other language
(```text for output) are not run. A block that exits non-zero, or runs past
:data:`BLOCK_TIMEOUT_S`, fails the test with the block and its output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a server, packs and DataLoader workers: about a minute or two

README = Path(__file__).parents[1] / "README.md"
MAX_LINES = 250  # issue 52
# The quickstart's shell and Python blocks and the class-folder walk-through's: fewer means the
# parser found less than the README holds (or blocks were marked to skip), not that it all runs.
MIN_BLOCKS_RUN = 4
BLOCK_TIMEOUT_S = 300.0
OUTPUT_SHOWN_CHARS = 20_000  # the end of a failed block's output

RUNNERS = {"bash": "bash", "sh": "bash", "python": "python"}
SKIP_MARK = re.compile(r"<!--\s*readme-test:\s*skip\b.*?-->")
FENCE_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^\s`]*)")
SERVER_BUCKETS = re.compile(r"--bucket[ =](?P<name>[A-Za-z0-9.-]+)")


@dataclass(frozen=True, kw_only=True)
class Block:
    """A fenced code block of a Markdown file."""

    line: int  # 1-based line number of the opening fence
    lang: str  # the info string's first word, lower-cased; "" for none
    code: str
    skipped: bool  # the last non-blank line before the fence is a readme-test skip mark


def fenced_blocks(text: str) -> list[Block]:
    """The fenced code blocks of Markdown ``text``, in order (CommonMark's fences: three or more
    backticks or tildes, closed by at least as many of the same; the opening's indent removed)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opened = FENCE_OPEN.match(lines[i])
        if opened is None:
            i += 1
            continue
        fence, indent = opened["fence"], len(opened["indent"])
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                break
            line = lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            j += 1
        blocks.append(
            Block(
                line=i + 1,
                lang=opened["lang"].lower(),
                code="\n".join(body) + "\n",
                skipped=SKIP_MARK.search(before) is not None,
            )
        )
        i = j + 1
    return blocks


def test_fenced_blocks_finds_languages_skip_marks_and_indented_fences():
    text = (
        "# t\n\n<!-- readme-test: skip (not here) -->\n```bash\nserver\n```\n\n```text\nout\n```\n"
        "- item\n\n  ```python\n  print(1)\n    x = 2\n  ```\n\n````sh\n```\necho\n````\n~~~\nplain\n~~~\n"
    )
    assert fenced_blocks(text) == [
        Block(line=4, lang="bash", code="server\n", skipped=True),
        Block(line=8, lang="text", code="out\n", skipped=False),
        Block(line=13, lang="python", code="print(1)\n  x = 2\n", skipped=False),
        Block(line=18, lang="sh", code="```\necho\n", skipped=False),
        Block(line=22, lang="", code="plain\n", skipped=False),
    ]


def test_readme_is_a_front_page_of_at_most_250_lines():
    num_lines = len(README.read_text(encoding="utf-8").splitlines())
    assert num_lines <= MAX_LINES, (
        f"README.md has {num_lines} lines, more than {MAX_LINES} (issue 52): move detail to a page under docs/"
    )


def run_block(command: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[int | None, str, float]:
    """Runs ``command`` in its own process group; returns its exit code (None: it ran past
    BLOCK_TIMEOUT_S and its whole group was killed), its stdout and stderr together, and seconds."""
    start = time.monotonic()
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # DataLoader workers and packs' processes too
        output, _ = process.communicate()
        code = None
    return code, output, time.monotonic() - start


def test_readme_runs_as_written(s3_server, tmp_path):
    blocks = fenced_blocks(README.read_text(encoding="utf-8"))
    to_run = [block for block in blocks if block.lang in RUNNERS and not block.skipped]
    buckets = sorted(
        {
            match["name"]
            for block in blocks
            if block.skipped and "s3-server" in block.code
            for match in SERVER_BUCKETS.finditer(block.code)
        }
    )
    assert buckets, "README.md: no skipped `shardstream s3-server --bucket NAME` block names the buckets to create"
    for bucket in buckets:  # on the session's server, beside other tests' buckets
        s3_server.create_bucket(bucket)

    work = tmp_path / "work"  # the README's working directory, empty at the start
    scripts = tmp_path / "blocks"
    work.mkdir()
    scripts.mkdir()
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, **s3_server.info.env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    ran: list[Block] = []
    for block in to_run:
        if RUNNERS[block.lang] == "bash":
            command = ["bash", "-euo", "pipefail", "-c", block.code]
        else:
            script = scripts / f"readme-line-{block.line}.py"
            script.write_text(block.code, encoding="utf-8")
            command = [sys.executable, str(script)]
        code, output, seconds = run_block(command, cwd=work, env=env)
        print(f"README.md line {block.line} ({block.lang}): exit {code} in {seconds:.1f} s")
        if code != 0:
            outcome = f"ran past {BLOCK_TIMEOUT_S:g} s" if code is None else f"exited with {code}"
            pytest.fail(
                f"README.md line {block.line}: the ```{block.lang} block {outcome} after {seconds:.1f} s "
                f"(in {work}, after {len(ran)} blocks ran)\n--- block ---\n{block.code}--- output ---\n"
                f"{output[-OUTPUT_SHOWN_CHARS:]}",
                pytrace=False,
            )
        ran.append(block)
    assert len(ran) >= MIN_BLOCKS_RUN, f"only {len(ran)} README blocks ran: {[b.line for b in ran]}"
    assert {RUNNERS[block.lang] for block in ran} == {"bash", "python"}
