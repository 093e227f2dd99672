"""The caches this layer writes under a cache folder, as ``episodestream cache ls|clear`` lists and
clears them beside the node cache of remote sources:

- the column cache, ``columns/<source key>/*.arrow``: Arrow copies of a source's data files that
  ``EpisodeDataset`` reads rows from (``columns``); rebuilt on first use when removed;
- the stats cache, ``stats/<digest>.json``: ``compute_stats()`` results (``stats_pass``), each
  recording the source it describes; computed again when removed.

Neither has users to wait for: a process holding a column copy open keeps reading the removed file
(POSIX), and a stats file is read once.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from episodestream._format.columns import _slug

_KINDS = ("columns", "stats")


@dataclass(frozen=True)
class CacheFiles:
    """One source's files in one of these caches."""

    kind: str  # "columns" or "stats"
    source: str  # the source key: the column folder's name; a stats file's recorded source, as that name
    paths: tuple[Path, ...]
    files: int
    size_bytes: int

    def matches(self, pattern: str | None) -> bool:
        """Selected by ``pattern`` as ``cache --source`` selects node-cache sources: the key, a glob over
        keys, or text the key contains once non-alphanumerics become '_'."""
        if pattern is None:
            return True
        text = re.sub(r"[^A-Za-z0-9_-]+", "_", pattern).strip("_")
        return fnmatch.fnmatchcase(self.source, pattern) or (bool(text) and text in self.source)

    def remove(self) -> None:
        for path in self.paths:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def _sizes(path: Path) -> list[int]:
    """The sizes of the files at ``path`` (a file, or a folder's files)."""
    try:
        if path.is_dir():
            return [p.stat().st_size for p in path.rglob("*") if p.is_file()]
        return [path.stat().st_size]
    except OSError:  # removed meanwhile
        return []


def _stats_source(path: Path) -> str:
    try:
        return _slug(str(json.loads(path.read_text())["source"]))
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"  # damaged: computed again on next use, and listed so it can be cleared


def cache_files(root: Path) -> list[CacheFiles]:
    """The column and stats caches under ``root``, one entry per (kind, source), sorted."""
    found: dict[tuple[str, str], list[Path]] = {}
    columns, stats = root / _KINDS[0], root / _KINDS[1]
    if columns.is_dir():
        for folder in columns.iterdir():
            found.setdefault(("columns", folder.name), []).append(folder)
    if stats.is_dir():
        for path in stats.glob("*.json"):
            found.setdefault(("stats", _stats_source(path)), []).append(path)
    listed = []
    for (kind, source), paths in sorted(found.items()):
        sizes = [size for path in paths for size in _sizes(path)]
        listed.append(CacheFiles(kind, source, tuple(sorted(paths)), len(sizes), sum(sizes)))
    return listed
