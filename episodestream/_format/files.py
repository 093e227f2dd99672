"""The seam between a dataset's files and everything that reads them: ``DatasetFiles`` and
``EpisodeVideos``, with the local implementations (``LocalFiles``, ``LocalVideos``).

Everything above this module names files by their dataset-relative path (``meta/info.json``,
``videos/<key>/chunk-000/file-000.mp4``); only implementations of ``DatasetFiles`` turn those into
real locations. A remote source (``remote/_remote_files.py``) plugs in by subclassing the same two
abstract base classes, so a missing or misspelt method fails when the class is instantiated (and
in the type checker), not when a caller first needs it; ``tests/test_seams.py`` runs one
conformance suite against every implementation (local, ``file://``, Hub, S3).
"""

from __future__ import annotations

import abc
import io
import os
import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from episodestream._base.turns import Turn
from episodestream._format.episodes import EpisodeInfo, EpisodeTable
from episodestream._format.mp4 import VideoTrack, read_local_track


class EpisodesOf(Protocol):
    """What a source's cache budget reads of a dataset's metadata (``DatasetMeta`` is one); declared
    here so that this module, which metadata reads files through, does not import metadata back."""

    @property
    def fps(self) -> int: ...

    @property
    def episodes(self) -> EpisodeTable: ...


@dataclass(frozen=True)
class SourceStats:
    """What this process's reads of a dataset's source cost (``dataset.source_stats()``); all zeros
    for a local folder, which is read in place. DataLoader workers count their own reads.

    requests, bytes_fetched: ranged reads sent to the remote source and the bytes received for them
        (metadata, parquet footers and row groups, mp4 headers and spans).
    cache_hits: node-cache entries (a metadata file, an mp4 header, an episode's span, a whole
        file) that were already on disk when this process acquired them.
    cache_misses: node-cache entries this process downloaded.
    cache_miss_bytes: the bytes of those entries: a span's byte range, a header's stored bytes, a
        whole file's size (reads that found nothing to cache, such as parquet rows, are not in it).
    lookup_requests: requests that asked the size and version of files the source was not listed
        for (a v2.x dataset's episode files, asked when an episode is admitted): one paths-info
        request per episode on the Hub, one ``info`` (HEAD) per file on object stores and HTTP;
        not in ``requests``.
    """

    requests: int = 0
    bytes_fetched: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_miss_bytes: int = 0
    lookup_requests: int = 0


class EpisodeVideos(abc.ABC):
    """One consumer's view of where its admitted episodes' video bytes are, locally.

    The streaming loop calls ``admit`` ahead of need (when ``prefetches``), ``path`` when it builds
    a sample, and ``evict`` once the episode's samples are decoded. A local dataset needs none of
    this; a remote one fetches the bytes on admit into a refcounted cache.
    """

    prefetches: bool = False  # True when admit() starts work worth doing ahead of need

    @abc.abstractmethod
    def admit(self, episode: EpisodeInfo) -> None:
        """Start making the episode's video bytes local (may return before they are)."""

    def admit_many(self, episodes: Sequence[EpisodeInfo]) -> None:
        """``admit`` each of ``episodes``, which are needed in this order (a fetcher that can order
        or join their downloads overrides this)."""
        for episode in episodes:
            self.admit(episode)

    @abc.abstractmethod
    def path(self, episode: EpisodeInfo, key: str) -> str:
        """A local file the decoder can read this episode's frames of camera ``key`` from (admits
        the episode first if it was not admitted; the caller evicts it)."""

    def local_file(self, episode: EpisodeInfo, key: str) -> str:
        """The local file holding this episode's bytes of camera ``key``: what ``path`` names here (a
        source whose decoders read several files as one, ``ServedVideo``, overrides it)."""
        return self.path(episode, key)

    def track(self, episode: EpisodeInfo, key: str) -> VideoTrack:
        """The sample index (``_format.mp4.VideoTrack``) of the whole video file holding this
        episode's frames of camera ``key``: every frame's time, as the doctor checks them. Read from
        the file ``path`` gives, which is the whole file here (``Mp4LayoutError`` where its index
        cannot be read)."""
        return read_local_track(self.path(episode, key))

    def check(self, episode: EpisodeInfo) -> None:  # noqa: B027 - a no-op default: most sources checked at start
        """Raise now, naming the file, if the episode's video files are missing (called when the
        pool holds the episode, after its rows are read). Sources that looked at every file when the
        dataset was built have nothing left to check."""

    @abc.abstractmethod
    def evict(self, episode: EpisodeInfo) -> Sequence[str]:
        """The episode's samples are decoded: release what one ``admit`` took. Returns the local
        files it let go of that no later sample reads (a remote episode's spans; none where files
        are read in place), whose decoders the caller may close."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop work in flight and release everything this consumer holds."""


class DatasetFiles(abc.ABC):
    """What the format, row and video layers need from a dataset root (nine methods, plus the
    cache budget check and the cache folder that only sources with a cache have)."""

    description: str  # for error messages: where the dataset lives
    # True when the local file a video's path names is the dataset's own and stays as it is while
    # the source is open, so a decoder opened on it may serve later passes too. A remote source's
    # cache deletes files between passes and may fetch another span of the same file under its
    # name (a sparse partial download): a decoder kept open would read the old bytes.
    videos_stay_in_place: bool = False

    @abc.abstractmethod
    def exists(self, relpath: str) -> bool:
        """Whether the dataset has this file."""

    @abc.abstractmethod
    def read_bytes(self, relpath: str) -> bytes:
        """The whole file (small metadata files)."""

    @abc.abstractmethod
    def list_files(self, reldir: str, *, suffix: str) -> list[str]:
        """Dataset-relative paths under ``reldir`` ending in ``suffix``, sorted."""

    @abc.abstractmethod
    def local_path(self, relpath: str) -> str:
        """A local filesystem path holding the whole file (metadata files)."""

    @abc.abstractmethod
    def size_bytes(self, relpath: str) -> int:
        """The file's size in bytes."""

    @abc.abstractmethod
    def open_input(self, relpath: str) -> str | io.IOBase:
        """What pyarrow should read a data parquet from: a local path, or a file object that
        reads byte ranges on demand (so an episode's row group is fetched without the file)."""

    def read_ahead(self, relpath: str, ranges: Callable[[], Sequence[tuple[int, int]]]) -> None:  # noqa: B027 - local files: nothing to do
        """Byte ranges of ``relpath`` (``ranges()``, asked for only by a source that uses them) that
        reads through ``open_input`` want next: a source whose reads cross a link fetches them now,
        joined into as few requests as their gaps allow."""

    @abc.abstractmethod
    def episode_videos(self, *, turn: Turn | None = None) -> EpisodeVideos:
        """A new per-consumer ``EpisodeVideos`` (made inside the consumer's process); a source that
        downloads starts the consumer's first downloads in its ``turn`` (``_base.turns``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what this process holds (remote: its references to cached metadata)."""

    @abc.abstractmethod
    def stats(self) -> SourceStats:
        """What this process's reads of the source cost so far (zeros when read in place)."""

    @property
    def node_cache_dir(self) -> Path | None:
        """The node cache folder this source's fetched bytes live in; None when read in place."""
        return None

    @property
    def knows_every_file(self) -> bool:
        """Whether ``exists`` and ``size_bytes`` cost no request (a local folder, a listed remote
        source). Where each costs one (a remote v2.x source, whose files the templates name), the
        readers trust the templates and check each file when its episode is admitted."""
        return True

    def look_up(self, relpaths: Iterable[str]) -> None:  # noqa: B027 - a no-op default: nothing to ask
        """Learn, in as few requests as the source allows, whether each of ``relpaths`` exists and
        its size, before they are asked about one by one (a no-op where ``knows_every_file``)."""

    def check_cache_budget(  # noqa: B027 - a no-op default on purpose: only cached sources override it
            self, meta: EpisodesOf | None = None, *, episodes_in_flight: int = 0) -> None:
        """Refuse, before streaming, a cache too small for what one consumer keeps in flight.

        Sources read in place keep no cache: nothing to check. Remote sources override it.
        """

    def cache_holds(self, meta: EpisodesOf, *, episodes_in_flight: int) -> bool:
        """Whether ``check_cache_budget(meta, episodes_in_flight=...)`` would pass: a question, where
        that check refuses (and closes the source). Sources read in place keep no cache."""
        return True

    def pool_cache_bytes(self, meta: EpisodesOf, *, extra_episodes: int) -> Callable[[int], int] | None:
        """What one consumer keeps in the cache for a pool of ``pool`` episodes (plus
        ``extra_episodes`` in flight), as a function of ``pool``; None where nothing is kept (read in
        place) or it is not known without asking about every file."""
        return None


def check_relpath(relpath: str, *, what: str) -> str:
    """Normalise a dataset-relative path; refuse absolute paths and ones that escape the root.

    Paths come from templates and values inside the dataset's own metadata, which we do not trust:
    ``{video_key}`` = ``../../etc`` must not read outside the dataset.
    """
    normalised = posixpath.normpath(relpath.replace("\\", "/"))
    if posixpath.isabs(normalised) or normalised == ".." or normalised.startswith("../"):
        raise ValueError(f"{what} {relpath!r} escapes the dataset root; refusing to read it.")
    return normalised


class LocalFiles(DatasetFiles):
    """A dataset folder on a local or network filesystem, read in place (never copied)."""

    videos_stay_in_place = True

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self.description = str(self.root)
        self._resolved: dict[str, Path] = {}  # checked relpaths, joined to the root once

    def _path(self, relpath: str) -> Path:
        path = self._resolved.get(relpath)
        if path is None:
            # The check is lexical: what the dataset's metadata names must not climb out of the root,
            # but a file inside it may be a symlink to anywhere. huggingface_hub's cache
            # (``snapshots/<sha>/`` files linking to ``../../blobs/``) is laid out that way, and
            # whoever can place a symlink in the folder could as well have placed the file itself.
            path = self.root / check_relpath(relpath, what="Path")
            self._resolved[relpath] = path
        return path

    def exists(self, relpath: str) -> bool:
        return self._path(relpath).is_file()

    def read_bytes(self, relpath: str) -> bytes:
        return self._path(relpath).read_bytes()

    def list_files(self, reldir: str, *, suffix: str) -> list[str]:
        base = self._path(reldir)
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob(f"*{suffix}") if p.is_file())

    def local_path(self, relpath: str) -> str:
        return str(self._path(relpath))

    def open_input(self, relpath: str) -> str:
        return self.local_path(relpath)

    def size_bytes(self, relpath: str) -> int:
        return self._path(relpath).stat().st_size

    def episode_videos(self, *, turn: Turn | None = None) -> LocalVideos:
        return LocalVideos(self)  # read in place: nothing crosses a link, no turn to wait for

    def close(self) -> None:
        pass

    def stats(self) -> SourceStats:
        return SourceStats()  # read in place: nothing is fetched or cached


class LocalVideos(EpisodeVideos):
    """Local videos are read in place: nothing to fetch, keep or release."""

    prefetches = False

    def __init__(self, files: LocalFiles) -> None:
        self._files = files

    def admit(self, episode: EpisodeInfo) -> None:
        pass

    def path(self, episode: EpisodeInfo, key: str) -> str:
        return self._files.local_path(episode.videos[key].relpath)

    def evict(self, episode: EpisodeInfo) -> Sequence[str]:
        return ()

    def close(self) -> None:
        pass
