"""``shardstream pack-text``: see docs/tokens.md."""

from __future__ import annotations

import argparse

__all__ = ["add_parsers"]


def add_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Adds no command yet."""
