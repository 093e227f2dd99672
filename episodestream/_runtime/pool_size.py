"""``episode_pool_size="auto"``: a pool as wide as the source's layout makes free, else 16.

Why a layout decides: a batch draws from at most the pool's episodes, so a pool of 16 gives a batch
of 32 under half the distinct episodes of a global shuffle (``_plan.shuffle_quality``); about 320
reach 0.95 of it, and a pool wider than a consumer's episodes shuffles its whole share. What a wider
pool costs is not rows (tabular, small) but decoders: every pooled episode's video files stay in
reach of every decode thread. Where the selection's video files (every camera's) are no more than
a pool of 16 may already keep open (16 x cameras, at most the decoder cache's cap), a wide pool
opens no decoder that 16 would not, so it streams as fast in as much memory (docs/benchmarks.md,
"Shuffle quality"); elsewhere, a file per episode and camera (v2.x) or more files than that, it
would open and close decoders per sample, and it stays 16. A remote source stays 16 too: each
pooled episode's video is its own node-cache entry, held on disk while pooled.

The wide pool is the selection's episodes + 1 (one more than a consumer can own: a pool of exactly
its episodes would give the last one a one-slot window), at most 1,024 and at most what
``ROWS_BUDGET_BYTES`` of rows hold.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from episodestream._format.dtypes import is_numeric, sample_dtype
from episodestream._format.episodes import EpisodeSelection
from episodestream._format.metadata import DatasetMeta
from episodestream._sample.video.decoder_cache import MAX_DECODERS

log = logging.getLogger(__name__)

AUTO = "auto"
NARROW_POOL = 16  # the pool where a wide one costs decoders; every release before "auto" defaulted to it
WIDE_POOL_MAX = 1024  # 0.98 of a global shuffle's distinct episodes at batch 32 on 2,000 episodes
ROWS_BUDGET_BYTES = 256 * 2**20  # a consumer's pooled rows, estimated from the features' shapes
_TEXT_BYTES = 64  # a string or language row's guess: their sizes are not in info.json


@dataclass(frozen=True)
class PoolChoice:
    """The pool ``"auto"`` chose, and why (logged once, shown by ``episodestream bench``)."""

    size: int
    reason: str


def row_bytes_per_frame(meta: DatasetMeta) -> int:
    """A frame's tabular row in RAM, estimated from info.json (an image stored in the parquet
    counted as its pixels, a string as ``_TEXT_BYTES``)."""
    total = 0
    for feature in meta.features.values():
        if feature.dtype == "video":
            continue
        values = math.prod(feature.shape) if feature.shape else 1
        if is_numeric(feature.dtype):
            total += values * sample_dtype(feature.dtype).itemsize
        elif feature.dtype == "image":
            total += values
        else:
            total += _TEXT_BYTES
    return max(1, total)


def choose_pool_size(meta: DatasetMeta, selection: EpisodeSelection, *, remote: bool) -> PoolChoice:
    """What ``episode_pool_size="auto"`` is for this selection of this source (module docstring)."""
    if remote:
        return PoolChoice(NARROW_POOL, "a remote source: each pooled episode's video is held in the node cache")
    cameras = len(meta.video_keys)
    files = selection.video_files() if cameras else 0
    cap = min(MAX_DECODERS, NARROW_POOL * cameras)
    if files > cap:
        return PoolChoice(NARROW_POOL, f"the selection's frames are in {files} video files ({cameras} camera(s)), "
                                       f"more than the {cap} decoders a pool of {NARROW_POOL} may keep open")
    episode_bytes = row_bytes_per_frame(meta) * max(1.0, float(np.mean(selection.lengths)))
    by_rows = int(ROWS_BUDGET_BYTES // episode_bytes)
    size = max(NARROW_POOL, min(WIDE_POOL_MAX, len(selection) + 1, by_rows))
    if size == len(selection) + 1:
        why = f"every selected episode ({len(selection)}) fits"
    elif size == by_rows:
        why = f"{ROWS_BUDGET_BYTES // 2**20} MiB of rows (~{episode_bytes / 2**10:.0f} KiB per episode) hold {by_rows}"
    else:
        why = f"at most {WIDE_POOL_MAX}"
    fit = (f"{files} video file(s) fit the decoders a pool of {NARROW_POOL} keeps" if cameras
           else "no video to decode")
    return PoolChoice(size, f"{fit}; {why}")
