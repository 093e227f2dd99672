"""A valid tiny v2.1 (or v2.0) dataset, damaged one way at a time in its v2.x files: each case ends
in a clear error naming the damaged file and the field (or line), as ``test_corruption`` does for v3.0."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from episodestream import DatasetFormatError, EpisodeDataset, EpisodeStreamingDataset
from episodestream.tools.synthetic import write_synthetic_dataset

from .conftest import built_once

CAMERA = "observation.images.front"
LENGTHS = (5, 8, 4, 6)
EPISODES = "meta/episodes.jsonl"
EPISODES_STATS = "meta/episodes_stats.jsonl"


def _tiny(version: str):
    return lambda root: write_synthetic_dataset(root, version=version, num_episodes=len(LENGTHS),
                                                episode_length=list(LENGTHS), cameras=(CAMERA,), height=64, width=64,
                                                chunks_size=3, seed=0)


@pytest.fixture(scope="session")
def tiny_v21(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "v2x-corruption-v21", _tiny("v2.1"))


@pytest.fixture(scope="session")
def tiny_v20(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "v2x-corruption-v20", _tiny("v2.0"))


def _lines(root: Path, relpath: str) -> list[str]:
    return (root / relpath).read_text().splitlines()


def _write_lines(root: Path, relpath: str, lines: list[str]) -> None:
    (root / relpath).write_text("".join(line + "\n" for line in lines))


def _edit_line(relpath: str, number: int, edit: Callable[[dict], dict | str]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        lines = _lines(root, relpath)
        record = edit(json.loads(lines[number - 1]))
        lines[number - 1] = record if isinstance(record, str) else json.dumps(record)
        _write_lines(root, relpath, lines)
    return damage


def _edit_info(**changes) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        info = json.loads((root / "meta/info.json").read_text())
        info.update(changes)
        (root / "meta/info.json").write_text(json.dumps(info))
    return damage


def _drop_line(relpath: str, number: int) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        lines = _lines(root, relpath)
        del lines[number - 1]
        _write_lines(root, relpath, lines)
    return damage


def _remove(relpath: str) -> Callable[[Path], None]:
    return lambda root: (root / relpath).unlink()


# (case, damage, error, message): every message names the file and the field or line.
AT_CONSTRUCTION = [
    ("unknown codebase_version", _edit_info(codebase_version="v1.6"), DatasetFormatError,
     r"meta/info.json: field 'codebase_version' is 'v1.6'; episodestream reads 'v2.0', 'v2.1', 'v3.0'"),
    ("malformed episodes.jsonl line", _edit_line(EPISODES, 3, lambda r: '{"episode_index": 2, "len'),
     DatasetFormatError, r"meta/episodes.jsonl line 3: not valid JSON"),
    ("episodes.jsonl line not an object", _edit_line(EPISODES, 2, lambda r: "[1, 2]"),
     DatasetFormatError, r"meta/episodes.jsonl line 2: expected a JSON object, got list"),
    ("missing episodes.jsonl line", _drop_line(EPISODES, 3), DatasetFormatError,
     r"meta/episodes.jsonl: 3 episodes, but .*info.json says total_episodes 4 .*episode_index \[2\] have no line"),
    ("episodes.jsonl line without length", _edit_line(EPISODES, 2, lambda r: {"episode_index": 1, "tasks": []}),
     DatasetFormatError, r"meta/episodes.jsonl line 2: field\(s\) \['length'\] are missing"),
    ("length not an integer", _edit_line(EPISODES, 4, lambda r: {**r, "length": "6"}),
     DatasetFormatError, r"meta/episodes.jsonl line 4: field 'length' must be an integer >= 1, got '6'"),
    ("episode_index twice", _edit_line(EPISODES, 2, lambda r: {**r, "episode_index": 0}),
     DatasetFormatError, r"meta/episodes.jsonl line 2: episode_index 0 appears twice"),
    ("tasks not strings", _edit_line(EPISODES, 1, lambda r: {**r, "tasks": [3]}),
     DatasetFormatError, r"meta/episodes.jsonl line 1: field 'tasks' must be a list of strings"),
    ("episodes.jsonl missing", _remove(EPISODES), FileNotFoundError, r"meta/episodes.jsonl not found"),
    ("tasks.jsonl missing", _remove("meta/tasks.jsonl"), FileNotFoundError, r"meta/tasks.jsonl not found"),
    ("chunks_size not a positive int", _edit_info(chunks_size=0), DatasetFormatError,
     r"meta/info.json: field 'chunks_size' must be a positive integer, got 0"),
    ("data_path names a missing file", _remove("data/chunk-001/episode_000003.parquet"), FileNotFoundError,
     r"meta/info.json: field 'data_path' .* names .*data/chunk-001/episode_000003.parquet for episode_index 3, "
     r"which does not exist"),
    ("video_path names a missing file", _remove(f"videos/chunk-000/{CAMERA}/episode_000001.mp4"), FileNotFoundError,
     rf"meta/info.json: field 'video_path' .* names .*videos/chunk-000/{CAMERA}/episode_000001.mp4 for "
     r"episode_index 1, which does not exist"),
    ("template of another layout", _edit_info(data_path="data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
     DatasetFormatError, r"meta/info.json \(field 'data_path', episode_index 0\): path template .* cannot be formatted"),
    ("episodes_stats.jsonl missing", _remove(EPISODES_STATS), FileNotFoundError,
     r"meta/episodes_stats.jsonl not found \(LeRobot v2.x keeps per-episode stats there\)"),
    ("malformed episodes_stats.jsonl line", _edit_line(EPISODES_STATS, 2, lambda r: "{"), DatasetFormatError,
     r"meta/episodes_stats.jsonl line 2: not valid JSON"),
    ("an episode's stats without count", _edit_line(EPISODES_STATS, 3, lambda r: {
        **r, "stats": {**r["stats"], "action": {k: v for k, v in r["stats"]["action"].items() if k != "count"}}}),
     DatasetFormatError, r"meta/episodes_stats.jsonl \(feature 'action'\): statistic 'count' is missing"),
    ("episodes_stats.jsonl episode_index not an integer",  # issue 48 item 13: a bare TypeError from sorting
     _edit_line(EPISODES_STATS, 2, lambda r: {**r, "episode_index": "1"}), DatasetFormatError,
     r"meta/episodes_stats.jsonl line 2: field 'episode_index' must be an integer >= 0, got '1'"),
    ("episodes' stats that do not stack", _edit_line(EPISODES_STATS, 2, lambda r: {
        **r, "stats": {**r["stats"], "action": {**r["stats"]["action"], "mean": [1.0, 2.0]}}}), DatasetFormatError,
     r"meta/episodes_stats.jsonl \(feature 'action'\): episodes' 'mean' do not stack"),
]


@pytest.mark.parametrize("case,damage,error,message", AT_CONSTRUCTION, ids=[c[0] for c in AT_CONSTRUCTION])
def test_damaged_v21_metadata_is_refused_at_construction(tiny_v21, tmp_path, case, damage, error, message):
    root = tmp_path / "damaged"
    shutil.copytree(tiny_v21, root)
    damage(root)
    for face in (EpisodeStreamingDataset, EpisodeDataset):
        with pytest.raises(error, match=message):
            face(root)


def test_v20_without_stats_is_refused(tiny_v20, tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(tiny_v20, root)
    assert len(EpisodeDataset(root)) == sum(LENGTHS)
    (root / "meta/stats.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"meta/stats.json not found: a LeRobot v2.0 dataset keeps its "
                                                r"normalisation stats there"):
        EpisodeStreamingDataset(root)


def test_episodes_jsonl_length_that_disagrees_with_the_parquet_rows(tiny_v21, tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(tiny_v21, root)
    _edit_line(EPISODES, 2, lambda r: {**r, "length": 7})(root)  # the file holds 8 rows
    message = (r"data/chunk-000/episode_000001.parquet: holds 8 rows, but its episodes in meta/episodes.jsonl "
               r"\(1\) have 7 frames")
    with pytest.raises(DatasetFormatError, match=message):
        list(EpisodeStreamingDataset(root, episodes=[1]))
    dataset = EpisodeDataset(root)
    try:
        with pytest.raises(DatasetFormatError, match=message):
            dataset[LENGTHS[0]]
    finally:
        dataset.close()


def test_a_wrong_length_is_blamed_on_its_episode_when_a_later_one_is_read(tiny_v21, tmp_path):
    """Episode 1's length is wrong: reading episode 3 (whose own rows are fine, but no longer start
    where the lengths before it say) named episode 3 ("expected 6 rows ..., found 5"; issue 48 item
    12). The error names episode 1, its listed length and its file's rows."""
    root = tmp_path / "damaged"
    shutil.copytree(tiny_v21, root)
    _edit_line(EPISODES, 2, lambda r: {**r, "length": 7})(root)  # the file holds 8 rows
    message = (r"episode_000003.parquet \(episode_index 3\): its rows start at index 17, not 16 as the lengths "
               r"before it in meta/episodes.jsonl say: episode 1 is listed with length 7 there, but its data file "
               r".*episode_000001.parquet holds 8 rows")
    with pytest.raises(DatasetFormatError, match=message):
        list(EpisodeStreamingDataset(root, episodes=[3]))
    dataset = EpisodeDataset(root)
    try:
        with pytest.raises(DatasetFormatError, match=message):
            dataset[len(dataset) - 1]
    finally:
        dataset.close()


def test_compute_stats_refuses_a_length_that_disagrees_with_the_parquet(tiny_v21, tmp_path):
    """``compute_stats()`` (and ``episodestream stats``) took the listed length's rows of a file that
    holds more and returned stats over the wrong rows (issue 48 item 4), where streaming refuses it."""
    from episodestream.tools.cli import main

    root = tmp_path / "damaged"
    shutil.copytree(tiny_v21, root)
    _edit_line(EPISODES, 2, lambda r: {**r, "length": 7})(root)  # the file holds 8 rows
    message = (r"data/chunk-000/episode_000001.parquet: holds 8 rows, but its episodes in meta/episodes.jsonl "
               r"\(1\) have 7 frames")
    with pytest.raises(DatasetFormatError, match=message):
        EpisodeStreamingDataset(root, episodes=[1]).compute_stats(cache=False)
    assert main(["stats", str(root), "--episodes", "0-1", "--no-cache", "--no-progress"]) == 1


def test_a_duplicated_episodes_stats_line_counts_once(tiny_v21, tmp_path):
    """LeRobot's converter keys ``episodes_stats.jsonl`` by episode, the last line winning; the line
    was counted twice (issue 48 item 5)."""
    root = tmp_path / "damaged"
    shutil.copytree(tiny_v21, root)
    expected = EpisodeStreamingDataset(tiny_v21).meta.stats
    lines = _lines(root, EPISODES_STATS)
    _write_lines(root, EPISODES_STATS, [*lines, lines[1]])
    got = EpisodeStreamingDataset(root).meta.stats
    for key, entry in expected.items():
        for name, value in entry.items():
            np.testing.assert_array_equal(got[key][name], value, err_msg=f"{key} {name}")


def test_a_task_index_past_the_tasks_names_tasks_jsonl(tiny_v21, tmp_path):
    """The v2.x error named ``meta/tasks.parquet``, a file v2.x does not have (issue 48 item 15)."""
    root = tmp_path / "damaged"
    shutil.copytree(tiny_v21, root)
    _write_lines(root, "meta/tasks.jsonl", _lines(root, "meta/tasks.jsonl")[:1])
    tasks = [json.loads(line)["task_index"] for line in _lines(tiny_v21, "meta/tasks.jsonl")]
    assert len(tasks) > 1
    dataset = EpisodeDataset(root)
    try:
        with pytest.raises(ValueError, match=r"task_index [1-9][0-9]* is not in meta/tasks.jsonl \(1 tasks\)"):
            for index in range(len(dataset)):
                dataset[index]
    finally:
        dataset.close()
