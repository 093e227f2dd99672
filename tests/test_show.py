"""``episodestream show`` draws one sample into a PNG: opened and checked here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from episodestream.tools.cli import main

pytest.importorskip("matplotlib", reason="episodestream show draws with matplotlib (a test extra)")


@pytest.fixture(scope="session")
def depth_root_for_show(tmp_path_factory):
    from tests.test_lerobot06_features import FPS, LENGTHS
    from tests.conftest import built_once
    from episodestream.tools.synthetic import write_synthetic_dataset

    return built_once(tmp_path_factory, "lerobot06", lambda root: write_synthetic_dataset(
        root, num_episodes=len(LENGTHS), episode_length=LENGTHS, fps=FPS, cameras=("observation.images.front",),
        depth_cameras=("observation.images.depth",), extra_dtypes=True, height=64, width=64,
        max_episodes_per_video_file={"observation.images.front": 2}, seed=0))


def test_show_draws_cameras_windows_and_padding(depth_root_for_show, tmp_path, capsys):
    out = tmp_path / "sample.png"
    assert main(["show", str(depth_root_for_show), "--episode", "1", "--frames=-6,0,2", "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    image = np.asarray(Image.open(out).convert("RGB"))
    # 3 window steps side by side, one row per camera (2) plus the plots' row.
    assert image.shape[1] >= 3 * 300 and image.shape[0] >= 3 * 250
    assert image.std() > 10  # something is drawn, not a blank page


def test_show_prints_the_path_it_wrote(depth_root_for_show, tmp_path, monkeypatch, capsys):
    """``--out figures`` printed "wrote figures" while matplotlib wrote figures.png, and an existing
    folder got a sibling figures.png (issue 62 item 10): a name without a suffix gets ".png", a
    folder gets sample.png inside it, and the line printed names the file written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "figures").mkdir()
    for out, written in (("plot", tmp_path / "plot.png"), ("figures", tmp_path / "figures" / "sample.png"),
                         (".", tmp_path / "sample.png")):
        assert main(["show", str(depth_root_for_show), "--out", out]) == 0
        printed = capsys.readouterr().out.strip()
        assert printed.startswith("wrote ") and Path(printed.removeprefix("wrote ")).resolve() == written
        assert Image.open(written).format == "PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures", "plot.png", "sample.png"]


def test_show_refuses_what_it_cannot_draw_in_one_line(depth_root_for_show, tmp_path, capsys):
    assert main(["show", str(depth_root_for_show), "--index", "100000", "--out", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "episodestream show: ValueError: --index 100000 is out of range" in err and err.count("\n") == 1
    assert main(["show", str(depth_root_for_show), "--episode", "99", "--out", str(tmp_path / "x.png")]) == 1
    assert "--episode 99 is not an episode" in capsys.readouterr().err


def test_the_figure_data_holds_the_samples_values(depth_root_for_show):
    from episodestream import EpisodeDataset
    from episodestream.tools.show import sample_figure_data

    windows = {"observation.state": [-0.2, 0.0]}
    dataset = EpisodeDataset(depth_root_for_show, delta_timestamps=windows)
    sample = dataset[9]  # episode 1, frame 0: the state's first step pads
    data = sample_figure_data(sample, dataset.meta.camera_keys, dataset.meta.depth_keys)
    values, pad = data["tabular"]["observation.state"]
    assert pad.tolist() == [True, False] and np.array_equal(values, sample["observation.state"].numpy())
    depth = data["cameras"]["observation.images.depth"][0]
    assert depth.shape == (64, 64) and depth.min() >= 500  # millimetres, not [0, 1]
