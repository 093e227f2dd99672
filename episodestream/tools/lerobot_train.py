"""``episodestream lerobot-train ARGS...``: LeRobot's own ``lerobot_train`` on episodestream's datasets.

The arguments are ``lerobot-train``'s (``--dataset.repo_id``, ``--dataset.root``,
``--dataset.streaming``, ``--policy.type``, ``--output_dir``, ``--steps``, ``--save_freq``,
``--config_path=... --resume=true``, ...). LeRobot's ``train()`` runs unchanged; for the run, four of
the names it looks up are replaced (and restored afterwards):

- ``make_train_eval_datasets`` -> ``episodestream.lerobot.make_train_eval_datasets``; on
  ``--resume=true`` a streaming train dataset also loads the stream state saved with the checkpoint
  (a checkpoint of another dataset, episode selection or seed is refused there, naming the fields,
  before any training step);
- ``cycle`` (how the trainer loops over its DataLoader) -> the same loop, counting the batches
  taken from the current epoch, which is the position a checkpoint records;
- ``save_checkpoint`` -> LeRobot's, then the stream state written beside LeRobot's training state,
  ``<checkpoint>/training_state/episodestream_stream_state.json``;
- ``accelerate.Accelerator`` -> a subclass whose ``prepare`` gives a DataLoader over an
  ``EpisodeStreamingDataset`` device placement only. The dataset already streams only its rank's
  share of the epoch; Accelerate's own wrapping of an IterableDataset on several processes (a
  dispatcher iterating on process 0, or a shard keeping one batch in N) would train on 1/N of each
  epoch (see ``_runtime.accelerate_guard``). It also keeps the DataLoader wrapper's epoch counter
  on the dataset's epoch: Accelerate calls ``dataset.set_epoch(its counter)`` at every pass, which
  after a resume would restart epoch 0.

So the stream resumes exactly where the checkpoint's step left it (same process count and workers),
or elastically (the rest of the epoch split afresh) when ``accelerate launch --num_processes``
or ``--num_workers`` changed. Map-style training (``--dataset.streaming=false``) resumes through
LeRobot's own ``EpisodeAwareSampler`` state, as in LeRobot.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

from episodestream._plan.saved_state import STRICT_HINT
from episodestream._runtime.face import load_trainer_state
from episodestream.streaming import EpisodeStreamingDataset, stream_state

STATE_FILE = "episodestream_stream_state.json"
TRAINING_STATE_DIR = "training_state"  # lerobot.utils.constants.TRAINING_STATE_DIR


def state_path(checkpoint_dir: str | os.PathLike) -> Path:
    """Where a checkpoint keeps the stream state."""
    return Path(checkpoint_dir) / TRAINING_STATE_DIR / STATE_FILE


class _BeforeTraining(Exception):
    """What the configuration or checkpoint got wrong, found before the first step: ``main`` prints
    it as one line (its message names the field) instead of LeRobot's traceback."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")


class _Run:
    """What one process of a training run keeps: its streaming dataset, the loader the trainer
    loops over, and the batches it has taken from the current epoch (from the epoch's start)."""

    def __init__(self, original_cycle) -> None:
        self.dataset: EpisodeStreamingDataset | None = None
        self.loader: Any = None
        self.batches = 0
        self._original_cycle = original_cycle

    def make_train_eval_datasets(self, cfg: Any):
        from episodestream.lerobot import make_train_eval_datasets

        try:
            train, held_out = make_train_eval_datasets(cfg)
            if isinstance(train, EpisodeStreamingDataset):
                self.dataset = train
                if cfg.resume:
                    self._resume(cfg.checkpoint_path, train, num_workers=cfg.num_workers)
        except (OSError, ValueError, TypeError, NotImplementedError) as error:
            raise _BeforeTraining(error) from error
        return train, held_out

    def _resume(self, checkpoint_path: str | os.PathLike, dataset: EpisodeStreamingDataset, *,
                num_workers: int) -> None:
        path = state_path(checkpoint_path)
        if not path.is_file():
            raise ValueError(f"--resume=true: the checkpoint {checkpoint_path} has no {TRAINING_STATE_DIR}/{STATE_FILE}, "
                             f"so where its data stream stopped is unknown (it was not saved by 'episodestream "
                             f"lerobot-train' with --dataset.streaming=true). Resume it with the tool that trained "
                             f"it, or start a new run.")
        state = json.loads(path.read_text())
        try:
            # dataset.load_state_dict(state), logging what it resumed ("resumed epoch E at batch B (exact)")
            # with this run's DataLoader workers.
            load_trainer_state(dataset, state, num_workers=num_workers)
        except ValueError as error:
            # strict=False is no option here: say what a command-line user can change instead.
            why = str(error).removesuffix(STRICT_HINT)
            raise ValueError(f"--resume=true: the stream state in {path} was saved by another run: {why} Resume with "
                             f"that run's settings (its --config_path holds them; drop the options that differ), "
                             f"or train afresh with another --output_dir.") from error
        # Unfinished epoch: the count goes on from the checkpoint's (a stream state counts from the
        # epoch's start, across resumes); a finished one: the next epoch starts from 0.
        self.batches = int(state["batches_consumed"]) if dataset.epoch == state["epoch"] else 0

    def cycle(self, iterable: Any) -> Iterator[Any]:
        if self.dataset is None or getattr(iterable, "dataset", None) is not self.dataset:
            yield from self._original_cycle(iterable)
            return
        self.loader = iterable
        while True:
            for batch in iterable:
                self.batches += 1
                yield batch
            self.batches = 0  # the next pass is the next epoch (the dataset advances by itself)

    def save_checkpoint(self, original, checkpoint_dir, *args: Any, **kwargs: Any) -> None:
        original(checkpoint_dir, *args, **kwargs)
        if self.dataset is None or self.loader is None:
            return
        # Every rank takes one batch per step and has the same number of batches per epoch, so the
        # main process's count (it alone saves) is every rank's.
        loader = getattr(self.loader, "base_dataloader", self.loader)
        path = state_path(checkpoint_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(stream_state(loader, self.batches), indent=1))
        partial.replace(path)


def _accelerator_class(base: type) -> type:
    """``base`` (Accelerate's Accelerator) whose ``prepare`` places an ``EpisodeStreamingDataset``'s
    DataLoader on the device without sharding it again (see the module docstring)."""

    class EpisodeAccelerator(base):  # type: ignore[misc, valid-type]
        def prepare_data_loader(self, data_loader, device_placement=None, slice_fn_for_dispatch=None):
            dataset = getattr(data_loader, "dataset", None)
            if not isinstance(dataset, EpisodeStreamingDataset):
                return super().prepare_data_loader(data_loader, device_placement=device_placement,
                                                   slice_fn_for_dispatch=slice_fn_for_dispatch)
            from accelerate.data_loader import prepare_data_loader

            prepared = prepare_data_loader(
                data_loader, self.device, num_processes=1, process_index=0,
                put_on_device=self.device_placement if device_placement is None else device_placement,
                rng_types=None, dispatch_batches=False, non_blocking=self.non_blocking)
            prepared.iteration = dataset.epoch  # Accelerate sets the dataset's epoch to this at every pass
            self._dataloaders.append(prepared)
            return prepared

    EpisodeAccelerator.__name__ = EpisodeAccelerator.__qualname__ = base.__name__
    return EpisodeAccelerator


def main(argv: list[str]) -> int:
    """Run LeRobot's ``lerobot_train`` with ``argv`` (its own arguments) on episodestream's datasets."""
    try:
        import accelerate
        from lerobot.scripts import lerobot_train
    except ImportError as error:
        from episodestream.lerobot import INSTALL_HINT

        print(f"episodestream lerobot-train needs LeRobot 0.6 with its training extra ({INSTALL_HINT}): {error}",
              file=sys.stderr)
        return 2
    run = _Run(lerobot_train.cycle)
    original_save = lerobot_train.save_checkpoint
    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(lerobot_train, "make_train_eval_datasets", run.make_train_eval_datasets))
        patches.enter_context(mock.patch.object(lerobot_train, "cycle", run.cycle))
        patches.enter_context(mock.patch.object(
            lerobot_train, "save_checkpoint", lambda *a, **k: run.save_checkpoint(original_save, *a, **k)))
        patches.enter_context(mock.patch.object(accelerate, "Accelerator", _accelerator_class(accelerate.Accelerator)))
        # LeRobot's config parser reads sys.argv itself (draccus, plugins, --config_path).
        patches.enter_context(mock.patch.object(sys, "argv", ["lerobot-train", *argv]))
        try:
            lerobot_train.main()
        except _BeforeTraining as error:
            print(f"episodestream lerobot-train: {error}", file=sys.stderr)
            return 1
    return 0
