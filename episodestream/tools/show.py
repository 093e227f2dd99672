"""``episodestream show``: one sample drawn as a LeRobot-trained policy sees it, to check transforms,
windows and padding by looking.

One row per camera (its window steps side by side; depth colour-mapped, with its range in the
title), then small plots of the state and action values over their window steps with the padded
steps (``<key>_is_pad``) marked, and the task text. The sample comes from ``EpisodeDataset`` with the
same options a training run would pass, so what is drawn is what the policy gets.
matplotlib draws it (an optional dependency: ``pip install matplotlib``), without a display.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

_TABULAR_KEYS = ("observation.state", "action")
DEFAULT_NAME = "sample.png"  # what --out writes by default, and inside a folder given as --out


def sample_figure_data(sample: Mapping[str, Any], camera_keys: Sequence[str],
                       depth_keys: Sequence[str]) -> dict[str, Any]:
    """What the figure draws, from one sample: per camera its steps as (H, W, C) arrays in [0, 1]
    (depth: (H, W) values), the tabular windows as (T, D) arrays with their padded steps, the task."""
    cameras: dict[str, list[np.ndarray]] = {}
    for key in camera_keys:
        value = sample[key]
        frames = value if value.dim() == 4 else value[None]  # (T, C, H, W)
        if key in depth_keys:
            cameras[key] = [frame[0].float().numpy() for frame in frames]
        else:
            scale = 255.0 if frames.dtype == torch.uint8 else 1.0
            cameras[key] = [(frame.float() / scale).clamp(0, 1).permute(1, 2, 0).numpy() for frame in frames]
    tabular: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key in _TABULAR_KEYS:
        if key not in sample:
            continue
        values = sample[key].float().numpy()
        values = values.reshape(1, -1) if values.ndim < 2 else values.reshape(values.shape[0], -1)
        pad = sample.get(f"{key}_is_pad")
        tabular[key] = (values, np.zeros(len(values), bool) if pad is None else pad.numpy().astype(bool))
    return {"cameras": cameras, "tabular": tabular, "task": sample.get("task", ""),
            "title": f"episode {int(sample['episode_index'])}, frame {int(sample['frame_index'])}, "
                     f"index {int(sample['index'])}"}


def png_path(out: str | os.PathLike) -> Path:
    """The file ``out`` names: matplotlib adds ".png" to a name without a suffix (so "figures" wrote
    figures.png, and an existing folder "figures" a sibling file); the path reported must be that
    file. An existing folder gets ``DEFAULT_NAME`` inside it."""
    path = Path(out).expanduser()
    if path.is_dir():
        return path / DEFAULT_NAME
    return path if path.suffix else path.with_name(path.name + ".png")


def draw_sample(data: Mapping[str, Any], out: str | os.PathLike, *, depth_keys: Sequence[str] = ()) -> Path:
    """Draw ``sample_figure_data``'s result into the PNG ``out`` (``png_path``); returns its path."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("episodestream show draws with matplotlib, which is not installed: "
                          "pip install matplotlib") from error
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    cameras, tabular = data["cameras"], data["tabular"]
    columns = max([len(steps) for steps in cameras.values()] + [len(tabular) or 1])
    rows = len(cameras) + (1 if tabular else 0)
    figure, axes = plt.subplots(max(rows, 1), columns, figsize=(3.2 * columns, 2.6 * max(rows, 1) + 0.6),
                                squeeze=False)
    for row, (key, steps) in enumerate(cameras.items()):
        for column in range(columns):
            axis = axes[row][column]
            axis.axis("off")
            if column >= len(steps):
                continue
            if key in depth_keys:
                shown = axis.imshow(steps[column], cmap="turbo")
                figure.colorbar(shown, ax=axis, fraction=0.046)
                axis.set_title(f"{key} [{column}]\n{steps[column].min():.0f}..{steps[column].max():.0f}", fontsize=7)
            else:
                axis.imshow(steps[column])
                axis.set_title(f"{key} [{column}]", fontsize=7)
    if tabular:
        row = len(cameras)
        for column in range(columns):
            axes[row][column].axis("off")
        for column, (key, (values, pad)) in enumerate(tabular.items()):
            axis = axes[row][column]
            axis.axis("on")
            steps = np.arange(len(values))
            axis.plot(steps, values, marker="o", markersize=2, linewidth=0.8)
            for step in np.flatnonzero(pad):
                axis.axvspan(step - 0.5, step + 0.5, color="grey", alpha=0.3)
            axis.set_title(f"{key} ({values.shape[1]} dims; grey: padded)", fontsize=7)
            axis.set_xlabel("window step", fontsize=7)
            axis.tick_params(labelsize=6)
    figure.suptitle(f"{data['title']}\ntask: {data['task']}", fontsize=9)
    figure.tight_layout()
    path = png_path(out)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def show_sample(source: str, *, out: str | os.PathLike, index: int | None = None, episode: int | None = None,
                frames: Sequence[int] = (), revision: str | None = None) -> Path:
    """Draw sample ``index`` (or the middle frame of ``episode``; default: sample 0) of ``source`` into
    ``out``, every camera and ``observation.state`` / ``action`` windowed over ``frames`` (offsets
    in frames, e.g. (-2, 0, 2); none: single frames)."""
    from episodestream import EpisodeDataset

    probe = EpisodeDataset(source, revision=revision, column_cache=False)
    fps = probe.meta.fps
    keys = [*probe.meta.camera_keys, *(k for k in _TABULAR_KEYS if k in probe.meta.features)]
    windows = {key: [f / fps for f in frames] for key in keys} if frames else None
    dataset = EpisodeDataset(source, revision=revision, delta_timestamps=windows, column_cache=False)
    if index is not None and episode is not None:
        raise ValueError("Pass --index or --episode, not both.")
    if episode is not None:
        episodes = dataset.meta.episodes
        rows = [i for i, e in enumerate(episodes["episode_index"]) if int(e) == episode]
        if not rows:
            raise ValueError(f"--episode {episode} is not an episode of {source} (it has {len(episodes)}).")
        start, length = int(episodes["dataset_from_index"][rows[0]]), int(episodes["length"][rows[0]])
        index = start + length // 2
    index = 0 if index is None else index
    if not 0 <= index < len(dataset):
        raise ValueError(f"--index {index} is out of range: {source} has {len(dataset)} samples.")
    sample = dataset[index]
    depth = dataset.meta.depth_keys
    return draw_sample(sample_figure_data(sample, dataset.meta.camera_keys, depth), out, depth_keys=depth)
