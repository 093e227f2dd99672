"""Video decoding: backends behind one interface, a per-consumer decoder cache, grouped queries."""

from ._backends import VIDEO_BACKENDS, PyAVReader, TorchCodecReader, VideoReader, resolve_backend
from ._decoder_cache import MAX_DECODERS, DecodedFile, DecoderCache, FrameQuery, VideoDecodeError, decode_files

__all__ = [
    "MAX_DECODERS",
    "VIDEO_BACKENDS",
    "DecodedFile",
    "DecoderCache",
    "FrameQuery",
    "PyAVReader",
    "TorchCodecReader",
    "VideoDecodeError",
    "VideoReader",
    "decode_files",
    "resolve_backend",
]
