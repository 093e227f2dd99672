"""``HubLink``: the filesystem a Hub source reads through, in place of huggingface_hub's ``HfFileSystem``.

Every request a Hub source sends is ours, through ``request.request``: the commit, listings and
look-ups (``_remote.source.hub_api``) and reads (``download.DownloadFetch``, one ``hub_http.hub_send``
per attempt). Of its filesystem a Hub source then needs only where the link goes: the endpoint (the
download budget's name, the ``/resolve/`` URLs) and the token (the request headers). ``HfFileSystem``
carried those, but its module imports ``huggingface_hub.hf_api`` and the rest of the client (more
than the HTTP stack alone, after torch, benchmarks/LOG.md; paid again by each spawned
DataLoader worker) for requests it never sent.

A ``HubLink`` is an fsspec filesystem in type and protocol only (``"hf"``, so that ``link_name`` and
``DownloadFetch`` tell it is the Hub): it sends nothing, and opening a file through it is refused.
``client_class("hf")`` (``_remote.source.resolve``) returns this class.
"""

from __future__ import annotations

from typing import Any

from fsspec import AbstractFileSystem


class HubLink(AbstractFileSystem):
    """The Hub at ``endpoint`` with ``token`` (None: huggingface_hub's lookup; ``False``: none), for
    ``DownloadFetch`` to read through. ``storage_options`` are accepted and unused, as
    ``HfFileSystem`` left them to requests that are now ours."""

    protocol = "hf"
    cachable = False  # one per process and source (``ResolvedSource.filesystem``), like every client

    def __init__(self, *, endpoint: str, token: Any = None, **storage_options: Any) -> None:
        super().__init__(**storage_options)
        self.endpoint = endpoint
        self.token = token

    def __repr__(self) -> str:
        return f"HubLink(endpoint={self.endpoint!r})"  # never the token

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        # Reads go through the download path (permits, the one retry policy): a fetch of our own.
        raise NotImplementedError(
            f"HubLink sends no request itself: read {path!r} through a DownloadFetch "
            f"(RemoteFiles(fetch=...) must be one, or call one), which sends Hub reads as ranged GETs.")
