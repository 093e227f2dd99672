"""``coalesce``: neighbouring byte ranges joined into few reads, within a hole and a read size."""

from __future__ import annotations

from episodestream._base.byte_ranges import coalesce


def test_neighbours_closer_than_the_hole_are_one_read_and_others_apart():
    ranges = [(300, 400), (0, 100), (110, 200), (1000, 1100)]
    assert coalesce(ranges, hole_bytes=10, max_bytes=10_000) == [(0, 200), (300, 400), (1000, 1100)]
    assert coalesce(ranges, hole_bytes=100, max_bytes=10_000) == [(0, 400), (1000, 1100)]
    assert coalesce(ranges, hole_bytes=0, max_bytes=10_000) == [(0, 100), (110, 200), (300, 400), (1000, 1100)]


def test_overlaps_join_and_a_read_never_passes_max_bytes_nor_cuts_a_range():
    assert coalesce([(0, 100), (50, 150), (150, 160)], hole_bytes=0, max_bytes=1_000) == [(0, 160)]
    # 0..100 and 90..250 would be a read of 250 > 200: the second starts where the first ended.
    assert coalesce([(0, 100), (90, 250)], hole_bytes=0, max_bytes=200) == [(0, 100), (100, 250)]
    # A range longer than max_bytes is a read of its own, whole.
    assert coalesce([(0, 10), (12, 500), (505, 510)], hole_bytes=5, max_bytes=100) == [(0, 10), (12, 500), (505, 510)]
    # Every byte asked for is in a read; empty ranges are dropped.
    ranges = [(5, 9), (9, 9), (40, 80), (70, 75), (100, 130)]
    reads = coalesce(ranges, hole_bytes=15, max_bytes=60)
    assert reads == [(5, 9), (40, 80), (100, 130)]
    assert all(any(a <= s and e <= b for a, b in reads) for s, e in ranges if e > s)


def test_ranges_kept_ahead_stop_at_half_the_readers_cache_and_are_then_read_from_memory():
    """``ChunkedReader.keep``: each range one request; past half the reader's cache it keeps no
    more (kept, the last would push the first out before they are read); a later read inside a
    kept range asks for nothing."""
    from episodestream._remote.transport.reader import ChunkedReader

    data = bytes(range(256)) * 40
    asked: list[tuple[int, int]] = []

    def fetch(fs, path, start, end):
        asked.append((start, end))
        return data[start:end]

    reader = ChunkedReader(None, lambda path: len(data), fetch=fetch, cache_bytes=1_000)
    reader.keep("f", [(0, 200), (1_000, 1_200), (2_000, 2_200), (3_000, 3_200)])
    assert sorted(asked) == [(0, 200), (1_000, 1_200)]  # 400 bytes of a 1,000-byte cache: 2 of 4
    asked.clear()
    assert reader.read("f", 1_050, 1_100) == data[1_050:1_100]
    assert asked == []
