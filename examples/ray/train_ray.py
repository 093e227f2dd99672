"""Ray Train on episodestream, with exact resume from Ray Train's checkpoints.

    .venv/bin/python examples/ray/train_ray.py --num-workers 2                 # a synthetic dataset, 2 CPU workers
    .venv/bin/python examples/ray/train_ray.py --dataset /data/robocasa --num-workers 8 --use-gpu

``TorchTrainer`` starts ``--num-workers`` processes joined by a process group (gloo on CPU). Each
builds its own ``EpisodeStreamingDataset``, which reads its rank and world size from that group and
streams a disjoint share of each epoch, and an ``EpisodeLoader`` (decode threads in the worker).
Every ``--checkpoint-every`` steps rank 0 puts the loader's ``state_dict()`` (one small JSON dict,
the same on every rank) beside the model in a ``ray.train.Checkpoint``. When a worker fails,
``FailureConfig(max_failures=...)`` restarts the group and each worker resumes from the latest
checkpoint: with the same number of workers exactly (the batches it would have seen, in order);
rerun with the same ``--name`` and ``--storage-path`` and another ``--num-workers`` and it resumes
elastically (every sample of the epoch not yet trained on comes once, in a new order).

``--fail-at-step K`` makes rank ``--fail-rank`` raise once at step K, to see the restart;
``--record-dir`` writes, per rank, the (episode, frame) of every sample the checkpointed steps
trained on (written when the checkpoint is saved, so the steps a failure rolls back are not in it):
tests/test_ray_train.py checks every sample of the epoch comes once.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn as nn

RECORD_FILE = "rank{rank}.jsonl"


class TinyPolicy(nn.Module):
    """State + one camera -> action: just enough model to exercise the training loop."""

    def __init__(self, state_dim: int, action_dim: int) -> None:
        super().__init__()
        self.vision = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(8 + state_dim, 64), nn.ReLU(), nn.Linear(64, action_dim))

    def forward(self, image: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.vision(image), state], dim=-1))


def build(config: dict) -> tuple:
    """This rank's dataset, loader, model and the camera it reads: ``(dataset, loader, model, camera)``.
    Rank and world size come from the process group the launcher set up (TorchTrainer's, or
    ``accelerate launch``'s in benchmarks/ray/benchmark_ray_train.py): no sampler, no sharding here."""
    from episodestream import EpisodeLoader, EpisodeStreamingDataset

    dataset = EpisodeStreamingDataset(config["dataset"], seed=config["seed"])
    loader = EpisodeLoader(dataset, config["batch_size"], num_threads=config["num_threads"])
    camera = dataset.meta.video_keys[0]
    features = dataset.meta.features
    model = TinyPolicy(features["observation.state"]["shape"][0], features["action"]["shape"][0])
    return dataset, loader, model, camera


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict, camera: str) -> torch.Tensor:
    """One optimizer step on ``batch`` (DDP all-reduces the gradients in ``backward``); returns the loss."""
    loss = nn.functional.mse_loss(model(batch[camera], batch["observation.state"]), batch["action"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def train_loop(config: dict) -> None:
    """What each Ray Train worker runs."""
    import ray.train
    import ray.train.torch

    rank = ray.train.get_context().get_world_rank()
    dataset, loader, model, camera = build(config)
    step = 0
    checkpoint = ray.train.get_checkpoint()  # the latest one: after a restart, or a rerun of the same run
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            model.load_state_dict(torch.load(Path(folder) / "model.pt"))
            saved = json.loads((Path(folder) / "train_state.json").read_text())
        loader.load_state_dict(saved["stream"])  # exact with the saving world size, elastic with another
        step = saved["step"]
    model = ray.train.torch.prepare_model(model)  # DDP over the group
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    record = Path(config["record_dir"]) / RECORD_FILE.format(rank=rank) if config["record_dir"] else None
    trained: list[tuple[int, int]] = []  # samples of the steps since the last checkpoint

    def save() -> None:
        if record is not None:  # this rank's steps up to the checkpoint, now part of it
            with record.open("a") as out:
                out.writelines(json.dumps(pair) + "\n" for pair in trained)
            trained.clear()
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:  # every rank's loader state is the same: one copy
                torch.save(model.module.state_dict() if hasattr(model, "module") else model.state_dict(),
                           Path(folder) / "model.pt")
                state = {"step": step, "stream": loader.state_dict()}
                (Path(folder) / "train_state.json").write_text(json.dumps(state))
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report({"step": step, "epoch": loader.dataset.epoch}, checkpoint=checkpoint)

    while dataset.epoch < config["epochs"]:
        for batch in loader:
            step += 1
            trained += zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())
            train_step(model, optimizer, batch, camera)
            if step == config["fail_at_step"] and rank == config["fail_rank"]:
                marker = Path(config["storage_path"]) / f"{config['name']}.failed-once"
                if not marker.exists():  # once: the restarted worker goes past this step
                    marker.touch()
                    raise RuntimeError(f"injected failure at step {step} on rank {rank}")
            if step % config["checkpoint_every"] == 0:
                save()
            if config["max_steps"] and step >= config["max_steps"]:
                break
        if config["max_steps"] and step >= config["max_steps"]:
            break
    if trained:
        save()  # the steps after the last checkpoint
    loader.close()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", help="LeRobot dataset (default: a synthetic one under --storage-path)")
    parser.add_argument("--storage-path", default="outputs/train_ray", help="where Ray Train keeps checkpoints")
    parser.add_argument("--name", default="train_ray", help="the run's name; rerun the same name to resume it")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--num-threads", type=int, default=1, help="EpisodeLoader decode threads per worker")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=5, help="steps between checkpoints")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    parser.add_argument("--max-failures", type=int, default=1, help="worker-group restarts Ray Train may do")
    parser.add_argument("--fail-at-step", type=int, default=0, help="inject one failure at this step (0: none)")
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--record-dir", default=None, help="write each rank's trained (episode, frame) here")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    args = parse_args(argv)
    storage = Path(args.storage_path).resolve()
    dataset = args.dataset
    if dataset is None:
        from episodestream.tools.synthetic import write_synthetic_dataset

        dataset = storage / "synthetic"
        if not (dataset / "meta" / "info.json").exists():
            write_synthetic_dataset(dataset, num_episodes=8, episode_length=(20, 60), overwrite=True)
    if args.record_dir:
        Path(args.record_dir).mkdir(parents=True, exist_ok=True)
    if not ray.is_initialized():
        ray.init()
    config = {"dataset": str(dataset), "seed": args.seed, "batch_size": args.batch_size,
              "num_threads": args.num_threads, "epochs": args.epochs, "checkpoint_every": args.checkpoint_every,
              "max_steps": args.max_steps, "fail_at_step": args.fail_at_step, "fail_rank": args.fail_rank,
              "record_dir": args.record_dir and str(Path(args.record_dir).resolve()),
              "storage_path": str(storage), "name": args.name}
    trainer = TorchTrainer(
        train_loop, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=RunConfig(name=args.name, storage_path=str(storage),
                             failure_config=FailureConfig(max_failures=args.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)))
    result = trainer.fit()
    print(f"done: step {result.metrics.get('step')}, checkpoint {result.checkpoint}")


if __name__ == "__main__":
    main()
