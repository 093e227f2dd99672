"""Access to a dataset's files by path relative to its root.

Everything above this module names files by their dataset-relative path (``meta/info.json``,
``videos/<key>/chunk-000/file-000.mp4``); only this module turns those into real locations, so a
remote source can plug in by providing the same four methods.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

if TYPE_CHECKING:
    from ._metadata import EpisodeInfo


class EpisodeVideos(Protocol):
    """One consumer's view of where its admitted episodes' video bytes are, locally.

    The streaming loop calls ``admit`` ahead of need (when ``prefetches``), ``path`` when it builds
    a sample, and ``evict`` once the episode's samples are decoded. A local dataset needs none of
    this; a remote one fetches the bytes on admit into a refcounted cache.
    """

    prefetches: bool  # True when admit() starts work worth doing ahead of need

    def admit(self, episode: EpisodeInfo) -> None: ...

    def path(self, episode: EpisodeInfo, key: str) -> str:
        """A local file the decoder can read this episode's frames of camera ``key`` from."""
        ...

    def evict(self, episode: EpisodeInfo) -> None: ...

    def close(self) -> None: ...


class DatasetFiles(Protocol):
    """What the format, row and video layers need from a dataset root."""

    description: str  # for error messages: where the dataset lives

    def exists(self, relpath: str) -> bool: ...

    def read_bytes(self, relpath: str) -> bytes: ...

    def list_files(self, reldir: str, *, suffix: str) -> list[str]: ...

    def local_path(self, relpath: str) -> str:
        """A local filesystem path holding the whole file (metadata files)."""
        ...

    def size_bytes(self, relpath: str) -> int: ...

    def open_input(self, relpath: str) -> str | BinaryIO:
        """What pyarrow should read a data parquet from: a local path, or a file object that
        reads byte ranges on demand (so an episode's row group is fetched without the file)."""
        ...

    def episode_videos(self) -> EpisodeVideos:
        """A new per-consumer ``EpisodeVideos`` (made inside the consumer's process)."""
        ...

    def close(self) -> None:
        """Release what this process holds (remote: its references to cached metadata)."""
        ...


def check_relpath(relpath: str, *, what: str) -> str:
    """Normalise a dataset-relative path; refuse absolute paths and ones that escape the root.

    Paths come from templates and values inside the dataset's own metadata, which we do not trust:
    ``{video_key}`` = ``../../etc`` must not read outside the dataset.
    """
    normalised = posixpath.normpath(relpath.replace("\\", "/"))
    if posixpath.isabs(normalised) or normalised == ".." or normalised.startswith("../"):
        raise ValueError(f"{what} {relpath!r} escapes the dataset root; refusing to read it.")
    return normalised


class LocalFiles:
    """A dataset folder on a local or network filesystem, read in place (never copied)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self.description = str(self.root)
        self._resolved: dict[str, Path] = {}  # resolving symlinks costs a syscall per path component

    def _path(self, relpath: str) -> Path:
        path = self._resolved.get(relpath)
        if path is None:
            path = (self.root / check_relpath(relpath, what="Path")).resolve()
            # A symlink inside the dataset may still point outside it.
            if path != self.root and self.root not in path.parents:
                raise ValueError(f"Path {relpath!r} resolves to {path}, outside the dataset root {self.root}.")
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

    def episode_videos(self) -> "LocalVideos":
        return LocalVideos(self)

    def close(self) -> None:
        pass


class LocalVideos:
    """Local videos are read in place: nothing to fetch, keep or release."""

    prefetches = False

    def __init__(self, files: LocalFiles) -> None:
        self._files = files

    def admit(self, episode: "EpisodeInfo") -> None:
        pass

    def path(self, episode: "EpisodeInfo", key: str) -> str:
        return self._files.local_path(episode.videos[key].relpath)

    def evict(self, episode: "EpisodeInfo") -> None:
        pass

    def close(self) -> None:
        pass
