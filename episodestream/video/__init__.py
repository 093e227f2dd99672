"""Video decoding: backends behind one interface, a per-consumer decoder cache, grouped queries."""

from ._backends import VIDEO_BACKENDS, PyAVReader, TorchCodecReader, VideoReader, resolve_backend
from ._cache import MAX_DECODERS, DecoderCache, FrameQuery, VideoDecodeError, decode_queries

__all__ = [
    "MAX_DECODERS",
    "VIDEO_BACKENDS",
    "DecoderCache",
    "FrameQuery",
    "PyAVReader",
    "TorchCodecReader",
    "VideoDecodeError",
    "VideoReader",
    "decode_queries",
    "resolve_backend",
]
