"""Compatibility: ``from shardstream.pack import Part, PackReport`` keeps working.

The packing half lives in :mod:`shardstream.packing`; import ``Part`` from ``shardstream``
or :mod:`shardstream.packing`. ``shardstream.pack`` itself is the :func:`pack` function:
``shardstream/__init__.py`` imports this module before binding that name, so importing it
later never replaces the function with this module.
"""

from .packing.pack import OnError, PackReport, pack
from .packing.parts import Part

__all__ = ["OnError", "PackReport", "Part", "pack"]
