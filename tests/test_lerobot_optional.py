"""LeRobot is optional: ``episodestream.lerobot`` imports without it and says how to install it
when called; ``episodestream lerobot-train`` says so too (tests/with_lerobot runs them with it)."""

from __future__ import annotations

import importlib.util

import pytest

import episodestream.lerobot
from episodestream.tools.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lerobot") is not None,
                                reason="LeRobot is installed: tests/with_lerobot runs these for real")


def test_factory_says_how_to_install_lerobot():
    with pytest.raises(ImportError, match=r"needs LeRobot 0.6 \(pip install 'episodestream\[lerobot\]'\)"):
        episodestream.lerobot.make_train_eval_datasets(object())


def test_lerobot_train_says_how_to_install_lerobot(capsys):
    assert main(["lerobot-train", "--dataset.repo_id=lerobot/pusht", "--policy.type=act"]) == 2
    assert "pip install 'episodestream[lerobot]'" in capsys.readouterr().err
