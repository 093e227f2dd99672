"""LeRobot's dataset factory on episodestream's datasets.

``make_train_eval_datasets(cfg)`` takes LeRobot's ``TrainPipelineConfig`` and returns what
``lerobot.datasets.factory.make_train_eval_datasets`` returns, built on this library:
``cfg.dataset.streaming=true`` gives an ``EpisodeStreamingDataset``, false an ``EpisodeDataset``,
and a held-out ``eval_split`` an ``EpisodeDataset`` of the last ceil(n * eval_split) episodes of
each task, split exactly as LeRobot splits them. Their samples equal LeRobot's ``LeRobotDataset``'s
for the same arguments: what ``cfg.dataset`` names (``repo_id``/``root``, ``revision``,
``episodes``, ``image_transforms``, ``video_backend``, ``use_imagenet_stats``), the policy's
``delta_timestamps`` (LeRobot's own ``resolve_delta_timestamps``), ``cfg.tolerance_s``, and uint8
frames, which LeRobot 0.6's factory always asks for (its trainer divides them by 255; the
``dataset.return_uint8`` field is not read by that factory, so not here either).
In LeRobot's trainer the batches are LeRobot's too: it collates with ``lerobot_collate_fn`` when
``meta.has_language_columns`` (ours answers as LeRobot's), which leaves the raw language columns out
(``episodestream.collate`` is that collate; docs/lerobot.md, "Batches").
``episodestream lerobot-train`` runs LeRobot's trainer with this factory (``tools/lerobot_train``).

LeRobot is optional (``INSTALL_HINT``) and imported only when one of these
functions is called.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from episodestream._plan.splits import held_out_split
from episodestream.mapstyle import EpisodeDataset
from episodestream.streaming import EpisodeStreamingDataset

__all__ = ["make_dataset", "make_train_eval_datasets", "resolve_source"]


# episodestream is not on a package index: its extra installs from a checkout.
INSTALL_HINT = ("pip install 'lerobot[training]>=0.6,<0.7', which needs Python >= 3.12; from a checkout: "
                "pip install -e '.[lerobot]', or bash scripts/setup.sh --lerobot")


def _lerobot_factory():
    try:
        from lerobot.datasets import factory
    except ImportError as error:
        raise ImportError(f"episodestream.lerobot needs LeRobot 0.6 ({INSTALL_HINT}); "
                          f"importing lerobot failed: {error}") from error
    return factory


def resolve_source(dataset_cfg: Any) -> str | Path:
    """Where ``cfg.dataset`` points, as LeRobot reads it: ``root`` when given; else LeRobot's local
    copy ``$HF_LEROBOT_HOME/<repo_id>`` when it holds a dataset; else the Hub repo ``repo_id``,
    which is streamed (LeRobot would download the whole repo there first)."""
    if getattr(dataset_cfg, "repo_type", "dataset") != "dataset":
        raise ValueError(f"Invalid dataset.repo_type ({dataset_cfg.repo_type!r}). Supported values are 'dataset' "
                         f"(an HF Storage Bucket is not readable here yet).")
    if not isinstance(dataset_cfg.repo_id, str):
        raise NotImplementedError(f"dataset.repo_id must name one dataset, got {dataset_cfg.repo_id!r}: LeRobot's "
                                  f"MultiLeRobotDataset is not supported (nor is it by LeRobot's own factory).")
    if dataset_cfg.root is not None:
        root = Path(dataset_cfg.root).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"dataset.root={os.fspath(dataset_cfg.root)!r} is not a folder: "
                                    f"{'it is a file' if root.exists() else 'nothing is there'}. Pass the folder "
                                    f"holding the dataset's meta/info.json, or no root to read dataset.repo_id "
                                    f"from the Hub.")
        return root
    from lerobot.utils.constants import HF_LEROBOT_HOME

    local = Path(HF_LEROBOT_HOME) / dataset_cfg.repo_id
    return local if (local / "meta" / "info.json").is_file() else dataset_cfg.repo_id


def _open(cls: type, cfg: Any, source: str | Path, **kwargs: Any):
    """``cls(source, **kwargs)``; an error names the config fields that chose the source."""
    named = f"dataset.root={os.fspath(cfg.dataset.root)!r}" if cfg.dataset.root is not None else \
        f"dataset.repo_id={cfg.dataset.repo_id!r}"
    try:
        return cls(source, **kwargs)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"{named} (episodes={cfg.dataset.episodes!r}, revision={cfg.dataset.revision!r}, "
                         f"video_backend={cfg.dataset.video_backend!r}): {error}") from error


def _common_options(cfg: Any, delta_timestamps: dict[str, list[float]] | None) -> dict[str, Any]:
    # Depth cameras come out in cfg.dataset.depth_output_unit, as LeRobot's factory asks of its map-style
    # dataset (its streaming dataset refuses depth; ours reads it either way).
    return {"revision": cfg.dataset.revision, "delta_timestamps": delta_timestamps, "tolerance_s": cfg.tolerance_s,
            "return_uint8": True, "video_backend": cfg.dataset.video_backend,
            "depth_output_unit": getattr(cfg.dataset, "depth_output_unit", "mm")}


def _image_transforms(cfg: Any):
    from lerobot.transforms import ImageTransforms

    return ImageTransforms(cfg.dataset.image_transforms) if cfg.dataset.image_transforms.enable else None


def _build(cfg: Any, source: str | Path, *, streaming: bool, episodes: list[int] | None,
           delta_timestamps: dict[str, list[float]] | None, image_transforms: Any):
    options = {**_common_options(cfg, delta_timestamps), "episodes": episodes, "image_transforms": image_transforms}
    if streaming:
        # LeRobot's seed (default 1000) also orders the stream; None (no seeding) streams seed 0's order.
        return _open(EpisodeStreamingDataset, cfg, source, seed=cfg.seed if cfg.seed is not None else 0, **options)
    return _open(EpisodeDataset, cfg, source, **options)


def _imagenet_stats(dataset: Any, *, skip_depth: bool) -> None:
    """LeRobot's ``use_imagenet_stats``: ImageNet's mean/std/min/max replace each camera's stats."""
    import torch
    from lerobot.utils.constants import IMAGENET_STATS

    for key in dataset.meta.camera_keys:
        if skip_depth and key in dataset.meta.depth_keys:
            continue
        for stats_type, stats in IMAGENET_STATS.items():
            dataset.meta.stats[key][stats_type] = torch.tensor(stats, dtype=torch.float32)


def make_dataset(cfg: Any):
    """LeRobot's ``make_dataset(cfg)`` on this library: the whole selection of ``cfg.dataset``."""
    factory = _lerobot_factory()
    source = resolve_source(cfg.dataset)
    # The policy's windows depend on the dataset's features and fps: read its metadata first.
    meta = _open(EpisodeDataset, cfg, source, revision=cfg.dataset.revision, video_backend=cfg.dataset.video_backend).meta
    delta_timestamps = factory.resolve_delta_timestamps(cfg.trainable_config, meta)
    dataset = _build(cfg, source, streaming=bool(cfg.dataset.streaming), episodes=cfg.dataset.episodes,
                     delta_timestamps=delta_timestamps, image_transforms=_image_transforms(cfg))
    if cfg.dataset.use_imagenet_stats:
        _imagenet_stats(dataset, skip_depth=True)
    return dataset


def split_episodes(episodes: list[int], episode_tasks: Any, eval_split: float) -> tuple[list[int], list[int]]:
    """LeRobot's held-out split: episodes grouped by their first task (in ``episodes``' order), the
    last ceil(n * eval_split) of each group held out for evaluation (``_plan.splits``)."""
    groups = [tasks[0] if tasks else "" for tasks in (episode_tasks[e] for e in episodes)]
    train, held_out = held_out_split(episodes, groups, eval_split)
    if not train:
        raise ValueError(f"dataset.eval_split={eval_split} leaves 0 training episodes from {len(episodes)} total.")
    return train, held_out


def make_train_eval_datasets(cfg: Any):
    """A drop-in for ``lerobot.datasets.factory.make_train_eval_datasets(cfg)`` (see the module
    docstring): ``(train_dataset, eval_dataset)``, ``eval_dataset`` None when ``eval_split`` is 0.

    LeRobot's own factory makes a map-style train dataset whenever there is an eval split; here the
    train dataset stays streaming when ``cfg.dataset.streaming`` says so (same episodes, same samples)."""
    factory = _lerobot_factory()
    full = make_dataset(cfg)
    if cfg.dataset.eval_split == 0.0:
        return full, None
    base = full.episodes if full.episodes is not None else list(range(full.num_episodes))
    train_episodes, eval_episodes = split_episodes(base, full.meta.episodes["tasks"], cfg.dataset.eval_split)
    delta_timestamps = factory.resolve_delta_timestamps(cfg.trainable_config, full.meta)
    source = resolve_source(cfg.dataset)
    train = _build(cfg, source, streaming=bool(cfg.dataset.streaming), episodes=train_episodes,
                   delta_timestamps=delta_timestamps, image_transforms=_image_transforms(cfg))
    held_out = _build(cfg, source, streaming=False, episodes=eval_episodes, delta_timestamps=delta_timestamps,
                      image_transforms=None)
    if cfg.dataset.use_imagenet_stats:
        for dataset in (train, held_out):
            _imagenet_stats(dataset, skip_depth=False)  # as LeRobot: here depth keys are not skipped
    return train, held_out
