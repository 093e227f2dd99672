"""Video decoding, public subset: the backends a dataset's ``video_backend=`` accepts and the error
a failed decode raises. The decoders and their cache live in ``episodestream._sample.video``."""

from episodestream._sample.video.backends import VIDEO_BACKENDS
from episodestream._sample.video.decoder_cache import VideoDecodeError

__all__ = ["VIDEO_BACKENDS", "VideoDecodeError"]
