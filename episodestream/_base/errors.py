"""Errors a user may catch, defined where importing them loads nothing and every layer can raise them
(``CacheFullError`` is raised by the remote cache, whose package imports fsspec; ``DatasetFormatError``
by every module of the format layer)."""

from __future__ import annotations


class CacheFullError(RuntimeError):
    """The node cache's disk budget (``cache_limit``) cannot hold what a dataset needs: pinned
    (prewarmed) entries fill it, or other users did not release space within the cache wait. The
    message says how much is pinned by which sources and how to unpin them."""


class DatasetFormatError(ValueError):
    """The dataset's files do not follow the LeRobot format (v3.0, or the v2.0 / v2.1 layout they say they have)."""
