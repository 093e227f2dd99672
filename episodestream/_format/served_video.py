"""``ServedVideo``: a video whose bytes a reader object serves, not one file on disk.

A remote consumer keeps each pooled episode's bytes in a span file of its own (the node cache's
entries), and serves one source mp4's spans together through a single file-like reader
(``_remote.source.file_view``), so that one decoder per source file reads every pooled episode of
it, as a decoder of a local v3.0 file does. The decode layer knows videos by name (its decoder cache
is keyed by name), so the name carries how to open the bytes: a ``str`` (the key, for messages and
the cache) with ``open_bytes`` (a new binary file-like with ``read`` and ``seek``) and ``track`` (the
file's sample index, for exact seeking without reading it from the bytes).
"""

from __future__ import annotations

import io
from collections.abc import Callable

from episodestream._format.mp4 import VideoTrack


class ServedVideo(str):
    """A video's name (a ``str``) whose bytes ``open_bytes()`` serves; ``track`` is its sample index."""

    open_bytes: Callable[[], io.RawIOBase]
    track: VideoTrack

    def __new__(cls, name: str, *, open_bytes: Callable[[], io.RawIOBase], track: VideoTrack) -> ServedVideo:
        served = super().__new__(cls, name)
        served.open_bytes = open_bytes
        served.track = track
        return served
