"""The test seam into video decoding, without a dataset: open a reader of a local mp4 with one of the
backends a dataset's ``video_backend=`` names.

A dataset decodes through a reader per video file (``frames_played_at(seconds)`` gives the frames
shown at those times and their pts; ``close`` lets the file go). Tests of decoding itself (B-frames,
depth cameras, sparse downloads decoding as the whole file) open one here instead of importing the
backends, so this module is the one place outside the package that knows where they live. Close
the readers you open.

    from episodestream.testing import video_readers

    reader = video_readers.open_video_reader(path, backend="pyav")
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from episodestream._sample.video.backends import VideoReader

__all__ = ["open_video_reader"]


def open_video_reader(path: str | os.PathLike, *, backend: str, **options: Any) -> VideoReader:
    """A reader of the local mp4 ``path`` as a dataset with ``video_backend=backend`` opens one on the
    CPU, whatever ``EPISODESTREAM_VIDEO_BACKEND`` says (a test names the backend it tests).
    ``options``: the backend's own, ``pixel_format`` ("rgb24", or "gray12le" for a depth camera)
    for "pyav", ``device`` for "torchcodec"."""
    from episodestream._base.options import check_choice
    from episodestream._sample.video.backends import VIDEO_BACKENDS, PyAVReader, TorchCodecReader

    reader = PyAVReader if check_choice("backend", backend, VIDEO_BACKENDS) == "pyav" else TorchCodecReader
    return reader(os.fspath(path), **options)
