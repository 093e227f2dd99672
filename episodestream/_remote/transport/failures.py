"""What a failed remote read means, decided in one place.

Every client (huggingface_hub over requests/httpx, s3fs over aiobotocore, fsspec's HTTP over
aiohttp) raises its own classes and hides the HTTP status in its own place. This module reads them
all the same way:

- ``status_of`` / ``retry_after_of``: the HTTP status and ``Retry-After`` on an error or its
  ``response`` (the one helper for both).
- ``normalise``: a transport error of any client becomes a ``TransferInterrupted`` (a
  ``ConnectionError``) or a ``TransferTimeout`` (a ``TimeoutError``), and a botocore status hidden in
  s3fs's translated ``OSError`` becomes an ``HTTPStatusError`` carrying the status and ``Retry-After``.
- ``classify``: throttle, timeout, transient or fatal (what ``request`` retries and what the
  download controller cuts its budget for), always of the normalised error.
- ``as_file_error``: a client error as the ``FileNotFoundError`` / ``PermissionError`` / ``OSError``
  a ``DatasetFiles`` caller expects, naming the file, with secrets redacted.
"""

from __future__ import annotations

import email.utils
import http.client
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from episodestream._base.redact import redact_secrets

FailureKind = Literal["throttle", "timeout", "transient", "fatal"]
THROTTLE_STATUSES = frozenset({429, 503})      # the server says "too many": cut and maybe pause
TIMEOUT_STATUSES = frozenset({408, 504})       # a timeout reported as a status: cut like a timeout
# Statuses worth retrying (the policy decides how); others keep the client's own error.
_RETRYABLE_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))
# Class names (any client) of errors that mean the connection broke or the body came short.
_TRANSPORT_NAME_MARKERS = ("Connection", "Disconnected", "IncompleteRead", "ChunkedEncoding", "ProtocolError",
                           "PayloadError", "ContentLength", "NetworkError", "ReadError", "WriteError",
                           "ResponseStreamingError", "EndpointConnectionError")


@dataclass(frozen=True)
class Failure:
    """What a failed attempt means: ``throttle`` and ``timeout`` retry and cut the budget,
    ``transient`` retries, ``fatal`` does not retry."""

    kind: FailureKind
    status: int | None = None
    retry_after_s: float | None = None


class HTTPStatusError(OSError):
    """A response with a status worth retrying (429, 5xx, 408), from a client that hid it."""

    def __init__(self, status: int, retry_after_s: float | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class TransferInterrupted(ConnectionError):
    """The connection broke, or the body came short, before the whole range arrived."""


class TransferTimeout(TimeoutError):
    """No answer, or no bytes, within the per-request timeout."""


def status_of(error: BaseException) -> int | None:
    """The HTTP status on ``error`` or its ``response`` (``status`` or ``status_code``, as requests,
    httpx, aiohttp and huggingface_hub errors carry it); None when there is none."""
    for holder in (error, getattr(error, "response", None)):
        for attribute in ("status", "status_code"):
            value = getattr(holder, attribute, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def retry_after_of(error: BaseException) -> float | None:
    """Seconds the server asked us to wait (``retry_after_s``, or a ``Retry-After`` header on the
    error or its ``response``); None when it asked nothing."""
    value = getattr(error, "retry_after_s", None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    for holder in (error, getattr(error, "response", None)):
        headers = getattr(holder, "headers", None)
        if headers is not None and hasattr(headers, "get"):
            parsed = parse_retry_after(headers.get("Retry-After"))
            if parsed is not None:
                return parsed
    return None


def parse_retry_after(value: str | None, *, now_s: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date.

    ``now_s`` is the wall clock (``time.time()``) for dates. None when absent or unparseable.
    """
    if value is None:
        return None
    value = str(value).strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and all(link is not e for e in seen) and len(seen) < 20:
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen


def _botocore_status(error: BaseException) -> tuple[int, float | None] | None:
    response = getattr(error, "response", None)
    if not isinstance(response, Mapping):
        return None
    meta = response.get("ResponseMetadata") or {}
    status = meta.get("HTTPStatusCode")
    if not isinstance(status, int):
        return None
    headers = {str(k).lower(): v for k, v in (meta.get("HTTPHeaders") or {}).items()}
    return status, parse_retry_after(headers.get("retry-after"))


def normalise(error: BaseException) -> BaseException:
    """``error`` as ``classify`` reads it (see the module docstring); unchanged if it already
    carries a status, or says nothing about the link."""
    if status_of(error) is not None:
        return error
    chain = _chain(error)
    message = f"{type(error).__name__}: {error}"
    for link in chain:
        found = _botocore_status(link)
        if found is not None:
            status, retry_after_s = found
            if status in _RETRYABLE_STATUSES or retry_after_s is not None:
                return HTTPStatusError(status, retry_after_s, f"HTTP {status}: {message}")
            return error
    names = {cls.__name__ for link in chain for cls in type(link).__mro__}
    if any(isinstance(link, TimeoutError) for link in chain) or any("Timeout" in name for name in names):
        return TransferTimeout(message)
    if any(isinstance(link, (ConnectionError, EOFError, http.client.HTTPException)) for link in chain) or any(
            marker in name for name in names for marker in _TRANSPORT_NAME_MARKERS):
        return TransferInterrupted(message)
    return error


def classify(error: BaseException) -> Failure:
    """Throttle (429, 503, any Retry-After), timeout (timeouts of any client, 408, 504), transient
    (other 5xx, connection resets, truncated bodies) or fatal (everything else), of
    ``normalise(error)``."""
    error = normalise(error)
    status = status_of(error)
    retry_after_s = retry_after_of(error)
    if status is not None:
        if status in THROTTLE_STATUSES or retry_after_s is not None:
            return Failure("throttle", status, retry_after_s)
        if status in TIMEOUT_STATUSES:
            return Failure("timeout", status)
        return Failure("transient" if status >= 500 else "fatal", status)
    if isinstance(error, TimeoutError):
        return Failure("timeout")
    if isinstance(error, ConnectionError):
        return Failure("transient")
    return Failure("fatal")


def error_line(error: BaseException, secrets: Iterable[str], *, default: str | None = None) -> str:
    """The first line of ``error``'s message with ``secrets`` redacted; ``default`` (the error's
    class name unless given) when the message is empty."""
    text = str(error)
    first = text.splitlines()[0] if text else (type(error).__name__ if default is None else default)
    return redact_secrets(first, secrets)


def as_file_error(error: BaseException, *, where: str, secrets: Iterable[str]) -> OSError:
    """A client error reading ``where`` as the error a file reader expects: ``FileNotFoundError``
    (404, any ``...NotFound...`` class), ``PermissionError`` (401, 403) or ``OSError``, naming the
    file and the status, with ``secrets`` redacted."""
    status = status_of(error)
    message = error_line(error, secrets, default="")
    kind: type[OSError] = (
        FileNotFoundError if isinstance(error, FileNotFoundError) or status == 404
        or "NotFound" in type(error).__name__ else
        PermissionError if isinstance(error, PermissionError) or status in (401, 403) else OSError)
    return kind(f"Reading {where} failed: {type(error).__name__}"
                + (f" (HTTP {status})" if status else "") + f": {message}")
