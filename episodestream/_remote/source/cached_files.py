"""``CachedFiles``: what the cache budget, prewarming and episode videos use of a remote source's
files. ``RemoteFiles`` is the one implementation and is built from those modules, so they name this
protocol rather than import it back (no import cycle, not even a type-only one)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from episodestream._base.turns import Turn
from episodestream._format.files import EpisodeVideos, SourceStats
from episodestream._remote.cache.node_cache import NodeCache


class CachedFiles(Protocol):
    description: str  # the source, redacted, for messages
    cache: NodeCache
    fetch_threads: int

    def cache_name(self, kind: str, relpath: str, suffix: str = "") -> str: ...

    def pinned_bytes(self) -> tuple[dict[str, tuple[int, int]], int, int]: ...

    @property
    def knows_every_file(self) -> bool: ...

    def look_up(self, relpaths: Iterable[str]) -> None: ...

    def exists(self, relpath: str) -> bool: ...

    def size_bytes(self, relpath: str) -> int: ...

    def list_files(self, reldir: str, *, suffix: str) -> list[str]: ...

    def local_path(self, relpath: str) -> str: ...

    def fetch_whole(self, relpath: str, *, holder: str, stop: Callable[[], bool] | None = None) -> Path: ...

    def read_range(self, relpath: str, start: int, end: int, *, exact: bool = False,
                   block_bytes: int | None = None) -> bytes: ...

    def episode_videos(self, *, turn: Turn | None = None) -> EpisodeVideos: ...

    def stats(self) -> SourceStats: ...

    def close(self) -> None: ...
