"""Warnings blamed on the user's line: ``warn_user(message, category)``.

A warning's ``stacklevel`` counted by hand breaks whenever a wrapper is added or a second public
path reaches the same code (the count then blames a line inside episodestream, or one in the
user's caller's caller). ``warn_user`` instead walks the stack to the first frame outside the
package and warns there, however deep the call chain.

Python 3.12's ``warnings.warn(skip_file_prefixes=...)`` does this walk; this project supports
Python 3.10 and 3.11, so it is written out here. Once 3.12 is the oldest supported version,
``skip_file_prefixes=(_PACKAGE_DIR,)`` replaces ``_user_stacklevel`` (keeping the thread fallback
below, which that argument does not make).
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

# The package's folder with a trailing separator, so that a sibling such as
# ``episodestream_extras/`` is not taken for it. Unresolved, as frames' ``co_filename`` are.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# A thread's entry points: a frame of these is not a user's line but a thread that episodestream
# started (a decode or prefetch thread), which has no user's line at all.
_THREAD_MODULES = frozenset({"threading", "concurrent.futures.thread"})


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` blamed on the first frame outside episodestream: the
    user's line that called the public API, however many of the package's frames lie between.

    Where there is none (the warning is raised on a thread the package started, whose stack is the
    package's frames over the thread's entry point), the line that called ``warn_user`` is blamed,
    as a plain ``warnings.warn`` there would. In a DataLoader worker the first frame outside the
    package is torch's, the one that called the dataset: that is the line blamed.
    """
    warnings.warn(message, category, stacklevel=_user_stacklevel(sys._getframe(1)))


def _user_stacklevel(caller: FrameType) -> int:
    """The ``stacklevel`` that makes ``warnings.warn`` in ``warn_user`` blame the first frame outside
    the package, ``caller`` being ``warn_user``'s caller (stacklevel 2).

    Counted as ``warnings`` counts: importlib's bootstrap frames are skipped, not counted.
    """
    level, frame = 2, caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = _next_counted(frame)
        level += 1
    if frame is None or frame.f_globals.get("__name__") in _THREAD_MODULES:
        return 2
    return level


def _next_counted(frame: FrameType) -> FrameType | None:
    # warnings.warn steps over these frames without counting them (warnings._next_external_frame).
    frame_back = frame.f_back
    while frame_back is not None and _is_importlib_frame(frame_back):
        frame_back = frame_back.f_back
    return frame_back


def _is_importlib_frame(frame: FrameType) -> bool:
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename
