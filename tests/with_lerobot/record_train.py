"""``episodestream lerobot-train ARGS`` that also records, per rank, the ``index`` of every sample
each training step consumed: one JSON line per step in ``$RECORD_DIR/rank<r>.jsonl``. The tests in
this folder run it (as a script, under ``python`` or ``accelerate launch``) to compare runs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from lerobot.scripts import lerobot_train

from episodestream.tools.lerobot_train import main

original_update = lerobot_train.update_policy


def recording_update(train_metrics, policy, batch, *args, **kwargs):
    rank = int(os.environ.get("RANK", "0"))
    with open(Path(os.environ["RECORD_DIR"]) / f"rank{rank}.jsonl", "a") as out:
        out.write(json.dumps(batch["index"].tolist()) + "\n")
    return original_update(train_metrics, policy, batch, *args, **kwargs)


if __name__ == "__main__":
    lerobot_train.update_policy = recording_update
    sys.exit(main(sys.argv[1:]))
