"""Turning a user's ``source`` argument into a ``DatasetFiles``.

Resolution order: an existing local path, or a ``file://`` URL naming a local folder (both read in
place, never copied into the cache); a URL with a scheme (``hf://``, ``s3://``, ``gs://``,
``http(s)://``, other fsspec protocols), read through fsspec; anything else is a Hugging Face Hub
dataset repo id. Remote sources go through ``remote``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from episodestream._base.warn import warn_user
from episodestream._format.files import DatasetFiles, LocalFiles
from episodestream._runtime.source_options import REMOTE_OPTION_NAMES, SOURCE_OPTION_DEFAULTS, SourceOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

_FILE_SCHEME = "file://"


def open_source(source: str | os.PathLike, *, local_cache_dir: bool = False,
                **options: Unpack[SourceOptions]) -> DatasetFiles:
    """The source's files, read with the ``SourceOptions`` it uses: ``revision`` and the remote
    options (``REMOTE_OPTION_NAMES``; any other option is not its business and left alone), each
    left out taking its default from ``SOURCE_OPTION_DEFAULTS``.

    ``local_cache_dir``: the caller also uses ``cache_dir`` for a local folder (the map-style
    dataset's column cache), so giving it is not a mistake to warn about."""
    revision = options.get("revision", SOURCE_OPTION_DEFAULTS["revision"])
    remote_options: dict[str, Any] = {name: options.get(name, SOURCE_OPTION_DEFAULTS[name])
                                      for name in REMOTE_OPTION_NAMES}
    folder = local_folder(source)
    if folder is not None:
        if revision is not None:
            raise ValueError(f"revision={revision!r} applies to Hub datasets; {os.fspath(source)!r} is a local "
                             f"folder, read as it is on disk. Pass revision=None.")
        if not os.path.isdir(folder):
            raise NotADirectoryError(f"source {os.fspath(source)!r} is a file; pass the dataset's root folder "
                                     f"(the one holding meta/info.json).")
        given = [name for name, value in remote_options.items()
                 if value is not None and not (name == "cache_dir" and local_cache_dir)]
        if given:
            # Silently dropping e.g. a cache_limit would let a user believe a budget applies.
            warn_user(f"{', '.join(given)} only apply to remote sources; {os.fspath(source)!r} is a local "
                          f"folder, read in place without the cache or a download, so they are ignored.", UserWarning)
        return LocalFiles(folder)
    if not isinstance(source, str) or not source:
        raise TypeError(f"source must be a dataset folder, a URL or a Hub repo id, got {source!r}.")
    from episodestream._remote.source.open import open_remote_source  # fsspec and huggingface_hub load only for remote sources

    return open_remote_source(source, revision=revision, fetch_metadata=True, **remote_options)


def local_folder(source: Any) -> str | None:
    """The local path ``source`` names (a path, or a ``file://`` URL), or None for anything else.

    A ``file://`` URL is a local folder like any other: reading it through the node cache would
    copy the metadata and every episode's video into the cache for nothing.
    """
    if isinstance(source, os.PathLike):
        return os.fspath(source)
    if not isinstance(source, str):
        return None
    if not source.startswith(_FILE_SCHEME):
        return source if os.path.exists(source) else None
    path = source[len(_FILE_SCHEME):]
    if path.startswith("localhost/"):
        path = path[len("localhost"):]
    # Path.as_uri() percent-encodes ("a%20b"); a name that really holds '%' is found as it is.
    for candidate in (path, unquote(path)):
        if candidate and os.path.exists(candidate):
            return candidate
    raise FileNotFoundError(f"source {source!r} names the local path {unquote(path)!r}, which does not exist.")
