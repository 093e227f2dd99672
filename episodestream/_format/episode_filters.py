"""Curation inputs that need the dataset's files: a keep-ranges JSON file, predicates over
``meta/episodes`` and a weight column of it. Read once, at construction; the arithmetic is
``_plan.curation``'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodestream._base.gc_pause import gc_paused
from episodestream._format.metadata import DatasetMeta
from episodestream._format.versions import load_lerobot_episodes


def load_keep_frames(value: Mapping[Any, Any] | str | os.PathLike) -> tuple[Mapping[Any, Any], str]:
    """``keep_frames`` as a mapping, and how errors should name it (the JSON file's path)."""
    if isinstance(value, Mapping):
        return value, "keep_frames"
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"keep_frames must be a dict {{episode_index: [(start, end), ...]}} or a path to a JSON "
                        f"file of that shape, got {type(value).__name__}.")
    path = Path(value)
    try:
        with open(path, encoding="utf-8") as f, gc_paused():
            loaded = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"keep_frames: no such JSON file: {path}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"keep_frames: {path} is not valid JSON: {error}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"keep_frames: {path} must hold a JSON object {{episode_index: [[start, end], ...]}}, "
                         f"got a {type(loaded).__name__}.")
    return loaded, f"keep_frames ({path})"


def episodes_table(meta: DatasetMeta) -> pa.Table:
    """The episodes table predicates, weight columns and ``split_episodes(by=)`` read: v3.0's
    ``meta/episodes`` (every column but the per-episode ``stats/`` ones; files whose column types
    differ, int32 in one and int64 in another, promoted to one type), or for v2.x the columns
    LeRobot's converter writes from ``meta/episodes.jsonl`` (what ``dataset.meta.episodes`` shows)."""
    return load_lerobot_episodes(meta)


def is_predicate(value: Any) -> bool:
    return isinstance(value, pc.Expression) or callable(value)


def _truth(keep: Any, predicate: Any, episode: Any) -> bool:
    """A predicate's answer as a bool: a numpy array of several values has none (numpy's own error
    names neither the predicate nor the episode)."""
    try:
        return bool(keep)
    except Exception as error:
        raise TypeError(f"episodes: the predicate {predicate!r:.200} returned {keep!r:.80} for episode {episode}, "
                        f"which is neither true nor false ({type(error).__name__}: {error}); it must return a bool "
                        f"for each episode's row (e.g. reduce an array with .all() or .any()).") from None


def select_by_predicate(table: pa.Table, predicate: Callable[[dict[str, Any]], Any] | pc.Expression,
                        description: str, where: str) -> list[int]:
    """The episode indices (ascending) whose row ``predicate`` keeps; errors name the episode, or
    say that nothing was selected (``where``: the episodes metadata, ``<dataset>/meta/episodes``
    or v2.x's ``<dataset>/meta/episodes.jsonl``)."""
    if isinstance(predicate, pc.Expression):
        try:
            kept = table.filter(predicate)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, KeyError) as error:
            raise ValueError(f"episodes: the expression {predicate} cannot be evaluated over {where} "
                             f"(columns: {table.column_names}): {str(error).splitlines()[0]}") from None
        selected = sorted(kept.column("episode_index").to_pylist())
    else:
        selected = []
        for row in table.to_pylist():
            try:
                keep = predicate(row)
            except Exception as error:
                raise ValueError(f"episodes: the predicate raised on episode {row.get('episode_index')}: "
                                 f"{type(error).__name__}: {error}") from error
            if _truth(keep, predicate, row.get("episode_index")):
                selected.append(int(row["episode_index"]))
        selected.sort()
    if not selected:
        raise ValueError(f"episodes: the predicate {predicate!r:.200} selects no episode of {description} "
                         f"({table.num_rows} episodes).")
    return selected


def weight_column(table: pa.Table, name: str, episode_index: np.ndarray, where: str) -> np.ndarray:
    """Column ``name`` of the episodes table as float64, aligned with ``episode_index`` (ascending);
    ``where`` names the episodes metadata in errors."""
    if name not in table.column_names:
        raise ValueError(f"episode_weights={name!r} is not a column of {where} "
                         f"(columns: {table.column_names}).")
    column = table.column(name)
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise TypeError(f"episode_weights={name!r}: the column is {column.type}, not numeric.")
    if column.null_count:
        where = int(np.argmax(np.asarray(column.is_null())))
        raise ValueError(f"episode_weights={name!r}: episode {table.column('episode_index')[where].as_py()} has no "
                         f"value (null).")
    values = column.to_numpy().astype(np.float64)
    rows = np.searchsorted(episode_index, table.column("episode_index").to_numpy())
    out = np.empty(len(episode_index), np.float64)
    out[rows] = values
    return out
