"""A consumer keeps a GOP pair's other frame for its turn (``GopPairs``): only where that pays, within
its budget, dropping what was left unasked, and never serving a frame it was not given for that time."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from episodestream._sample.video.gop_pairs import GopPairs

FPS = 10.0


def _track(gop: int, frames: int = 40, *, reorder_depth: int = 0) -> SimpleNamespace:
    """A file's sample table: a keyframe every ``gop`` frames from frame 0."""
    return SimpleNamespace(pts_s=np.arange(frames) / FPS, is_sync=np.arange(frames) % gop == 0,
                           reorder_depth=reorder_depth)


def _pairs(budget_bytes: int = 10_000, **tracks) -> GopPairs:
    return GopPairs(budget_bytes=budget_bytes, track_of=lambda path: tracks[path])


def _frame(value: int) -> torch.Tensor:
    return torch.full((2, 2, 3), value, dtype=torch.uint8)  # 12 bytes


def t(frame: int) -> float:
    return frame / FPS


def _take(pairs: GopPairs, path: str, time_s: float) -> torch.Tensor | None:
    """The frame served for ``time_s``, as the decoder reads it (a copy: its slot is reused after)."""
    with pairs.taken(path, [time_s]) as frames:
        frame = frames.get(time_s)
        return None if frame is None else frame.clone()


def test_the_first_of_a_pair_brings_its_mate_and_the_second_is_served_it():
    pairs = _pairs(a=_track(gop=2))
    assert pairs.mates("a", [(t(5), t(4))]) == [t(4)]  # frame 5 decodes from keyframe 4: one GOP
    pairs.keep("a", t(4), _frame(4))
    assert _take(pairs, "b", t(4)) is None and _take(pairs, "a", t(5)) is None  # another file, another time
    served = _take(pairs, "a", t(4))
    assert torch.equal(served, _frame(4)) and _take(pairs, "a", t(4)) is None  # served once
    assert pairs.stats() == {"kept": 1, "served": 1, "dropped": 0, "not_kept_full": 0, "not_kept_late": 0,
                             "held_bytes": 0}


def test_a_second_asked_for_before_its_first_kept_it_is_not_kept_after():
    pairs = _pairs(a=_track(gop=2))
    assert pairs.mates("a", [(t(6), t(7))]) == [t(7)]
    assert _take(pairs, "a", t(7)) is None  # another decode thread got to the second first
    pairs.keep("a", t(7), _frame(7))  # the first's call, late: nobody would ask for it now
    assert pairs.stats()["held_bytes"] == 0 and pairs.stats()["not_kept_late"] == 1
    assert pairs.mates("a", [(t(6), t(7))]) == [t(7)]  # the next epoch's pair is kept again
    pairs.keep("a", t(7), _frame(7))
    assert torch.equal(_take(pairs, "a", t(7)), _frame(7))


def test_mates_in_another_gop_or_with_b_frames_or_without_a_budget_are_not_decoded():
    pairs = _pairs(odd=_track(gop=2), ten=_track(gop=10), bframes=_track(gop=2, reorder_depth=2))
    assert pairs.mates("odd", [(t(7), t(8))]) == []  # frames 7 and 8 straddle keyframe 8
    assert pairs.mates("ten", [(t(7), t(6))]) == [t(6)]  # one GOP of 10
    assert pairs.mates("bframes", [(t(4), t(5))]) == []
    assert _pairs(budget_bytes=0, a=_track(gop=2)).mates("a", [(t(4), t(5))]) == []


def test_the_budget_bounds_what_is_kept_and_unasked_frames_go_when_room_is_needed():
    pairs = _pairs(budget_bytes=24, a=_track(gop=2, frames=2000))
    for first in (0, 2):
        assert pairs.mates("a", [(t(first), t(first + 1))]) == [t(first + 1)]
        pairs.keep("a", t(first + 1), _frame(first + 1))
    assert pairs.mates("a", [(t(4), t(5))]) == []  # full: the two kept are due soon
    assert pairs.stats()["held_bytes"] == 24
    for _ in range(300):  # many queries later, frames 1 and 3 were never asked for
        _take(pairs, "a", t(1999))
    assert pairs.mates("a", [(t(8), t(9))]) == [t(9)]
    pairs.keep("a", t(9), _frame(9))
    stats = pairs.stats()
    assert stats["dropped"] == 1 and stats["held_bytes"] == 24 and torch.equal(_take(pairs, "a", t(9)), _frame(9))
    assert _take(pairs, "a", t(1)) is None and torch.equal(_take(pairs, "a", t(3)), _frame(3))


def test_forgotten_files_hold_nothing():
    pairs = _pairs(a=_track(gop=2), b=_track(gop=2))
    for path in ("a", "b"):
        pairs.mates(path, [(t(0), t(1))])
        pairs.keep(path, t(1), _frame(1))
    pairs.forget(["a"])
    assert _take(pairs, "a", t(1)) is None and _take(pairs, "b", t(1)) is not None
    assert pairs.stats()["held_bytes"] == 0


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match="budget_bytes must be >= 0, got -1"):
        GopPairs(budget_bytes=-1)


def test_a_files_table_is_read_once_while_remembered():
    reads = []
    tracks = {"a": _track(gop=2), "b": _track(gop=2)}

    def track_of(path):
        reads.append(path)
        return tracks[path]

    for remembered, expected in ((2, ["a", "b"]), (1, ["a", "b", "a", "b"])):
        reads.clear()
        pairs = GopPairs(budget_bytes=1000, files_remembered=remembered, track_of=track_of)
        for path in ("a", "b", "a", "b"):
            assert pairs.mates(path, [(t(2), t(3))]) == [t(3)]
        assert reads == expected
