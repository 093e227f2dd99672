"""The download controller's knobs: ``ControllerConfig``, validated once, with
``EPISODESTREAM_DOWNLOAD_<NAME>`` environment overrides."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any

from episodestream._base.options import parse_size_bytes
from episodestream._remote.transport.permits import MAX_PERMITS

ENV_PREFIX = "EPISODESTREAM_DOWNLOAD_"


def _knob(kind: str, default: Any, *, low: float | None = None, high: float | None = None,
          open_low: bool = False, open_high: bool = False) -> Any:
    return field(default=default, metadata={"kind": kind, "low": low, "high": high,
                                            "open_low": open_low, "open_high": open_high})


@dataclass(frozen=True)
class ControllerConfig:
    """The controller's knobs, validated once. Each has an ``EPISODESTREAM_DOWNLOAD_<NAME>``
    environment override read by ``from_env`` (never at import or construction).

    Budget (permits = downloads in flight on the whole node):
        ``floor_permits``, ``cap_permits``: the normal range; only throttling takes it below the
        floor (down to 1). ``initial_permits``: the budget before anything is measured.
    Reacting to the link:
        ``decrease_factor``, ``cooldown_s``: a throttle or timeout multiplies the budget by the
        factor, at most once per cooldown. ``increase_interval_s``, ``increase_step``: a healthy
        window of this length adds the step. ``slow_start_factor``: until the first throttle,
        timeout or slowdown, a healthy window multiplies the budget by this instead (at least
        +step), as TCP's slow start does; 1 means additive from the start.
        ``probe_min_gain``: an increase is kept only if the node's goodput grew by at least this
        share of what the added permits would carry at the old per-permit rate (a third: a
        doubling near the link's cap still clears it, a full link's window-to-window jitter
        rarely does). ``max_hold_windows``: after an increase that bought nothing, no increase
        for 1, 2, 4 ... windows, at most this many. ``max_slowdown``: no increase while
        bandwidth is below, or round trip above, its best since the last cut by more than this
        factor; the model lowers the budget only when its target is below the budget by more
        than it.
    Measuring the link:
        ``bandwidth_min_bytes``: single-stream transfers at least this big are bandwidth samples.
        ``latency_max_bytes``: transfers at most this big are round-trip samples (sizes between
        the two are neither). ``min_samples``: per class, before defaults give way to estimates.
        ``window_samples``: recent samples kept per class. ``default_bandwidth_bytes_per_s``,
        ``default_rtt_s``, ``default_object_bytes``: the warm-up values. ``min_rtt_s``: the
        smallest round trip we believe (a transfer-free round trip can compute to ~0).
    Retrying one request:
        ``max_attempts``, ``base_backoff_s``, ``max_backoff_s``, ``max_retry_after_s`` (longest
        ``Retry-After`` honoured), ``max_throttle_wait_s`` (how long one request may wait as
        throttles with ``Retry-After`` ask before those count as failed attempts),
        ``request_timeout_s`` (given to the HTTP client per attempt).
    Sharing across processes:
        ``permits_dir``: where node-wide permits and state live (node-local; default
        ``/dev/shm/episodestream-<uid>/permits`` where /dev/shm is writable, else under the
        temp dir). ``idle_reset_s``: shared state untouched this
        long is stale (an earlier run) and starts afresh.
    """

    floor_permits: int = _knob("int", 4, low=1, high=MAX_PERMITS)
    cap_permits: int = _knob("int", 64, low=1, high=MAX_PERMITS)
    initial_permits: int = _knob("int", 8, low=1, high=MAX_PERMITS)
    decrease_factor: float = _knob("float", 0.5, low=0, high=1, open_low=True, open_high=True)
    cooldown_s: float = _knob("float", 2.0, low=0, open_low=True)
    increase_interval_s: float = _knob("float", 2.0, low=0, open_low=True)
    increase_step: int = _knob("int", 1, low=1, high=MAX_PERMITS)
    slow_start_factor: float = _knob("float", 2.0, low=1)
    probe_min_gain: float = _knob("float", 1 / 3, low=0, high=1, open_low=True)
    max_hold_windows: int = _knob("int", 16, low=1, high=100_000)
    max_slowdown: float = _knob("float", 1.25, low=1, open_low=True)
    bandwidth_min_bytes: int = _knob("size", 128 * 1024)
    latency_max_bytes: int = _knob("size", 16 * 1024)
    min_samples: int = _knob("int", 8, low=1, high=100_000)
    window_samples: int = _knob("int", 32, low=1, high=100_000)
    default_bandwidth_bytes_per_s: float = _knob("rate", 25e6, low=0, open_low=True)
    default_rtt_s: float = _knob("float", 0.05, low=0, open_low=True)
    default_object_bytes: int = _knob("size", 512 * 1024)
    min_rtt_s: float = _knob("float", 0.001, low=0, open_low=True)
    max_attempts: int = _knob("int", 5, low=1, high=1000)
    base_backoff_s: float = _knob("float", 0.5, low=0, open_low=True)
    max_backoff_s: float = _knob("float", 30.0, low=0, open_low=True)
    max_retry_after_s: float = _knob("float", 120.0, low=0, open_low=True)
    max_throttle_wait_s: float = _knob("float", 300.0, low=0)
    request_timeout_s: float = _knob("float", 30.0, low=0, open_low=True)
    idle_reset_s: float = _knob("float", 300.0, low=0, open_low=True)
    permits_dir: str | None = _knob("path", None)

    def __post_init__(self) -> None:
        for knob in fields(self):
            object.__setattr__(self, knob.name, _check_knob(knob, getattr(self, knob.name)))
        for low, high in _ORDERED_KNOBS:
            if getattr(self, low) > getattr(self, high):
                raise _CrossKnobError(
                    (low, high), f"{low} ({getattr(self, low)!r}) must be <= {high} "
                                 f"({getattr(self, high)!r}).")
        if self.latency_max_bytes >= self.bandwidth_min_bytes:
            raise _CrossKnobError(
                ("latency_max_bytes", "bandwidth_min_bytes"),
                f"latency_max_bytes ({self.latency_max_bytes}) must be < bandwidth_min_bytes "
                f"({self.bandwidth_min_bytes}): one transfer cannot be a sample of both classes.")

    @classmethod
    def from_env(cls, **overrides: Any) -> ControllerConfig:
        """Knobs from keyword arguments, else ``EPISODESTREAM_DOWNLOAD_<NAME>``, else defaults.

        Read when called, so a process can set variables first. A bad variable raises an error
        naming the variable, its value and the valid range.
        """
        knobs = {knob.name: knob for knob in fields(cls)}
        unknown = sorted(set(overrides) - set(knobs))
        if unknown:
            raise TypeError(f"Unknown ControllerConfig option(s) {unknown}. Valid: {sorted(knobs)}.")
        values, from_env = dict(overrides), {}
        for name, knob in knobs.items():
            variable = env_var(name)
            raw = os.environ.get(variable, "")
            if name in overrides or not raw.strip():
                continue
            try:
                values[name] = _check_knob(knob, _parse_env(knob, raw.strip()))
            except (TypeError, ValueError) as error:
                raise ValueError(f"Environment variable {variable}={raw!r} is invalid: {error}") from None
            from_env[name] = f"{variable}={raw!r}"
        try:
            return cls(**values)
        except _CrossKnobError as error:
            sources = [from_env[name] for name in error.names if name in from_env]
            if not sources:
                raise
            raise ValueError(f"{error} (set by environment: {', '.join(sources)})") from None


# Pairs that must satisfy low <= high; written once so every check reads the same way.
_ORDERED_KNOBS = (("floor_permits", "cap_permits"), ("floor_permits", "initial_permits"),
                  ("initial_permits", "cap_permits"), ("min_samples", "window_samples"),
                  ("base_backoff_s", "max_backoff_s"))


class _CrossKnobError(ValueError):
    def __init__(self, names: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.names = names


def env_var(knob: str) -> str:
    """The environment variable overriding ``knob``: ``EPISODESTREAM_DOWNLOAD_<KNOB>``."""
    return ENV_PREFIX + knob.upper()


def _parse_env(knob: dataclasses.Field, raw: str) -> Any:
    kind = knob.metadata["kind"]
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    return raw  # sizes, rates and paths are parsed by _check_knob


def _check_knob(knob: dataclasses.Field, value: Any) -> Any:
    meta, name = knob.metadata, knob.name
    kind = meta["kind"]
    if kind == "path":
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a path or None, got {value!r}.")
        return None if value is None else os.fspath(value)
    if kind == "size":
        return parse_size_bytes(name, value)
    if kind == "rate" and isinstance(value, str):
        value = float(parse_size_bytes(name, value))  # "25MB" means 25 MB per second
    number_type = int if kind == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, number_type) or not math.isfinite(value):
        what = "an int" if kind == "int" else "a finite number"
        raise TypeError(f"Invalid {name} ({value!r}): must be {what}.")
    low, high = meta["low"], meta["high"]
    too_low = low is not None and (value <= low if meta["open_low"] else value < low)
    too_high = high is not None and (value >= high if meta["open_high"] else value > high)
    if too_low or too_high:
        left = "(" if meta["open_low"] else "["
        right = ")" if meta["open_high"] else "]"
        valid = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
        raise ValueError(f"Invalid {name} ({value!r}). Valid range is {valid}.")
    return value if kind == "int" else float(value)
