"""``split_opening`` and ``split_closing``: EpisodeLoader's first batch cut over its threads, and
the last groups of a pass cut smaller, samples and evictions kept."""

from __future__ import annotations

import pytest

from episodestream._runtime.lookahead.pipeline import split_closing, split_opening
from episodestream._runtime.stream import PlannedGroup


def _groups(sizes: list[int]) -> list[PlannedGroup]:
    groups, next_sample = [], 0
    for i, size in enumerate(sizes):
        groups.append(PlannedGroup(list(range(next_sample, next_sample + size)), [f"evicted-{i}"]))
        next_sample += size
    return groups


@pytest.mark.parametrize(("sizes", "samples", "part_size", "expected"), [
    ([32, 32], 32, 16, [16, 16, 32]),  # v2.x's default group, a batch of 32 on 2 threads
    ([16, 16, 16], 32, 16, [16, 16, 16]),  # groups no larger than a part: untouched
    ([32, 32], 4, 2, [2, 2, 28, 32]),  # only the first batch is cut; the rest of the group is one part
    ([5, 32, 7], 12, 3, [3, 2, 3, 3, 1, 25, 7]),  # a group straddling the first batch's end
    ([0, 10], 10, 4, [0, 4, 4, 2]),  # a sample-less group (evictions only) passes as it is
    ([10], 100, 4, [4, 4, 2]),  # an epoch shorter than the batch
])
def test_split_opening_cuts_the_first_batch_and_keeps_samples_and_evictions(sizes, samples, part_size, expected):
    groups = _groups(sizes)
    parts = list(split_opening(iter(groups), samples=samples, part_size=part_size))
    assert [len(p.pendings) for p in parts] == expected
    _assert_kept(groups, parts)


@pytest.mark.parametrize(("sizes", "from_sample", "part_size", "expected"), [
    ([16, 16, 16], 32, 4, [16, 16, 4, 4, 4, 4]),  # the last group in quarters
    ([16, 16, 16], 24, 4, [16, 8, 4, 4, 4, 4, 4, 4]),  # a group straddling the start of the cut
    ([16, 16, 5], 30, 4, [16, 14, 2, 4, 1]),  # the pass's short last group, cut too
    ([16, 0, 16], 16, 8, [16, 0, 8, 8]),  # a sample-less group (evictions only) passes as it is
    ([4, 4], 0, 4, [4, 4]),  # groups no larger than a part: untouched
    ([16, 16], 100, 4, [16, 16]),  # nothing at or past from_sample
])
def test_split_closing_cuts_the_last_samples_and_keeps_samples_and_evictions(sizes, from_sample, part_size, expected):
    groups = _groups(sizes)
    parts = list(split_closing(iter(groups), from_sample=from_sample, part_size=part_size))
    assert [len(p.pendings) for p in parts] == expected
    _assert_kept(groups, parts)


def _assert_kept(groups, parts):
    sizes = [len(g.pendings) for g in groups]
    assert [s for p in parts for s in p.pendings] == list(range(sum(sizes)))
    # Each group's evictions go with its last part only, in order, once.
    assert [e for p in parts for e in p.evicted] == [f"evicted-{i}" for i in range(len(sizes))]
    ends = {}
    for p in parts:
        if p.evicted:
            ends[p.evicted[0]] = p.pendings[-1] if p.pendings else None
    for i, g in enumerate(groups):
        if g.pendings:
            assert ends[f"evicted-{i}"] == g.pendings[-1], f"group {i}'s evictions left before its last sample"
