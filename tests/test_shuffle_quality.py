"""``_plan.shuffle_quality``: distinct episodes per batch and recurrence, exact on tiny cases.

A global shuffle's expectations are checked against enumerating every permutation of a few frames;
a schedule's measure against its emits walked by hand.
"""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path
from fractions import Fraction

import numpy as np
import pytest

from episodestream._base.world import World
from episodestream._plan.sampling import EMIT, EpochPlan, Segment, consumer_rng, consumer_schedule
from episodestream._plan.shuffle_quality import (emitted_episodes, global_distinct, global_recur_gap,
                                                  shuffle_quality, window_diversity)


def _frames(counts: list[int]) -> list[int]:
    """One entry per frame: its episode."""
    return [e for e, n in enumerate(counts) for _ in range(n)]


@pytest.mark.parametrize("counts", [[1], [2, 2], [1, 2, 3], [3, 1, 1, 2], [4, 0, 2]])
def test_global_distinct_is_the_mean_over_every_batch(counts: list[int]) -> None:
    frames = _frames(counts)
    for b in range(1, len(frames) + 1):
        subsets = list(itertools.combinations(frames, b))
        exact = Fraction(sum(len(set(s)) for s in subsets), len(subsets))
        assert global_distinct(counts, b) == pytest.approx(float(exact), abs=1e-12)
    assert global_distinct(counts, len(frames) + 5) == pytest.approx(sum(1 for n in counts if n))


@pytest.mark.parametrize("counts", [[2, 2], [1, 2, 3], [3, 1, 2]])
def test_global_recur_gap_is_the_mean_over_every_permutation(counts: list[int]) -> None:
    frames = _frames(counts)
    gaps = []
    for order in itertools.permutations(frames):
        last: dict[int, int] = {}
        for position, episode in enumerate(order):
            if episode in last:
                gaps.append(position - last[episode])
            last[episode] = position
    assert global_recur_gap(counts) == pytest.approx(float(Fraction(sum(gaps), len(gaps))), abs=1e-12)
    assert np.isnan(global_recur_gap([1, 1, 1]))


def test_training_windows_measured_window_by_window() -> None:
    """Distinct episodes over consecutive runs of ``window`` samples (the last, partial one left out),
    against a uniform permutation of the stream's own frames, or of the frames given."""
    ids = [0, 0, 1, 1, 2, 0, 2, 1, 2, 9, 9]  # windows of 5: {0, 1, 2} and {0, 1, 2, 9}
    w = window_diversity(np.array(ids), 5)
    assert (w.window, w.windows, w.distinct) == (5, 2, 3.5)
    assert w.uniform_distinct == pytest.approx(global_distinct([3, 3, 3, 2], 5))
    assert w.ratio == pytest.approx(3.5 / global_distinct([3, 3, 3, 2], 5))
    other = window_diversity(np.array(ids), 5, frame_counts=[10] * 4)
    assert other.uniform_distinct == pytest.approx(global_distinct([10] * 4, 5)) and other.distinct == 3.5
    short = window_diversity(np.array(ids), 12)
    assert (short.windows, short.distinct) == (0, 0.0) and np.isnan(short.ratio) and "shorter" in short.summary()
    with pytest.raises(ValueError, match="window"):
        window_diversity(np.array(ids), 0)
    # shuffle_quality carries them, by default over 3,200 and 32,000 samples.
    q = shuffle_quality(ids, 4, windows=(5, 12))
    assert q.windows == (w, short)
    assert [d.window for d in shuffle_quality(ids, 4).windows] == [3_200, 32_000]


def test_a_stream_measured_batch_by_batch() -> None:
    ids = [0, 0, 1, 1, 2, 0, 2, 1, 2, 9]  # batches of 4: {0, 1} and {0, 1, 2}; the last 2 samples left out
    q = shuffle_quality(ids, 4)
    assert (q.batch_size, q.batches, q.distinct) == (4, 2, 2.5)
    # Gaps: episode 0 at 0, 1, 5; 1 at 2, 3, 7; 2 at 4, 6, 8.
    assert q.recur_gap == pytest.approx((1 + 4 + 1 + 4 + 2 + 2) / 6)
    counts = [3, 3, 3, 1]
    assert q.global_distinct == pytest.approx(global_distinct(counts, 4))
    assert q.global_recur_gap == pytest.approx(global_recur_gap(counts))
    assert q.ratio == pytest.approx(q.distinct / q.global_distinct)
    assert q.summary() == f"batch 4: 2.5 distinct episodes per batch, a global shuffle {q.global_distinct:.1f} ({q.ratio:.2f})"
    assert q.recurrence().startswith("an episode's frames recur every 2 samples, in a global shuffle every ")
    # Another epoch's frames for the global shuffle's side; an ndarray the same as a list.
    other = shuffle_quality(np.array(ids), 4, frame_counts=[5] * 10)
    assert other.distinct == q.distinct and other.global_distinct == pytest.approx(global_distinct([5] * 10, 4))
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        shuffle_quality(ids, 0)


def test_a_global_shuffle_of_one_episode_per_batch_slot() -> None:
    # Batch size 1: one distinct episode per batch, whatever the order; so is the expectation.
    q = shuffle_quality([3, 3, 4], 1)
    assert (q.distinct, q.global_distinct, q.ratio) == pytest.approx((1.0, 1.0, 1.0))


def _schedule(pool_size: int, *, shuffle: bool = True, seed: int = 3):
    lengths = np.random.default_rng(seed).integers(5, 30, 60)
    plan = EpochPlan([Segment(i, range(int(n))) for i, n in enumerate(lengths)], seed=seed, epoch=0,
                     shuffle=shuffle, world_size=1)
    world = World(0, 1)
    return consumer_schedule(plan.share(world), pool_size=pool_size, shuffle=shuffle,
                             rng=consumer_rng(seed, 0, world)), lengths


def test_a_schedule_measured_from_its_emits() -> None:
    schedule, lengths = _schedule(8)
    steps = list(schedule)
    ids = [episode for kind, episode, _ in steps if kind == EMIT]
    assert emitted_episodes(steps).tolist() == ids
    assert shuffle_quality(_schedule(8)[0], 16) == shuffle_quality(ids, 16)
    assert shuffle_quality(ids, 16) == shuffle_quality(ids, 16, frame_counts=lengths)


def test_a_wider_pool_shuffles_closer_to_global() -> None:
    ratios = [shuffle_quality(_schedule(pool)[0], 16).ratio for pool in (1, 4, 16, 64)]
    assert ratios == sorted(ratios) and ratios[-1] > 0.9 > 0.5 > ratios[0]
    in_order = shuffle_quality(_schedule(8, shuffle=False)[0], 16)
    assert in_order.recur_gap == 1.0  # unshuffled: an episode's frames come one after another


def test_the_benchmarks_print_it(dataset_root, capsys) -> None:
    from .scripts import load_script, run_main

    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks" / "streaming"
    run_main(benchmarks / "benchmark_shuffle_quality.py",
             ["--episodes", "400", "--min-frames", "40", "--max-frames", "60", "--pool-sizes", "4,auto",
              "--num-workers", "1"])
    table = capsys.readouterr().out.splitlines()
    assert table[1] == "| pool | batch 32 | batch 256 | 3,200 samples | 32,000 samples | recurs every | plan s |"
    assert len(table) == 5
    narrow, auto = (row.split(" | ") for row in table[-2:])
    # A pool of 4 draws a 3,200-sample window from under a third of a uniform permutation's episodes; a
    # pool holding every episode from about as many (its ramp's first slots from fewer); no 32,000-sample
    # window in 20,000 frames.
    assert narrow[0] == "| 4" and float(narrow[3].split("(")[1].rstrip(")")) < 0.3
    assert auto[0] == "| auto (401)" and float(auto[3].split("(")[1].rstrip(")")) >= 0.95 and auto[4] == "-"
    # `episodestream bench`'s line: one consumer's planned batches against a global shuffle.
    streaming = load_script(benchmarks / "benchmark_streaming.py")
    q32, q256 = streaming.planned_shuffle_quality(dataset_root, pool_size=2, num_workers=1, batch_sizes=[32, 256])
    assert (q32.batch_size, q256.batch_size) == (32, 256) and 1 <= q32.distinct <= q32.global_distinct


def test_the_pool_cost_benchmark_runs(tmp_path, capsys, monkeypatch, request) -> None:
    import torch

    import episodestream._sample.video.decoder_cache as decoder_cache
    from episodestream.tools.synthetic import write_synthetic_dataset

    from .scripts import load_script, run_own_commands_in_process

    # A tiny dataset: this checks the benchmark's route and rows, not its numbers.
    tiny = write_synthetic_dataset(tmp_path / "tiny", num_episodes=4, episode_length=6, height=64, width=64,
                                   cameras=("observation.images.front",), seed=0)
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "streaming" / "benchmark_pool_cost.py"
    script = load_script(path)
    # Each epoch goes through the benchmark's fresh-process route, its command run by this process.
    # The --one epoch raises the decoder cap (--max-decoders) in the process it runs in: here, only
    # for this test.
    for name in ("MAX_DECODERS", "DECODERS_CEILING", "DECODER_BUDGET_BYTES"):
        monkeypatch.setattr(decoder_cache, name, getattr(decoder_cache, name))
    # Each epoch also sets torch to one thread, meant for its own fresh process: this one gets its count back.
    request.addfinalizer(functools.partial(torch.set_num_threads, torch.get_num_threads()))
    epochs = run_own_commands_in_process(script, monkeypatch)
    assert script.main(["--datasets", str(tiny), "--pool-sizes", "16,2", "--dtypes", "uint8", "--rounds", "1",
                        "--batch-size", "8", "--max-decoders", "200", "--output", str(tmp_path / "rows.json")]) == 0
    assert [command[2] for command in epochs] == ["--one", "--one"]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "pool 16: " in lines[0] and "pool 2: " in lines[1] and "per CPU-second" in lines[1]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["pool"] for r in rows] == [16, 2] and all(r["decoder_cache"]["misses"] > 0 for r in rows)
    assert rows[0]["distinct"] >= rows[1]["distinct"] and rows[0]["samples_per_cpu_s"] > 0
    # Through a DataLoader worker (--num-workers): the same frames, its CPU and RSS counted, no decoder stats.
    worker = script._one_epoch(tiny, 2, True, 1, 8, None, num_workers=1)
    assert worker["decoder_cache"] is None and worker["peak_rss_mb"] > 0 and worker["samples_per_cpu_s"] > 0
    assert worker["distinct"] == rows[1]["distinct"]  # one consumer of the same schedule either way
