"""What both datasets share: the source, its metadata, the episode selection and the sample builder.

The options that choose these (``SourceOptions``) are declared in ``_runtime.source_options``; this module's
``DatasetCore`` signature holds their defaults.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from episodestream._format.episodes import EpisodeSelection
from episodestream._format.files import EpisodeVideos, SourceStats
from episodestream._sample.builder import SampleBuilder, delta_indices
from episodestream._format.lerobot_meta import LeRobotMeta
from episodestream._format.metadata import DatasetMeta
from episodestream._format.versions import load_metadata
from episodestream._base.options import check_bool, check_positive_float
from episodestream._format.rows import RowReader
from episodestream._plan.sampling import Segment
from episodestream._runtime.sources import open_source
from episodestream._sample.video.decoder_cache import MAX_DECODERS, DecoderCache
from episodestream._sample.video.backends import resolve_backend

if TYPE_CHECKING:
    from episodestream._remote.transport.config import ControllerConfig


def select_episodes(meta: DatasetMeta, episodes: Sequence[int] | None) -> EpisodeSelection:
    """The selected episodes in ascending order; every requested index must exist, once."""
    table = meta.episodes
    if episodes is None:
        return EpisodeSelection(table, np.arange(len(table)))
    if isinstance(episodes, np.ndarray):
        episodes = episodes.tolist()  # numpy ints become ints; a bool or float array is refused below
    if isinstance(episodes, (str, bytes)) or not isinstance(episodes, Sequence):
        raise TypeError(f"episodes must be a list of episode indices, got {episodes!r}.")
    # bool is an int to Python (True would select episode 1), and 1.0 == 1 finds episode 1 too.
    not_ints = [e for e in episodes if isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, np.integer))]
    if not_ints:
        raise TypeError(f"episodes must be a list of int episode indices, got {not_ints[0]!r} "
                        f"({type(not_ints[0]).__name__}) in {episodes!r}.")
    episodes = [int(e) for e in episodes]
    unknown = [e for e in episodes if e not in table]
    if unknown:
        raise ValueError(f"episodes {unknown} are not in {meta.description} (episode indices "
                         f"{table.episode_index[0]}..{table.episode_index[-1]}, {len(table)} episodes).")
    if len(set(episodes)) != len(episodes):
        raise ValueError(f"episodes lists some indices more than once: {sorted(episodes)}.")
    if not episodes:
        raise ValueError("episodes is empty; pass None to use every episode.")
    return EpisodeSelection(table, np.array([table.position(e) for e in sorted(episodes)], np.int64))


class DatasetCore:
    """Opens and validates once, in the constructing process; per-process readers are made on demand.

    Its keywords from ``revision`` to ``download_config`` are the ``SourceOptions`` (mypy checks the
    TypedDict against this signature), and this signature holds their defaults.
    """

    def __init__(self, source: str | os.PathLike, *, revision: str | None = None,
                 episodes: Sequence[int] | None = None,
                 delta_timestamps: Mapping[str, Sequence[float]] | None = None, tolerance_s: float = 1e-4,
                 return_uint8: bool = False, image_transforms: Callable | None = None,
                 video_backend: str | None = None, decode_device: str = "cpu",
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | str | None = None,
                 storage_options: Mapping[str, Any] | None = None, token: str | None = None,
                 hub_endpoint: str | None = None,
                 download_config: ControllerConfig | Mapping[str, Any] | None = None,
                 episodes_in_flight: int = 1, local_cache_dir: bool = False) -> None:
        self.source = source
        self.revision = revision
        self.tolerance_s = check_positive_float("tolerance_s", tolerance_s)
        if image_transforms is not None and not callable(image_transforms):
            raise TypeError(f"image_transforms must be callable, got {image_transforms!r}.")
        self.files = open_source(source, revision=revision, local_cache_dir=local_cache_dir, cache_dir=cache_dir,
                                 cache_limit=cache_limit, storage_options=storage_options, token=token,
                                 hub_endpoint=hub_endpoint, download_config=download_config)
        self.meta = load_metadata(self.files)
        # A remote cache must hold what one consumer keeps in flight; refuse a smaller budget now
        # rather than stall mid-epoch.
        self.files.check_cache_budget(self.meta, episodes_in_flight=episodes_in_flight)
        self.lerobot_meta = LeRobotMeta(typed=self.meta, files=self.files, source=source, revision=revision)
        self.episodes = select_episodes(self.meta, episodes)
        # As given (validated above), for LeRobot's ``dataset.episodes``: None selects every episode.
        self.requested_episodes = None if episodes is None else [int(e) for e in episodes]
        # Validated before it is copied: copying a list or None-per-key would fail with a bare error.
        self.offsets = delta_indices(self.meta, delta_timestamps, self.tolerance_s)
        self.delta_timestamps = {k: list(v) for k, v in (delta_timestamps or {}).items()}
        self.open_video = resolve_backend(video_backend, decode_device, has_video=bool(self.meta.video_keys))
        self._whole_episodes: list[Segment] | None = None
        self.builder = SampleBuilder(self.meta, offsets=self.offsets,
                                     tolerance_s=self.tolerance_s, return_uint8=check_bool("return_uint8", return_uint8),
                                     image_transforms=image_transforms)

    def whole_episodes(self) -> list[Segment]:
        """One whole-episode ``Segment`` per selected episode, in selection order; made once, as
        building 92,000 of them costs ~0.2 s (mostly the garbage collector noticing them)."""
        if self._whole_episodes is None:
            selection = self.episodes
            self._whole_episodes = [Segment(e, range(n)) for e, n in
                                    zip(selection.episode_indices.tolist(), selection.lengths.tolist())]
        return self._whole_episodes

    def __getstate__(self) -> dict:
        # DataLoader workers rebuild the list if they need it, rather than unpickle 92,000 objects.
        return {**self.__dict__, "_whole_episodes": None}

    @property
    def num_frames(self) -> int:
        return int(self.episodes.lengths.sum())

    def row_reader(self) -> RowReader:
        return RowReader(self.files, self.meta, tolerance_s=self.tolerance_s)

    def episode_videos(self) -> EpisodeVideos:
        return self.files.episode_videos()

    def decoder_cache(self, working_set: int) -> DecoderCache:
        """A decoder cache holding ``working_set`` episodes' files of every camera (at most 128)."""
        capacity = max(1, min(MAX_DECODERS, working_set * max(1, len(self.meta.video_keys))))
        return DecoderCache(self.open_video, capacity=capacity)


class DatasetFacts:
    """What both datasets tell about their source and episode selection, read from their
    ``DatasetCore`` (``_runtime.core``); written once here, inherited by each."""

    _core: DatasetCore

    @property
    def meta(self) -> LeRobotMeta:
        """``LeRobotMeta``: the metadata as LeRobot's ``LeRobotDatasetMetadata`` gives it (plain
        feature dicts, numpy ``stats``, ...), for ``make_policy(cfg, ds_meta=dataset.meta)`` and the like."""
        return self._core.lerobot_meta

    @property
    def typed_meta(self) -> DatasetMeta:
        """``DatasetMeta``: this library's typed view (``Feature`` objects, ``EpisodeInfo`` by index)."""
        return self._core.meta

    @property
    def num_frames(self) -> int:
        """Frames of the selected episodes (all ranks together), as LeRobot's ``num_frames``."""
        return self._core.num_frames

    @property
    def num_episodes(self) -> int:
        """Selected episodes, as LeRobot's ``num_episodes``."""
        return len(self._core.episodes)

    @property
    def episodes(self) -> list[int] | None:
        """The ``episodes`` argument as given (None: every episode), as LeRobot's ``dataset.episodes``."""
        return self._core.requested_episodes

    @property
    def episode_indices(self) -> list[int]:
        """The selected episodes' indices, ascending (``typed_meta.episodes[i]`` describes each)."""
        return self._core.episodes.episode_indices.tolist()

    @property
    def resolved_source(self) -> str:
        """Where the dataset is read from, as resolved at construction: a local folder's absolute
        path, or the remote URL with a Hub revision pinned to its commit (credentials left out)."""
        return self._core.files.description

    @property
    def node_cache_dir(self) -> Path | None:
        """The node cache folder a remote source's bytes are fetched into (what ``episodestream
        cache ls --cache-dir`` takes); None for a local folder, read in place."""
        return self._core.files.node_cache_dir

    def source_stats(self) -> SourceStats:
        """What this process's reads of the source have cost so far (requests, bytes, node-cache
        hits and misses; all zeros for a local folder). Each DataLoader worker counts its own:
        call it in the worker (e.g. at the end of its iteration) for what the worker fetched."""
        return self._core.files.stats()
