"""Remote sources, public subset: what a user configures, catches or manages. Sources themselves are
opened by passing a Hub repo id or URL to a dataset; the machinery lives in ``episodestream._remote``
(transport, node cache, source), which is private."""

from episodestream._base.errors import CacheFullError
from episodestream._base.paths import default_cache_dir
from episodestream._remote.cache.node_cache import CacheStats, EntryState, NodeCache
from episodestream._format.mp4 import Mp4LayoutError
from episodestream._remote.transport.config import ControllerConfig
from episodestream._remote.transport.request import DownloadError

__all__ = [
    "CacheFullError",
    "CacheStats",
    "ControllerConfig",
    "DownloadError",
    "EntryState",
    "Mp4LayoutError",
    "NodeCache",
    "default_cache_dir",
]
