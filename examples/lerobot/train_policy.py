"""Train a LeRobot policy (default ACT) on a streamed LeRobot v3.0 dataset, on CPU or GPU, resumably.

    bash scripts/setup.sh --lerobot   # LeRobot into .venv; it needs Python >= 3.12 (in an environment of your own: python -m pip install -e '.[lerobot]')
    .venv/bin/python examples/lerobot/train_policy.py --steps 2000 --dataset lerobot/aloha_sim_insertion_human
    .venv/bin/python examples/lerobot/train_policy.py --steps 2 --policy-option pretrained_backbone_weights=null  # synthetic data, offline

ACT's (and Diffusion's) ResNet backbone downloads its ImageNet weights when the policy is built;
``--policy-option pretrained_backbone_weights=null`` trains it from scratch with no download, which is
what the offline command passes (drop it for pretrained features when a network is there).

What LeRobot's own training script does, with ``EpisodeStreamingDataset`` in place of
``LeRobotDataset``: ``dataset.meta`` answers LeRobot's metadata calls, so the policy's windows come
from ``resolve_delta_timestamps(cfg, dataset.meta)``, the policy from ``make_policy(cfg,
ds_meta=dataset.meta)`` and the normalizers from ``make_pre_post_processors(cfg,
dataset_stats=dataset.meta.stats)``. ``--dataset`` is a folder, a Hub repo id or a URL (``hf://``,
``s3://``, ...); without it a synthetic dataset is written under ``--output-dir``.

Every ``--checkpoint-every`` steps the policy, the optimizer and the stream position are saved to
``OUTPUT_DIR/checkpoint``; running the same command again resumes there, with exactly the samples
the interrupted run would have seen next (see ``docs/resume.md``). At the end the policy and its
processors are saved with LeRobot's ``save_pretrained`` to ``OUTPUT_DIR/pretrained_model``.
``--policy-option key=value`` sets a field of the policy's config (the value is JSON), e.g.
``--policy-option chunk_size=20 --policy-option pretrained_backbone_weights=null``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.utils.data

from episodestream import EpisodeLoader, EpisodeStreamingDataset
from episodestream.tools.synthetic import write_synthetic_dataset

INSTALL_HINT = "This example needs LeRobot: pip install lerobot (LeRobot needs Python >= 3.12)."


def make_loader(dataset: EpisodeStreamingDataset, args: argparse.Namespace) -> EpisodeLoader:
    """Batches built on decode threads in this process; the loader knows its position
    (``state_dict()`` / ``load_state_dict()``), so the checkpoint needs no batch count."""
    return EpisodeLoader(dataset, args.batch_size, num_threads=args.num_threads,
                         pin_memory=args.device == "cuda" and torch.cuda.is_available())


def _policy_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--policy-option must be KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a bare string, e.g. vision_backbone=resnet34


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", help="LeRobot v3.0 dataset: folder, Hub repo id or URL "
                                          "(default: a synthetic one under OUTPUT_DIR)")
    parser.add_argument("--revision", help="Hub revision (branch, tag or commit) of --dataset")
    parser.add_argument("--cache-dir", help="node cache for remote datasets (default: ~/.cache/episodestream)")
    parser.add_argument("--policy", default="act", help="LeRobot policy type (act, diffusion, pi0, smolvla, ...)")
    parser.add_argument("--policy-option", action="append", type=_policy_option, default=[], metavar="KEY=VALUE",
                        help="set a field of the policy config; VALUE is JSON (repeatable)")
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps in all (a resumed run counts on)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the policy's own)")
    parser.add_argument("--num-threads", type=int, default=None,
                        help="EpisodeLoader decode threads (default: the cores this process may use)")
    parser.add_argument("--pool-size", type=lambda v: v if v == "auto" else int(v), default="auto",
                        help="episodes each consumer holds: an int, or 'auto' (the library's default)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    parser.add_argument("--output-dir", default="outputs/lerobot_train_policy")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (0: none)")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "pool_size", "log_every"):
        if getattr(args, name) != "auto" and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def ensure_dataset(args: argparse.Namespace) -> str:
    if args.dataset:
        return args.dataset
    root = Path(args.output_dir) / "synthetic"
    if not (root / "meta" / "info.json").exists():
        print(f"writing a synthetic dataset (8 episodes of 20-60 frames, AV1 video) to {root} ...", flush=True)
        write_synthetic_dataset(root, num_episodes=8, episode_length=(20, 60), overwrite=True)
    return str(root)


def _import_lerobot():
    try:
        from lerobot.datasets.factory import resolve_delta_timestamps
        from lerobot.policies.factory import make_policy, make_policy_config, make_pre_post_processors
    except ImportError as error:
        raise SystemExit(f"{INSTALL_HINT} ({error})") from None
    return resolve_delta_timestamps, make_policy, make_policy_config, make_pre_post_processors


def _save(checkpoint: Path, *, policy, optimizer, loader: EpisodeLoader, step: int) -> None:
    # Written beside the final folder and renamed, so a kill mid-save leaves the previous checkpoint.
    partial = checkpoint.with_name(checkpoint.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    torch.save({"policy": policy.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
               partial / "training_state.pt")
    (partial / "stream_state.json").write_text(json.dumps(loader.state_dict()))
    previous = checkpoint.with_name(checkpoint.name + ".previous")
    if checkpoint.exists():
        checkpoint.rename(previous)
    partial.rename(checkpoint)
    if previous.exists():
        for path in previous.iterdir():
            path.unlink()
        previous.rmdir()


def main(argv=None) -> int:
    args = parse_args(argv)
    # Nothing else is printed until the first step's line: say what the slow parts are doing.
    print("importing LeRobot and its policies ...", flush=True)
    resolve_delta_timestamps, make_policy, make_policy_config, make_pre_post_processors = _import_lerobot()
    torch.manual_seed(args.seed)
    out = Path(args.output_dir)
    checkpoint = out / "checkpoint"
    source = ensure_dataset(args)
    print(f"building the {args.policy} policy and its normalizers for {source} ...", flush=True)

    cfg = make_policy_config(args.policy, device=args.device, **dict(args.policy_option))
    probe = EpisodeStreamingDataset(source, revision=args.revision, cache_dir=args.cache_dir)
    delta_timestamps = resolve_delta_timestamps(cfg, probe.meta)  # the policy's own windows
    dataset = EpisodeStreamingDataset(source, revision=args.revision, cache_dir=args.cache_dir,
                                      delta_timestamps=delta_timestamps, episode_pool_size=args.pool_size,
                                      seed=args.seed)
    probe.close()
    policy = make_policy(cfg, ds_meta=dataset.meta)
    preprocessor, postprocessor = make_pre_post_processors(policy.config, dataset_stats=dataset.meta.stats)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr or getattr(cfg, "optimizer_lr", 1e-4))
    loader = make_loader(dataset, args)

    step = 0
    if (checkpoint / "training_state.pt").exists():
        saved = torch.load(checkpoint / "training_state.pt", map_location=args.device, weights_only=True)
        policy.load_state_dict(saved["policy"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
        loader.load_state_dict(json.loads((checkpoint / "stream_state.json").read_text()))
        print(f"resumed at step {step} (epoch {dataset.epoch})", flush=True)

    policy.train()
    print(f"training to step {args.steps} on {args.device}, batches of {args.batch_size}; a line every "
          f"{args.log_every} steps ...", flush=True)
    start, frames = time.perf_counter(), 0
    while step < args.steps:
        for batch in loader:
            loss, _ = policy.forward(preprocessor(batch))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            frames += len(batch["index"])
            if step % args.log_every == 0 or step == args.steps:
                rate = frames / (time.perf_counter() - start)
                print(f"step {step}: loss {loss.item():.4f}, epoch {dataset.epoch}, {rate:.1f} samples/s", flush=True)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                _save(checkpoint, policy=policy, optimizer=optimizer, loader=loader, step=step)
            if step >= args.steps:
                break
    _save(checkpoint, policy=policy, optimizer=optimizer, loader=loader, step=step)
    policy.save_pretrained(out / "pretrained_model")
    preprocessor.save_pretrained(out / "pretrained_model")
    postprocessor.save_pretrained(out / "pretrained_model")
    dataset.close()
    print(f"done: {step} steps; policy and processors in {out / 'pretrained_model'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
