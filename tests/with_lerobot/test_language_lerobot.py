"""LeRobot 0.6 language annotations: our samples equal ``LeRobotDataset[i]`` value for value.

The dataset is written by LeRobot itself, its annotation pipeline's own code included
(``lerobot_written.write_language_dataset``). A second copy stores ``tool_calls`` items as JSON
strings (LeRobot's canonical ``pa.json_()`` type). Batches: ``test_batches_lerobot.py``.

Skips without LeRobot (see ``tests/with_lerobot/__init__.py``).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

try:
    from lerobot.annotations.steerable_pipeline.executor import Executor  # noqa: F401
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.utils.collate import lerobot_collate_fn
except ImportError as error:  # CI: LeRobot is not installed
    pytest.skip(f"LeRobot 0.6 (with its annotation pipeline) is not importable here ({error})",
                allow_module_level=True)

import episodestream
from episodestream import EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset
from tests.with_lerobot.lerobot_written import LANGUAGE_CAMERA as CAMERA
from tests.with_lerobot.lerobot_written import LANGUAGE_KEYS as KEYS
from tests.with_lerobot.lerobot_written import LANGUAGE_LENGTHS as LENGTHS
from tests.with_lerobot.lerobot_written import write_language_dataset


@pytest.fixture(scope="module", params=["inferred", "json"])
def written(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("language-lerobot") / "ds"
    shutil.rmtree(root, ignore_errors=True)
    return write_language_dataset(root, json_tool_calls=request.param == "json")


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
    for batch in EpisodeLoader(EpisodeStreamingDataset(written, seed=7), batch_size=4, language_columns="keep"):
        for j, index in enumerate(batch["index"].tolist()):
            _same({key: batch[key][j] for key in KEYS}, theirs[index])
    # LeRobot 0.6.1's lerobot_collate_fn drops the language columns from its batches, and so does
    # episodestream.collate; language_columns="keep" keeps them, one list entry per sample.
    samples = [theirs[i] for i in range(4)]
    dropped, kept = lerobot_collate_fn(samples), episodestream.collate(samples, language_columns="keep")
    assert not set(KEYS) & set(dropped) and not set(KEYS) & set(episodestream.collate(samples))
    assert all(kept[key] == [s[key] for s in samples] for key in KEYS)
    assert all(torch.equal(kept[key], value) for key, value in dropped.items() if isinstance(value, torch.Tensor))
