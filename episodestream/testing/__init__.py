"""Loopback servers that stand in for remote storage in tests and benchmarks.

``FakeHub`` serves dataset folders as Hugging Face Hub repos, ``S3Server`` is an S3 endpoint (moto),
``HttpServer`` a plain HTTP file server (the standard library's, with Range requests and Basic auth)
and ``ShapingProxy`` sits in front of any of them to throttle, delay and break the link. Each binds to
127.0.0.1 on a free port when started and stops its threads when stopped; importing this package
starts nothing and imports neither moto nor huggingface_hub.

``episodestream.testing.faults`` (imported on its own) is the test seam into a dataset: where it opens
video readers, row readers, episode videos, decoder caches and downloads, for tests that inject faults
there, and what a consumer's schedule plans. Three more, each imported on its own, do the same
without a dataset, for tests of one layer: ``episodestream.testing.source_files`` opens a source's
files, ``episodestream.testing.downloads`` names the parts of the download path and
``episodestream.testing.video_readers`` opens a backend's video reader.
"""

from episodestream.testing._fake_hub import FakeHub, HubStats, PathStats
from episodestream.testing._http import HttpServer, HttpStats
from episodestream.testing._s3 import S3Server
from episodestream.testing._shaping_proxy import LinkSettings, ProxyStats, ShapingProxy

__all__ = [
    "FakeHub",
    "HttpServer",
    "HttpStats",
    "HubStats",
    "LinkSettings",
    "PathStats",
    "ProxyStats",
    "S3Server",
    "ShapingProxy",
]
