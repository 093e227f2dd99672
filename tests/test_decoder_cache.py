"""A consumer's decode threads share one decoder cache: each decoder lent to one thread at a time,
each file kept open once, the cache's capacity bounding lent and idle decoders together."""

from __future__ import annotations

import threading

import pytest

from episodestream._sample.video.decoder_cache import DecoderCache


class _Reader:
    def __init__(self, path: str, opened: list[_Reader]) -> None:
        self.path, self.closed = path, False
        opened.append(self)

    def frames_played_at(self, seconds):
        raise AssertionError("not decoded here")

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


def _cache(capacity: int) -> tuple[DecoderCache, list[_Reader]]:
    opened: list[_Reader] = []
    return DecoderCache(lambda path: _Reader(path, opened), capacity=capacity), opened


def test_threads_share_a_files_decoder_one_at_a_time():
    cache, opened = _cache(capacity=8)
    first, second = cache.share(), cache.share()
    with first.reading("a.mp4") as reader:
        with second.reading("a.mp4") as other:  # read at once: a decoder each
            assert other is not reader
    with second.reading("a.mp4") as again:  # then either thread takes an idle one
        assert again in (reader, other)
    assert len(opened) == 2
    with first.reading("b.mp4"):
        pass
    assert cache.stats() == {"hits": 1, "misses": 3, "evictions": 0, "open": 3, "capacity": 8,
                             "pair_frames_kept": 0, "pair_frames_served": 0}


def test_capacity_bounds_lent_and_idle_decoders_least_recent_closed_first():
    cache, opened = _cache(capacity=2)
    share = cache.share()
    for path in ("a", "b", "c"):
        with share.reading(path):
            pass
    assert [r.path for r in opened if r.closed] == ["a"]
    with share.reading("b") as b, cache.share().reading("c") as c:  # both lent: room for no idle one
        with share.reading("d"):
            pass
    assert [r.path for r in opened if r.closed] == ["a", "d"] and not b.closed and not c.closed
    assert cache.stats()["open"] == 2


def test_a_reader_that_raised_is_closed_and_the_last_share_closes_the_rest():
    cache, opened = _cache(capacity=4)
    first, second = cache.share(), cache.share()
    with pytest.raises(ValueError):
        with first.reading("a"):
            raise ValueError("broken frame")
    assert opened[0].closed
    with first.reading("b"):
        pass
    first.close()
    assert not opened[1].closed  # the other thread still reads through it
    with second.reading("b") as reader, pytest.raises(RuntimeError, match="closed"):
        first.reading("b")
    assert reader is opened[1]
    second.close()
    assert all(r.closed for r in opened)
    assert cache.stats()["misses"] == 2  # counts stay readable


def test_a_decoder_lent_when_the_cache_closes_is_closed_on_return():
    cache, opened = _cache(capacity=4)
    share = cache.share()
    lent = threading.Event()
    done = threading.Event()

    def read() -> None:
        with share.reading("a"):
            lent.set()
            done.wait(5)

    thread = threading.Thread(target=read)
    thread.start()
    lent.wait(5)
    cache.close()
    assert not opened[0].closed
    done.set()
    thread.join(5)
    assert opened[0].closed and cache.stats()["open"] == 0


def test_a_second_decoder_of_a_file_is_closed_before_any_files_only_one():
    """Closing a file's only decoder where a pool reads every file at an even pace would take the
    one needed soonest: a duplicate (two threads read its file at once) goes first."""
    cache, opened = _cache(capacity=3)
    share, other = cache.share(), cache.share()
    with share.reading("a"):
        pass
    with share.reading("b"), other.reading("b"):
        pass
    with share.reading("c"):  # over capacity: one of b's two closes, not a (the least recent)
        pass
    assert [r.path for r in opened if r.closed] == ["b"] and not opened[0].closed


def test_forgotten_files_decoders_are_closed():
    cache, opened = _cache(capacity=4)
    share = cache.share()
    for path in ("a", "b", "c"):
        with share.reading(path):
            pass
    cache.forget(["b", "not open"])
    assert [r.path for r in opened if r.closed] == ["b"] and cache.stats()["open"] == 2
