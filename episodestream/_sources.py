"""Turning a user's ``source`` argument into a ``DatasetFiles``.

Resolution order: an existing local path (read in place); a ``file://`` URL; anything else is a
remote source (Hub repo id or another URL scheme), which this version does not read yet.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse

from ._files import DatasetFiles, LocalFiles


def open_source(source: str | os.PathLike, *, revision: str | None) -> DatasetFiles:
    if isinstance(source, os.PathLike) or (isinstance(source, str) and os.path.exists(source)):
        if revision is not None:
            raise ValueError(f"revision={revision!r} applies to Hub datasets; {os.fspath(source)!r} is a local "
                             f"folder, read as it is on disk. Pass revision=None.")
        if not os.path.isdir(source):
            raise NotADirectoryError(f"source {os.fspath(source)!r} is a file; pass the dataset's root folder "
                                     f"(the one holding meta/info.json).")
        return LocalFiles(source)
    if not isinstance(source, str) or not source:
        raise TypeError(f"source must be a dataset folder, a URL or a Hub repo id, got {source!r}.")
    parsed = urlparse(source)
    if parsed.scheme == "file":
        return open_source(unquote(parsed.path), revision=revision)
    looks_remote = parsed.scheme or source.count("/") == 1
    what = f"a {parsed.scheme}:// URL" if parsed.scheme else "a Hugging Face Hub repo id" if looks_remote else "a path"
    raise FileNotFoundError(
        f"source {source!r} is not an existing local folder. It looks like {what}; this version of "
        f"episodestream reads local (or network-mounted) LeRobot v3.0 folders only.")
