"""``RowsAhead``: rows read ahead on one thread of its own, in the order asked for, taken by
``read``; errors raised by the ``read`` that wants those rows; nothing left running after
``close``, nor once idle."""

from __future__ import annotations

import threading
import time

import pytest

from episodestream._runtime.lookahead.rows_ahead import RowsAhead


class _Episode:
    def __init__(self, index: int) -> None:
        self.episode_index = index


class _SlowReader:
    """Reads take ``delay_s``; records (episode, thread name) per read; ``fail`` raises for those."""

    def __init__(self, delay_s: float = 0.05, fail: tuple[int, ...] = ()) -> None:
        self.delay_s, self.fail = delay_s, fail
        self.reads: list[tuple[int, str]] = []

    def read(self, episode):
        time.sleep(self.delay_s)
        self.reads.append((episode.episode_index, threading.current_thread().name))
        if episode.episode_index in self.fail:
            raise OSError(f"episode {episode.episode_index}: no rows")
        return f"rows of {episode.episode_index}"


def _idle(rows: RowsAhead, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(t.name == "episodestream-rows" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_reads_ahead_run_in_order_on_their_own_thread_and_are_taken_by_read():
    reader = _SlowReader()
    rows = RowsAhead(reader, keep=8)
    episodes = [_Episode(i) for i in (4, 1, 7)]
    for episode in episodes:
        rows.ahead(episode)
    rows.ahead(episodes[0])  # already on its way: not read twice
    _idle(rows)  # the thread exits once nothing is queued
    started = time.monotonic()
    assert [rows.read(e) for e in episodes] == ["rows of 4", "rows of 1", "rows of 7"]
    assert time.monotonic() - started < reader.delay_s  # all three were read already
    assert reader.reads == [(4, "episodestream-rows"), (1, "episodestream-rows"), (7, "episodestream-rows")]
    assert rows.read(episodes[1]) == "rows of 1"  # taken once: a second read reads again
    assert len(reader.reads) == 4
    rows.close()


def test_an_error_ahead_is_raised_by_the_read_that_wants_those_rows():
    rows = RowsAhead(_SlowReader(fail=(2,)), keep=8)
    rows.ahead(_Episode(2))
    rows.ahead(_Episode(3))
    with pytest.raises(OSError, match="episode 2: no rows"):
        rows.read(_Episode(2))
    assert rows.read(_Episode(3)) == "rows of 3"
    rows.close()


def test_reads_ahead_beyond_keep_drop_the_oldest_not_started():
    reader = _SlowReader(delay_s=0.2)
    rows = RowsAhead(reader, keep=2)
    rows.ahead(_Episode(0))
    time.sleep(0.05)  # 0 is being read
    for index in range(1, 5):
        rows.ahead(_Episode(index))
    # 0, 1 and 2 made room for 3 and 4 (keep=2): 0 is read all the same, 1 and 2 never started.
    assert [rows.read(_Episode(i)) for i in (3, 4, 1)] == ["rows of 3", "rows of 4", "rows of 1"]
    assert [index for index, _ in reader.reads] == [0, 3, 4, 1]
    rows.close()


def test_close_waits_for_the_read_under_way_and_refuses_more():
    reader = _SlowReader(delay_s=0.2)
    rows = RowsAhead(reader, keep=4)
    rows.ahead(_Episode(0))
    rows.ahead(_Episode(1))
    time.sleep(0.05)  # 0 is being read, 1 is queued
    rows.close()
    assert [index for index, _ in reader.reads] == [0]
    assert not any(t.name == "episodestream-rows" for t in threading.enumerate())
    rows.ahead(_Episode(2))  # ignored
    with pytest.raises(RuntimeError, match="closed"):
        rows.read(_Episode(2))
