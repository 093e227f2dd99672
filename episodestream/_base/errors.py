"""Errors a user may catch that belong to optional layers, defined where importing them loads nothing
(``CacheFullError`` is raised by the remote cache, whose package imports fsspec)."""

from __future__ import annotations


class CacheFullError(RuntimeError):
    """The node cache's disk budget (``cache_limit``) cannot hold what a dataset needs: pinned
    (prewarmed) entries fill it, or other users did not release space within the cache wait. The
    message says how much is pinned by which sources and how to unpin them."""
