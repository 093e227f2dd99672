"""One attempt at a Hub request, on huggingface_hub's HTTP session without its retries.

``hub_send`` is one request through huggingface_hub's own session (``get_session()``: its proxies,
redirects to the CDN), checked by ``hf_raise_for_status`` (its ``RepositoryNotFoundError``,
``RevisionNotFoundError``, ``EntryNotFoundError``), never through ``http_backoff``, whose retries
would hide throttling from the download controller: ``request`` retries. ``hub_headers`` is the
token and user agent, made here rather than by ``build_hf_headers``, which (telemetry on) asks the
Hub for its agent-harness registry on a process's first request: one more round trip before a
cold process's first byte, for a user-agent suffix.
"""

from __future__ import annotations

import platform
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

_HUB_PATH = re.compile(r"^(datasets|spaces|models)/([^/@]+/[^/@]+)(?:@([^/]+))?/(.+)$")


def import_client() -> None:
    """Import the parts of huggingface_hub a Hub request uses (its HTTP session and stack, the
    token lookup, its error classes), and not ``hf_api`` or ``hf_file_system``, which the requests
    here do not need. ``resolve.client_class`` calls it with the cyclic collector paused.

    The session is made here too, not at the first request: its transport imports the rest of the
    HTTP stack (httpcore, anyio, and trio where it is installed) when it is made, and with the
    collector on, in a process that has imported torch and torchcodec, that import made a cold build
    slower (``benchmark_first_batch.py``; benchmarks/LOG.md, "The remote first batch from a
    cold process")."""
    import huggingface_hub.errors  # noqa: F401
    from huggingface_hub import get_session
    from huggingface_hub.utils import get_token, hf_raise_for_status  # noqa: F401

    get_session()  # huggingface_hub's one client of the process, made once


def hub_headers(token: Any) -> dict[str, str]:
    """Headers of every Hub request: the user agent, and ``Authorization`` for ``token`` (None:
    huggingface_hub's lookup, ``HF_TOKEN`` or the stored login; ``False``: none)."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import get_token

    if token is None or token is True:
        token = None if (token is None and constants.HF_HUB_DISABLE_IMPLICIT_TOKEN) else get_token()
    headers = {"user-agent": f"episodestream; hf_hub/{huggingface_hub.__version__}; "
                             f"python/{platform.python_version()}"}
    if isinstance(token, str) and token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def hub_url(endpoint: str, path: str) -> str:
    """The ``/resolve/`` URL of a Hub filesystem path ``datasets/<owner>/<name>@<revision>/<file>``."""
    match = _HUB_PATH.match(path.removeprefix("hf://"))
    if match is None:
        raise ValueError(f"Not a Hub file path with a revision: {path!r}")
    kind, repo_id, revision, path_in_repo = match.groups()
    revision = urllib.parse.unquote(revision) if revision else "main"
    return (f"{endpoint.rstrip('/')}/{'' if kind == 'models' else kind + '/'}{repo_id}/resolve/"
            f"{urllib.parse.quote(revision, safe='')}/{urllib.parse.quote(path_in_repo)}")


def hub_send(method: str, url: str, headers: Mapping[str, str], timeout_s: float, *,
             data: Mapping[str, Any] | None = None) -> tuple[bytes, Any]:
    """One ``method`` request of ``url``: the body and the response's headers; raises the
    client's error (a status that is not 2xx raised by ``hf_raise_for_status``)."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import hf_raise_for_status

    response = get_session().request(method, url, headers=dict(headers), data=data, timeout=timeout_s)
    hf_raise_for_status(response)
    return response.content, response.headers
