"""The caches this layer writes under a cache folder, as ``episodestream cache ls|clear`` lists and
clears them beside the node cache of remote sources:

- the column cache, ``columns/<source key>/*.arrow``: Arrow copies of a source's data files that
  ``EpisodeDataset`` reads rows from (``columns``); rebuilt on first use when removed;
- the stats cache, ``stats/<digest>.json``: ``compute_stats()`` results (``stats_pass``), each
  recording the source it describes; computed again when removed.

Neither has users to wait for: a process holding a column copy open keeps reading the removed file
(POSIX), and a stats file is read once.

Only files this package writes are listed and cleared, recognised by their names (and a stats file
by its contents): ``cache clear --cache-dir`` pointed by mistake at a folder of the user's deletes none
of its files, and a column folder is removed only once nothing else is left in it.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

from episodestream._format.columns import _slug

_KINDS = ("columns", "stats")
# The names ``columns`` and ``stats_pass`` give their files (``_slug``: a readable part without dots
# and 8 hex digits; a column copy adds its 16-digit signature, a stats file is a 20-digit digest),
# and the temporary files they write and rename (``.<name>.tmp-<random>``).
_SLUG = r"[^./]+-[0-9a-f]{8}"
_OWN_NAMES = {"columns": re.compile(rf"\.?{_SLUG}\.[0-9a-f]{{16}}\.arrow(\.tmp-[^/]+)?"),
              "stats": re.compile(r"\.?[0-9a-f]{20}\.json(\.tmp-[^/]+)?")}
_COLUMN_FOLDER = re.compile(_SLUG)


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
        """Delete these files; a column folder left empty goes too (one holding anything else stays)."""
        for path in self.paths:
            path.unlink(missing_ok=True)
        if self.kind == "columns":
            for folder in {path.parent for path in self.paths}:
                try:
                    folder.rmdir()
                except OSError:  # not empty: something not ours is in it
                    pass


def _own_files(folder: Path, kind: str) -> list[Path]:
    """The files in ``folder`` named as this package names ``kind``'s files (not its subfolders)."""
    try:
        return [p for p in folder.iterdir() if _OWN_NAMES[kind].fullmatch(p.name) and p.is_file()]
    except OSError:  # removed meanwhile, or unreadable: nothing of ours to list
        return []


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:  # removed meanwhile
        return None


def _stats_source(path: Path) -> str | None:
    """The source a stats file records, or None when it is not one this package wrote (or is damaged:
    written again on next use)."""
    if path.name.startswith("."):  # a temporary file of a write that did not finish
        return "unknown"
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict) or not {"format", "source", "stats"} <= raw.keys():
            return None
        return _slug(str(raw["source"]))
    except (OSError, ValueError):
        return None


def cache_files(root: Path) -> list[CacheFiles]:
    """The column and stats caches under ``root``, one entry per (kind, source), sorted: only the files
    this package writes (the module docstring)."""
    found: dict[tuple[str, str], list[Path]] = {}
    columns, stats = root / _KINDS[0], root / _KINDS[1]
    if columns.is_dir():
        for folder in columns.iterdir():
            if _COLUMN_FOLDER.fullmatch(folder.name) and folder.is_dir():
                for path in _own_files(folder, "columns"):
                    found.setdefault(("columns", folder.name), []).append(path)
    if stats.is_dir():
        for path in _own_files(stats, "stats"):
            if (source := _stats_source(path)) is not None:
                found.setdefault(("stats", source), []).append(path)
    listed = []
    for (kind, source), paths in sorted(found.items()):
        sizes = [size for size in map(_size, paths) if size is not None]
        listed.append(CacheFiles(kind, source, tuple(sorted(paths)), len(sizes), sum(sizes)))
    return listed
