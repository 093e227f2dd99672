"""``dataset.meta``: the dataset's metadata in the shape LeRobot's own code reads it.

LeRobot's training code hands ``LeRobotDatasetMetadata`` to ``make_policy(cfg, ds_meta=...)`` (which
reads ``features`` as plain dicts and ``stats``), passes ``meta.stats`` to
``make_pre_post_processors`` (which turns every array into a tensor), builds ``delta_timestamps``
from ``features`` and ``fps``, and gives its samplers the per-episode columns
``meta.episodes["dataset_from_index"]`` / ``["dataset_to_index"]``; ``lerobot_train`` asks
``meta.has_language_columns`` to pick its collate function, and ``make_train_eval_datasets`` (with an
``eval_split``) reads ``meta.episodes["tasks"]``. ``LeRobotMeta`` answers those with the same types:
features as info.json's dicts with tuple shapes, stats as numpy arrays, and ``episodes`` as the
Hugging Face ``datasets.Dataset`` LeRobot keeps there (``ds["column"]`` a list-like ``Column``,
``ds[i]`` a row dict, ``ds.filter(...)``, ``ds.select_columns(...)``).

It is built once, in the process that builds the dataset, from what ``_format.metadata`` already read plus
``meta/stats.json`` and the episodes parquet files (read again without their ``stats/`` columns,
as LeRobot does; a remote source serves them from its cache). It holds plain data and a pyarrow
table, so it pickles into DataLoader workers without touching the source again. The
``datasets.Dataset`` is made from that table on the first read of ``meta.episodes`` and is not
pickled: importing ``datasets`` costs ~1.5 s, which a worker that never reads ``meta.episodes``
(and a trainer that never hands the meta to LeRobot) should not pay. It is held in memory rather
than memory-mapped from an Arrow cache file as LeRobot's ``Dataset.from_parquet`` does: the
episodes table is small (one row per episode, without the ``stats/`` columns), and a cache file
would be written into the user's Hugging Face cache by merely opening a dataset.

The library's own typed view stays ``DatasetMeta`` (``dataset.typed_meta``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from episodestream._base.redact import shown_source
from episodestream._format.files import DatasetFiles, LocalFiles
from episodestream._format.language import DEFAULT_TOOLS, LANGUAGE_COLUMNS
from episodestream._format.metadata import DatasetMeta
from episodestream._format.depth import DEFAULT_DEPTH_UNIT, DepthUnit, is_depth, rescaled_stats
from episodestream._format.versions import load_dataset_stats, load_lerobot_episodes


class InfoDict(dict):
    """``meta/info.json`` as a dict whose keys also read as attributes.

    LeRobot 0.4/0.5 keep ``info`` as the JSON dict (``info["fps"]``); later releases wrap it in a
    ``DatasetInfo`` dataclass read by attribute (``info.fps``). Both spellings work here.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # pickle and copy probe dunders; they must not look like keys
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"info.json has no field {name!r} (fields: {sorted(self)})") from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, shapes back to lists (as ``DatasetInfo.to_dict``)."""
        data = copy.deepcopy(dict(self))
        for spec in data.get("features", {}).values():
            if isinstance(spec.get("shape"), tuple):
                spec["shape"] = list(spec["shape"])
        return data


def _repo_id(source: str | os.PathLike) -> str:
    """A Hub repo id as given; ``hf://datasets/owner/name[@rev][/sub]`` -> ``owner/name``;
    anything else (a folder, another URL) as given, less a URL's ``user:password@`` and query: the
    id is shown in reprs, logs and errors, where a password must never appear."""
    text = shown_source(source)
    prefix = "hf://datasets/"
    if text.startswith(prefix):
        parts = text[len(prefix):].split("/")
        if len(parts) >= 2:
            return f"{parts[0]}/{parts[1].split('@')[0]}"
    return text


def _lerobot_features(info: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    # LeRobot's load_info (and DatasetInfo) turn JSON shape lists into tuples; everything else as in the file.
    features = copy.deepcopy(dict(info["features"]))
    for spec in features.values():
        if isinstance(spec.get("shape"), list):
            spec["shape"] = tuple(spec["shape"])
    return features


class LeRobotMeta:
    """What LeRobot's code asks of ``LeRobotDatasetMetadata`` (see the module docstring).

    Attributes as in LeRobot: ``repo_id``, ``repo_type`` ("dataset"), ``root`` (the dataset folder
    as a ``Path``; for a remote source its URL, since no folder holds the whole dataset),
    ``revision``, ``info``, ``features``, ``stats`` (None without ``meta/stats.json``; a plain dict
    that ``use_imagenet_stats`` may overwrite entries of), ``tasks`` (a pandas DataFrame indexed by
    task, column ``task_index``; a dict ``{task: task_index}`` where pandas is not installed),
    ``episodes`` (a ``datasets.Dataset``, every episode of the dataset whatever the selection, as in
    LeRobot) and the properties below. Writing (``save_episode`` and the like) is LeRobot's alone.
    """

    repo_type = "dataset"
    latest_episode = None  # LeRobot's writer sets it; a read-only meta never has one

    def __init__(self, *, typed: DatasetMeta, files: DatasetFiles, source: str | os.PathLike,
                 revision: str | None, depth_output_unit: DepthUnit = DEFAULT_DEPTH_UNIT) -> None:
        self._typed = typed
        self.repo_id = _repo_id(source)
        # A remote source has no local folder holding the whole dataset: its URL stands in.
        self.root: Path | str = files.root if isinstance(files, LocalFiles) else files.description
        self.revision = revision
        self.info = InfoDict(copy.deepcopy(dict(typed.info)))
        self.info["features"] = _lerobot_features(typed.info)
        self.stats = load_dataset_stats(files, typed)  # v2.x: aggregated as LeRobot's converter does
        if self.stats is not None:  # depth stats in the unit samples come out in (LeRobot's constructor)
            self.stats = rescaled_stats(self.stats, {k: typed.features[k].info for k in typed.depth_keys},
                                        depth_output_unit)
        self._episode_table = load_lerobot_episodes(typed)
        self._episodes = None  # the datasets.Dataset over _episode_table, made on first read

    def __getstate__(self) -> dict[str, Any]:
        # The datasets.Dataset is remade on first read in the new process (see the module docstring).
        return {**self.__dict__, "_episodes": None}

    @property
    def episodes(self):
        """The episodes parquet files' rows without their ``stats/`` columns, sorted by
        ``episode_index``, as the ``datasets.Dataset`` LeRobot's ``load_episodes`` returns."""
        if self._episodes is None:
            try:
                import datasets
                from datasets.table import InMemoryTable
            except ImportError as error:  # a dependency; only a broken install lacks it
                raise ImportError("meta.episodes is a Hugging Face datasets.Dataset, as in LeRobot, and needs the "
                                  "'datasets' package: pip install datasets") from error
            self._episodes = datasets.Dataset(InMemoryTable(self._episode_table))
        return self._episodes

    @episodes.setter
    def episodes(self, value) -> None:
        # LeRobot's own code reassigns meta.episodes (e.g. after reloading); keep what it sets.
        self._episodes = value

    def ensure_readable(self) -> None:
        """LeRobot's guard before reading metadata it is writing: everything here is read already."""

    def filter_episodes(self, predicate, candidates: list[int] | None = None) -> list[int]:
        """The sorted episode indices whose row satisfies ``predicate`` (among ``candidates``), as LeRobot."""
        if candidates is not None:
            chosen = set(candidates)
            rows = (row for row in self.episodes if row["episode_index"] in chosen)
        else:
            rows = iter(self.episodes)
        return sorted(int(row["episode_index"]) for row in rows if predicate(row))

    # -- LeRobot's properties, read from info.json ------------------------------------------------

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.info["features"]

    @property
    def fps(self) -> int:
        return self._typed.fps

    @property
    def robot_type(self) -> str | None:
        return self.info.get("robot_type")

    @property
    def total_episodes(self) -> int:
        return int(self.info.get("total_episodes", len(self._typed.episodes)))

    @property
    def total_frames(self) -> int:
        return int(self.info.get("total_frames", self._typed.total_frames))

    @property
    def total_tasks(self) -> int:
        return int(self.info.get("total_tasks", len(self._typed.tasks)))

    @property
    def chunks_size(self) -> int | None:
        return self.info.get("chunks_size")

    @property
    def data_files_size_in_mb(self) -> int | None:
        return self.info.get("data_files_size_in_mb")

    @property
    def video_files_size_in_mb(self) -> int | None:
        return self.info.get("video_files_size_in_mb")

    @property
    def data_path(self) -> str:
        return self.info["data_path"]

    @property
    def video_path(self) -> str | None:
        return self.info.get("video_path")

    @property
    def video_keys(self) -> list[str]:
        return [key for key, spec in self.features.items() if spec["dtype"] == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [key for key, spec in self.features.items() if spec["dtype"] == "image"]

    @property
    def has_language_columns(self) -> bool:
        """Whether the dataset declares a language column (``lerobot_train`` then collates with
        ``lerobot_collate_fn``)."""
        return any(column in self.features for column in LANGUAGE_COLUMNS)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """info.json's ``tools`` (OpenAI-style tool schemas), else LeRobot's default ``say`` tool; a copy."""
        declared = self.info.get("tools")
        return [copy.deepcopy(dict(tool)) for tool in (declared or DEFAULT_TOOLS)]

    @property
    def url_root(self) -> str:
        return f"hf://datasets/{self.repo_id}"

    @property
    def _version(self):
        """The codebase version the dataset was written with, as ``packaging.version.Version``."""
        import packaging.version  # LeRobot's own dependency; only LeRobot's code asks for this

        return packaging.version.parse(str(self.info.get("codebase_version")))

    @property
    def camera_keys(self) -> list[str]:
        return [key for key, spec in self.features.items() if spec["dtype"] in ("video", "image")]

    @property
    def depth_keys(self) -> list[str]:
        return [key for key, spec in self.features.items() if is_depth(spec.get("info"), spec.get("video_info"))]

    @property
    def names(self) -> dict[str, Any]:
        return {key: spec.get("names") for key, spec in self.features.items()}

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {key: tuple(spec["shape"]) for key, spec in self.features.items()}

    @cached_property
    def tasks(self):
        """LeRobot's task table: index ``task`` (the string), column ``task_index``."""
        try:
            import pandas as pd
        except ImportError:  # LeRobot itself always has pandas; without it a plain mapping will do
            return {task: index for index, task in enumerate(self._typed.tasks)}
        return pd.DataFrame({"task_index": range(len(self._typed.tasks))},
                            index=pd.Index(list(self._typed.tasks), name="task"))

    # -- LeRobot's look-ups ------------------------------------------------------------------------

    def get_task_index(self, task: str) -> int | None:
        return self._typed.tasks.index(task) if task in self._typed.tasks else None

    def get_data_file_path(self, ep_index: int) -> Path:
        return Path(self._episode(ep_index).data_relpath)

    def get_video_file_path(self, ep_index: int, vid_key: str) -> Path:
        episode = self._episode(ep_index)
        if vid_key not in episode.videos:
            raise KeyError(f"{vid_key!r} is not a video key of {self.repo_id} (video keys: {self.video_keys})")
        return Path(episode.videos[vid_key].relpath)

    def _episode(self, ep_index: int):
        try:
            return self._typed.episodes[ep_index]
        except KeyError:
            raise IndexError(f"episode {ep_index} is not in {self.repo_id} "
                             f"({len(self._typed.episodes)} episodes)") from None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(repo_id={self.repo_id!r}, total_episodes={self.total_episodes}, "
                f"total_frames={self.total_frames}, features={list(self.features)})")
