"""LeRobot 0.6 language annotations (``language_persistent`` / ``language_events``) in every path.

The synthetic writer lays the columns out as LeRobot's annotation pipeline does
(``tools/_synthetic_language.py``); ``_expected`` spells each frame's value out again, as
``LeRobotDataset[i]`` gives it (checked against LeRobot itself in
``tests/with_lerobot/test_language_lerobot.py``): lists of dicts in LeRobot's field order, the
persistent rows' ``timestamp`` as float32, tool calls decoded, absent fields None.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import episodestream
from episodestream import DatasetFormatError, EpisodeDataset, EpisodeLoader, EpisodeMixture, EpisodeStreamingDataset
from episodestream._format.language import language_values
from episodestream.tools.synthetic import write_synthetic_dataset
from tests.conftest import built_once

FRONT = "observation.images.front"
LENGTHS = (5, 3, 6, 2, 4)
FPS = 10
PERSISTENT, EVENTS = "language_persistent", "language_events"
SAY = {"type": "function", "function": {
    "name": "say", "description": "Speak a short utterance to the user via the TTS executor.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string", "description": "The verbatim text to speak."}},
                   "required": ["text"]}}}


@pytest.fixture(scope="session")
def annotated_root(tmp_path_factory):
    """5 episodes (episode 2 without persistent rows, as an unannotated episode), 2 per data file."""
    return built_once(tmp_path_factory, "language", lambda root: write_synthetic_dataset(
        root, num_episodes=len(LENGTHS), episode_length=list(LENGTHS), fps=FPS, cameras=(FRONT,),
        max_episodes_per_data_file=2, language=True, seed=0))


@pytest.fixture(scope="session")
def plain_root(tmp_path_factory):
    """The same shape without annotations: for mixtures and ``meta.tools``' fallback."""
    return built_once(tmp_path_factory, "language-plain", lambda root: write_synthetic_dataset(
        root, num_episodes=3, episode_length=[4, 3, 5], fps=FPS, cameras=(FRONT,), seed=1))


def _row(role, content, style, *, camera=None, tool_calls=None, **timestamp):
    return {"role": role, "content": content, "style": style, **timestamp, "camera": camera, "tool_calls": tool_calls}


def _expected(episode: int, frame: int) -> tuple[list, list]:
    """Frame ``frame`` of episode ``episode``: (language_persistent, language_events)."""
    length = LENGTHS[episode]
    persistent = [] if episode % 3 == 2 else [
        _row("user", f"episode {episode} subtask", "subtask", timestamp=0.0),
        # written as float64 length / fps / 3, read as LeRobot's Value("float32") gives it
        _row("assistant", f"episode {episode} plan", "plan", timestamp=float(np.float32(length / FPS / 3)))]
    events = []
    if frame == 1:
        say = {"type": "function", "function": {"name": "say", "arguments": {"text": f"episode {episode} frame 1"}}}
        events = [_row("assistant", None, None, tool_calls=[say])]
    elif frame == 2:
        events = [_row("user", f"episode {episode} frame 2 interjection", "interjection"),
                  _row("user", f"episode {episode} frame 2 question", "vqa", camera=FRONT)]
    return persistent, events


def _check(sample) -> None:
    persistent, events = _expected(int(sample["episode_index"]), int(sample["frame_index"]))
    assert sample[PERSISTENT] == persistent
    assert sample[EVENTS] == events
    for rows in (sample[PERSISTENT], sample[EVENTS]):
        assert type(rows) is list and all(type(row) is dict for row in rows)
        assert all(list(row) == [k for k in ("role", "content", "style", "timestamp", "camera", "tool_calls")
                                 if k in row] for row in rows)
        assert all(type(row["timestamp"]) is float for row in rows if "timestamp" in row)


def _check_batch(batch, size: int) -> None:
    for key in (PERSISTENT, EVENTS):
        assert type(batch[key]) is list and len(batch[key]) == size
    for j in range(size):
        _check({PERSISTENT: batch[PERSISTENT][j], EVENTS: batch[EVENTS][j],
                "episode_index": batch["episode_index"][j], "frame_index": batch["frame_index"][j]})


@pytest.mark.parametrize("column_cache", [True, False])
def test_map_style_samples_hold_lerobots_values(annotated_root, column_cache):
    dataset = EpisodeDataset(annotated_root, column_cache=column_cache)
    assert len(dataset) == sum(LENGTHS)
    for i in range(len(dataset)):
        sample = dataset[i]
        _check(sample)
        assert isinstance(sample["observation.state"], torch.Tensor) and sample[FRONT].shape == (3, 64, 96)


def test_a_sample_owns_its_rows(annotated_root):
    dataset = EpisodeDataset(annotated_root)
    first = dataset[1]
    first[PERSISTENT][0]["content"] = "edited"
    first[EVENTS][0]["tool_calls"][0]["function"]["name"] = "edited"
    _check(dataset[1])
    _check(dataset[2])


def _flip(frame):
    return frame.flip(-1)


def test_shuffled_stream(annotated_root):
    stream = list(EpisodeStreamingDataset(annotated_root, episode_pool_size=2, seed=3))
    assert Counter((int(s["episode_index"]), int(s["frame_index"])) for s in stream) == Counter(
        (e, f) for e, n in enumerate(LENGTHS) for f in range(n))
    for sample in stream:
        _check(sample)


# image_transforms: frames not written in place, so the loader collates whole samples (the other path).
@pytest.mark.parametrize("image_transforms", [None, _flip])
def test_episode_loader_batches_as_lerobots_trainer_and_keeps_the_columns_when_asked(annotated_root,
                                                                                      image_transforms):
    def stream():
        return EpisodeStreamingDataset(annotated_root, episode_pool_size=2, seed=3, image_transforms=image_transforms)

    # By default, LeRobot 0.6.1's trainer's batch (lerobot_collate_fn): the language columns left out.
    dropped = list(EpisodeLoader(stream(), batch_size=4, num_threads=2))
    assert sum(len(b["index"]) for b in dropped) == sum(LENGTHS)
    assert all(PERSISTENT not in b and EVENTS not in b for b in dropped)
    # language_columns="keep": each a list with one entry per sample.
    kept = list(EpisodeLoader(stream(), batch_size=4, num_threads=2, language_columns="keep"))
    for batch in kept:
        _check_batch(batch, len(batch["index"]))
    # The loader's batches are the DataLoader's with episodestream.collate, key for key, either way.
    keep = functools.partial(episodestream.collate, language_columns="keep")
    for batches, collate_fn in ((dropped, episodestream.collate), (kept, keep)):
        for got, expected in zip(batches, DataLoader(stream(), batch_size=4, collate_fn=collate_fn), strict=True):
            assert list(got) == list(expected)
            for key, value in expected.items():
                assert (torch.equal(got[key], value) if isinstance(value, torch.Tensor) else got[key] == value), key
    with pytest.raises(ValueError, match=r"Invalid language_columns \('raw'\). Supported values are 'drop', 'keep'."):
        EpisodeLoader(stream(), batch_size=4, language_columns="raw")


def _same_batch(got, expected) -> None:
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert type(got[key]) is type(value), key
        assert torch.equal(got[key], value) if isinstance(value, torch.Tensor) else got[key] == value, key


def _rendered(sample: dict, episode: int) -> dict:
    """``sample`` as LeRobot's render_messages_processor leaves it: the language columns replaced by
    the rendered messages (the test of that against LeRobot itself is in tests/with_lerobot)."""
    rest = {k: v for k, v in sample.items() if k not in (PERSISTENT, EVENTS)}
    return {**rest, "messages": [{"role": "user", "content": f"task {episode}"}, {"role": "assistant", "content": "ok"}],
            "message_streams": ["high_level", "low_level"], "target_message_indices": [1]}


def test_collate_gives_lerobots_batch_and_keeps_the_columns_when_asked(annotated_root):
    """LeRobot 0.6.1's lerobot_collate_fn, by its code (compared with it in tests/with_lerobot): the
    language columns dropped, the rendered messages kept as lists, None samples dropped, the rest
    default_collate."""
    dataset = EpisodeDataset(annotated_root)
    samples = [dataset[i] for i in range(4)]
    with pytest.raises((RuntimeError, TypeError)):  # rows of different lengths, None fields: not default_collate's
        default_collate(samples)
    plain = [{k: v for k, v in s.items() if k not in (PERSISTENT, EVENTS)} for s in samples]
    _same_batch(episodestream.collate(samples), default_collate(plain))
    _same_batch(episodestream.collate(plain), default_collate(plain))
    _same_batch(episodestream.collate([None, samples[0], None, *samples[1:]]), default_collate(plain))
    assert episodestream.collate([None, None]) is None
    # "keep": the raw columns too, in the samples' key order, one list entry per sample.
    kept = episodestream.collate(samples, language_columns="keep")
    assert list(kept) == list(samples[0])
    _check_batch(kept, 4)
    for batch in DataLoader(dataset, batch_size=3, collate_fn=functools.partial(episodestream.collate,
                                                                                language_columns="keep")):
        _check_batch(batch, len(batch["index"]))
    assert all(PERSISTENT not in b and EVENTS not in b
               for b in DataLoader(dataset, batch_size=3, collate_fn=episodestream.collate))

    # Rendered messages stay plain lists (default_collate would transpose lists of equal lengths).
    rendered = [_rendered(s, int(s["episode_index"])) for s in samples]
    batch = episodestream.collate(rendered)
    for key in ("messages", "message_streams", "target_message_indices"):
        assert type(batch[key]) is list and batch[key] == [s[key] for s in rendered], key
    _same_batch({k: v for k, v in batch.items() if k in plain[0]}, default_collate(plain))
    assert batch["target_message_indices"] == [[1]] * 4 and batch["message_streams"][0] == ["high_level", "low_level"]
    # All or none of a batch's samples carry them: a shorter list would pair messages with the wrong samples.
    with pytest.raises(ValueError, match=r"Inconsistent batch: 3/4 samples carry 'messages'"):
        episodestream.collate([samples[0], *rendered[1:]])
    with pytest.raises(ValueError, match=r"Invalid language_columns \(True\). Supported values are 'drop', 'keep'."):
        episodestream.collate(samples, language_columns=True)
    # Other samples: default_collate's batch.
    assert torch.equal(episodestream.collate([torch.ones(2), torch.zeros(2)]), torch.tensor([[1.0, 1], [0, 0]]))


@pytest.mark.parametrize("key", [PERSISTENT, EVENTS])
def test_windows_of_a_language_column_are_refused_at_construction(annotated_root, key):
    for make in (EpisodeDataset, EpisodeStreamingDataset):
        with pytest.raises(ValueError, match=rf"delta_timestamps key '{key}': windows of a language column are not "
                                             r"supported"):
            make(annotated_root, delta_timestamps={key: [0.0, 1 / FPS]})
    # other keys' windows are fine beside the language columns
    sample = EpisodeDataset(annotated_root, delta_timestamps={"action": [0.0, 1 / FPS]})[1]
    _check(sample)


def test_curation_keeps_each_frames_rows(annotated_root):
    keep = {0: [(1, 3)], 3: [(0, 2)], 4: [(2, 4)]}
    mapped = EpisodeDataset(annotated_root, episodes=[0, 1, 4], keep_frames=keep)
    seen = [(int(mapped[i]["episode_index"]), int(mapped[i]["frame_index"])) for i in range(len(mapped))]
    assert seen == [(0, 1), (0, 2), (4, 2), (4, 3)]
    for i in range(len(mapped)):
        _check(mapped[i])
    stream = list(EpisodeStreamingDataset(annotated_root, keep_frames=keep, episode_weights={0: 2, 3: 1, 4: 0.5},
                                          seed=2))
    assert Counter(int(s["episode_index"]) for s in stream) == {0: 4, 3: 2, 4: 1}
    for sample in stream:
        _check(sample)


def test_mixture_union_fills_missing_columns_with_empty_lists(annotated_root, plain_root):
    def mixture():
        return EpisodeMixture([EpisodeStreamingDataset(annotated_root, seed=0),
                               EpisodeStreamingDataset(plain_root, seed=1)], keys="union", seed=4)
    assert mixture().meta.features[PERSISTENT]["dtype"] == "language"
    samples = list(mixture())
    assert Counter(int(s["dataset_index"]) for s in samples)[1] > 0
    for sample in samples:
        missing = int(sample["dataset_index"]) == 1
        for key in (PERSISTENT, EVENTS):
            assert sample[f"{key}_is_missing"].item() is missing
        if missing:
            assert sample[PERSISTENT] == [] and sample[EVENTS] == []
        else:
            _check(sample)
    for batch in EpisodeLoader(mixture(), batch_size=4):  # the columns left out, their flags kept
        assert PERSISTENT not in batch and EVENTS not in batch
        assert batch[f"{PERSISTENT}_is_missing"].tolist() == (batch["dataset_index"] == 1).tolist()
    for batch in EpisodeLoader(mixture(), batch_size=4, language_columns="keep"):
        for j, index in enumerate(batch["dataset_index"].tolist()):
            if index == 1:
                assert batch[PERSISTENT][j] == [] and batch[EVENTS][j] == []
            else:
                _check({**{k: batch[k][j] for k in (PERSISTENT, EVENTS, "episode_index", "frame_index")}})
    with pytest.raises(ValueError, match="cannot join"):  # the columns do not mix with other features
        EpisodeMixture([EpisodeStreamingDataset(annotated_root), EpisodeStreamingDataset(plain_root)], keys="union",
                       rename=[None, {"task_index": EVENTS}])
    with pytest.raises(ValueError, match="renames its language column 'language_events' onto it; language columns "
                                         "keep their names"):
        EpisodeMixture([EpisodeStreamingDataset(annotated_root), EpisodeStreamingDataset(plain_root)], keys="union",
                       rename=[{EVENTS: "events"}, None])


def test_meta_tools_and_has_language_columns(annotated_root, plain_root, tmp_path):
    annotated, plain = EpisodeDataset(annotated_root).meta, EpisodeDataset(plain_root).meta
    assert annotated.has_language_columns is True and plain.has_language_columns is False
    assert annotated.features[EVENTS] == {"dtype": "language", "shape": (1,), "names": None}
    assert annotated.tools == [SAY] and plain.tools == [SAY]  # info.json's, else LeRobot's DEFAULT_TOOLS
    annotated.tools[0]["function"]["name"] = "edited"  # a copy
    assert annotated.tools == [SAY]


def test_a_mixtures_stats_leave_language_columns_out_as_a_datasets_do(annotated_root, plain_root, tmp_path):
    """``mixture.meta.stats`` of annotated components (what LeRobot's ``make_policy`` normalizes with):
    no statistics for the language columns, as ``compute_stats()`` of one dataset (issue 62 item 7)."""
    own = EpisodeDataset(annotated_root, cache_dir=tmp_path).compute_stats()
    assert PERSISTENT not in own and EVENTS not in own
    for second, keys in ((annotated_root, "same"), (plain_root, "union")):
        mixture = EpisodeMixture([EpisodeStreamingDataset(annotated_root, seed=0, cache_dir=tmp_path),
                                  EpisodeStreamingDataset(second, seed=1, cache_dir=tmp_path)], keys=keys)
        meta = mixture.meta
        assert set(meta.stats) == set(own), keys
        assert all(set(s) == set(own) for s in meta.component_stats) and set(meta.provenance) == set(own)
        if keys == "same":
            np.testing.assert_allclose(meta.stats["action"]["mean"], own["action"]["mean"])


def test_language_values_decode_every_stored_tool_call_type():
    """``tool_calls`` items as LeRobot's ``datasets.Json()`` decodes them: JSON strings (the
    canonical ``pa.json_()`` type, or a plain string column) parsed, a plain string kept."""
    call = {"type": "function", "function": {"name": "say", "arguments": {"text": "hi"}}}
    row = {"role": "assistant", "content": None, "style": None, "camera": None}
    def events_type(item_type):
        return pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("style", pa.string()),
                                   ("camera", pa.string()), ("tool_calls", pa.list_(item_type))]))

    strings = pa.array([[{**row, "tool_calls": [json.dumps(call)]}], [], None], events_type(pa.string()))
    for column in (strings, strings.cast(events_type(pa.json_()))):
        assert language_values(column, EVENTS) == [[{**row, "tool_calls": [call]}], [], None]
    text = pa.array([[{"role": "user", "tool_calls": ["not json"]}]])
    assert language_values(text, EVENTS) == [[{"role": "user", "content": None, "style": None, "camera": None,
                                               "tool_calls": ["not json"]}]]
    assert language_values(pa.array([[], []], pa.list_(pa.null())), PERSISTENT) == [[], []]


def test_a_language_column_stored_as_something_else_is_refused(annotated_root, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    root = tmp_path / "damaged"
    shutil.copytree(annotated_root, root)
    path = root / "data/chunk-000/file-000.parquet"  # episode 0's
    table = pq.read_table(path)
    position = table.column_names.index(EVENTS)
    pq.write_table(table.set_column(position, EVENTS, pa.array(["x"] * table.num_rows)), path)
    with pytest.raises(DatasetFormatError, match=rf"column '{EVENTS}' is stored as string, but info.json declares "
                                                 r"dtype 'language' \(stored as a list of structs\)"):
        EpisodeDataset(root, column_cache=False)[0]


def test_synthetic_language_is_v30_only(tmp_path):
    with pytest.raises(ValueError, match="language"):
        write_synthetic_dataset(tmp_path / "v21", num_episodes=1, episode_length=2, cameras=(), language=True,
                                version="v2.1")


def test_the_docs_way_to_keep_the_columns_runs(annotated_root, capsys):
    """docs/lerobot.md, "Batches": the block that keeps the raw columns, run on an annotated dataset."""
    doc = (Path(__file__).resolve().parents[1] / "docs/lerobot.md").read_text()
    section = doc.split("### Batches: as LeRobot's trainer gets them")[1].split("\n## ")[0]
    (block,) = re.findall(r"```python no-run\n(.*?)```", section, flags=re.S)
    assert '"path/to/annotated_dataset"' in block
    namespace: dict = {}
    exec(compile(block.replace("path/to/annotated_dataset", str(annotated_root)), "docs/lerobot.md", "exec"), namespace)
    _check_batch(namespace["batch"], 8)
    first = namespace["batch"]
    assert capsys.readouterr().out.strip() == repr(first[PERSISTENT][0])
