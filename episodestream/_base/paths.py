"""Where episodestream keeps its caches on this machine (the node cache, the column cache)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "EPISODESTREAM_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$EPISODESTREAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/episodestream``, else ``~/.cache/episodestream``."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "episodestream"
