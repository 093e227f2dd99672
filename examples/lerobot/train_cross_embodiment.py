"""Train one LeRobot policy (default ACT) on two robots at once: different state widths, different cameras.

    bash scripts/setup.sh --lerobot   # LeRobot into .venv; it needs Python >= 3.12 (in an environment of your own: python -m pip install -e '.[lerobot]')
    .venv/bin/python examples/lerobot/train_cross_embodiment.py --steps 2 --policy-option pretrained_backbone_weights=null  # two synthetic robots, offline
    .venv/bin/python examples/lerobot/train_cross_embodiment.py --steps 2000 --datasets /data/arm6 /data/bimanual14

ACT's ResNet backbone downloads its ImageNet weights when the policy is built;
``--policy-option pretrained_backbone_weights=null`` (the offline command) trains it from scratch instead.

The two datasets are mixed by ``EpisodeMixture(keys="union", weights=...)``: a sample of the
narrower robot has its ``observation.state`` and ``action`` zero-padded to the widest robot's
width (``<key>_dim_mask`` says which dimensions are real), and a camera it lacks comes as a zero
frame with ``<key>_is_missing`` True. ``mixture.meta.features`` is the mixture's own feature table,
so ``make_policy(cfg, ds_meta=mixture.meta)`` builds a policy of the mixture's widths and cameras.

Normalization is per embodiment: joint angles of one robot and gripper widths of another do not
share a mean. Each batch's ``observation.state`` and ``action`` are normalized here with their own
component's exact statistics (``mixture.meta.component_stats[dataset_index]``, whose padded
dimensions are the identity, so the padding stays zero); LeRobot's processors then get identity
statistics for those two keys and the mixture's ``meta.stats`` for the cameras. At inference, a
robot's actions are un-normalized with its own component's statistics (``--save-stats`` writes them).

``--datasets`` are folders, Hub repo ids or URLs; without it two synthetic robots are written under
``--output-dir``. ``--policy-option key=value`` sets a field of the policy's config (JSON value).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from episodestream import EpisodeLoader, EpisodeMixture, EpisodeStreamingDataset
from episodestream.tools.synthetic import write_synthetic_dataset

INSTALL_HINT = "This example needs LeRobot: pip install lerobot (LeRobot needs Python >= 3.12)."
PER_EMBODIMENT = ("observation.state", "action")  # normalized with each robot's own statistics


def _policy_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--policy-option must be KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", help="LeRobot v3.0 datasets of different robots (default: two "
                                                      "synthetic ones under OUTPUT_DIR)")
    parser.add_argument("--weights", nargs="+", type=float, help="each dataset's share of the samples (default: "
                                                                 "by frames)")
    parser.add_argument("--policy", default="act", help="LeRobot policy type (act, diffusion, ...)")
    parser.add_argument("--policy-option", action="append", type=_policy_option, default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--num-threads", type=int, default=None, help="EpisodeLoader decode threads")
    parser.add_argument("--pool-size", type=lambda v: v if v == "auto" else int(v), default="auto",
                        help="episodes each consumer holds: an int, or 'auto' (the library's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output-dir", default="outputs/lerobot_train_cross_embodiment")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "pool_size", "log_every"):
        if getattr(args, name) != "auto" and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.weights is not None and args.datasets is not None and len(args.weights) != len(args.datasets):
        parser.error(f"--weights needs one weight per dataset ({len(args.datasets)}), got {len(args.weights)}")
    return args


def synthetic_robots(out: Path) -> list[str]:
    """A 6-DoF arm with a front camera and a 14-DoF bimanual rig with front and wrist cameras."""
    robots = {"arm6": dict(state_dim=6, cameras=("observation.images.front",)),
              "bimanual14": dict(state_dim=14, cameras=("observation.images.front", "observation.images.wrist"))}
    roots = []
    for seed, (name, options) in enumerate(robots.items()):
        root = out / "synthetic" / name
        if not (root / "meta" / "info.json").exists():
            print(f"writing a synthetic robot ({name}: 4 episodes of 20-40 frames, AV1 video) to {root} ...", flush=True)
            write_synthetic_dataset(root, num_episodes=4, episode_length=(20, 40), seed=seed, overwrite=True,
                                    **options)
            info = json.loads((root / "meta" / "info.json").read_text())
            info["robot_type"] = name
            (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
        roots.append(str(root))
    return roots


def _import_lerobot():
    try:
        from lerobot.datasets.factory import resolve_delta_timestamps
        from lerobot.policies.factory import make_policy, make_policy_config, make_pre_post_processors
    except ImportError as error:
        raise SystemExit(f"{INSTALL_HINT} ({error})") from None
    return resolve_delta_timestamps, make_policy, make_policy_config, make_pre_post_processors


class PerEmbodimentNormalizer:
    """``(x - mean) / std`` with each sample's own component's statistics (``dataset_index``)."""

    def __init__(self, component_stats: list[dict], keys=PER_EMBODIMENT, eps: float = 1e-8) -> None:
        self._stats = {key: (torch.tensor(np.stack([s[key]["mean"] for s in component_stats]), dtype=torch.float32),
                             torch.tensor(np.stack([s[key]["std"] for s in component_stats]), dtype=torch.float32))
                       for key in keys}
        self._eps = eps

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        index = batch["dataset_index"]
        for key, (mean, std) in self._stats.items():
            value = batch[key]
            shape = (len(index),) + (1,) * (value.ndim - 2) + (value.shape[-1],)  # windows: broadcast over time
            batch[key] = (value - mean[index].reshape(shape)) / (std[index].reshape(shape) + self._eps)
        return batch


def processor_stats(meta) -> dict[str, dict[str, np.ndarray]]:
    """What LeRobot's processors normalize with: identity for the per-embodiment keys (normalized
    already), the mixture's statistics for the rest (cameras: the components' stats.json combined)."""
    stats = {key: dict(value) for key, value in meta.stats.items()}
    for key in PER_EMBODIMENT:
        shape = np.shape(stats[key]["mean"])
        stats[key] = {"mean": np.zeros(shape), "std": np.ones(shape), "min": -np.ones(shape),
                      "max": np.ones(shape), "q01": -np.ones(shape), "q99": np.ones(shape)}
    return stats


def main(argv=None) -> int:
    args = parse_args(argv)
    # Nothing else is printed until the mixture's features: say what the slow parts are doing.
    print("importing LeRobot and its policies ...", flush=True)
    resolve_delta_timestamps, make_policy, make_policy_config, make_pre_post_processors = _import_lerobot()
    torch.manual_seed(args.seed)
    out = Path(args.output_dir)
    sources = args.datasets or synthetic_robots(out)

    cfg = make_policy_config(args.policy, device=args.device, **dict(args.policy_option))
    probe = EpisodeStreamingDataset(sources[0])
    delta_timestamps = resolve_delta_timestamps(cfg, probe.meta)  # the policy's windows, in seconds
    probe.close()
    datasets = [EpisodeStreamingDataset(s, delta_timestamps=delta_timestamps, episode_pool_size=args.pool_size,
                                        seed=args.seed + i) for i, s in enumerate(sources)]
    mixture = EpisodeMixture(datasets, args.weights, seed=args.seed, keys="union")
    meta = mixture.meta
    print("mixture features: " + ", ".join(f"{k} {list(v['shape'])}" for k, v in meta.features.items()
                                           if k.startswith(("observation", "action"))), flush=True)
    print(f"building the {args.policy} policy and its normalizers ...", flush=True)
    policy = make_policy(cfg, ds_meta=meta)
    preprocessor, postprocessor = make_pre_post_processors(policy.config, dataset_stats=processor_stats(meta))
    per_embodiment = PerEmbodimentNormalizer(meta.component_stats)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr or getattr(cfg, "optimizer_lr", 1e-4))
    loader = EpisodeLoader(mixture, args.batch_size, num_threads=args.num_threads)

    policy.train()
    print(f"training {args.steps} steps on {args.device}, batches of {args.batch_size}; a line every "
          f"{args.log_every} steps ...", flush=True)
    step, frames, start = 0, 0, time.perf_counter()
    while step < args.steps:
        for batch in loader:
            loss, _ = policy.forward(preprocessor(per_embodiment(batch)))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            frames += len(batch["index"])
            if step % args.log_every == 0 or step == args.steps:
                robots = {str(r): int(n) for r, n in zip(*np.unique(batch["robot_type"], return_counts=True))}
                rate = frames / (time.perf_counter() - start)
                print(f"step {step}: loss {loss.item():.4f}, robots in batch {robots}, {rate:.1f} samples/s",
                      flush=True)
            if step >= args.steps:
                break
    loader.close()
    target = out / "pretrained_model"
    policy.save_pretrained(target)
    preprocessor.save_pretrained(target)
    postprocessor.save_pretrained(target)
    (target / "component_stats.json").write_text(json.dumps(
        [{key: {n: np.asarray(v).tolist() for n, v in s[key].items()} for key in PER_EMBODIMENT}
         for s in meta.component_stats], indent=2))
    for dataset in datasets:
        dataset.close()
    print(f"done: {step} steps; policy, processors and per-robot stats in {target}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
