"""Remote sources: streaming from the Hub, buckets and fsspec URLs through a node-wide cache, the
adaptive download controller and node-wide download permits."""

from ._node_cache import CacheFullError, CacheStats, EntryState, NodeCache
from ._config import ControllerConfig
from ._controller import DownloadController
from ._download import DownloadFetch, FetchStats, default_fetch, link_name
from ._estimator import LinkEstimator
from ._open import open_remote_source
from ._remote_files import RemoteFiles
from ._remote_videos import RemoteVideos
from ._resolve import default_cache_dir
from ._mp4 import Mp4LayoutError
from ._permits import NodePermits
from ._reader import ChunkedReader, RangedFile, ReadStats, fetch_range
from ._retry import DownloadError, RetryPolicy

__all__ = [
    "CacheFullError",
    "CacheStats",
    "ChunkedReader",
    "ControllerConfig",
    "DownloadController",
    "DownloadError",
    "DownloadFetch",
    "EntryState",
    "FetchStats",
    "LinkEstimator",
    "Mp4LayoutError",
    "NodeCache",
    "NodePermits",
    "RangedFile",
    "ReadStats",
    "RemoteFiles",
    "RemoteVideos",
    "RetryPolicy",
    "default_cache_dir",
    "default_fetch",
    "fetch_range",
    "link_name",
    "open_remote_source",
]
