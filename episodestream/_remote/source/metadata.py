"""``fetch_metadata``: the metadata files a dataset reads while it is built, downloaded together.

Building a dataset reads ``meta/info.json``, the episodes parquet files, the tasks and the stats
one after another (``_format.versions.load_metadata``, then ``LeRobotMeta``), and each read of a
remote file is a download of its own: from a far store their round trips add up (one per file,
the larger part of building a dataset over a 50 ms link). The listing already names them all and
none depends on another's content, so they are fetched here concurrently, held for this process
as its reads would hold them (``RemoteFiles.local_path``, one download per file at a time); each read
then finds its file local. ``concurrent.futures`` rather than our ``DaemonPool``: this runs once per
dataset, in the process that builds it, and waits for every thread before it returns, so no
thread outlives it (nor is left running when DataLoader workers fork).

A failed fetch is not raised here: the read that needs the file fetches it again and raises its
own error (naming the file, as it did before), and a file that building does not read (the other
version's stats) is never an error at all.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from episodestream._remote.source.budget import metadata_files

if TYPE_CHECKING:
    from episodestream._remote.source.cached_files import CachedFiles

logger = logging.getLogger("episodestream.remote")

FETCHES_IN_FLIGHT = 8  # the download controller's initial node-wide budget


def fetch_metadata(files: CachedFiles) -> list[str]:
    """Download ``files``' metadata files (``budget.metadata_files``) into the node cache at once,
    held for this process as its reads hold them (``local_path``); returns the files fetched."""
    relpaths = metadata_files(files)
    if len(relpaths) < 2:
        return []  # one file: nothing to overlap, the read fetches it
    with ThreadPoolExecutor(max_workers=min(FETCHES_IN_FLIGHT, len(relpaths)),
                            thread_name_prefix="episodestream-metadata") as pool:
        futures = [pool.submit(files.local_path, relpath) for relpath in relpaths]
    fetched = []
    for relpath, future in zip(relpaths, futures):
        error = future.exception()
        if error is None:
            fetched.append(relpath)
        else:
            # Only the type: the read that fetches it again raises the error, its message redacted.
            logger.debug("%s/%s: fetching ahead failed (%s); its read fetches it again.",
                         files.description, relpath, type(error).__name__)
    return fetched
