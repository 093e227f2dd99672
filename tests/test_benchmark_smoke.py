"""The streaming benchmark runs end to end, as its users run it, on a tiny dataset: from local disk and
from a fake Hub behind a shaped link, writing results that summarize_results.py reads."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch

from .scripts import load_script, run_main

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "streaming" / "benchmark_streaming.py"
SUMMARIZE = SCRIPT.parent / "summarize_results.py"
TINY = ["--episodes", "2", "--episode-length", "30", "--height", "64", "--width", "96", "--rss-pool-sizes", "",
        "--mode", "single", "--batch-size", "8"]


def _run(tmp_path: Path, source: str, *extra: str) -> dict:
    out = tmp_path / f"out-{source}"
    run_main(SCRIPT, ["--source", source, *TINY, *extra, "--cache-dir", str(tmp_path / "datasets"),
                      "--output-dir", str(out)])
    row = json.loads((out / f"{source}-single-cpu-float32.json").read_text())
    assert (row["source"], row["mode"], row["decode"], row["status"]) == (source, "single", "cpu", "ok")
    assert row["samples"] == 60 and row["samples_per_s"] > 0 and row["frames_per_s"] == 2 * row["samples_per_s"]
    assert set(row["latency_ms"]) == {"p50", "p95", "p99"} and row["first_batch_s"] > 0 and row["peak_rss_mb"] > 0
    assert set(row["decoder_cache"]) == {"hits", "misses", "evictions"}
    assert (out / "results.csv").read_text().startswith("source,mode,decode,")
    rows, malformed, _ = load_script(SUMMARIZE).load_results(out)
    assert not malformed and {r["source"] for r in rows} == {source}
    return row


@pytest.mark.slow
def test_local_source_compares_against_the_decoder_ceiling(tmp_path):
    # One worker (and one ceiling process): the route and the rows, at half the processes started.
    row = _run(tmp_path, "local", "--loader", "both", "--train-step-ms", "1", "--num-workers", "1")
    assert row["cache_hit_rate"] is None and row["fraction_of_ceiling"] > 0 and row["loader"] == "dataloader"
    out = tmp_path / "out-local"
    for suffix, step in (("-episodeloader", None), ("-episodeloader-sleep", "sleep:1ms"), ("-busy", "busy:1ms")):
        other = json.loads((out / f"local-single-cpu-float32{suffix}.json").read_text())
        assert other["samples"] == 60 and other["fraction_of_ceiling"] > 0 and other["train_step"] == step
        assert set(other["batch_wait_ms"]) == {"p50", "p95", "p99"} and other["first_batch_s"] > 0
    rows, malformed, _ = load_script(SUMMARIZE).load_results(out)
    assert not malformed and len(rows) == 6


@pytest.mark.slow
def test_the_default_run_is_the_quick_look_at_both_loaders(tmp_path, capsys):
    # No --mode, --loader or --rss-pool-sizes: single frames, both loaders side by side, no RSS passes.
    out = tmp_path / "out"
    run_main(SCRIPT, ["--episodes", "2", "--episode-length", "30", "--height", "64", "--width", "96",
                      "--batch-size", "8", "--num-workers", "1", "--cache-dir", str(tmp_path / "datasets"),
                      "--output-dir", str(out)])
    assert sorted(p.name for p in out.glob("*.json")) == ["local-single-cpu-float32-episodeloader.json",
                                                          "local-single-cpu-float32.json"]
    captured = capsys.readouterr()
    assert "2 run(s) (single float32 dataloader, single float32 episode): about " in captured.err
    assert "--full runs the long matrix" in captured.err
    assert re.search(r"single float32: DataLoader \(1 workers\) \d+, [\d.]+ s; EpisodeLoader \(1 threads\) \d+",
                     captured.out), captured.out


def test_hub_source_through_a_shaped_link(tmp_path):
    row = _run(tmp_path, "hub", "--latency-ms", "20", "--bandwidth-mbps", "20")
    assert row["local_samples_per_s"] > 0 and row["remote_over_local"] > 0
    assert row["link"]["latency_ms"] == 20 and row["link"]["bytes"] > 0
    # A cold cache: every span is downloaded once (two workers share each mp4's header, so a hit
    # or two), and an episode costs a few percent more than its own compressed bytes.
    assert 0 <= row["cache_hit_rate"] < 0.5 and row["node_cache"]["misses"] >= 4
    per_episode = row["bytes_per_episode"]
    assert 1.0 < per_episode["video_fetched_over_own"] < 1.5, per_episode


def test_cuda_decoding_without_a_gpu_is_refused_clearly(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit) as exited:
        run_main(SCRIPT, ["--decode", "cuda", "--output-dir", str(tmp_path)])
    assert exited.value.code == 2
    stderr = capsys.readouterr().err
    assert "--decode cuda needs a CUDA GPU" in stderr and "Use --decode cpu" in stderr


@pytest.mark.slow
def test_transfer_breakdown_times_three_ways_against_the_ceiling(tmp_path):
    out = tmp_path / "out"
    run_main(SCRIPT.parent / "benchmark_transfer.py",
             ["--episodes", "2", "--episode-length", "30", "--height", "64", "--width", "96", "--mode", "single",
              "--batch-size", "8", "--cache-dir", str(tmp_path / "datasets"), "--output-dir", str(out)])
    report = json.loads((out / "transfer.json").read_text())["single"]
    assert report["ceiling_frames_per_s"] > 0 and report["unique_frames"] == 2 * 60
    assert set(report["ways"]) == {"decode only", "uint8", "float32"}
    for way in report["ways"].values():
        assert way["samples"] == 60 and way["fraction_of_ceiling"] > 0


def test_the_ceiling_reports_a_decode_process_killed_outright():
    # Regression: the parent waited forever for a result from a process killed by a signal, and the
    # other process waited forever at the start barrier for it.
    bench = load_script(SCRIPT)  # a fresh module: the patch below stays in it

    def decode(calls, device, ready=None):
        if calls == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        ready.wait()
        return (0.0, 1.0, 1)

    bench._decode_worker = decode
    with pytest.raises(RuntimeError, match=r"died without reporting \(exit codes \[-9\]"):
        bench.ceiling(["killed", "waits at the barrier"])


@pytest.mark.slow
def test_the_remote_shuffle_benchmark_runs_and_samples_disk_from_its_own_process(tmp_path):
    """Its node cache's peak on disk is sampled by a process of its own (a walk in the loader's
    process held its GIL): the peak it reports must be what the spans and headers took."""
    import subprocess
    import sys

    script = SCRIPT.parent / "benchmark_remote_shuffle.py"
    done = subprocess.run([sys.executable, str(script), "--episodes", "4", "--pool-sizes", "auto", "--rounds", "1",
                           "--cache-dir", str(tmp_path)], capture_output=True, text=True, timeout=300, check=True)
    line = done.stdout.strip().splitlines()[-1]
    peak_mb = float(re.search(r"peak cache ([\d.]+) MB", line).group(1))
    video_mb = float(re.search(r"\(video ([\d.]+) MB\)", line).group(1))
    assert "round 0 pool auto" in line and re.search(r"link [\d.]+x the video bytes", line)
    assert video_mb > 0 and peak_mb >= video_mb  # every span was on disk at the end, its header beside it
