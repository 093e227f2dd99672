"""The GOP-pair benchmark runs as its users run it and prints what it measured."""

from __future__ import annotations

import json
from pathlib import Path

from .scripts import load_script, run_main

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "streaming" / "benchmark_gop_pairs.py"


def test_it_times_a_gop_pair_apart_and_together(dataset_root, capsys):
    video = str(next((dataset_root / "videos").rglob("*.mp4")))
    run_main(SCRIPT, ["--video", video, "--pairs", "4", "--rounds", "1"])
    printed = capsys.readouterr().out
    result = json.loads(printed.strip().splitlines()[-1])
    ms = result["cpu_ms_per_call"]
    assert set(ms) == {"keyframe alone", "the frame after alone", "both in one call"} and min(ms.values()) >= 0
    assert result["pairs"] == 4 and result["gop_frames_median"] == 2.0  # the test data's GOP
    apart = ms["keyframe alone"] + ms["the frame after alone"]
    assert abs(result["apart_over_together"] - apart / ms["both in one call"]) < 1e-9
    assert f"{result['apart_over_together']:.2f}x" in printed


def test_it_picks_keyframes_followed_by_a_frame_of_their_gop(dataset_root, monkeypatch):
    video = str(next((dataset_root / "videos").rglob("*.mp4")))
    from episodestream._format.mp4 import read_local_track

    sync = read_local_track(video).is_sync
    calls: list[list[int]] = []

    class Recording:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def get_frames_at(self, indices):
            calls.append(list(indices))

    import torchcodec.decoders

    monkeypatch.setattr(torchcodec.decoders, "VideoDecoder", Recording)
    load_script(SCRIPT).measure(video, pairs=6, rounds=1, seed=1)
    asked = calls[1:]  # after the warm-up call
    assert len(asked) == 3 * 6
    for k in [c[0] for c in asked[:6]]:
        assert sync[k] and not sync[k + 1], k
    assert asked[12:] == [[c[0], c[0] + 1] for c in asked[:6]]
