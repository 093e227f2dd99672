"""Run in 2 ranks by test_accelerate_prepare.py (or under ``accelerate launch``): on every process, a DataLoader over
this rank's EpisodeStreamingDataset goes through ``accelerator.prepare`` twice. Accelerate's own
prepare (dispatch_batches=False) must raise on the first batch; the Accelerator that
``episodestream lerobot-train`` uses must give every frame of the epoch once across the ranks.
Each process writes what it saw to OUT/rank<r>.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration

from episodestream import EpisodeStreamingDataset
from episodestream.tools.lerobot_train import _accelerator_class


def main(dataset: str, out: str) -> int:
    accelerator = _accelerator_class(Accelerator)(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))
    plain = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))
    stream = EpisodeStreamingDataset(dataset, seed=0)
    try:
        next(iter(plain.prepare(torch.utils.data.DataLoader(stream, batch_size=4))))
        refused = None
    except RuntimeError as error:
        refused = str(error)
    loader = accelerator.prepare(torch.utils.data.DataLoader(EpisodeStreamingDataset(dataset, seed=0), batch_size=4))
    indices = [i for batch in loader for i in batch["index"].tolist()]
    record = {"rank": accelerator.process_index, "world_size": accelerator.num_processes, "refused": refused,
              "indices": indices}
    (Path(out) / f"rank{accelerator.process_index}.json").write_text(json.dumps(record))
    accelerator.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
