"""``split_episodes``: held-out episode splits (train, eval) to pass as ``episodes=``."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from episodestream._base.options import check_int
from episodestream._format.episode_filters import episodes_table
from episodestream._format.metadata import DatasetMeta
from episodestream._format.versions import load_metadata
from episodestream._plan.splits import held_out_split
from episodestream._runtime.core import DatasetFacts
from episodestream._runtime.sources import open_source


def split_episodes(source: str | os.PathLike | DatasetFacts, eval_fraction: float, *, by: str | None = "task",
                   seed: int | None = None, revision: str | None = None,
                   storage_options: Mapping[str, Any] | None = None, token: str | None = None,
                   hub_endpoint: str | None = None) -> tuple[list[int], list[int]]:
    """``(train, eval)`` episode lists: of each group of ``n`` episodes, ``ceil(n * eval_fraction)``
    held out for evaluation.

    Args:
        source (str | os.PathLike | EpisodeStreamingDataset | EpisodeDataset): a dataset's location
            (as the datasets take it; every episode is split), or a dataset (its selected episodes
            are split: a predicate, ``keep_frames`` and weights already applied).
        eval_fraction (float): the share of each group held out, in [0, 1).
        by (str | None): "task" groups by each episode's first task (LeRobot's grouping); None
            makes one group; any other name groups by that column of ``meta/episodes`` (a success
            flag, a scene id; for v2.x, of the columns LeRobot's converter writes from
            ``meta/episodes.jsonl``). Defaults to ``"task"``.
        seed (int | None): None holds out each group's *last* episodes, so that ``by="task"`` gives
            exactly LeRobot's ``make_train_eval_datasets`` split (same lists, same order); an int
            holds out episodes drawn per group from the seed, both lists sorted. Defaults to ``None``.
        revision (str | None): as for the datasets, when ``source`` is a location. Defaults to ``None``.
        storage_options (Mapping[str, Any] | None): as for the datasets, when ``source`` is a
            location. Defaults to ``None``.
        token (str | None): as for the datasets, when ``source`` is a location. Defaults to ``None``.
        hub_endpoint (str | None): as for the datasets, when ``source`` is a location. Defaults to
            ``None``.

    Returns:
        tuple[list[int], list[int]]: the training and the held-out episode indices.

    Raises:
        TypeError: ``by`` is not a string or None.
        ValueError: ``eval_fraction`` out of [0, 1), a ``by`` column that does not exist, or a split
            that leaves no training episode (an error, as in LeRobot).
    """
    if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float, np.floating)) \
            or not 0 <= eval_fraction < 1:
        raise ValueError(f"eval_fraction must be a number in [0, 1), got {eval_fraction!r}.")
    if seed is not None:
        seed = check_int("seed", seed, minimum=0)
    if isinstance(source, DatasetFacts):
        meta = source.typed_meta
        # As LeRobot's factory: the episodes in the order the dataset was given them.
        episodes = source.episodes if source.episodes is not None else source.episode_indices
        groups = _groups(meta, episodes, by)
    else:
        files = open_source(source, revision=revision, storage_options=storage_options, token=token,
                            hub_endpoint=hub_endpoint)
        try:
            meta = load_metadata(files)
            episodes = meta.episodes.episode_index.tolist()
            groups = _groups(meta, episodes, by)
        finally:
            files.close()
    train, held_out = held_out_split(episodes, groups, float(eval_fraction), seed=seed)
    if not train:
        raise ValueError(f"eval_fraction={eval_fraction} leaves 0 training episodes from {len(episodes)} total.")
    return train, held_out


def _groups(meta: DatasetMeta, episodes: list[int], by: str | None) -> list[Hashable]:
    if by is None:
        return [0] * len(episodes)
    if not isinstance(by, str):
        raise TypeError(f"by must be 'task', None or a column name of meta/episodes, got {by!r}.")
    table = meta.episodes
    rows = [table.position(e) for e in episodes]
    if by == "task":
        return [tasks[0] if tasks else "" for tasks in (table.tasks_at(row) for row in rows)]
    columns = episodes_table(meta)
    if by not in columns.column_names:
        raise ValueError(f"by={by!r} is neither 'task' nor a column of {meta.description}/{meta.episodes_where} "
                         f"(columns: {columns.column_names}).")
    values = dict(zip(columns.column("episode_index").to_pylist(), columns.column(by).to_pylist()))
    return [_hashable(values[e]) for e in episodes]


def _hashable(value: Any) -> Hashable:
    return tuple(value) if isinstance(value, list) else value
