"""The test seam into the download path, without a dataset: the parts a remote source's reads go
through, for tests that drive one alone (with a fake clock and sleep, a permits directory of their
own) or watch what passes through it.

- ``DownloadFetch``: ``fetch(fs, path, start, end)``, each read through retries and the node-wide
  budget (what ``faults.download_fetch`` returns for a dataset; subclass it to watch its requests);
  ``default_fetch(config)`` is the one a remote source reads through unless given another, its
  settings read from the environment when called;
- ``DownloadController``: a node's download budget, raised and cut from the transfers it records,
  one per server (``link_name(fs)`` names a filesystem's); ``LinkEstimator``: the link's bandwidth
  and round trip, estimated from those transfers as the controller estimates them;
- ``NodePermits``: the permits that budget hands out, counted across the processes of a node;
- ``RetryPolicy``: which failures a request retries, and how long it waits between attempts;
- ``HubLink``: the filesystem a Hugging Face Hub source is read through (the package's own
  requests, not ``huggingface_hub``'s ``HfFileSystem``).

Their settings are a ``remote.ControllerConfig`` (``ControllerConfig.from_env()`` reads each knob
from ``env_var(knob)`` too); a request that gives up raises ``remote.DownloadError``. This module is
the one place outside the package that knows where they live; importing it loads none of them (nor
fsspec) until a name is used.

    from episodestream.testing import downloads

    controller = downloads.DownloadController(config=config, clock=clock, sleep=clock.sleep)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from episodestream._base.lazy_names import lazy_getattr

if TYPE_CHECKING:
    from episodestream._remote.transport.config import env_var
    from episodestream._remote.transport.controller import DownloadController
    from episodestream._remote.transport.download import DownloadFetch, default_fetch, link_name
    from episodestream._remote.transport.estimator import LinkEstimator
    from episodestream._remote.transport.hub_link import HubLink
    from episodestream._remote.transport.permits import NodePermits
    from episodestream._remote.transport.request import RetryPolicy

__all__ = ["DownloadController", "DownloadFetch", "HubLink", "LinkEstimator", "NodePermits", "RetryPolicy",
           "default_fetch", "env_var", "link_name"]

# Each name and the module that defines it; they load on first use.
_DEFINED_IN = {
    "DownloadController": "episodestream._remote.transport.controller",
    "DownloadFetch": "episodestream._remote.transport.download",
    "HubLink": "episodestream._remote.transport.hub_link",
    "LinkEstimator": "episodestream._remote.transport.estimator",
    "NodePermits": "episodestream._remote.transport.permits",
    "RetryPolicy": "episodestream._remote.transport.request",
    "default_fetch": "episodestream._remote.transport.download",
    "env_var": "episodestream._remote.transport.config",
    "link_name": "episodestream._remote.transport.download",
}

__getattr__ = lazy_getattr(__name__, _DEFINED_IN)
