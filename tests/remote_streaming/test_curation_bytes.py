"""Curation fetches less: only kept episodes' video, and of a short kept range only the byte span
covering the range, the windows' reach and the GOP before it (counted on the FakeHub server)."""

from __future__ import annotations

import shutil

import pytest
import torch.utils.data

from episodestream import EpisodeDataset, EpisodeStreamingDataset
from episodestream.testing import FakeHub
from episodestream.tools.synthetic import write_synthetic_dataset

from ..conftest import built_once
from .conftest import assert_same_samples, remote_dataset

REPO = "lerobot/long"
LENGTHS = [200, 180, 220, 160, 240]  # 1000 frames, 2 mp4 files


@pytest.fixture(scope="module")
def long_hub(tmp_path_factory):
    """Long episodes with camera-like texture (so that frames, not mp4 headers, are most of the
    bytes) and GOP 10 (short next to an episode, as LeRobot encodes), as a FakeHub repo."""
    root = built_once(tmp_path_factory, "long-textured", lambda root: write_synthetic_dataset(
        root, num_episodes=len(LENGTHS), episode_length=LENGTHS, cameras=("observation.images.front",),
        max_episodes_per_video_file=3, gop=10, texture=True, height=120, width=160, seed=2))
    hub = tmp_path_factory.mktemp("hub-long")
    shutil.copytree(root, hub / "datasets" / REPO)
    return root, hub


def _video_bytes(hub) -> int:
    return sum(s.bytes_sent for name, s in hub.stats().by_file.items() if name.endswith(".mp4"))


@pytest.mark.slow  # ~4 s here: 1000 textured frames encoded (once per run), a curated epoch over loopback
def test_a_ten_percent_keep_selection_fetches_at_most_a_fifth_of_the_epochs_video(long_hub, tmp_path):
    root, hub_root = long_hub
    windows = {"observation.images.front": [-0.1, 0.0], "observation.state": [-0.2, 0.0, 0.2]}
    # 10% of the frames: one range of a tenth of episodes 0, 2 and 4 each (their middle), and one
    # of twice that in episode 3; episode 1 is left out.
    keep = {0: [(90, 110)], 2: [(100, 122)], 3: [(40, 72)], 4: [(120, 146)]}
    assert sum(b - a for r in keep.values() for a, b in r) == 100 == sum(LENGTHS) // 10
    options = dict(seed=1, delta_timestamps=windows, return_uint8=True, episode_pool_size=2)
    with FakeHub(hub_root) as hub, remote_dataset(
            EpisodeStreamingDataset, REPO, cache_dir=tmp_path / "curated", hub_endpoint=hub.url, token=False,
            **options, keep_frames=keep) as dataset:
        hub.reset_stats()
        curated = list(torch.utils.data.DataLoader(dataset, batch_size=None))
        fetched = _video_bytes(hub)
    assert len(curated) == 100
    # A whole epoch fetches every mp4 byte once (tests/remote_streaming/test_bytes.py): the files'
    # sizes are its video bytes.
    whole = sum(path.stat().st_size for path in (hub_root / "datasets" / REPO).glob("videos/**/*.mp4"))
    print(f"video bytes: curated {fetched}, whole epoch {whole}, ratio {fetched / whole:.3f}")
    assert fetched <= 0.2 * whole, (fetched, whole)
    # The curated samples are the uncurated dataset's samples of the kept frames, bit for bit.
    mapped = EpisodeDataset(root, delta_timestamps=windows, return_uint8=True)
    assert_same_samples(curated, [mapped[int(s["index"])] for s in curated])
    local = list(torch.utils.data.DataLoader(EpisodeStreamingDataset(root, keep_frames=keep, **options),
                                             batch_size=None))
    assert_same_samples(curated, local)
