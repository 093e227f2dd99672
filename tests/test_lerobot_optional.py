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
    # episodestream is on no package index: 'episodestream[lerobot]' did not resolve (issue 49 item 4).
    with pytest.raises(ImportError, match=r"needs LeRobot 0.6 \(pip install 'lerobot\[training\]>=0.6,<0.7', which "
                                          r"needs Python >= 3.12; from a checkout: pip install -e '.\[lerobot\]'"):
        episodestream.lerobot.make_train_eval_datasets(object())


def test_lerobot_train_says_how_to_install_lerobot(capsys):
    assert main(["lerobot-train", "--dataset.repo_id=lerobot/pusht", "--policy.type=act"]) == 2
    err = capsys.readouterr().err
    assert "pip install -e '.[lerobot]'" in err and "scripts/setup.sh --lerobot" in err and "episodestream[" not in err
