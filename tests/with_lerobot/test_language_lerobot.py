"""LeRobot 0.6 language annotations: our samples equal ``LeRobotDataset[i]`` value for value.

The dataset is written by LeRobot itself: ``LeRobotDataset.create`` / ``add_frame`` /
``save_episode`` / ``finalize``, then the annotation pipeline's last steps on it, with its own code:
``LanguageColumnsWriter._materialize_table`` (the rows normalised by the writer's
``_normalize_persistent_row`` / ``_normalize_event_row``, events bucketed on the frame whose
timestamp they fire at) rewriting each data file with ``write_table_one_row_group_per_episode``,
and ``Executor._ensure_annotation_metadata_in_info`` adding the features and ``tools`` to info.json.
A second copy stores ``tool_calls`` items as JSON strings (LeRobot's canonical ``pa.json_()`` type).

Skips without LeRobot (see ``tests/with_lerobot/__init__.py``).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

try:
    from lerobot.annotations.steerable_pipeline.executor import Executor
    from lerobot.annotations.steerable_pipeline.writer import (
        LanguageColumnsWriter,
        _normalize_event_row,
        _normalize_persistent_row,
        speech_atom,
    )
    from lerobot.datasets.io_utils import write_table_one_row_group_per_episode
    from lerobot.datasets.language import language_events_arrow_type, language_persistent_arrow_type
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.utils.collate import lerobot_collate_fn
except ImportError as error:  # CI: LeRobot is not installed
    pytest.skip(f"LeRobot 0.6 (with its annotation pipeline) is not importable here ({error})",
                allow_module_level=True)

import episodestream
from episodestream import EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset

CAMERA = "observation.images.front"
LENGTHS = [6, 4, 7]
FPS = 10
KEYS = ("language_persistent", "language_events")


def _annotations(episode: int) -> tuple[list[dict], dict[int, list[dict]]]:
    """Episode ``episode``'s persistent rows and its events by frame, as the writer normalises them."""
    if episode == 1:  # an episode the pipeline left unannotated
        return [], {}
    persistent = [_normalize_persistent_row(r) for r in (
        {"role": "user", "content": f"ep {episode} subtask", "style": "subtask", "timestamp": 0.0},
        {"role": "assistant", "content": f"ep {episode} plan", "style": "plan", "timestamp": 0.1234567},
        {"role": "assistant", "content": "memory", "style": "memory", "timestamp": 0.3})]
    louder = {"type": "function", "function": {"name": "say", "arguments": {"text": "ok", "volume": 0.5}}}
    events = {
        1: [_normalize_event_row(speech_atom(0.1, f"ep {episode} hello"))],
        3: [_normalize_event_row({"role": "user", "content": "stop", "style": "interjection", "tool_calls": [louder]}),
            _normalize_event_row({"role": "user", "content": "what is there?", "style": "vqa", "camera": CAMERA})],
    }
    return persistent, events


def _write(root, *, json_tool_calls: bool) -> None:
    features = {"observation.state": {"dtype": "float32", "shape": (3,), "names": None},
                CAMERA: {"dtype": "video", "shape": (64, 64, 3), "names": ["height", "width", "channels"]}}
    dataset = LeRobotDataset.create("local/language", fps=FPS, features=features, root=root, use_videos=True)
    rng = np.random.default_rng(0)
    for episode, length in enumerate(LENGTHS):
        for frame in range(length):
            dataset.add_frame({"observation.state": np.full(3, episode * 100 + frame, np.float32),
                               CAMERA: rng.integers(0, 255, (64, 64, 3), dtype=np.uint8), "task": f"task {episode}"})
        dataset.save_episode()
    dataset.finalize()
    for path in sorted(root.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        episodes = table.column("episode_index").to_pylist()
        frames = table.column("frame_index").to_pylist()
        persistent = [_annotations(e)[0] for e in episodes]
        events = [_annotations(e)[1].get(f, []) for e, f in zip(episodes, frames)]
        table = LanguageColumnsWriter()._materialize_table(table, persistent, events, drop_old=True)
        if json_tool_calls:  # the canonical types: tool calls as JSON text
            for key, canonical in zip(KEYS, (language_persistent_arrow_type(), language_events_arrow_type())):
                rows = [[{**r, "tool_calls": None if r["tool_calls"] is None else
                          [json.dumps(c) for c in r["tool_calls"]]} for r in frame]
                        for frame in table.column(key).to_pylist()]
                as_text = pa.array(rows, _with_text_tool_calls(canonical))
                table = table.set_column(table.column_names.index(key), key, as_text.cast(canonical))
        write_table_one_row_group_per_episode(table, path)
    Executor._ensure_annotation_metadata_in_info(root)


def _with_text_tool_calls(list_type: pa.ListType) -> pa.ListType:
    row = list_type.value_type
    fields = [pa.field(f.name, pa.list_(pa.string())) if f.name == "tool_calls" else f for f in row]
    return pa.list_(pa.struct(fields))


@pytest.fixture(scope="module", params=["inferred", "json"])
def written(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("language-lerobot") / "ds"
    shutil.rmtree(root, ignore_errors=True)
    _write(root, json_tool_calls=request.param == "json")
    return root


def _same(ours, theirs) -> None:
    # repr: the same types too (float, not numpy; None, not a missing key; dict key order)
    for key in KEYS:
        assert repr(ours[key]) == repr(theirs[key]), key


def test_samples_equal_lerobot(written):
    theirs = LeRobotDataset("local/language", root=written)
    assert theirs.meta.has_language_columns
    for column_cache in (True, False):
        ours = EpisodeDataset(written, column_cache=column_cache)
        assert len(ours) == len(theirs) == sum(LENGTHS)
        for i in range(len(ours)):
            mine, reference = ours[i], theirs[i]
            _same(mine, reference)
            assert torch.equal(mine["observation.state"], reference["observation.state"])
            assert torch.equal(mine[CAMERA], reference[CAMERA])
    # What the comparison covers: tool calls decoded, with the fields other calls of the file have
    # (None here), and persistent times as float32.
    annotated = theirs[1]["language_events"]
    assert annotated[0]["tool_calls"][0]["function"]["arguments"] == {"text": "ep 0 hello", "volume": None}
    assert theirs[0]["language_persistent"][1]["timestamp"] == float(np.float32(0.1234567)) != 0.1234567
    assert EpisodeDataset(written).meta.tools == theirs.meta.tools
    assert EpisodeDataset(written).meta.has_language_columns is True


def test_stream_and_batches_equal_lerobot(written):
    theirs = LeRobotDataset("local/language", root=written)
    for sample in EpisodeStreamingDataset(written, seed=7, episode_pool_size=2):
        _same(sample, theirs[int(sample["index"])])
    for batch in EpisodeLoader(EpisodeStreamingDataset(written, seed=7), batch_size=4):
        for j, index in enumerate(batch["index"].tolist()):
            _same({key: batch[key][j] for key in KEYS}, theirs[index])
    # LeRobot 0.6.1's lerobot_collate_fn drops the language columns from its batches;
    # episodestream.collate keeps them, one list entry per sample, the rest as it collates.
    samples = [theirs[i] for i in range(4)]
    dropped, kept = lerobot_collate_fn(samples), episodestream.collate(samples)
    assert not set(KEYS) & set(dropped) and all(kept[key] == [s[key] for s in samples] for key in KEYS)
    assert all(torch.equal(kept[key], value) for key, value in dropped.items() if isinstance(value, torch.Tensor))
