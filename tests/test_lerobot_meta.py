"""``dataset.meta`` answers what LeRobot's code asks of ``LeRobotDatasetMetadata``, without LeRobot.

LeRobot needs Python >= 3.12, so these tests check the contract against what LeRobot's source does
with the object (read from lerobot 0.4-0.6: ``dataset_metadata.py``, ``io_utils.load_stats`` /
``load_info``, ``policies/factory.py``, ``processor/normalize_processor.py``,
``datasets/factory.resolve_delta_timestamps``, ``datasets/sampler.EpisodeAwareSampler``); the
expected values come from the dataset's files, not from our code.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from episodestream import DatasetFormatError, EpisodeDataset, EpisodeStreamingDataset
from episodestream.tools.cli import main

LEROBOT_STATS = {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}


def _file(root, relpath):
    return json.loads((root / relpath).read_text())


def _lerobot_features(info):
    """LeRobot's load_info: info.json's features with each shape list made a tuple."""
    return {key: {**spec, "shape": tuple(spec["shape"])} for key, spec in info["features"].items()}


# -- stand-ins for the LeRobot code that reads the meta (what it indexes and calls, nothing more) --

def _dataset_to_policy_features(features):
    """lerobot.utils.feature_utils.dataset_to_policy_features: (type, shape) per feature."""
    policy = {}
    for key, spec in features.items():
        shape = spec["shape"]
        if spec["dtype"] in ("image", "video"):
            if len(shape) != 3:
                raise ValueError(f"Number of dimensions of {key} != 3 (shape={shape})")
            if spec["names"][2] in ("channel", "channels"):
                shape = (shape[2], shape[0], shape[1])
            policy[key] = ("VISUAL", shape)
        elif key == "observation.environment_state":
            policy[key] = ("ENV", shape)
        elif key.startswith("observation"):
            policy[key] = ("STATE", shape)
        elif key.startswith("action"):
            policy[key] = ("ACTION", shape)
    return policy


def _make_policy_inputs(ds_meta):
    """What lerobot.policies.factory.make_policy reads from ds_meta before building the policy."""
    if bool(ds_meta) == bool(None):
        raise ValueError("Either one of a dataset metadata or a sim env must be provided.")
    features = _dataset_to_policy_features(ds_meta.features)
    outputs = {k: ft for k, ft in features.items() if ft[0] == "ACTION"}
    inputs = {k: ft for k, ft in features.items() if k not in outputs}
    action_names = ds_meta.features.get("action", {}).get("names")
    stats = ds_meta.stats if hasattr(ds_meta, "stats") else None
    return inputs, outputs, action_names, stats


def _resolve_delta_timestamps(ds_meta, *, observation_delta_indices, action_delta_indices):
    """lerobot.datasets.factory.resolve_delta_timestamps."""
    deltas = {}
    for key in ds_meta.features:
        if key == "action" and action_delta_indices is not None:
            deltas[key] = [i / ds_meta.fps for i in action_delta_indices]
        if key.startswith("observation.") and observation_delta_indices is not None:
            deltas[key] = [i / ds_meta.fps for i in observation_delta_indices]
    return deltas or None


def _to_tensor_stats(stats, features):
    """The normalizer's __post_init__: every statistic to a float32 tensor (processor.converters.to_tensor),
    1-D visual stats reshaped to (C, 1, 1)."""
    tensors = {key: {name: torch.as_tensor(value, dtype=torch.float32) for name, value in sub.items()}
               for key, sub in stats.items()}
    for key, (kind, _) in features.items():
        if kind == "VISUAL" and key in tensors:
            tensors[key] = {n: t.reshape(-1, 1, 1) if t.ndim == 1 else t for n, t in tensors[key].items()}
    return tensors


def _normalize(tensor, stats, mode, eps=1e-8):
    """_NormalizationMixin._apply_transform for each mode LeRobot's policies use."""
    if mode == "MEAN_STD":
        return (tensor - stats["mean"]) / (stats["std"] + eps)
    low, high = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}[mode]
    denom = stats[high] - stats[low]
    denom = torch.where(denom == 0, torch.tensor(eps, dtype=tensor.dtype), denom)
    return 2 * (tensor - stats[low]) / denom - 1


# -- the contract -----------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [EpisodeStreamingDataset, EpisodeDataset])
def test_features_info_and_keys_are_lerobots(dataset_root, cls):
    meta = cls(dataset_root).meta
    info = _file(dataset_root, "meta/info.json")
    assert meta.features == _lerobot_features(info)
    assert all(type(spec["shape"]) is tuple for spec in meta.features.values())
    assert meta.info == {**info, "features": _lerobot_features(info)}
    assert meta.info.to_dict() == info
    assert meta.info.fps == meta.info["fps"] == meta.fps == info["fps"] and type(meta.fps) is int
    assert (meta.robot_type, meta.total_episodes, meta.total_frames, meta.total_tasks) == (
        info["robot_type"], info["total_episodes"], info["total_frames"], info["total_tasks"])
    videos = [k for k, s in info["features"].items() if s["dtype"] == "video"]
    images = [k for k, s in info["features"].items() if s["dtype"] == "image"]
    assert (meta.video_keys, meta.image_keys) == (videos, images) and len(videos) == 2 and len(images) == 1
    assert meta.camera_keys == [k for k in info["features"] if k in videos + images]
    assert meta.names == {k: s["names"] for k, s in info["features"].items()}
    assert meta.shapes == {k: tuple(s["shape"]) for k, s in info["features"].items()}
    assert meta.root == dataset_root and meta.repo_id == str(dataset_root)
    assert meta.data_path == info["data_path"] and meta.video_path == info["video_path"]
    with pytest.raises(AttributeError, match="no field 'nonexistent'"):
        meta.info.nonexistent  # noqa: B018 (the attribute access is what raises)


def test_typed_view_keeps_its_types(dataset_root):
    dataset = EpisodeStreamingDataset(dataset_root)
    typed = dataset.typed_meta
    assert typed.features["action"].shape == (6,) and typed.episodes[0].length == 23
    assert dataset.meta.features["action"]["shape"] == (6,)
    assert dataset.meta.video_keys == typed.video_keys and dataset.meta.fps == typed.fps


def test_stats_are_the_files_values_with_lerobots_dtypes(dataset_root):
    meta = EpisodeStreamingDataset(dataset_root).meta
    raw = _file(dataset_root, "meta/stats.json")
    assert set(meta.stats) == set(raw)
    for key, values in raw.items():
        assert set(values) == LEROBOT_STATS, key  # the synthetic writer writes every statistic LeRobot does
        for name, value in values.items():
            got = meta.stats[key][name]
            assert isinstance(got, np.ndarray) and got.dtype == (np.int64 if name == "count" else np.float64)
            np.testing.assert_array_equal(got, np.atleast_1d(np.array(value)))
    assert meta.stats["observation.images.front"]["q50"].shape == (3, 1, 1)
    assert meta.stats["action"]["count"].shape == (1,)


def test_stats_none_without_the_file_and_bad_files_named(dataset_root, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(dataset_root, root)
    (root / "meta/stats.json").unlink()
    assert EpisodeDataset(root).meta.stats is None
    (root / "meta/stats.json").write_text("{not json")
    with pytest.raises(DatasetFormatError, match=r"copy/meta/stats.json: not valid JSON"):
        EpisodeDataset(root)
    (root / "meta/stats.json").write_text(json.dumps({"action": {"mean": ["a", "b"]}}))
    with pytest.raises(DatasetFormatError, match=r"stats.json\['action'\]\['mean'\]: expected numbers"):
        EpisodeDataset(root)
    # An older writer's scalar count still comes out as LeRobot's (1,) array.
    (root / "meta/stats.json").write_text(json.dumps({"action": {"mean": [0.5], "count": 7}}))
    assert EpisodeDataset(root).meta.stats["action"]["count"].tolist() == [7]


def test_episodes_are_what_lerobots_samplers_read(dataset_root):
    dataset = EpisodeDataset(dataset_root)
    episodes, typed = dataset.meta.episodes, dataset.typed_meta.episodes
    assert len(episodes) == len(typed) == 6
    starts, ends = episodes["dataset_from_index"], episodes["dataset_to_index"]
    assert list(zip(starts, ends)) == [(ep.from_index, ep.to_index) for ep in typed.values()]
    assert not [c for c in episodes.column_names if c.startswith("stats/")]
    row = episodes[1]
    assert row["episode_index"] == 1 and row["length"] == 140 and row["tasks"] == ["synthetic task 1"]
    assert episodes[-1]["episode_index"] == 5 and [r["episode_index"] for r in episodes] == list(range(6))
    # EpisodeAwareSampler(meta.episodes["dataset_from_index"], meta.episodes["dataset_to_index"], drop_n_last_frames=1)
    frames = [i for start, end in zip(starts, ends, strict=True) for i in range(start, end - 1)]
    assert len(frames) == len(dataset) - 6 and all(dataset.locate(i)[1] < typed[dataset.locate(i)[0]].length - 1
                                                   for i in frames[::25])
    assert dataset.meta.get_data_file_path(3).as_posix() == typed[3].data_relpath
    assert dataset.meta.get_video_file_path(3, "observation.images.wrist").as_posix() == \
        typed[3].videos["observation.images.wrist"].relpath
    # LeRobot's meta.episodes is a datasets.Dataset: its own errors, its own filter and column selection.
    import datasets

    assert isinstance(episodes, datasets.Dataset)
    with pytest.raises(ValueError, match="Column 'nope' doesn't exist"):
        episodes["nope"]
    with pytest.raises(IndexError, match="out of bounds"):
        episodes[6]
    assert episodes.select_columns(["episode_index", "length"])[2] == {"episode_index": 2, "length": 17}
    assert dataset.meta.filter_episodes(lambda ep: ep["length"] > 30) == [1, 3, 5]
    assert dataset.meta.filter_episodes(lambda ep: ep["length"] > 30, candidates=[0, 1, 2]) == [1]


def test_lerobot_train_reads_what_it_asks_for(dataset_root, tmp_path):
    """lerobot_train: ``meta.has_language_columns`` (collate), ``dataset.episodes`` and
    ``dataset.absolute_to_relative_idx`` (EpisodeAwareSampler), ``meta.episodes["tasks"]`` (eval split)."""
    full = EpisodeDataset(dataset_root)
    assert full.meta.has_language_columns is False and full.episodes is None
    assert full.absolute_to_relative_idx is None
    assert full.meta.tools[0]["function"]["name"] == "say" and full.meta.url_root == f"hf://datasets/{dataset_root}"
    assert str(full.meta._version) == "3.0" and full.meta.repo_type == "dataset" and full.meta.latest_episode is None
    assert list(full.meta.episodes["tasks"]) == [["synthetic task 0"], ["synthetic task 1"]] * 3
    some = EpisodeDataset(dataset_root, episodes=[3, 1])
    assert some.episodes == [3, 1] and len(some.meta.episodes) == 6  # the meta keeps every episode, as LeRobot's
    mapping = some.absolute_to_relative_idx
    starts = some.meta.episodes["dataset_from_index"]
    assert len(mapping) == len(some) == 140 + 41
    assert mapping[starts[1]] == 0 and mapping[starts[3]] == 140 and mapping[starts[3] + 40] == 180
    assert some[mapping[starts[3] + 5]]["index"].item() == starts[3] + 5
    # A dataset that declares a language column is collated by LeRobot's language-aware collate.
    root = tmp_path / "copy"
    shutil.copytree(dataset_root, root)
    info = _file(root, "meta/info.json")
    info["features"]["language_events"] = {"dtype": "string", "shape": [1], "names": None}
    info["tools"] = [{"type": "function", "function": {"name": "wave"}}]
    (root / "meta/info.json").write_text(json.dumps(info))
    meta = EpisodeDataset(root).meta
    assert meta.has_language_columns is True and meta.tools == [{"type": "function", "function": {"name": "wave"}}]


def test_tasks_as_lerobot_keeps_them(dataset_root):
    meta = EpisodeDataset(dataset_root).meta
    assert meta.get_task_index("synthetic task 1") == 1 and meta.get_task_index("unknown") is None
    try:
        import pandas  # noqa: F401
    except ImportError:
        assert meta.tasks == {"synthetic task 0": 0, "synthetic task 1": 1}
        return
    assert meta.tasks.index.name == "task" and list(meta.tasks.index) == ["synthetic task 0", "synthetic task 1"]
    assert meta.tasks.loc["synthetic task 1"].task_index == 1 and meta.tasks.iloc[0].name == "synthetic task 0"


def test_meta_pickles_whole(dataset_root):
    dataset = EpisodeStreamingDataset(dataset_root)
    copy = pickle.loads(pickle.dumps(dataset)).meta
    assert type(copy) is type(EpisodeDataset(dataset_root).meta)
    assert copy.features == dataset.meta.features and copy.info == dataset.meta.info
    assert copy.episodes["dataset_to_index"] == dataset.meta.episodes["dataset_to_index"]
    for key, values in dataset.meta.stats.items():
        for name, value in values.items():
            np.testing.assert_array_equal(copy.stats[key][name], value)


def test_lerobot_policy_and_processor_calls_run_on_meta(dataset_root):
    """Stand-ins of make_policy(cfg, ds_meta=dataset.meta), resolve_delta_timestamps(cfg, dataset.meta)
    and make_pre_post_processors(cfg, dataset_stats=dataset.meta.stats) on a real batch."""
    probe = EpisodeStreamingDataset(dataset_root)
    inputs, outputs, action_names, stats = _make_policy_inputs(probe.meta)
    assert outputs == {"action": ("ACTION", (6,))}
    assert inputs["observation.images.front"] == ("VISUAL", (3, 64, 96))
    assert inputs["observation.state"] == ("STATE", (6,)) and "timestamp" not in inputs
    assert action_names == [f"motor_{j}" for j in range(6)] and stats is probe.meta.stats

    deltas = _resolve_delta_timestamps(probe.meta, observation_delta_indices=None,
                                       action_delta_indices=list(range(10)))  # ACT's chunk of actions
    dataset = EpisodeStreamingDataset(dataset_root, delta_timestamps=deltas, seed=0)
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=4)))
    features = {**inputs, **outputs}
    tensor_stats = _to_tensor_stats(dataset.meta.stats, features)
    for mode in ("MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10"):
        for key in features:
            normalized = _normalize(batch[key].float(), tensor_stats[key], mode)
            assert normalized.shape == batch[key].shape and torch.isfinite(normalized).all(), (mode, key)
    assert batch["action"].shape == (4, 10, 6)
    action = _normalize(batch["action"], tensor_stats["action"], "MEAN_STD")
    assert action.abs().max() < 5  # the stats describe these values


def test_remote_source_reads_stats_with_the_metadata(dataset_root, tmp_path):
    from episodestream.testing import HttpServer

    served = tmp_path / "served"
    shutil.copytree(dataset_root, served / "main")
    local = EpisodeDataset(dataset_root).meta
    # A plain HTTP server is a remote source (a file:// URL to a folder is read in place).
    with HttpServer(served) as server:
        url = server.url_for("main")
        dataset = EpisodeStreamingDataset(url, cache_dir=tmp_path / "cache")
        try:
            (served / "main/meta/stats.json").unlink()  # read once, at construction: nothing reads it again
            remote = pickle.loads(pickle.dumps(dataset)).meta
            assert remote.root == url and remote.features == local.features
            assert remote.episodes["dataset_from_index"] == local.episodes["dataset_from_index"]
            np.testing.assert_array_equal(remote.stats["action"]["q99"], local.stats["action"]["q99"])
        finally:
            dataset.close()


def test_info_prints_a_stats_summary(dataset_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EPISODESTREAM_CACHE_DIR", str(tmp_path / "cache"))  # the remote source's cache
    assert main(["info", str(dataset_root), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    raw = _file(dataset_root, "meta/stats.json")
    assert stats["action"]["mean"] == pytest.approx(raw["action"]["mean"][:3])
    assert stats["action"]["min"] == pytest.approx(min(raw["action"]["min"]))
    assert stats["action"]["size"] == 6
    assert main(["info", str(dataset_root)]) == 0
    assert "stats action: mean [" in capsys.readouterr().out
    root = tmp_path / "copy"
    shutil.copytree(dataset_root, root)
    (root / "meta/stats.json").unlink()
    assert main(["info", f"file://{root}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"] is None
    assert main(["info", str(root)]) == 0
    assert "stats: none (the dataset has no meta/stats.json" in capsys.readouterr().out


def test_readme_lerobot_block_compiles():
    """The README's LeRobot calls are not run here (no LeRobot), but must stay valid Python."""
    readme = (Path(__file__).resolve().parents[1] / "docs/lerobot.md").read_text()  # moved from the README
    blocks = re.findall(r"```python no-run\n(.*?)```", readme, flags=re.S)
    assert blocks and any("make_pre_post_processors" in b and "dataset.meta.stats" in b for b in blocks)
    for block in blocks:
        compile(block, "README.md", "exec")
        # Pasted alone, a block runs: it imports or defines every name it uses (it used
        # EpisodeStreamingDataset without importing it).
        assert not _undefined_names(block), _undefined_names(block)


def _undefined_names(code: str) -> set[str]:
    """Names ``code`` reads that it neither binds (assignment, import, def, loop or with target) nor
    gets from builtins: a NameError when pasted alone."""
    import ast
    import builtins

    tree = ast.parse(code)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
            and node.id not in bound}
