"""2 CPU processes (gloo) as `accelerate launch` starts them (forked: forked_ranks.py):
``accelerator.prepare(DataLoader(dataset))``
re-shards what our dataset already split by rank, and the first batch says so; the Accelerator
``episodestream lerobot-train`` builds places the loader on the device only, so the 2 ranks together
see every frame of the epoch once (the dispatcher, Accelerate's default, is checked in one process
in tests/test_accelerate_guard.py; with LeRobot, tests/with_lerobot trains on 2 processes)."""

from __future__ import annotations

import json

import pytest

from .forked_ranks import run_forked_ranks
from .test_streaming_distributed import skip_unless_two_processes_can_run

pytestmark = pytest.mark.distributed


def test_prepare_is_refused_and_lerobot_trains_accelerator_covers_the_epoch(camera_less_root, tmp_path):
    skip_unless_two_processes_can_run()
    from . import accelerate_prepare

    run_forked_ranks(lambda: accelerate_prepare.main(str(camera_less_root), str(tmp_path)))
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in records] == [2, 2], "the processes did not form a group of 2"
    for record in records:
        assert "IterableDatasetShard" in record["refused"] and f"rank {record['rank']} of 2" in record["refused"]
    seen = records[0]["indices"] + records[1]["indices"]
    frames = 154  # camera_less_root: sum(TABULAR_LENGTHS)
    assert len(records[0]["indices"]) == len(records[1]["indices"]) == frames // 2
    assert sorted(seen) == list(range(frames)), "every frame once across the 2 ranks"
