"""How many cores this process may run on."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process is allowed (its affinity mask where the OS has one), at least 1."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
