"""What both datasets share: the source, its metadata, the episode selection and the sample builder.

The options that choose these (``SourceOptions``) are declared in ``_runtime.source_options``; this module's
``DatasetCore`` signature holds their defaults.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from episodestream._format.episodes import EpisodeSelection, EpisodeTable
from episodestream._format.files import EpisodeVideos, SourceStats
from episodestream._format.depth import check_depth_unit
from episodestream._sample.builder import SampleBuilder, delta_indices
from episodestream._sample.window_checks import window_warnings
from episodestream._format.lerobot_meta import LeRobotMeta
from episodestream._format.metadata import DatasetMeta
from episodestream._format.versions import load_metadata
from episodestream._base.fork_safety import freeze_inherited_objects_in_forked_children
from episodestream._base.options import check_bool, check_positive_float
from episodestream._base.turns import Turn
from episodestream._base.warn import warn_user
from episodestream._format.rows import RowReader
from episodestream._format.episode_filters import (
    episodes_table,
    is_predicate,
    load_keep_frames,
    select_by_predicate,
    weight_column,
)
from episodestream._plan.curation import Anchors, anchor_counts, check_epoch_size, check_keep_frames, check_weights
from episodestream._runtime.needed_spans import NeededEpisodes
from episodestream._runtime.pool_size import video_decoder_limit
from episodestream._runtime.dataset_stats import exact_stats
from episodestream._runtime.source_options import SourceOptions, takes_source_options
from episodestream._runtime.sources import open_source
from episodestream._sample.video.decoder_cache import DecoderCache
from episodestream._sample.video.gop_pairs import KEPT_FRAMES_MAX_BYTES
from episodestream._sample.video.backends import resolve_backend

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11



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

    It takes the ``SourceOptions`` (``takes_source_options``: their declared defaults filled) and
    what only the faces decide: curation weights, episodes kept in flight, the local cache folder.
    """

    @takes_source_options
    def __init__(self, source: str | os.PathLike, *, episode_weights: Mapping[int, float] | str | None = None,
                 episodes_in_flight: int | None = 1, local_cache_dir: bool = False,
                 **options: Unpack[SourceOptions]) -> None:
        episodes, keep_frames = options["episodes"], options["keep_frames"]
        delta_timestamps, image_transforms = options["delta_timestamps"], options["image_transforms"]
        # DataLoader workers fork this process: they must not free its garbage (``_base.fork_safety``).
        freeze_inherited_objects_in_forked_children()
        self.source = source
        self.revision = revision = options["revision"]
        self.cache_dir = options["cache_dir"]  # also where exact stats are cached (``compute_stats``)
        self.tolerance_s = check_positive_float("tolerance_s", options["tolerance_s"])
        # checked once, before the source is opened
        depth_output_unit = check_depth_unit(options["depth_output_unit"])
        if image_transforms is not None and not callable(image_transforms):
            raise TypeError(f"image_transforms must be callable, got {image_transforms!r}.")
        # The options go on as one value: open_source takes the revision and the remote options from it.
        self.files = open_source(source, local_cache_dir=local_cache_dir, **options)
        self.meta = load_metadata(self.files)
        # A remote cache must hold what one consumer keeps in flight; refuse a smaller budget now
        # rather than stall mid-epoch (None: the caller checks, once it has chosen its pool).
        if episodes_in_flight is not None:
            self.files.check_cache_budget(self.meta, episodes_in_flight=episodes_in_flight)
        self.lerobot_meta = LeRobotMeta(typed=self.meta, files=self.files, source=source, revision=revision,
                                        depth_output_unit=depth_output_unit)
        if is_predicate(episodes):
            episodes = select_by_predicate(self._episodes_table(), episodes, self.meta.description,  # type: ignore[arg-type]
                                           f"{self.meta.description}/{self.meta.episodes_where}")
        selection = select_episodes(self.meta, episodes)  # type: ignore[arg-type]
        self.episodes, self.anchors, self.curation = self._curate(selection, keep_frames, episode_weights)
        # For LeRobot's ``dataset.episodes``: None selects every episode; else the episodes used,
        # in the order given (LeRobot's split follows it), less those curation left out.
        if episodes is None and self.curation is None:
            self.requested_episodes: list[int] | None = None
        else:
            used = set(self.episodes.episode_indices.tolist())
            given = self.episodes.episode_indices.tolist() if episodes is None else [int(e) for e in episodes]  # type: ignore[union-attr]
            self.requested_episodes = [e for e in given if e in used]
        # Validated before it is copied: copying a list or None-per-key would fail with a bare error.
        self.offsets = delta_indices(self.meta, delta_timestamps, self.tolerance_s)
        self.delta_timestamps = {k: list(v) for k, v in (delta_timestamps or {}).items()}
        for message in window_warnings(self.delta_timestamps, self.offsets, fps=self.meta.fps,
                                       longest_episode=int(self.episodes.lengths.max())):
            warn_user(message, RuntimeWarning)
        self.open_video = resolve_backend(options["video_backend"], options["decode_device"],
                                          has_video=bool(self.meta.video_keys))
        self.builder = SampleBuilder(self.meta, offsets=self.offsets,
                                     tolerance_s=self.tolerance_s,
                                     return_uint8=check_bool("return_uint8", options["return_uint8"]),
                                     image_transforms=image_transforms,
                                     depth_output_unit=depth_output_unit)

    def _episodes_table(self):
        if self.__dict__.get("_table") is None:
            self._table = episodes_table(self.meta)
        return self._table

    def _curate(self, selection: EpisodeSelection, keep_frames: Any,
                weights: Any) -> tuple[EpisodeSelection, Anchors, dict[str, str] | None]:
        """The selection left once ``keep_frames`` and ``episode_weights`` are applied (episodes
        without an anchor dropped: never admitted, never fetched), its anchors, and what the
        state's fingerprint records of them (None: not curated)."""
        table = self.meta.episodes
        indices, lengths = selection.episode_indices, selection.lengths
        if keep_frames is None and weights is None:
            return selection, Anchors(indices, lengths, None, lengths.astype(np.int64)), None
        curation: dict[str, str] = {}
        ranges = None
        kept_count = lengths
        if keep_frames is not None:
            mapping, where = load_keep_frames(keep_frames)
            ranges = check_keep_frames(mapping, episode_index=table.episode_index, lengths=table.length, where=where)
            kept_count = ranges.kept_counts(indices)
            curation["keep_frames"] = ranges.digest()
        weight_of = None
        if weights is not None:
            if isinstance(weights, str):
                weights = weight_column(self._episodes_table(), weights, table.episode_index,
                                        f"{self.meta.description}/{self.meta.episodes_where}")
            weight_of = check_weights(weights, episode_index=table.episode_index)[selection.rows]
            check_epoch_size(kept_count, weight_of, episode_index=indices)
        counts = anchor_counts(kept_count, weight_of)
        if not counts.any():
            raise ValueError(f"keep_frames / episode_weights leave no frame of the {len(selection)} selected "
                             f"episode(s) of {self.meta.description}.")
        used = np.flatnonzero(counts)
        selection = EpisodeSelection(table, selection.rows[used])
        anchors = Anchors(selection.episode_indices, selection.lengths, ranges, counts[used])
        curation["anchors"] = anchors.digest()
        return selection, anchors, curation

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_table": None}

    @property
    def num_frames(self) -> int:
        return int(self.episodes.lengths.sum())

    @property
    def fetched_episodes(self) -> EpisodeTable | NeededEpisodes:
        """What consumers hold episodes as (``EpisodeInfo`` by index): with ``keep_frames``, each
        video span narrowed to the part its kept frames and windows read (``needed_spans``)."""
        if self.curation is None or "keep_frames" not in self.curation:
            return self.meta.episodes
        if self.__dict__.get("_needed") is None:
            self._needed = NeededEpisodes(self.meta.episodes, self.anchors, self.offsets, self.meta.fps)
        return self._needed

    @property
    def num_anchors(self) -> int:
        """Anchors per epoch: the kept frames, times their episodes' weights."""
        return self.anchors.total

    def row_reader(self) -> RowReader:
        return RowReader(self.files, self.meta, tolerance_s=self.tolerance_s)

    def episode_videos(self, turn: Turn | None = None) -> EpisodeVideos:
        return self.files.episode_videos(turn=turn)

    def decoder_cache(self, working_set: int, *, threads: int = 1, gop_pairs: bool = False) -> DecoderCache:
        """A consumer's decoder cache, shared by its ``threads`` decode threads, for ``working_set``
        episodes' files of every camera: within the consumer's ``decoder_limit``
        (``_sample.video.decoder_cache``) however many threads decode, and no wider than those files
        open in every thread at once (the most it may need: each thread reading each at once).
        ``gop_pairs``: a shuffled stream's, which keeps a GOP pair's second frame for its turn
        (``_sample.video.gop_pairs``)."""
        cameras = max(1, len(self.meta.video_keys))
        capacity = max(1, min(video_decoder_limit(self.meta), working_set * cameras * max(1, threads)))
        return DecoderCache(self.open_video, capacity=capacity,
                            gop_pairs_bytes=KEPT_FRAMES_MAX_BYTES if gop_pairs else 0)


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

    def compute_stats(self, *, cache: bool = True, progress: bool = False) -> dict[str, dict[str, np.ndarray]]:
        """Exact statistics of the selected episodes, in LeRobot's ``stats.json`` layout.

        For every tabular feature (numbers and bools): ``mean``, ``std``, ``min``, ``max``, ``q01``,
        ``q10``, ``q50``, ``q90``, ``q99`` (float64 arrays of the feature's shape) and ``count``
        (int64, shape (1,): the selected frames), computed from the parquet rows in one pass, the
        quantiles exact (``_format.exact_stats`` defines them). Camera features keep the values of
        the dataset's ``meta/stats.json`` (whole dataset, sampled by LeRobot), where it has them.
        ``meta.stats`` stays LeRobot's ``stats.json`` as it is (see docs/mixtures.md, "Stats").
        A curated dataset's are the statistics of what an epoch samples: frames outside
        ``keep_frames`` left out, each kept frame weighing its episode's anchors per epoch over its
        kept frames (``episode_weights``: ``w`` for an integer weight, the anchors' exact share for a
        fractional one); ``count`` is the kept frames.

        Args:
            cache (bool): keep the result under ``cache_dir/stats`` (default
                ``EPISODESTREAM_CACHE_DIR``, else the user's cache folder), keyed by the source,
                revision, selection and each data file's version; a second call, in this run or a
                later one, reads it back. Defaults to ``True``.
            progress (bool): show a tqdm progress bar of the rows read. Defaults to ``False``.

        Returns:
            dict[str, dict[str, np.ndarray]]: ``{feature: {statistic: array}}``, as above.

        Raises:
            TypeError: ``cache`` or ``progress`` is not a bool.
        """
        return exact_stats(self._core, cache=check_bool("cache", cache), progress=check_bool("progress", progress))

    def source_stats(self) -> SourceStats:
        """What this process's reads of the source have cost so far. Each DataLoader worker counts
        its own: call it in the worker (e.g. at the end of its iteration) for what the worker fetched.

        Returns:
            SourceStats: requests, bytes, node-cache hits and misses (all zeros for a local folder).
        """
        return self._core.files.stats()
