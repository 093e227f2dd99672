"""Stream LeRobot v3.0 episode datasets (parquet rows + mp4 video) into PyTorch training."""

from ._dataset_files import SourceStats
from ._errors import CacheFullError
from ._metadata import DatasetFormatError
from ._source_options import SourceOptions
from .loader import EpisodeLoader
from .mapstyle import EpisodeDataset
from .mixture import EpisodeMixture
from .streaming import EpisodeStreamingDataset, stream_state
from .synthetic import write_synthetic_dataset
from .tracing import disable_tracer, enable_tracer, load_trace, set_process_name
from .video import VideoDecodeError

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
    "disable_tracer",
    "enable_tracer",
    "load_trace",
    "set_process_name",
    "stream_state",
    "write_synthetic_dataset",
]
