"""The same samples in the same order for the same seeds as the code before the resume record
(issue 66 item 1): every scenario of ``tests/resume_orders.py`` against the order it recorded then
(``tests/data/resume_orders.json``, written at commit d0e64df)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import resume_orders

RECORDED = json.loads((Path(__file__).parent / "data" / "resume_orders.json").read_text())

pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed (test extra)")
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    return resume_orders.write_datasets(tmp_path_factory.mktemp("resume_orders"))


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_resumed_order_is_the_recorded_one(roots, name):
    assert resume_orders.scenarios(roots)[name]() == RECORDED[name]


def test_every_scenario_is_recorded():
    assert sorted(resume_orders.scenarios((Path("a"), Path("b")))) == sorted(RECORDED)
