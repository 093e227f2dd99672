"""A per-consumer LRU of open video decoders its decode threads share, and grouped, tolerance-checked
frame queries."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from episodestream._sample.chw import gather_chw
from episodestream._base.tracing import trace_span
from episodestream._sample.depth import DepthDecoding
from episodestream._sample.video.backends import PyAVReader, VideoReader
from episodestream._sample.video.gop_pairs import GopPairs

# The decoders any layout may keep open per consumer (the cap before they were sized by memory).
MAX_DECODERS = 128
# The most, whatever their memory: each holds a file descriptor and FFmpeg's contexts.
DECODERS_CEILING = 1024
# One consumer's open decoders, estimated (``decoder_limit``): what lets a wide pool over many shared
# files keep every file open. An open decoder holds ~0.6 MB plus ~4 bytes per pixel of its frames
# after decoding (torchcodec, one FFmpeg thread; measured at 64x96, 240x320 and 480x640:
# docs/benchmarks.md, "Decoders by memory, shared by a consumer's threads").
DECODER_BUDGET_BYTES = 512 * 2**20
_DECODER_BASE_BYTES = 600 * 2**10
_DECODER_BYTES_PER_PIXEL = 4
# And its file's index, whatever frames it reads: FFmpeg's and the decoder's entries per sample of the
# whole file (~24 bytes a frame on a 45,503-frame AV1 file, ~24-42 on H.264 files of 50,000 and
# 150,000 frames: docs/benchmarks.md, "Decoders by memory, shared by a consumer's threads").
_DECODER_BYTES_PER_INDEXED_FRAME = 32


def decoder_limit(frame_pixels: Sequence[int], *, frames_per_file: float = 0.0) -> int:
    """How many decoders one consumer may keep open for videos whose frames have ``frame_pixels``
    pixels (one entry per camera) in files of ``frames_per_file`` frames on average (each decoder
    holds its file's index): as many as ``DECODER_BUDGET_BYTES`` holds at their mean size, at least
    ``MAX_DECODERS``, at most ``DECODERS_CEILING`` and half the process's open-file limit."""
    import resource  # the limit is the process's now, not at import

    each = (_DECODER_BASE_BYTES + _DECODER_BYTES_PER_PIXEL * (sum(frame_pixels) / max(1, len(frame_pixels)))
            + _DECODER_BYTES_PER_INDEXED_FRAME * frames_per_file)
    soft_files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = DECODERS_CEILING if soft_files == resource.RLIM_INFINITY else min(DECODERS_CEILING, soft_files // 2)
    return max(min(MAX_DECODERS, ceiling), min(ceiling, int(DECODER_BUDGET_BYTES // each)))


class VideoDecodeError(RuntimeError):
    """A video could not be decoded at the requested times."""


@dataclass(slots=True)
class FrameQuery:
    """Frames wanted from one video file for camera ``key`` of episode ``episode_index``."""

    path: str
    timestamps_s: list[float]
    episode_index: int
    key: str
    depth: DepthDecoding | None = None  # a depth camera's: its 12-bit codes decoded, then dequantised
    # A single frame's GOP-pair mate (the episode's frame 2q+1 for 2q, and 2q for 2q+1), file time;
    # None: no mate (windows, depth, the last frame of an odd episode, an unshuffled stream).
    mate_s: float | None = None
    # Whether the stream emits this frame before its mate (its mate is then decoded with it and kept
    # where that pays, ``GopPairs``) or after (its frame may have been kept).
    first_of_pair: bool = False

    @property
    def who(self) -> str:
        """What asked, for error messages (formatted only when one is raised: a query is made per
        camera of every sample)."""
        return f"episode {self.episode_index} key {self.key!r}"


class DecoderCache:
    """Open decoders by file path, the least recently used closed first; one per consumer, shared by
    its decode threads.

    Never module-level: decoders hold FFmpeg state that must not cross processes. A decoder is lent
    to one thread at a time (``reading``: FFmpeg's state is not thread-safe), and a file that two
    threads read at once gets a second decoder. So a consumer keeps each file of a wide pool open
    once, not once per thread, and its decoders never pass ``capacity`` (its memory budget, lent
    ones included) however many threads decode. Each thread holds it through ``share()``; the last
    to close closes it.
    """

    def __init__(self, open_reader: Callable[[str], VideoReader], *, capacity: int, gop_pairs_bytes: int = 0) -> None:
        if not 1 <= capacity <= DECODERS_CEILING:
            raise ValueError(f"decoder cache capacity must be in 1..{DECODERS_CEILING}, got {capacity!r}.")
        self._open_reader = open_reader
        self.capacity = capacity
        self._lock = threading.Lock()  # the threads sharing it lend and return at once
        # Idle decoders by a token, least recently returned first; the tokens of each file's.
        self._idle: OrderedDict[int, tuple[_Key, VideoReader]] = OrderedDict()
        self._idle_of: dict[_Key, list[int]] = {}
        self._tokens = itertools.count()
        self._lent = 0
        self._shares = 0
        self._closed = False
        self._hits = self._misses = self._evictions = 0
        # The consumer's frames kept for their turn, shared by its threads: a shuffled stream's only
        # (it emits GOP pairs); 0 bytes keeps none (random access by index, an unshuffled stream).
        self.gop_pairs = GopPairs(budget_bytes=gop_pairs_bytes, files_remembered=capacity)

    @contextmanager
    def reading(self, path: str, *, depth: bool = False) -> Iterator[VideoReader]:
        """An open decoder of ``path``, this thread's until the block ends; a depth camera's
        (``depth``) decodes its 12-bit planes with PyAV whatever the backend, as LeRobot does
        (torchcodec hands over RGB frames only). One that raised is closed, not kept."""
        key = (path, depth)
        reader = self._lend(key)
        kept = False
        try:
            yield reader
            kept = True
        finally:
            self._give_back(key, reader, keep=kept)

    def _lend(self, key: _Key) -> VideoReader:
        with self._lock:
            tokens = self._idle_of.get(key)
            if tokens:
                token = tokens.pop()
                if not tokens:
                    del self._idle_of[key]
                self._hits += 1
                self._lent += 1
                return self._idle.pop(token)[1]
            self._misses += 1
            self._lent += 1
        try:  # outside the lock: an open is slow, and other threads' files are open already
            path, depth = key
            return PyAVReader(path, pixel_format="gray12le") if depth else self._open_reader(path)
        except BaseException:
            with self._lock:
                self._lent -= 1
            raise

    def _give_back(self, key: _Key, reader: VideoReader, *, keep: bool) -> None:
        with self._lock:
            self._lent -= 1
            keep = keep and not self._closed
            closing = [] if keep else [reader]
            if keep:
                token = next(self._tokens)
                self._idle[token] = (key, reader)
                self._idle_of.setdefault(key, []).append(token)
            while self._idle and len(self._idle) + self._lent > self.capacity:
                closing.append(self._evict_one())
                self._evictions += 1
        for old in closing:
            old.close()

    def _evict_one(self) -> VideoReader:
        """Take out the idle decoder to close (under the lock): a second one of a file first (made
        for two threads reading it at once: the file stays open), else the least recently used.
        Closing a file's only decoder where the pool cycles through every file at an even pace
        takes the one needed soonest, and its reopen takes the next: each duplicate would start
        that cascade."""
        doubled = next((key for key, tokens in self._idle_of.items() if len(tokens) > 1), None) \
            if len(self._idle) > len(self._idle_of) else None
        if doubled is not None:
            token = self._idle_of[doubled].pop(0)
            return self._idle.pop(token)[1]
        token, (old_key, old) = self._idle.popitem(last=False)
        tokens = self._idle_of[old_key]
        tokens.remove(token)
        if not tokens:
            del self._idle_of[old_key]
        return old

    def forget(self, paths: Sequence[str]) -> None:
        """Close the idle decoders of ``paths``: files no later sample of the pass reads (a remote
        episode's spans once it left the pool, deleted from the node cache). Left open, they would
        be the most recently used, and the least recently used closed in their place would be a
        pooled episode's, reopened soon after."""
        self.gop_pairs.forget(paths)
        closing = []
        with self._lock:
            for path in paths:
                for key in ((path, False), (path, True)):
                    for token in self._idle_of.pop(key, []):
                        closing.append(self._idle.pop(token)[1])
        for reader in closing:
            reader.close()

    def share(self) -> DecoderShare:
        """One decode thread's hold on this cache (its ``DecoderSet``)."""
        with self._lock:
            self._shares += 1
        return DecoderShare(self)

    def _unshare(self) -> None:
        with self._lock:
            self._shares -= 1
            last = self._shares == 0
        if last:
            self.close()

    def caches(self) -> list[DecoderCache]:
        return [self]

    def stats(self) -> dict[str, int]:
        with self._lock:
            counts = {"hits": self._hits, "misses": self._misses, "evictions": self._evictions,
                      "open": len(self._idle) + self._lent, "capacity": self.capacity}
        pairs = self.gop_pairs.stats()
        # Frames served from ``gop_pairs`` skipped the decoders: no hit or miss counted for them.
        return {**counts, "pair_frames_kept": pairs["kept"], "pair_frames_served": pairs["served"]}

    def close(self) -> None:
        """Close the idle decoders (a lent one is closed when its thread returns it: it is no
        longer kept)."""
        with self._lock:
            readers = [reader for _, reader in self._idle.values()]
            self._idle.clear()
            self._idle_of.clear()
            self._closed = True  # whatever is returned after this is closed, not kept
        for reader in readers:
            reader.close()


_Key = tuple[str, bool]  # (path, depth)


class DecoderShare:
    """One decode thread's hold on its consumer's ``DecoderCache``: reads through it, and closing
    lets go (the cache closes with its last share; its counts stay readable)."""

    def __init__(self, cache: DecoderCache) -> None:
        self._cache = cache
        self._closed = False

    def reading(self, path: str, *, depth: bool = False) -> AbstractContextManager[VideoReader]:
        if self._closed:
            raise RuntimeError("This thread's decoders were closed.")
        return self._cache.reading(path, depth=depth)

    def caches(self) -> list[DecoderCache]:
        return [self._cache]

    @property
    def gop_pairs(self) -> GopPairs:
        return self._cache.gop_pairs

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._cache._unshare()


@dataclass
class DecodedFile:
    """All frames decoded from one file for a group of queries, one per time: (N, H, W, C) uint8, or a
    depth camera's (N, H, W, 1) float32 depth; and those kept for their turn (``GopPairs``), apart:
    one tensor of both would copy every decoded frame again, and those copies grew the process's heap
    (docs/benchmarks.md, "GOP pairs")."""

    frames: torch.Tensor
    row_of: dict[float, int]  # query time (s) -> row in ``frames``
    kept: torch.Tensor | None = None  # (K, H, W, C): single frames kept for their turn
    kept_row_of: dict[float, int] = field(default_factory=dict)  # query time (s) -> row in ``kept``

    def source(self, query: FrameQuery) -> tuple[torch.Tensor, dict[float, int]]:
        """The frames a query's frames are rows of, and their rows by time (a query's frames are all
        decoded, or a single kept one)."""
        if self.kept is not None and query.timestamps_s[0] in self.kept_row_of:
            return self.kept, self.kept_row_of
        return self.frames, self.row_of

    def gather(self, query: FrameQuery) -> torch.Tensor:
        """The query's frames as one contiguous uint8 (T, C, H, W) tensor."""
        frames, row_of = self.source(query)
        return gather_chw(frames, [row_of[t] for t in query.timestamps_s])


def decode_files(cache: DecoderCache | DecoderShare, queries: Sequence[FrameQuery], *, fps: float,
                 tolerance_s: float) -> dict[str, DecodedFile]:
    """Decode every query; all timestamps wanted from one file are decoded in one call, and every
    frame is checked to be within ``tolerance_s`` of its query."""
    wanted: dict[str, set[float]] = {}
    depth_of: dict[str, DepthDecoding] = {}
    # Per file, the single frames of GOP pairs: (time, mate's time) of firsts, times of seconds.
    firsts_of: dict[str, dict[float, float]] = {}
    seconds_of: dict[str, set[float]] = {}
    for q in queries:
        wanted.setdefault(q.path, set()).update(q.timestamps_s)
        if q.depth is not None:
            depth_of[q.path] = q.depth
        elif q.mate_s is not None:
            if q.first_of_pair:
                firsts_of.setdefault(q.path, {})[q.timestamps_s[0]] = q.mate_s
            else:
                seconds_of.setdefault(q.path, set()).add(q.timestamps_s[0])
    decoded: dict[str, DecodedFile] = {}
    for path, stamps in wanted.items():
        with cache.gop_pairs.taken(path, sorted(seconds_of.get(path, ()))) as kept:
            decoded[path] = _decode_file(cache, path, stamps, kept, firsts_of.get(path, {}), depth_of.get(path),
                                         queries, fps=fps, tolerance_s=tolerance_s)
    return decoded


def _decode_file(cache: DecoderCache | DecoderShare, path: str, stamps: set[float], kept: dict[float, torch.Tensor],
                 firsts: dict[float, float], depth: DepthDecoding | None, queries: Sequence[FrameQuery], *,
                 fps: float, tolerance_s: float) -> DecodedFile:
    """``decode_files`` for one file: ``kept`` are frames kept for their turn (``GopPairs``, read
    here only), ``firsts`` the first frames of GOP pairs asked for, by time, with their mates' times."""
    pairs = cache.gop_pairs
    half_frame_s = 0.5 / fps
    mates = pairs.mates(path, [(t, m) for t, m in firsts.items() if m not in stamps])
    seconds = sorted(stamps.difference(kept).union(mates))
    try:
        # Asking for the frame played half a frame after the query returns the frame *nearest*
        # to it, so float32 timestamps a hair below a frame's pts do not land on the previous one.
        with trace_span("decode", cat="video", file=path, frames=len(seconds)):
            if seconds:
                with cache.reading(path, depth=depth is not None) as reader:
                    frames, pts_s = reader.frames_played_at([t + half_frame_s for t in seconds])
                if depth is not None:
                    frames = depth.values(frames)
    except Exception as error:
        whos = sorted({q.who for q in queries if q.path == path})
        raise VideoDecodeError(f"Decoding {path} at {len(seconds)} timestamp(s) "
                               f"{_preview(seconds)} for {'; '.join(whos)} failed: {error}") from error
    kept_frames, kept_row_of = None, {}
    if kept:
        times = sorted(kept)
        kept_frames, kept_row_of = torch.stack([kept[t] for t in times]), {t: i for i, t in enumerate(times)}
    if not seconds:  # every frame kept for its turn
        assert kept_frames is not None
        return DecodedFile(kept_frames, kept_row_of)
    off = np.abs(pts_s - np.asarray(seconds)) > tolerance_s
    if off.any():
        bad = [(seconds[i], float(pts_s[i])) for i in np.flatnonzero(off)]
        whos = sorted({q.who for q in queries if q.path == path})
        raise VideoDecodeError(
            f"{path}: decoded frames are more than tolerance_s={tolerance_s} from the query for "
            f"{'; '.join(whos)}: (query s, frame pts s) {_preview(bad)}. The video may be shorter "
            f"than its metadata says, or encoded at another frame rate.")
    row_of = {t: i for i, t in enumerate(seconds)}
    if frames.device.type == "cpu":
        for mate in mates:
            pairs.keep(path, mate, frames[row_of[mate]])  # copied into its slot
    return DecodedFile(frames, row_of, kept_frames, kept_row_of)


def _preview(values: Sequence, limit: int = 6) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return f"[{shown}{', ...' if len(values) > limit else ''}]"
