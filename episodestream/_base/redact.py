"""URLs as they may be shown: without the credentials a user put in them.

Here, below the format and remote layers, because both show sources: the remote layer in its
errors and logs, the metadata (``dataset.meta.repo_id``, its repr and errors) the source as given.
"""

from __future__ import annotations

import os
import urllib.parse


def redact_url(url: str) -> str:
    """``url`` without user info, query string or fragment (where signed URLs and tokens live)."""
    try:
        parts = urllib.parse.urlsplit(str(url))
    except ValueError:
        return "<unparseable url>"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    query = "?<redacted>" if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", "")) + query


def shown_source(source: str | os.PathLike) -> str:
    """``source`` as given, unless it is a URL holding credentials (``user:password@``, a query
    string, a fragment): then ``redact_url(source)``. Folders and clean URLs stay byte for byte."""
    text = os.fspath(source)
    if "://" not in text:
        return text
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:
        return "<unparseable url>"
    return redact_url(text) if "@" in parts.netloc or parts.query or parts.fragment else text
