"""Retrying one request (``RetryPolicy``): which failures retry, jittered exponential backoff,
``Retry-After``, and errors that name the URL without its credentials (``DownloadError``)."""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from episodestream._base.redact import redact_url
from episodestream._remote.transport.config import ControllerConfig
from episodestream._remote.transport.failures import Failure, classify

if TYPE_CHECKING:
    from episodestream._remote.transport.controller import DownloadController

T = TypeVar("T")


class DownloadError(RuntimeError):
    """A download failed for good. Names the URL (credentials removed), the last HTTP status
    (None when there was none, e.g. a timeout), how many attempts were made, and the last error."""

    def __init__(self, url: str, status: int | None, attempts: int, last_error: BaseException | str | None) -> None:
        self.url = redact_url(url)
        self.status = status
        self.attempts = attempts
        self.last_error = last_error
        if isinstance(last_error, BaseException):
            detail = f"{type(last_error).__name__}: {last_error}"
        else:
            detail = "" if last_error is None else str(last_error)
        self.detail = redact_text(detail)
        super().__init__(f"GET {self.url} failed after {attempts} attempt{'s' * (attempts != 1)} "
                         f"(last HTTP status: {status if status is not None else 'none'}): {self.detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        # The original error may not pickle (DataLoader workers send errors across processes).
        return (type(self), (self.url, self.status, self.attempts, self.detail))


class RetryPolicy:
    """Retries one request: which failures retry, jittered exponential backoff, ``Retry-After``.

    Knobs come from ``config`` (``max_attempts``, ``base_backoff_s``, ``max_backoff_s``,
    ``max_retry_after_s``, ``request_timeout_s``). Determinism: ``seed`` fixes the jitter;
    without it each process draws its own (re-seeded after fork, so DataLoader workers do not
    retry in lockstep). ``sleep`` is injectable for tests.
    """

    def __init__(self, *, config: ControllerConfig | None = None, seed: int | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config if config is not None else ControllerConfig()
        self._seed = seed
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._pid = os.getpid()

    def delay_s(self, attempt: int, *, retry_after_s: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        Exponential ``base * 2**(attempt - 1)`` capped at ``max_backoff_s``, jittered into
        [half, all] of it (never near zero, so the backoff really grows). A ``Retry-After`` is a
        lower bound (up to ``max_retry_after_s``), plus up to ``base_backoff_s`` of jitter so
        the workers it stopped do not all come back at the same instant.
        """
        if os.getpid() != self._pid and self._seed is None:
            self._rng, self._pid = random.Random(), os.getpid()
        ceiling = min(self.config.max_backoff_s, self.config.base_backoff_s * 2.0 ** min(attempt - 1, 60))
        delay = self._rng.uniform(ceiling / 2, ceiling)
        if retry_after_s is not None:
            honoured = min(retry_after_s, self.config.max_retry_after_s)
            delay = max(delay, honoured + self._rng.uniform(0, self.config.base_backoff_s))
        return delay

    @staticmethod
    def classify(error: BaseException) -> Failure:
        """What a failed attempt means (``_remote.transport.failures.classify``: throttle, timeout, transient, fatal)."""
        return classify(error)

    def call(self, fn: Callable[[float], T], *, url: str, controller: DownloadController | None = None) -> T:
        """Run ``fn(timeout_s)`` (one complete request) until it succeeds or attempts run out.

        With a ``controller`` each attempt holds a permit, a success is recorded as a transfer
        (its size is ``len(result)`` when the result has one) and every failure is reported. A
        result is returned exactly once, from the attempt that succeeded: ``fn`` must return the
        whole response or raise, so a fault mid-body is retried, never half-delivered.
        """
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                return self._attempt(fn, controller)
            except Exception as error:  # noqa: BLE001 - classified below; fatal ones re-raise
                failure = self.classify(error)
                if controller is not None:
                    controller.record_failure(failure)
                if failure.kind == "fatal" or attempt == self.config.max_attempts:
                    raise DownloadError(url, failure.status, attempt, error) from error
                self._sleep(self.delay_s(attempt, retry_after_s=failure.retry_after_s))
        raise AssertionError("unreachable: the loop returns or raises")

    def _attempt(self, fn: Callable[[float], T], controller: DownloadController | None) -> T:
        if controller is None:
            return fn(self.config.request_timeout_s)
        with controller.permit():
            start_s = controller.clock()
            result = fn(self.config.request_timeout_s)
            duration_s = controller.clock() - start_s
        try:
            size_bytes = len(result)  # type: ignore[arg-type]
        except TypeError:
            return result
        controller.record_transfer(size_bytes=size_bytes, duration_s=max(0.0, duration_s))
        return result


_CREDENTIAL_RES = (
    re.compile(r"\b(hf_|api_org_)[A-Za-z0-9]{6,}"),
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"),
    re.compile(r"(?i)\b(authorization|token|access_token|api_key|apikey|password|signature|sig|"
               r"x-amz-security-token|x-amz-signature|x-amz-credential)(['\"]?\s*[:=]\s*)['\"]?[^\s'\",&]+"),
)
_URL_RE = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def redact_text(text: str) -> str:
    """``text`` with URLs' query strings and anything that looks like a token removed."""
    text = _URL_RE.sub(lambda m: redact_url(m.group(0)), text)
    text = _CREDENTIAL_RES[0].sub(lambda m: m.group(1) + "<redacted>", text)
    text = _CREDENTIAL_RES[1].sub(lambda m: m.group(1) + " <redacted>", text)
    return _CREDENTIAL_RES[2].sub(lambda m: m.group(1) + m.group(2) + "<redacted>", text)
