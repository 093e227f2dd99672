"""Fixtures for streaming from loopback remotes: hub copies of the session datasets, a helper that
builds a dataset on a remote source, and cache inspection."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

# huggingface_hub reads these when it is imported.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

import pytest  # noqa: E402

from episodestream.tools.synthetic import write_synthetic_dataset  # noqa: E402

from ..conftest import built_once  # noqa: E402

REPO = "lerobot/main"
SPANS_REPO = "lerobot/spans"
ROWS_REPO = "lerobot/rows"


@pytest.fixture(scope="session")
def spans_root(tmp_path_factory):
    """Episodes of 20..60 frames (long enough that a GOP-2 keyframe and two trailing frames are
    small next to the episode), 5 per mp4, one camera."""
    return built_once(tmp_path_factory, "spans", lambda root: write_synthetic_dataset(
        root, num_episodes=9, episode_length=(20, 60), cameras=("observation.images.front",),
        max_episodes_per_video_file=5, seed=5))


@pytest.fixture(scope="session")
def rows_root(tmp_path_factory):
    """No video; one data file of 3 row groups of ~130 KB (a 1024-float state), so an episode's
    rows are a third of its data file."""
    return built_once(tmp_path_factory, "rows", lambda root: write_synthetic_dataset(
        root, num_episodes=3, episode_length=300, cameras=(), state_dim=1024, seed=1))


@pytest.fixture(scope="session")
def hub_root(dataset_root, spans_root, rows_root, tmp_path_factory):
    """A FakeHub folder holding the session datasets as ``lerobot/main``, ``lerobot/spans`` and
    ``lerobot/rows``."""
    root = tmp_path_factory.mktemp("hub")
    for source, repo in ((dataset_root, REPO), (spans_root, SPANS_REPO), (rows_root, ROWS_REPO)):
        shutil.copytree(source, root / "datasets" / repo)
    return root


@contextmanager
def remote_dataset(cls, source, *, cache_dir, revision=None, cache_limit=None, storage_options=None,
                   hub_endpoint=None, token=None, **kwargs):
    """``cls(source, ...)`` through the public constructor with these remote options; closes the
    remote files' metadata references afterwards."""
    dataset = cls(source, revision=revision, cache_dir=cache_dir, cache_limit=cache_limit,
                  storage_options=storage_options, hub_endpoint=hub_endpoint, token=token, **kwargs)
    try:
        yield dataset
    finally:
        dataset.close()


def cache_files(cache_dir) -> list[str]:
    """Files left in a cache folder, but its permanent budget lock and ledger."""
    cache_dir = Path(cache_dir)
    return sorted(p.relative_to(cache_dir).as_posix() for p in cache_dir.rglob("*")
                  if p.is_file() and p.name not in (".budget.lock", ".budget.used"))


def assert_same_samples(got: list[dict], expected: list[dict]) -> None:
    import torch

    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.keys() == b.keys(), i
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (i, key)
            else:
                assert a[key] == b[key], (i, key)
