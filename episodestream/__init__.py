"""Stream LeRobot v3.0 episode datasets (parquet rows + mp4 video) into PyTorch training.

The public API is the names below. Tooling has its own modules: ``episodestream.tools.synthetic``
(synthetic datasets), ``episodestream.tools.tracing`` (Chrome traces), ``episodestream.testing``
(offline stand-ins for remote services); ``episodestream.remote`` and ``episodestream.video`` hold
the remote cache's and the decoders' public names; ``episodestream.lerobot`` is LeRobot's dataset
factory on these datasets (it needs LeRobot). Modules and packages whose names start with an
underscore are private.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the public names, for type checkers and editors; at run time they load on first use
    from episodestream._base.errors import CacheFullError
    from episodestream._format.files import SourceStats
    from episodestream._base.errors import DatasetFormatError
    from episodestream._runtime.source_options import SourceOptions
    from episodestream._sample.collate import collate
    from episodestream._sample.video.decoder_cache import VideoDecodeError
    from episodestream.loader import EpisodeLoader
    from episodestream.mapstyle import EpisodeDataset
    from episodestream.mixture import EpisodeMixture
    from episodestream.splits import split_episodes
    from episodestream.streaming import EpisodeStreamingDataset, load_loader_state, stream_state

__all__ = [
    "CacheFullError",
    "DatasetFormatError",
    "EpisodeDataset",
    "EpisodeLoader",
    "EpisodeMixture",
    "EpisodeStreamingDataset",
    "SourceOptions",
    "SourceStats",
    "VideoDecodeError",
    "collate",
    "load_loader_state",
    "split_episodes",
    "stream_state",
]

# Each public name and the module that defines it. They load on first use, so that importing a part of
# the package that needs no torch (the command line's help, its cache and info commands, tracing in a
# spawned process) does not import torch and torchcodec, ~1.5-3 CPU-s a process.
_PUBLIC = {
    "CacheFullError": "episodestream._base.errors",
    "DatasetFormatError": "episodestream._base.errors",
    "EpisodeDataset": "episodestream.mapstyle",
    "EpisodeLoader": "episodestream.loader",
    "EpisodeMixture": "episodestream.mixture",
    "EpisodeStreamingDataset": "episodestream.streaming",
    "SourceOptions": "episodestream._runtime.source_options",
    "SourceStats": "episodestream._format.files",
    "VideoDecodeError": "episodestream._sample.video.decoder_cache",
    "collate": "episodestream._sample.collate",
    "load_loader_state": "episodestream.streaming",
    "split_episodes": "episodestream.splits",
    "stream_state": "episodestream.streaming",
}

# Tooling that was importable from the top level until 0.1; still there for one release, with a warning.
_MOVED = {
    "write_synthetic_dataset": "episodestream.tools.synthetic",
    "enable_tracer": "episodestream.tools.tracing",
    "disable_tracer": "episodestream.tools.tracing",
    "load_trace": "episodestream.tools.tracing",
    "set_process_name": "episodestream.tools.tracing",
}


def __getattr__(name: str) -> Any:
    public = _PUBLIC.get(name)
    if public is not None:
        value = getattr(importlib.import_module(public), name)
        globals()[name] = value  # loaded once; later lookups do not come here
        return value
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'episodestream' has no attribute {name!r}")
    from episodestream._base.warn import warn_user  # only a moved name needs it

    warn_user(f"episodestream.{name} moved to {module}.{name}; the top-level name goes in the next release.",
              DeprecationWarning)
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
