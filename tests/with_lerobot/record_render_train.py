"""``lerobot-train ARGS`` with each sample rendered by ``render_recipe.render`` (LeRobot's
``RenderMessagesStep``) before LeRobot's ``lerobot_collate_fn`` collates it, recording every
training step in ``$RECORD_DIR/steps.jsonl``: the batch's keys, its samples' ``index``, its
``messages`` / ``message_streams`` / ``target_message_indices`` and the step's loss.
``$RUNNER``: "lerobot" runs LeRobot's own ``lerobot_train.main``, "episodestream" runs
``episodestream lerobot-train`` (the same trainer on episodestream's datasets)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from lerobot.scripts import lerobot_train
from lerobot.utils.collate import lerobot_collate_fn

from tests.with_lerobot.render_recipe import render

original_update = lerobot_train.update_policy


def rendering_collate(batch):
    return lerobot_collate_fn([render(sample) for sample in batch])


def recording_update(train_metrics, policy, batch, *args, **kwargs):
    result = original_update(train_metrics, policy, batch, *args, **kwargs)
    step = {"keys": sorted(batch), "index": batch["index"].tolist(), "loss": train_metrics.loss.val,
            **{key: batch.get(key) for key in ("messages", "message_streams", "target_message_indices")}}
    with open(Path(os.environ["RECORD_DIR"]) / "steps.jsonl", "a") as out:
        out.write(json.dumps(step) + "\n")
    return result


if __name__ == "__main__":
    lerobot_train.update_policy = recording_update
    lerobot_train.lerobot_collate_fn = rendering_collate
    if os.environ["RUNNER"] == "lerobot":
        sys.argv = ["lerobot-train", *sys.argv[1:]]
        lerobot_train.main()
        sys.exit(0)
    from episodestream.tools.lerobot_train import main

    sys.exit(main(sys.argv[1:]))
