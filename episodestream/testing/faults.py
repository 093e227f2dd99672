"""The package's test seam: where a dataset opens video readers, row readers, episode videos, decoder
caches and downloads, for tests that inject faults there or watch what passes through, and what a
consumer's schedule plans (``planned_samples``); and, for every dataset of the process at once, its
exact-statistics pass (``refusing_stats_pass``).

Tests and benchmarks call these instead of reaching into a dataset's private parts, so this module
is the one place outside the datasets that knows where those parts live. Each function takes an
``EpisodeStreamingDataset`` or ``EpisodeDataset``; the ``wrap_*`` and ``replace_*`` ones change it
for the rest of its life, for what it opens after the call: every later iteration of a streaming
dataset, and the processes where a map-style dataset has not been indexed yet (it opens its
decoders and videos once per process). DataLoader workers forked after the call inherit the change
(spawned ones too, when the wrapper pickles). They are for tests: a wrapper that breaks things
breaks the dataset.

    from episodestream.testing import faults

    faults.wrap_video_readers(dataset, lambda reader, path: FailingReader(reader))
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from episodestream._runtime.core import DatasetCore
    from episodestream._format.files import DatasetFiles, EpisodeVideos
    from episodestream._format.rows import RowReader
    from episodestream.mapstyle import EpisodeDataset
    from episodestream._remote.transport.reader import FetchFn
    from episodestream.streaming import EpisodeStreamingDataset
    from episodestream._sample.video.decoder_cache import DecoderCache

    Dataset = EpisodeStreamingDataset | EpisodeDataset

__all__ = ["ReaderCounts", "count_row_reads", "count_video_readers", "download_fetch", "open_episode_videos",
           "planned_samples", "refusing_stats_pass", "replace_decoder_cache", "resize_decoder_cache", "source_files", "wrap_episode_videos", "wrap_row_readers",
           "wrap_video_readers"]


def _core(dataset: Dataset) -> DatasetCore:
    core = getattr(dataset, "_core", None)
    if core is None:
        raise TypeError(f"expected an EpisodeStreamingDataset or EpisodeDataset, got {type(dataset).__name__}.")
    return core


def wrap_video_readers(dataset: Dataset, wrap: Callable[[Any, str], Any]) -> None:
    """Every video reader the dataset opens from now on is ``wrap(reader, path)``: ``reader`` the
    one its backend opened for the local file ``path``; the result needs ``frames_played_at`` and
    ``close`` (see ``video.VideoReader``)."""
    core = _core(dataset)
    open_video = core.open_video
    core.open_video = lambda path: wrap(open_video(path), path)


@dataclass
class ReaderCounts:
    """The video readers a dataset opened and closed since ``count_video_readers``, each by a
    serial number of its own (in the order opened), so a test can tell which were closed."""

    opened: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)
    _serials: Any = field(default_factory=itertools.count, repr=False)

    def open_now(self) -> list[int]:
        """The readers opened and not closed yet."""
        return sorted(set(self.opened) - set(self.closed))


class _CountedReader:
    def __init__(self, inner: Any, counts: ReaderCounts) -> None:
        self._inner, self._counts = inner, counts
        self._serial = next(counts._serials)
        counts.opened.append(self._serial)  # list.append is atomic: decode threads open at once

    def frames_played_at(self, seconds):
        return self._inner.frames_played_at(seconds)

    def close(self) -> None:
        self._counts.closed.append(self._serial)
        self._inner.close()


def count_video_readers(dataset: Dataset) -> ReaderCounts:
    """Count the video readers the dataset opens and closes from now on (``wrap_video_readers``)."""
    counts = ReaderCounts()
    wrap_video_readers(dataset, lambda reader, path: _CountedReader(reader, counts))
    return counts


def wrap_row_readers(dataset: Dataset, wrap: Callable[[RowReader], Any]) -> None:
    """Every reader of episodes' rows the dataset opens from now on is ``wrap(reader)``; the result
    needs ``read(episode)`` (and ``read_many(episodes)``, which a pool uses where it has it) and
    whatever else it does not override (``__getattr__`` to the reader is enough)."""
    core = _core(dataset)
    row_reader = core.row_reader
    core.row_reader = lambda: wrap(row_reader())  # type: ignore[method-assign]


class _CountedRows:
    def __init__(self, inner: RowReader, reads: list[list[int]]) -> None:
        self._inner, self._reads = inner, reads

    def read(self, episode):
        self._reads.append([episode.episode_index])
        return self._inner.read(episode)

    def read_many(self, episodes):
        self._reads.append([episode.episode_index for episode in episodes])
        return self._inner.read_many(episodes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def count_row_reads(dataset: Dataset) -> list[list[int]]:
    """Record the rows the dataset reads from now on (``wrap_row_readers``): each read appends the
    episode indices it read, one for an episode read alone, several for a data file's episodes read
    together. The list returned is the record."""
    reads: list[list[int]] = []
    wrap_row_readers(dataset, lambda reader: _CountedRows(reader, reads))
    return reads


def planned_samples(dataset: EpisodeStreamingDataset, *, epoch: int, worker: int = 0,
                    num_workers: int = 1) -> list[tuple[int, int]]:
    """The ``(episode_index, frame_index)`` of each sample one consumer of the dataset's rank streams in
    ``epoch``, in order, from its schedule alone (no rows read, nothing decoded): DataLoader worker
    ``worker`` of ``num_workers`` (0 of 1: iterating in the main process)."""
    from episodestream._base.world import World
    from episodestream._plan.sampling import EMIT
    from episodestream._runtime.face import runtime_of

    runtime = runtime_of(dataset, needs="planned_samples needs")
    steps = runtime.schedule(World(runtime.rank, runtime.world_size, worker, num_workers), epoch)  # type: ignore[attr-defined]
    return [(episode, frame) for kind, episode, frame in steps if kind == EMIT]


def wrap_episode_videos(dataset: Dataset, wrap: Callable[[EpisodeVideos], Any]) -> None:
    """Every consumer's ``EpisodeVideos`` (where its admitted episodes' video bytes are) is from
    now on ``wrap(videos)``; the result needs what ``EpisodeVideos`` has (``admit``, ``path``,
    ``evict``, ``close``, ``prefetches``)."""
    core = _core(dataset)
    episode_videos = core.episode_videos
    core.episode_videos = lambda turn=None: wrap(episode_videos(turn=turn))  # type: ignore[method-assign]


def replace_decoder_cache(dataset: Dataset, make: Callable[[int], DecoderCache]) -> None:
    """Each consumer (or decode thread) gets its decoders from ``make(working_set)`` from now on,
    ``working_set`` being the episodes whose files it keeps open (see ``DatasetCore.decoder_cache``);
    ``make`` may raise, as a thread that cannot start its decoders would (how many threads share
    the consumer's decoder budget is not passed on)."""
    def decoder_cache(working_set: int, *, threads: int = 1, gop_pairs: bool = False) -> DecoderCache:
        return make(working_set)

    _core(dataset).decoder_cache = decoder_cache  # type: ignore[method-assign]


def resize_decoder_cache(dataset: Dataset, capacity: int) -> None:
    """Each consumer's decoder cache holds at most ``capacity`` decoders from now on, whatever its
    pool and thread count (readers still opened as the dataset opens them)."""
    from episodestream._sample.video.decoder_cache import DecoderCache

    core = _core(dataset)
    replace_decoder_cache(dataset, lambda working_set: DecoderCache(core.open_video, capacity=capacity))


def open_episode_videos(dataset: Dataset) -> EpisodeVideos:
    """A new ``EpisodeVideos``, as a consumer opens one (close it when done)."""
    return _core(dataset).episode_videos()


def source_files(dataset: Dataset) -> DatasetFiles:
    """The dataset's ``DatasetFiles``: ``LocalFiles`` for a folder read in place, ``RemoteFiles``
    (its ``cache``, ``download``, budget estimates, pickling) for a remote source."""
    return _core(dataset).files


def download_fetch(dataset: Dataset) -> FetchFn:
    """The ``fetch`` every remote read of the dataset goes through: by default a
    ``testing.downloads.DownloadFetch``, whose ``stats()`` counts attempts, throttles and retries and whose
    ``controllers()`` are the node-wide budgets. TypeError for a local folder (nothing is fetched)."""
    from episodestream._remote.source.files import RemoteFiles  # already loaded when the source is remote

    files = _core(dataset).files
    if not isinstance(files, RemoteFiles):
        raise TypeError(f"{files.description} is read in place: it has no downloads.")
    return files.download


@contextlib.contextmanager
def refusing_stats_pass(refuse: Callable[..., Any]) -> Iterator[None]:
    """Within it, wherever a dataset (or a mixture's component) would compute its exact statistics
    from its rows, it calls ``refuse`` instead, with what the pass was given, which raises: for tests
    that check statistics come from the stats cache. Process-wide (no dataset is named: the pass is
    one function for all), and undone on leaving."""
    from episodestream._format import stats_pass

    compute = stats_pass.compute_exact_stats
    stats_pass.compute_exact_stats = refuse
    try:
        yield
    finally:
        stats_pass.compute_exact_stats = compute
