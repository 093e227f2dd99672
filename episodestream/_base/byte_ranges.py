"""``coalesce``: byte ranges wanted together, joined into as few reads as their gaps allow.

Why our own: pyarrow coalesces a row group's column chunks (``CacheOptions``: holes up to 8 KiB),
but not the row groups of a ``read_row_groups`` call that lie apart, and nothing coalesces the
video spans of episodes admitted together. Over a link with a round trip per request, a pool's
first admissions (hundreds of episodes, ``_runtime.lookahead.stage``) cost a request per range
where their neighbours could share one. A gap up to ``hole_bytes`` is read rather than split at
(bytes for round trips); a read never grows past ``max_bytes`` (memory), and a range is never cut.
"""

from __future__ import annotations

from collections.abc import Iterable


def coalesce(ranges: Iterable[tuple[int, int]], *, hole_bytes: int, max_bytes: int) -> list[tuple[int, int]]:
    """``ranges`` (``[start, end)``, any order, overlapping or not) as sorted reads: neighbours
    closer than ``hole_bytes`` joined while the read stays within ``max_bytes`` (a range longer than
    that is a read of its own)."""
    reads: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if end <= start:
            continue
        if reads:
            first, last = reads[-1]
            if start - last <= hole_bytes and max(end, last) - first <= max_bytes:
                reads[-1] = (first, max(end, last))
                continue
            if start < last:  # an overlap too long to join: read what the last read left
                start = last
                if end <= start:
                    continue
        reads.append((start, end))
    return reads
