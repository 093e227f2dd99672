"""One remote request: a permit, one classification, one retry policy, one error.

Every request episodestream sends to a remote store goes through ``request``: ranged and whole-file
reads (``download.DownloadFetch``), a Hub revision's commit and listings (``_remote.source.resolve``,
``_remote.source.hub_api``) and look-ups of files by name (``_remote.source.lookup``). Each attempt
holds a permit of the node-wide ``DownloadController`` (when one is given) and is timed; a failure is
normalised and classified once (``failures.classify``: throttle, timeout, transient, fatal), reported
to the controller (throttles and timeouts cut its budget, ``Retry-After`` pauses it node-wide) and
retried after ``RetryPolicy.delay_s``. When attempts run out, ``DownloadError`` names the URL
(redacted once, ``_base.redact``), the last status and the attempts. A fatal failure (404, 403, a
bug) is not about the link: the client's own error is raised as it is, after one attempt, for the
caller to name the dataset file (``failures.as_file_error``).

An attempt returns the whole answer or raises, so a fault part-way through a body is retried from
the start, never half-delivered. A bytes answer is a transfer sample for the controller (one
stream, its size); other answers (a listing's entries) count for permits and failures only.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from episodestream._base.redact import redact_text, redact_url
from episodestream._remote.transport.config import ControllerConfig
from episodestream._remote.transport.failures import Failure, classify, normalise

if TYPE_CHECKING:
    from episodestream._remote.transport.controller import DownloadController

T = TypeVar("T")

# FetchStats counter of each failure kind.
COUNTER_OF_KIND = {"throttle": "throttles", "timeout": "timeouts", "transient": "transient", "fatal": "fatal"}


class DownloadError(RuntimeError):
    """A request failed for good. Names the URL (credentials removed), the last HTTP status
    (None when there was none, e.g. a timeout), how many attempts were made, and the last error."""

    def __init__(self, url: str, status: int | None, attempts: int, last_error: BaseException | str | None,
                 method: str = "GET") -> None:
        self.url = redact_url(url)
        self.status = status
        self.attempts = attempts
        self.last_error = last_error
        self.method = method
        if isinstance(last_error, BaseException):
            detail = f"{type(last_error).__name__}: {last_error}"
        else:
            detail = "" if last_error is None else str(last_error)
        self.detail = redact_text(detail)
        super().__init__(f"{method} {self.url} failed after {attempts} attempt{'s' * (attempts != 1)} "
                         f"(last HTTP status: {status if status is not None else 'none'}): {self.detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        # The original error may not pickle (DataLoader workers send errors across processes).
        return (type(self), (self.url, self.status, self.attempts, self.detail, self.method))


class RetryPolicy:
    """How ``request`` retries: which failures retry, jittered exponential backoff, ``Retry-After``.

    Knobs come from ``config`` (``max_attempts``, ``base_backoff_s``, ``max_backoff_s``,
    ``max_retry_after_s``, ``request_timeout_s``). Determinism: ``seed`` fixes the jitter;
    without it each process draws its own (re-seeded after fork, so DataLoader workers do not
    retry in lockstep). ``sleep`` is injectable for tests.
    """

    def __init__(self, *, config: ControllerConfig | None = None, seed: int | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config if config is not None else ControllerConfig()
        self._seed = seed
        self.sleep = sleep
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
        """What a failed attempt means (``failures.classify``: throttle, timeout, transient, fatal)."""
        return classify(error)

    def call(self, fn: Callable[[float], T], *, url: str, controller: DownloadController | None = None) -> T:
        """``request(fn, ...)`` under this policy, a fatal failure raised as a ``DownloadError``
        too (after its one attempt)."""
        try:
            return request(fn, url=url, policy=self, controller=controller)
        except DownloadError:
            raise
        except Exception as error:  # fatal: the client's own error, after one attempt
            raise DownloadError(url, classify(error).status, 1, error) from error


def request(attempt: Callable[[float], T], *, url: str, policy: RetryPolicy,
            controller: DownloadController | None = None, count: Callable[[str], None] | None = None,
            method: str = "GET") -> T:
    """Run ``attempt(timeout_s)`` (one complete request) until it succeeds or attempts run out.

    Each attempt holds a permit of ``controller`` (if any) and is timed; ``count(name)`` is told
    of each attempt (``"attempts"``) and failure (``COUNTER_OF_KIND``). A throttle that says when
    to come back (``Retry-After``) is waited out without counting as a failed attempt, for up to
    ``max_throttle_wait_s`` per request. Raises ``DownloadError``
    (``method`` and ``url`` named, redacted) when the link failed ``max_attempts`` times, or the
    client's own error after one attempt when the failure is fatal (see the module docstring).
    """
    attempts = failed = 0
    throttled_s = 0.0  # time waited as throttles with Retry-After asked, not counted as failures
    while True:
        attempts += 1
        if count is not None:
            count("attempts")
        try:
            return _attempt(attempt, policy.config.request_timeout_s, controller)
        except Exception as error:  # noqa: BLE001 - classified below; fatal ones re-raise
            normalised = normalise(error)
            failure = classify(normalised)
            if count is not None:
                count(COUNTER_OF_KIND[failure.kind])
            if controller is not None:
                controller.record_failure(failure)
            if failure.kind == "fatal":
                raise
            failed += 1
            delay_s = policy.delay_s(failed, retry_after_s=failure.retry_after_s)
            if failure.kind == "throttle" and failure.retry_after_s is not None \
                    and throttled_s + delay_s <= policy.config.max_throttle_wait_s:
                # The server said when to come back: a rate limit shared by many ranks answers a
                # launch with 429s for longer than max_attempts allow, and a rank that gave up
                # after 5 of them failed its run (6 of 32 ranks at 8 nodes x 4, 15 requests/s).
                failed -= 1
                throttled_s += delay_s
            elif failed == policy.config.max_attempts:
                raise DownloadError(url, failure.status, attempts, normalised, method) from error
            policy.sleep(delay_s)


def _attempt(attempt: Callable[[float], T], timeout_s: float, controller: DownloadController | None) -> T:
    if controller is None:
        return attempt(timeout_s)
    with controller.permit():
        start_s = controller.clock()
        result = attempt(timeout_s)
        duration_s = controller.clock() - start_s
    if isinstance(result, (bytes, bytearray, memoryview)):
        controller.record_transfer(size_bytes=len(result), duration_s=max(0.0, duration_s))
    return result
