"""URLs and messages as they may be shown: without the credentials a user put in them.

The one place secrets are taken out of text: ``redact_url`` (a URL), ``redact_text`` (any
message: URLs' user info and query strings, anything that looks like a token), ``redact_secrets``
(given secrets, e.g. a Hub token or keys in ``storage_options``).

Here, below the format and remote layers, because both show sources: the remote layer in its
errors and logs, the metadata (``dataset.meta.repo_id``, its repr and errors) the source as given.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable


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


_CREDENTIAL_RES = (
    re.compile(r"\b(hf_|api_org_)[A-Za-z0-9]{6,}"),
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"),
    re.compile(r"(?i)\b(authorization|token|access_token|api_key|apikey|password|signature|sig|"
               r"x-amz-security-token|x-amz-signature|x-amz-credential)(['\"]?\s*[:=]\s*)['\"]?[^\s'\",&]+"),
)
_URL_RE = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def redact_text(text: str) -> str:
    """``text`` with URLs' user info and query strings and anything that looks like a token removed."""
    text = _URL_RE.sub(lambda m: redact_url(m.group(0)), text)
    text = _CREDENTIAL_RES[0].sub(lambda m: m.group(1) + "<redacted>", text)
    text = _CREDENTIAL_RES[1].sub(lambda m: m.group(1) + " <redacted>", text)
    return _CREDENTIAL_RES[2].sub(lambda m: m.group(1) + m.group(2) + "<redacted>", text)


def redact_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
