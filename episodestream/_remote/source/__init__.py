"""Remote datasets: resolving a source (Hub revision pinned to a commit, fsspec URLs), mp4 byte
spans, ``RemoteFiles`` and ``RemoteVideos`` (the format layer's seams), ``open_remote_source``."""
