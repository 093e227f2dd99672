"""``episode_pool_size="auto"``: the whole share where the source's layout makes it free, else as wide as
decoders and disk allow.

Why a layout decides: a batch draws from at most the pool's episodes, and a run of training steps
from little more: a sliding pool of P episodes gives W consecutive samples about P + W / (frames per
episode) distinct episodes, where a global shuffle gives nearly min(W, episodes). A pool at least as
wide as a consumer's share is a global shuffle of that share (``_plan.sampling``: every episode
emits at an even pace over the whole stream), over batches and over hundreds of steps alike
(``_plan.shuffle_quality``, docs/benchmarks.md). What a wide pool costs is not rows (tabular, small)
but decoders: every pooled episode's video files stay in reach of the consumer's decode threads, whose
shared decoder cache holds at most ``video_decoder_limit`` (a memory budget, ``_sample.video.decoder_cache``),
and an open per sample and camera costs about half a decode (docs/benchmarks.md, "Shuffle over
training windows"). So:

- where the selection's video files (every camera's) fit that limit (v3.0's shared files, and v2.x's
  file per episode and camera up to ~580 files at 240x320), a wide pool reopens no decoder: the pool
  is the selection's episodes + 1 (at least
  any consumer's share, so each consumer shuffles its whole share), at most what
  ``ROWS_BUDGET_BYTES`` of rows hold;
- elsewhere (more files than that) it is the *spread* pool:
  96, or fewer where 96 x cameras would pass ``MAX_DECODERS`` (2 cameras: 64, 3: 42), where the rows
  budget holds fewer, or where the selection has fewer episodes (at least 16);
- a remote source keeps each pooled episode's video in the node cache as a file of its own per
  camera (its span), on disk while pooled, and its decoders read each mp4's pooled spans through one
  view of it (``_remote.source.file_view``), a decoder per mp4 as on a local disk: where its listing
  sizes every episode (v3.0) and its files fit the decoders, the pool is as wide as
  ``REMOTE_POOL_BYTES`` of node cache per consumer holds (and ``cache_limit``, for one consumer), up
  to the whole share; elsewhere the spread pool, at
  most 64, as far as ``cache_limit`` holds it. Bytes fetched do not grow with the pool (each
  episode's span is fetched once while it is pooled), but a pool is fetched whole over its first
  slots (``_plan.sampling``'s ramp): at the start of an epoch the link brings a pool's video before
  the stream runs at its pace (docs/benchmarks.md, "Remote sources").
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
from episodestream._sample.video.decoder_cache import MAX_DECODERS, decoder_limit

log = logging.getLogger(__name__)

AUTO = "auto"
NARROW_POOL = 16  # the floor; every release before "auto" defaulted to it
# Chosen when 64 fell short of a global shuffle's diversity on the small shares of DataLoader workers
# and ranks (their ramp and end weigh more). With systematic keys 64, and 42 (3 cameras), reach it there
# too; 96 stays for batch 256, which draws from at most the pool's episodes, and it streamed as fast
# (docs/usage.md). The decoder cap still bounds it per camera.
SPREAD_POOL = 96
# A remote source's widest spread pool (a file per episode): through a shaped link 96 was not shown
# to stream as fast as 64 (benchmarks/LOG.md, "The spread pool 96 for one camera").
REMOTE_SPREAD_POOL = 64
# The node cache one consumer's wide pool may keep on disk (metadata, pooled and prefetched episodes'
# video) where files fit the decoders. Chosen for a DROID-sized source (3 cameras, ~3 MB of video per
# episode: ~1,300 episodes, a global shuffle's diversity over 100 steps for 4 workers per rank on 8
# ranks) on a node's local disk; a cache_limit narrows it (docs/benchmarks.md, "Remote sources").
REMOTE_POOL_BYTES = 4 * 2**30
# Decode threads per consumer a wide pool is sized for: DataLoader workers decode on one,
# EpisodeLoader on 2 cores on two. A consumer's threads share one decoder cache, each file open once
# plus a decoder lent to each other thread at once (``DatasetCore.decoder_cache``); more threads
# than this lend a few more, which the cache makes room for by closing idle ones.
AUTO_DECODE_THREADS = 2
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


def video_decoder_limit(meta: DatasetMeta) -> int:
    """The decoders one consumer of this source may keep open (``decoder_limit``, from its cameras'
    frame sizes, the two largest dimensions of each video feature's shape, and its video files'
    frames: a v3.0 file of ~10^5 frames costs a decoder several MB of index)."""
    return decoder_limit(_frame_pixels(meta), frames_per_file=frames_per_video_file(meta))


def frames_per_video_file(meta: DatasetMeta) -> float:
    """The frames of one of the source's video files, on average over its files (every camera's):
    what each open decoder indexes when the cache holds one per file (0.0 without video)."""
    columns = meta.episodes.videos.values()
    files = sum(len(v.relpaths) for v in columns)
    return len(columns) * float(meta.episodes.length.sum()) / files if files else 0.0


def _frame_pixels(meta: DatasetMeta) -> list[int]:
    """Each camera's pixels per frame: the two largest dimensions of its video feature's shape."""
    return [math.prod(sorted(meta.features[key].shape)[-2:]) for key in meta.video_keys]


def pool_decoders(meta: DatasetMeta) -> int:
    """The decoders a consumer's pool may keep open, one per file: its ``video_decoder_limit`` less
    one lent to each other of ``AUTO_DECODE_THREADS`` threads reading a file at once."""
    return video_decoder_limit(meta) - (AUTO_DECODE_THREADS - 1)


def spread_pool(meta: DatasetMeta) -> int:
    """The pool whose episodes' files (one per camera each, at worst) a decoder cache keeps open."""
    cameras = len(meta.video_keys)
    return max(NARROW_POOL, min(SPREAD_POOL, MAX_DECODERS // cameras)) if cameras else SPREAD_POOL


def choose_pool_size(meta: DatasetMeta, selection: EpisodeSelection, *, remote: bool, world_size: int = 1,
                     cache_holds: Callable[[int], bool] | None = None,
                     pool_bytes: Callable[[], Callable[[int], int] | None] | None = None) -> PoolChoice:
    """What ``episode_pool_size="auto"`` is for this selection of this source (module docstring),
    read by each of ``world_size`` ranks (a rank's share of a file-per-episode layout is its
    episodes' files); ``cache_holds(pool)``: whether a remote source's ``cache_limit`` holds what that pool keeps;
    ``pool_bytes()``: what a pool keeps in a remote source's node cache, by pool size
    (``DatasetFiles.pool_cache_bytes``), asked for only where a wide pool may be chosen."""
    cameras = len(meta.video_keys)
    spread = spread_pool(meta)
    episode_bytes = row_bytes_per_frame(meta) * max(1.0, float(np.mean(selection.lengths)))
    by_rows = int(ROWS_BUDGET_BYTES // episode_bytes)
    rows_why = f"{ROWS_BUDGET_BYTES // 2**20} MiB of rows (~{episode_bytes / 2**10:.0f} KiB per episode) hold {by_rows}"
    # Nor need it pass the selection's episodes + 1 (a consumer owns at most those); never below 16.
    spread = max(NARROW_POOL, min(spread, by_rows, len(selection) + 1))
    files = selection.video_files() if cameras else 0
    if not meta.episodes_share_video_files and world_size > 1:
        # A rank's share: its episodes' files, and one more episode's where a share's edge cuts one.
        files = -(-files // world_size) + cameras
    # Every file open once in the cache the consumer's decode threads share (``DatasetCore.decoder_cache``).
    cap = pool_decoders(meta) if cameras else 0
    bytes_of = pool_bytes() if remote and pool_bytes is not None else None
    if bytes_of is not None:
        # A remote episode's video is a file of its own per camera (its span of the shared file, in
        # the node cache), read through its mp4's view: a decoder per mp4, as on a local disk.
        widest = min(len(selection) + 1, by_rows) if files <= cap else spread
        remote_wide = _remote_wide_pool(widest, spread, bytes_of, cache_holds, selection.lengths)
        if remote_wide is not None:
            return remote_wide
    if remote:
        spread = min(spread, REMOTE_SPREAD_POOL)
        candidates = (p for p in (spread, spread * 3 // 4, spread // 2, NARROW_POOL) if p >= NARROW_POOL)
        size = next((p for p in candidates if cache_holds is None or cache_holds(p)), NARROW_POOL)
        why = ("a remote source: each pooled episode's video is held in the node cache"
               + ("" if size == spread else f", and cache_limit holds a pool of {size}, not {spread}"))
        return PoolChoice(size, why + _run_of_steps(size, selection.lengths))
    if files > cap:
        where = "the selection's frames are" if world_size == 1 else f"a rank's share of the selection ({world_size} ranks) is"
        return PoolChoice(spread, f"{where} in {files} video files ({cameras} camera(s)), "
                                  f"more than the {cap} decoders a consumer may keep open"
                                  + _run_of_steps(spread, selection.lengths))
    wide = min(len(selection) + 1, by_rows)
    size = max(spread, wide)
    fit = (f"{files} video file(s) fit the {cap} decoders a consumer may keep open" if cameras
           else "no video to decode")
    if wide == len(selection) + 1:
        return PoolChoice(size, f"{fit}; every selected episode ({len(selection)}) fits: each consumer "
                                f"shuffles its whole share, over batches and runs of steps like a global shuffle")
    return PoolChoice(size, f"{fit}; {rows_why}" + _run_of_steps(size, selection.lengths))


def _remote_wide_pool(widest: int, spread: int, bytes_of: Callable[[int], int],
                      cache_holds: Callable[[int], bool] | None, lengths: np.ndarray) -> PoolChoice | None:
    """The widest pool up to ``widest`` whose node cache (``bytes_of``) fits ``REMOTE_POOL_BYTES`` and
    ``cache_limit``; None where that is no wider than ``spread`` (the spread pool's rule decides)."""
    lo, hi = spread, widest  # bytes_of grows with the pool: the last that fits, by bisection
    if bytes_of(lo) > REMOTE_POOL_BYTES:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if bytes_of(mid) <= REMOTE_POOL_BYTES else (lo, mid - 1)
    # cache_limit's own question costs a pass over the episodes: asked of a few sizes only (three
    # quarters, then halving: a handful even from a DROID-sized share down to the spread pool).
    candidates = [lo, lo * 3 // 4] + [lo >> k for k in range(1, max(1, lo // max(1, spread)).bit_length() + 1)]
    size = next((p for p in candidates if p > spread and (cache_holds is None or cache_holds(p))), None)
    if size is None:
        return None
    why = (f"a remote source: the pool keeps ~{bytes_of(size) / 2**30:.1f} GiB of node cache per consumer (at most "
           f"{REMOTE_POOL_BYTES / 2**30:.0f} GiB, and what cache_limit holds), its decoders one per mp4")
    if size == widest and widest == len(lengths) + 1:
        return PoolChoice(size, why + "; every selected episode fits: each consumer shuffles its whole share")
    return PoolChoice(size, why + _run_of_steps(size, lengths))


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
