"""``LookAhead``: a prefetching consumer's reads ahead of its pool, as one stage.

How far ahead admissions start (a full pool ``admissions_ahead`` ahead, a filling one as far as its
room), each episode started once while held, video handed over in need order and rows read on one
thread of the stage's (a data file's waiting reads together), errors raised by the ``read`` that
wants those rows, nothing left running after ``close`` nor once idle."""

from __future__ import annotations

import threading
import time

import pytest

from episodestream._plan.sampling import ADMIT, EMIT, EVICT, NO_FRAME, Step
from episodestream._runtime.lookahead.stage import (
    FIRST_ADMISSIONS_APART,
    MAX_STEPS_AHEAD,
    STEPS_AHEAD_PER_STEP,
    STEPS_PAST_ADMISSION,
    LookAhead,
)


class _Episode:
    def __init__(self, index: int, data_file: str = "data/file-000.parquet") -> None:
        self.episode_index = index
        self.data_relpath = data_file


class _Episodes(dict):
    def __missing__(self, index: int) -> _Episode:
        episode = self[index] = _Episode(index)
        return episode


class _SlowReader:
    """Reads take ``delay_s``; records (episodes, thread name) per read; ``fail`` raises for those."""

    def __init__(self, delay_s: float = 0.05, fail: tuple[int, ...] = ()) -> None:
        self.delay_s, self.fail = delay_s, fail
        self.reads: list[tuple[list[int], str]] = []

    def read(self, episode):
        time.sleep(self.delay_s)
        self.reads.append(([episode.episode_index], threading.current_thread().name))
        if episode.episode_index in self.fail:
            raise OSError(f"episode {episode.episode_index}: no rows")
        return f"rows of {episode.episode_index}"


class _ManyReader(_SlowReader):
    def read_many(self, episodes):
        time.sleep(self.delay_s)
        self.reads.append(([e.episode_index for e in episodes], threading.current_thread().name))
        if any(e.episode_index in self.fail for e in episodes):
            raise OSError("one of them has no rows")
        return [f"rows of {e.episode_index}" for e in episodes]


class _Videos:
    """Records each ``admit_many`` call with how many steps the stage had passed on by then."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[int]]] = []
        self.passed = 0

    def admit_many(self, episodes) -> None:
        self.calls.append((self.passed, [e.episode_index for e in episodes]))


def _stage(reader=None, *, pool_size: int = 2, ahead: int = 1) -> tuple[LookAhead, _Videos]:
    videos = _Videos()
    stage = LookAhead(reader or _SlowReader(delay_s=0), videos, _Episodes(), pool_size=pool_size,
                      admissions_ahead=ahead)  # type: ignore[arg-type]  # fakes of the protocol
    return stage, videos


def _run(stage: LookAhead, videos: _Videos, steps: list[Step]) -> list[Step]:
    out = []
    for step in stage.steps(iter(steps)):
        out.append(step)
        videos.passed += 1
    return out


def _admit(i: int) -> Step:
    return Step(ADMIT, i, NO_FRAME)


def _emit(i: int) -> Step:
    return Step(EMIT, i, 0)


def _evict(i: int) -> Step:
    return Step(EVICT, i, NO_FRAME)


def _idle(timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(t.name == "episodestream-rows" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_filling_pool_starts_as_many_as_its_room_and_a_full_one_admissions_ahead():
    stage, videos = _stage(pool_size=2, ahead=1)
    # A pool of 2: admits 0 and 1, then each later admission follows an eviction.
    steps = [_admit(0), _emit(0), _admit(1), _emit(1), _evict(0), _admit(2), _emit(2),
             _evict(1), _admit(3), _emit(3), _evict(2), _evict(3)]
    assert _run(stage, videos, steps) == steps  # passed through unchanged
    # At the start the pool has room for 2 and 1 more runs ahead: 0, 1 and 2 start together,
    # before any step is passed on. Then 3 starts once 0's eviction has been passed on (the
    # pool's room gone, one admission ahead).
    assert videos.calls == [(0, [0, 1, 2]), (5, [3])]
    stage.close()


def test_a_filling_pools_admissions_start_in_the_order_of_their_first_emits():
    """A pool filling up (a whole share admits every episode before its first emit) starts its
    admissions in the order the samples need them, not the order it admits them in: the first
    batch waits for its own episodes' rows and video, not for the whole pool's."""
    stage, videos = _stage(pool_size=4, ahead=1)
    steps = [_admit(0), _admit(1), _admit(2), _admit(3), _emit(2), _emit(0), _emit(2), _emit(3), _emit(1)]
    assert _run(stage, videos, steps) == steps  # passed through unchanged
    assert videos.calls == [(0, [2, 0, 3, 1])]
    stage.close()


def test_a_filling_pools_first_admissions_in_need_order_start_apart_from_the_rest():
    """The fetcher reads the spans of one ``admit_many`` call's episodes in runs of neighbours: the
    first batch's few episodes go in a call of their own, so their spans do not wait for runs."""
    count = FIRST_ADMISSIONS_APART + 8
    stage, videos = _stage(pool_size=count, ahead=1)
    need = list(range(count))[::-1]  # emitted in the reverse of their admission order
    steps = [_admit(i) for i in range(count)] + [_emit(i) for i in need]
    assert _run(stage, videos, steps) == steps
    assert videos.calls == [(0, need[:FIRST_ADMISSIONS_APART]), (0, need[FIRST_ADMISSIONS_APART:])]
    stage.close()


def test_a_read_wanted_now_goes_before_the_reads_queued_ahead_of_it():
    reader = _SlowReader(delay_s=0.1)
    stage, videos = _stage(reader, pool_size=3, ahead=0)
    it = stage.steps(iter([_admit(4), _admit(1), _admit(7)]))
    next(it)  # all three started, in need order 4, 1, 7 (the thread may have taken 4 already)
    assert stage.read(_Episode(7)) == "rows of 7"
    read = [episodes for episodes, _ in reader.reads]
    assert [7] in read and [1] not in read, read  # 7 went before 1
    list(it)
    stage.close()


def test_an_episode_is_started_once_per_time_the_pool_holds_it():
    stage, videos = _stage(pool_size=4, ahead=4)
    steps = [_admit(7), _admit(7), _emit(7), _evict(7), _admit(7), _evict(7), _evict(7), _admit(7), _evict(7)]
    _run(stage, videos, steps)
    # Two holds, then a third while one remains: one start; after the last eviction, another
    # (both taken ahead at once: the pool has room for all of it).
    assert videos.calls == [(0, [7, 7])]
    stage.close()


def test_steps_held_back_are_bounded_where_no_admission_comes():
    stage, videos = _stage(pool_size=2, ahead=1)
    emits = MAX_STEPS_AHEAD + 10
    source_pulled = 0

    def steps():
        nonlocal source_pulled
        yield _admit(0)
        for _ in range(emits):
            source_pulled += 1
            yield _emit(0)

    it = stage.steps(steps())
    assert next(it) == _admit(0)
    # Not the whole tail read ahead before the first step: a first batch waits for what is read.
    assert source_pulled <= STEPS_PAST_ADMISSION
    passed = 1000
    for _ in range(passed - 1):
        next(it)
    assert source_pulled <= STEPS_PAST_ADMISSION + passed * STEPS_AHEAD_PER_STEP
    assert sum(1 for _ in it) == emits + 1 - passed
    assert source_pulled == emits
    stage.close()


def test_a_filling_pools_admissions_are_all_found_before_the_first_step_passes():
    """Admissions far apart in a filling pool (a ramp's slots of long episodes) are all read ahead,
    however many emits lie between them, before the first step is passed on."""
    stage, videos = _stage(pool_size=4, ahead=1)
    gap = STEPS_PAST_ADMISSION - 1
    steps = [step for i in range(4) for step in [_admit(i)] + [_emit(i)] * gap]
    assert _run(stage, videos, steps) == steps
    assert videos.calls[0] == (0, [0, 1, 2, 3])
    stage.close()


def test_reads_ahead_run_in_need_order_on_their_own_thread_and_are_taken_by_read():
    reader = _SlowReader()
    stage, videos = _stage(reader, pool_size=3, ahead=0)
    it = stage.steps(iter([_admit(4), _admit(1), _admit(7), _emit(4)]))
    first = next(it)  # all three started together
    assert first == _admit(4) and videos.calls == [(0, [4, 1, 7])]
    _idle()  # the thread exits once nothing is queued
    started = time.monotonic()
    assert [stage.read(_Episode(i)) for i in (4, 1, 7)] == ["rows of 4", "rows of 1", "rows of 7"]
    assert time.monotonic() - started < reader.delay_s  # all three were read already
    assert reader.reads == [([4], "episodestream-rows"), ([1], "episodestream-rows"), ([7], "episodestream-rows")]
    assert stage.read(_Episode(1)) == "rows of 1"  # taken once: a second read reads again
    assert len(reader.reads) == 4
    list(it)
    stage.close()


def test_a_data_files_waiting_reads_are_taken_together_growing():
    reader = _ManyReader(delay_s=0.05)
    stage, videos = _stage(reader, pool_size=20, ahead=0)
    it = stage.steps(iter([_admit(i) for i in range(12)]))
    next(it)
    _idle()
    batches = [indices for indices, _ in reader.reads]
    # The first read alone would wait behind nothing; the queue holds all 12 when the thread
    # starts: 4 at the file's first read, then 8 (READ_TOGETHER, doubling).
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11]], batches
    assert [stage.read(_Episode(i)) for i in range(12)] == [f"rows of {i}" for i in range(12)]
    list(it)
    stage.close()


def test_an_error_ahead_is_raised_by_the_read_that_wants_those_rows_and_names_its_own():
    reader = _ManyReader(delay_s=0.01, fail=(2,))
    stage, videos = _stage(reader, pool_size=4, ahead=0)
    it = stage.steps(iter([_admit(1), _admit(2), _admit(3)]))
    next(it)
    # One file's reads failed together: each was read alone, so only episode 2's read raises.
    with pytest.raises(OSError, match="episode 2: no rows"):
        stage.read(_Episode(2))
    assert stage.read(_Episode(3)) == "rows of 3"
    assert stage.read(_Episode(1)) == "rows of 1"
    list(it)
    stage.close()


def test_close_waits_for_the_read_under_way_and_refuses_more():
    reader = _SlowReader(delay_s=0.2)
    stage, videos = _stage(reader, pool_size=2, ahead=0)
    it = stage.steps(iter([_admit(0), _admit(1)]))
    next(it)
    time.sleep(0.05)  # 0 is being read, 1 is queued
    stage.close()
    assert [indices for indices, _ in reader.reads] == [[0]]
    assert not any(t.name == "episodestream-rows" for t in threading.enumerate())
    with pytest.raises(RuntimeError, match="closed"):
        stage.read(_Episode(2))
