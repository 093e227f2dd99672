"""The test seam into a source's files, without a dataset: open a source as a dataset opens it (or
always through the node cache), and read its metadata and its episodes' rows.

A dataset reads its source through a ``DatasetFiles``: ``LocalFiles`` for a folder read in place,
``RemoteFiles`` through the node cache. Tests and benchmarks of that layer (listings, ranged reads,
the cache budget, the bytes and requests a build costs, download errors) open one here instead of
importing where it is built, so this module is the one place outside the package that knows. What
they return are the package's own objects, of the types named here (``DatasetFiles`` the seam,
``LocalFiles`` and ``RemoteFiles`` its two sides, ``EpisodeVideos`` a consumer's videos), for tests
that check which they got; close the files you open.

    from episodestream.testing import source_files

    files = source_files.open_remote_files("lerobot/pusht", cache_dir=tmp_path, token=False)
    meta = source_files.read_metadata(files)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from episodestream._base.lazy_names import lazy_getattr

if TYPE_CHECKING:
    from episodestream._base.turns import Turn
    from episodestream._format.files import DatasetFiles, EpisodeVideos, LocalFiles
    from episodestream._format.metadata import DatasetMeta, EpisodeInfo
    from episodestream._format.rows import RowReader
    from episodestream._remote.source.files import RemoteFiles
    from episodestream._remote.source.prewarm import PrewarmReport

__all__ = ["DatasetFiles", "EpisodeVideos", "LocalFiles", "RemoteFiles", "open_files", "open_remote_files", "prewarm",
           "read_metadata", "row_reader", "video_share_bytes", "worker_turns"]

# The types, each from where it is defined; they load on first use, so that importing this module
# loads neither fsspec nor the rest of the remote source.
_TYPES = {
    "DatasetFiles": "episodestream._format.files",
    "EpisodeVideos": "episodestream._format.files",
    "LocalFiles": "episodestream._format.files",
    "RemoteFiles": "episodestream._remote.source.files",
}

__getattr__ = lazy_getattr(__name__, _TYPES)


def open_files(source: str | os.PathLike, **options: Any) -> DatasetFiles:
    """``source``'s files as a dataset opens them: a local folder (or a ``file://`` URL naming one)
    read in place, anything else through the node cache. ``options``: the ``SourceOptions`` a
    source uses (``revision`` and the remote ones); a remote source's metadata is downloaded too."""
    from episodestream._runtime.sources import open_source

    return open_source(source, **options)


def open_remote_files(source: str, **options: Any) -> RemoteFiles:
    """``source``'s files through the node cache, whatever it is (a ``file://`` URL too), its files
    listed and nothing downloaded but what the call needs. ``options``: ``revision``, ``cache_dir``,
    ``cache_limit``, ``storage_options``, ``token`` (False sends none), ``hub_endpoint``,
    ``download_config``, and ``fetch_threads``, ``fetch_timeout_s``, ``cache_wait_s``,
    ``fetch_metadata`` (download the metadata a dataset reads, as a dataset's build does)."""
    from episodestream._remote.source.open import open_remote_source  # fsspec loads only here

    return open_remote_source(source, **options)


def read_metadata(files: DatasetFiles) -> DatasetMeta:
    """The source's metadata, read and validated as a dataset reads it (v3.0, or v2.0 / v2.1)."""
    from episodestream._format.versions import load_metadata

    return load_metadata(files)


def row_reader(files: DatasetFiles, meta: DatasetMeta, **options: Any) -> RowReader:
    """A reader of the episodes' rows (``read(meta.episodes[i])``), as a dataset's consumers read
    them; ``options``: ``max_open_files``, ``max_open_row_groups``."""
    from episodestream._format.rows import RowReader

    return RowReader(files, meta, **options)


def prewarm(files: RemoteFiles, episodes: Sequence[EpisodeInfo], *, progress: bool = False,
            meta: DatasetMeta | None = None) -> PrewarmReport:
    """Fetch and pin the metadata and the video bytes of ``episodes`` in the node cache, as
    ``episodestream prewarm`` does (a progress bar only with ``progress``: a test's output stays
    its own); under a ``cache_limit``, ``CacheFullError`` first where they cannot fit (checked from
    above with ``meta``, by the episodes' share of their files without)."""
    from episodestream._remote.source.prewarm import prewarm as prewarm_files

    return prewarm_files(files, episodes, progress=progress, meta=meta)


def video_share_bytes(files: RemoteFiles, episodes: Iterable[EpisodeInfo]) -> int:
    """The episodes' share of their mp4s, by duration: what a ``prewarm`` without ``meta`` expects
    their video to cost, and checks against the cache limit."""
    from episodestream._remote.source.budget import video_share_bytes as share_bytes

    return share_bytes(files, episodes)


def worker_turns(*, num_workers: int) -> Callable[..., list[Turn | None]]:
    """The turns in which a rank's ``num_workers`` DataLoader workers start downloading, as a dataset
    hands them out: ``turns(iteration, wait_s=...)`` is each worker's turn (in worker order) in
    DataLoader iteration number ``iteration``, to pass to ``files.episode_videos(turn=...)``; a
    worker's head start waits (at most ``wait_s``) for the worker before it to pass its turn on.
    Every call's turns share one record of who passed on, as one dataset's workers do."""
    from episodestream._base.turns import TURN_WAIT_S
    from episodestream._base.world import World
    from episodestream._runtime.lookahead.worker_turns import WorkerTurns

    shared = WorkerTurns()

    def turns(iteration: int, *, wait_s: float = TURN_WAIT_S) -> list[Turn | None]:
        return [shared.turn(World(0, 1, worker=worker, num_workers=num_workers), iteration, wait_s=wait_s)
                for worker in range(num_workers)]

    return turns
