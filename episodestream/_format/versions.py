"""Which reader reads a dataset, by info.json's ``codebase_version``: v3.0 (``metadata``) or v2.0 /
v2.1 (``v2x``, ``v2_stats``). Both give the same ``DatasetMeta``; what ``LeRobotMeta`` adds (the
dataset's ``stats`` and the LeRobot-shaped episodes table) is read here for either.

Everything that opens a dataset reads its metadata through ``load_metadata`` below, so no layer
above ``_format`` ever asks which version it reads.
"""

from __future__ import annotations

import pyarrow as pa

from episodestream._format.files import DatasetFiles
from episodestream._format.metadata import (SUPPORTED_CODEBASE_VERSION, DatasetMeta,
                                            read_info, load_metadata as load_v3_metadata)
from episodestream._format.stats import load_stats
from episodestream._format.v2_stats import Stats, load_v2_stats
from episodestream._format.v2x import V2_CODEBASE_VERSIONS, lerobot_episodes_table, load_v2_metadata

__all__ = ["V2_CODEBASE_VERSIONS", "is_v2", "load_dataset_stats", "load_lerobot_episodes", "load_metadata"]


def is_v2(meta: DatasetMeta) -> bool:
    return meta.info.get("codebase_version") in V2_CODEBASE_VERSIONS


def load_metadata(files: DatasetFiles) -> DatasetMeta:
    """Read and validate a dataset's metadata, whichever readable version it is."""
    info = read_info(files)  # refuses an unknown codebase_version, naming the file and the field
    if info["codebase_version"] == SUPPORTED_CODEBASE_VERSION:
        return load_v3_metadata(files, info)
    return load_v2_metadata(files, info)


def load_dataset_stats(files: DatasetFiles, meta: DatasetMeta) -> Stats | None:
    """``meta.stats`` as LeRobot gives it: v3.0's ``stats.json`` (None without one); for v2.x the
    stats LeRobot's converter writes into the v3.0 copy."""
    if is_v2(meta):
        return load_v2_stats(files, meta.info["codebase_version"])
    return load_stats(files)


def load_lerobot_episodes(meta: DatasetMeta) -> pa.Table:
    """The episodes table behind ``meta.episodes``, sorted by ``episode_index``, without stats columns."""
    if is_v2(meta):
        return lerobot_episodes_table(meta)
    if meta.episode_rows is None:  # v3.0 metadata is made by load_metadata, which reads them
        raise RuntimeError(f"{meta.description}: the episodes' rows were not read with the metadata.")
    return meta.episode_rows
