"""The ``shardstream`` command: argparse -> library call -> exit code, one module per command.

Exit codes: 0 success, 1 a :class:`~shardstream.errors.ShardstreamError` (one line on
stderr naming the thing and the way out), 2 bad command-line usage (including a value the
library refuses, such as a bad URL or shard name), 130 interrupted.

The parser is composed from the commands' modules, each with ``add_parsers(commands)``, which
adds its subcommands and sets ``run`` (the function the parsed arguments are given to) and,
where a rerun resumes, ``resume_hint`` (what Ctrl-C says after "interrupted"):
:mod:`.pack`, :mod:`.info`, :mod:`.access` (``ls``, ``head``, ``cat``, ``get``), :mod:`.verify`,
:mod:`.index`, :mod:`.plan`, :mod:`.servers` (``demo``, ``s3-server``); what they share is
:mod:`.options` (the size rule, the store option groups, the dataset argument).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence

from ..errors import ShardstreamError
from . import access, import_tokens, index, info, pack, pack_text, plan, servers, verify
from .access import escape, unsafe_path
from .info import (
    _info,  # noqa: F401 (the names earlier callers imported)
    extension_totals,
)
from .options import parse_size
from .options import request_config as _request_config  # noqa: F401

__all__ = ["build_parser", "escape", "extension_totals", "main", "parse_size", "unsafe_path"]

# the order of `shardstream --help`
_COMMANDS = (pack, pack_text, import_tokens, info, access, verify, index, plan, servers)


def build_parser() -> argparse.ArgumentParser:
    """The ``shardstream`` parser: each command module adds its subcommands."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="shardstream", description="Pack small files into tar shards and stream them back."
    )
    parser.add_argument("--version", action="version", version=f"shardstream {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in _COMMANDS:
        module.add_parsers(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the command, map :class:`ShardstreamError` to exit code 1."""
    args = build_parser().parse_args(argv)
    # What is loaded by now lives as long as the command: the collector's full passes need not
    # walk it again (they took a tenth of a 60,000-file pack's listing). Unfrozen after, for a
    # caller that runs main() in its own process.
    gc.freeze()
    try:
        return args.run(args) or 0
    except ShardstreamError as exc:
        print(f"shardstream: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # an argument the library refused: a usage error
        print(f"shardstream: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"shardstream: interrupted{getattr(args, 'resume_hint', '')}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `shardstream info ... | head`: the reader has gone, which is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail again
        return 141  # 128 + SIGPIPE, as a shell reports a command a pipe cut short
    finally:
        gc.unfreeze()
