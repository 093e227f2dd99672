"""Turning a user's ``source`` argument into a ``DatasetFiles``.

Resolution order: an existing local path (read in place, never copied); a URL with a scheme
(``hf://``, ``s3://``, ``gs://``, ``file://``, ``https://``, other fsspec protocols), read through
fsspec like any remote (``file://`` is how a local folder is served "as a remote"); anything else
is a Hugging Face Hub dataset repo id. Remote sources go through ``remote``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ._files import DatasetFiles, LocalFiles


def open_source(source: str | os.PathLike, *, revision: str | None, cache_dir: str | os.PathLike | None = None,
                cache_limit: int | str | None = None, storage_options: Mapping[str, Any] | None = None,
                token: str | None = None, hub_endpoint: str | None = None,
                download_config: Any = None) -> DatasetFiles:
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
    from .remote import open_remote_source  # fsspec and huggingface_hub load only for remote sources

    return open_remote_source(source, revision=revision, cache_dir=cache_dir, cache_limit=cache_limit,
                              storage_options=storage_options, hub_endpoint=hub_endpoint, token=token,
                              download_config=download_config)
