"""``EpisodeDataset``: the same samples as the streaming dataset, by index."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch.utils.data

from episodestream._format.columns import ColumnStore, default_columns_dir
from episodestream._runtime.core import DatasetCore, DatasetFacts
from episodestream._format.files import EpisodeVideos, LocalFiles
from episodestream._base.options import check_bool
from episodestream._runtime.source_options import SourceOptions, takes_source_options
from episodestream._sample.builder import build_samples
from episodestream._sample.holds import HeldEpisodes
from episodestream._format.rows import EpisodeRows
from episodestream._sample.video.decoder_cache import DecoderCache

_ROWS_CACHED = 4  # episodes' rows kept for neighbouring indices (a sampler often walks an episode)

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11



class EpisodeDataset(DatasetFacts, torch.utils.data.Dataset):
    """Map-style access: ``ds[i]`` is the i-th selected frame (the global ``index`` when episodes=None);
    with ``keep_frames``, the i-th kept frame (its windows still read the frames around it).

    Readers and decoders are opened lazily in each process that indexes the dataset (DataLoader
    workers included). The arguments, by purpose (each in ``Args`` below):

    - what to read: ``source`` and the source options ``revision``, ``episodes``, ``keep_frames``,
      ``delta_timestamps``, ``tolerance_s``;
    - what a sample looks like: the source options ``return_uint8``, ``image_transforms``,
      ``depth_output_unit``, ``video_backend``, ``decode_device``;
    - remote sources: the source options ``cache_dir``, ``cache_limit``, ``storage_options``,
      ``token``, ``hub_endpoint``, ``download_config``;
    - caching: ``column_cache``.

    Args:
        source (str | os.PathLike): as for ``EpisodeStreamingDataset``: a local folder, a URL or a
            Hub repo id.
        **options: the source options, shared with ``EpisodeStreamingDataset`` and each documented,
            with its default, in ``episodestream.SourceOptions`` (the groups above name them). Any
            other keyword (the streaming dataset's ``episode_pool_size``, say) raises TypeError.
        column_cache (bool): for local sources, read rows from an Arrow copy of each data file's
            tabular columns, built the first time one of its episodes is needed and kept under
            ``cache_dir/columns`` (default ``EPISODESTREAM_CACHE_DIR``, else the user's cache
            folder): random access is then much faster at DROID scale (benchmarks/LOG.md), and the
            bytes are shared by all processes of the node through the page cache (see
            ``_format.columns``). False, and remote sources (for now), read each episode's parquet
            row group instead. Defaults to ``True``.

    Raises:
        TypeError: an argument of the wrong type, or a keyword neither dataset takes.
        ValueError: an argument out of range (an episode not in the dataset, a ``cache_limit`` too
            small).
        FileNotFoundError: a ``file://`` source that does not exist.
        NotADirectoryError: a local source that is a file, not the dataset's folder.
        DatasetFormatError: the dataset's files do not follow the LeRobot format.
        CacheFullError: pinned (prewarmed) entries leave the node cache too little room.
    """

    @takes_source_options
    def __init__(self, source: str | os.PathLike, *, column_cache: bool = True,
                 **options: Unpack[SourceOptions]) -> None:
        column_cache = check_bool("column_cache", column_cache)
        self._core = DatasetCore(source, **options, episodes_in_flight=_ROWS_CACHED + 1, local_cache_dir=column_cache)
        anchors = self._core.anchors
        self._kept = anchors if self._core.curation else None  # each episode's kept frames, by position
        counts = anchors.kept_count()
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._episode_indices = self._core.episodes.episode_indices  # by selection position
        # Local sources only, for now: for a remote source the copy would sit beside the node cache
        # without its budget, refcounts or `cache clear` (see benchmarks/LOG.md, issue 13).
        use_columns = column_cache and isinstance(self._core.files, LocalFiles)
        self._columns_dir = default_columns_dir(options.get("cache_dir")) if use_columns else None
        self._process: _PerProcess | None = None

    def __len__(self) -> int:
        """The number of items.

        Returns:
            int: the selected frames (with ``keep_frames``, the kept frames).
        """
        return int(self._starts[-1])

    @property
    def absolute_to_relative_idx(self) -> dict[int, int] | None:
        """``{global index: item position}`` for a selection of episodes (None for all of them, where
        the two agree), as LeRobot's, which its ``EpisodeAwareSampler`` uses to turn the episodes
        table's global indices into ``ds[i]`` positions."""
        if self._core.requested_episodes is None:
            return None
        starts = self._core.episodes.from_indices.tolist()
        positions = self._starts.tolist()
        if self._kept is not None:
            kept = (self._kept.kept(i) for i in range(len(starts)))
            return {start + int(f): position + k for start, frames, position in zip(starts, kept, positions)
                    for k, f in enumerate(frames)}
        lengths = self._core.episodes.lengths.tolist()
        return {start + k: position + k for start, n, position in zip(starts, lengths, positions) for k in range(n)}

    def locate(self, i: int) -> tuple[int, int]:
        """Where item ``i`` is.

        Args:
            i (int): the item, ``-len(self) <= i < len(self)``.

        Returns:
            tuple[int, int]: its episode index and its frame's offset in the episode.

        Raises:
            TypeError: ``i`` is not an int.
            IndexError: ``i`` is out of range.
        """
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"index must be an int, got {i!r}.")
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} is out of range for {len(self)} frames.")
        i = int(i) % len(self)
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        offset = i - int(self._starts[k])
        return int(self._episode_indices[k]), offset if self._kept is None else int(self._kept.kept(k)[offset])

    def _per_process(self) -> _PerProcess:
        # Decoders and parquet handles must not cross a fork: rebuild them in each new process.
        if self._process is None or self._process.pid != os.getpid():
            reader = (self._core.row_reader() if self._columns_dir is None
                      else ColumnStore(self._core.files, self._core.meta, self._columns_dir,
                                       tolerance_s=self._core.tolerance_s))
            videos = self._core.episode_videos()
            self._process = _PerProcess(os.getpid(), self._core.decoder_cache(_ROWS_CACHED), videos,
                                        HeldEpisodes(reader, videos))
        return self._process

    def close(self) -> None:
        """Close this process's decoders and release cached video and metadata (remote sources)."""
        if self._process is not None and self._process.pid == os.getpid():
            self._process.decoders.close()
            self._process.videos.close()
        self._process = None
        self._core.files.close()

    def _rows(self, process: _PerProcess, episode_index: int) -> EpisodeRows:
        """The episode's rows, from the last few episodes held (an LRU of ``_ROWS_CACHED``)."""
        held = process.held
        if episode_index in held:
            return held.touch(episode_index)
        held.hold(self._core.fetched_episodes[episode_index])
        rows = held.rows(episode_index)
        if len(held) > _ROWS_CACHED and (oldest := held.release(held.oldest())) is not None:
            process.videos.evict(oldest)
        return rows

    def __getitem__(self, i: int) -> dict[str, Any]:
        """The sample of item ``i``: the same sample ``EpisodeStreamingDataset`` streams for its frame.

        Args:
            i (int): the item, ``-len(self) <= i < len(self)``.

        Returns:
            dict[str, Any]: the sample, as LeRobot's ``dataset[i]`` gives it.

        Raises:
            TypeError: ``i`` is not an int.
            IndexError: ``i`` is out of range.
            VideoDecodeError: a frame could not be decoded (the error names the file, episode, key and time).
        """
        episode_index, frame = self.locate(i)
        process = self._per_process()
        pending = self._core.builder.plan(self._rows(process, episode_index), frame, process.videos)
        return build_samples(self._core.builder, process.decoders, [pending])[0]


@dataclass
class _PerProcess:
    """What one process of a map-style dataset opens for itself."""

    pid: int
    decoders: DecoderCache
    videos: EpisodeVideos
    held: HeldEpisodes  # the last ``_ROWS_CACHED`` episodes' rows, their video admitted
