"""``gc_paused()``: the cyclic garbage collector held off while a block builds many acyclic objects.

Parsing a DROID-sized keep-ranges JSON (92,000 episodes, ~300,000 small lists) or building one
``Segment`` per episode allocates hundreds of thousands of containers, and each allocation burst
triggers collections that walk the whole heap (a trainer's, with torch imported, is large): such
a ``json.load`` took about three times as long with the collector on (benchmarks/LOG.md,
the curated construction at DROID's size). The objects made hold no cycles, so nothing is left for the collector to find afterwards.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the collector for the block (re-enabled after it only if it was enabled before)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
