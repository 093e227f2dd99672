"""``episode_pool_size="auto"``: the whole share where the source's layout makes it free, else the spread pool.

Why a layout decides: a batch draws from at most the pool's episodes, and a run of training steps
from little more: a sliding pool of P episodes gives W consecutive samples about P + W / (frames per
episode) distinct episodes, where a global shuffle gives nearly min(W, episodes). A pool at least as
wide as a consumer's share is a global shuffle of that share (``_plan.sampling``: every episode
emits at an even pace over the whole stream), over batches and over hundreds of steps alike
(``_plan.shuffle_quality``, docs/benchmarks.md). What a wide pool costs is not rows (tabular, small)
but decoders: every pooled episode's video files stay in reach of every decode thread, whose
decoder cache holds at most ``MAX_DECODERS``, and an open per sample and camera costs about half a
decode (docs/benchmarks.md, "Shuffle over training windows"). So:

- where the selection's video files (every camera's) are no more than the spread pool may keep open
  anyway (v3.0's shared files), a wide pool opens no decoder that the spread one would not, so it
  streams as fast: the pool is the selection's episodes + 1 (at least any consumer's share, so each
  consumer shuffles its whole share), at most what ``ROWS_BUDGET_BYTES`` of rows hold;
- elsewhere (a file per episode and camera, v2.x, or more files than that) it is the *spread* pool:
  96, or fewer where 96 x cameras would pass that cap (2 cameras: 64, 3: 42), where the rows budget
  holds fewer, or where the selection has fewer episodes (at least 16);
- a remote source gets the spread pool, at most 64, as far as ``cache_limit`` holds it (each pooled
  episode's video is a node-cache entry, on disk while pooled), and never a wide one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from episodestream._format.dtypes import is_numeric, sample_dtype
from episodestream._format.episodes import EpisodeSelection
from episodestream._format.metadata import DatasetMeta
from episodestream._plan.shuffle_quality import global_distinct
from episodestream._sample.video.decoder_cache import MAX_DECODERS

log = logging.getLogger(__name__)

AUTO = "auto"
NARROW_POOL = 16  # the floor; every release before "auto" defaulted to it
# Chosen when 64 fell short of a global shuffle's diversity on the small shares of DataLoader workers
# and ranks (their ramp and end weigh more). With systematic keys 64, and 42 (3 cameras), reach it there
# too; 96 stays for batch 256, which draws from at most the pool's episodes, and it streamed as fast
# (docs/usage.md). The decoder cap still bounds it per camera.
SPREAD_POOL = 96
# A remote source's widest: through a shaped link 96 was not shown to stream as fast as 64
# (benchmarks/LOG.md, "The spread pool 96 for one camera"); kept until measured better.
REMOTE_SPREAD_POOL = 64
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


def spread_pool(meta: DatasetMeta) -> int:
    """The pool whose episodes' files (one per camera each, at worst) a decoder cache keeps open."""
    cameras = len(meta.video_keys)
    return max(NARROW_POOL, min(SPREAD_POOL, MAX_DECODERS // cameras)) if cameras else SPREAD_POOL


def choose_pool_size(meta: DatasetMeta, selection: EpisodeSelection, *, remote: bool,
                     cache_holds: Callable[[int], bool] | None = None) -> PoolChoice:
    """What ``episode_pool_size="auto"`` is for this selection of this source (module docstring);
    ``cache_holds(pool)``: whether a remote source's ``cache_limit`` holds what that pool keeps."""
    cameras = len(meta.video_keys)
    spread = spread_pool(meta)
    episode_bytes = row_bytes_per_frame(meta) * max(1.0, float(np.mean(selection.lengths)))
    by_rows = int(ROWS_BUDGET_BYTES // episode_bytes)
    rows_why = f"{ROWS_BUDGET_BYTES // 2**20} MiB of rows (~{episode_bytes / 2**10:.0f} KiB per episode) hold {by_rows}"
    # Nor need it pass the selection's episodes + 1 (a consumer owns at most those); never below 16.
    spread = max(NARROW_POOL, min(spread, by_rows, len(selection) + 1))
    if remote:
        spread = min(spread, REMOTE_SPREAD_POOL)
        candidates = (p for p in (spread, spread * 3 // 4, spread // 2, NARROW_POOL) if p >= NARROW_POOL)
        size = next((p for p in candidates if cache_holds is None or cache_holds(p)), NARROW_POOL)
        why = ("a remote source: each pooled episode's video is held in the node cache"
               + ("" if size == spread else f", and cache_limit holds a pool of {size}, not {spread}"))
        return PoolChoice(size, why + _run_of_steps(size, selection.lengths))
    files = selection.video_files() if cameras else 0
    cap = min(MAX_DECODERS, spread * cameras)
    if files > cap:
        return PoolChoice(spread, f"the selection's frames are in {files} video files ({cameras} camera(s)), "
                                  f"more than the {cap} decoders a pool of {spread} may keep open"
                                  + _run_of_steps(spread, selection.lengths))
    wide = min(len(selection) + 1, by_rows)
    size = max(spread, wide)
    fit = (f"{files} video file(s) fit the decoders a pool of {spread} keeps" if cameras
           else "no video to decode")
    if wide == len(selection) + 1:
        return PoolChoice(size, f"{fit}; every selected episode ({len(selection)}) fits: each consumer "
                                f"shuffles its whole share, over batches and runs of steps like a global shuffle")
    return PoolChoice(size, f"{fit}; {rows_why}" + _run_of_steps(size, selection.lengths))


# What a user gets over a run of training steps, in the log line: 100 steps of 32.
_RUN_SAMPLES = 3_200


def _run_of_steps(pool: int, lengths: np.ndarray) -> str:
    """A sliding pool's episodes over ``_RUN_SAMPLES`` consecutive samples, against a global shuffle's
    (``_plan.shuffle_quality``: about the pool plus the episodes the run moves on by), in a few words."""
    if not len(lengths):
        return ""
    ours = min(len(lengths), pool + _RUN_SAMPLES / max(1.0, float(np.mean(lengths))))
    return (f"; over {_RUN_SAMPLES:,} consecutive samples a consumer draws from ~{ours:,.0f} episodes, a "
            f"global shuffle of the selection from ~{global_distinct(lengths, _RUN_SAMPLES):,.0f} (a pool wider "
            f"than a consumer's share shuffles it whole: pass episode_pool_size)")
