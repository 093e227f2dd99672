"""Validation of user-facing options, written once so every error reads the same way.

Each helper raises ``ValueError``/``TypeError`` naming the argument, showing the value and saying
what is valid, so a user never has to read our source to fix a call.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


def check_choice(name: str, value: T, choices: Iterable[T]) -> T:
    """Return ``value`` if it is one of ``choices``; else raise naming the argument and the choices."""
    choices = tuple(choices)
    if value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise ValueError(f"Invalid {name} ({value!r}). Supported values are {valid}.")
    return value


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an int within [minimum, maximum]; bools and floats are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__}).")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}.")
    return value


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is True or False: a string such as "no" is truthy, so it is refused."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__}).")
    return value


def check_positive_float(name: str, value: Any) -> float:
    """Return ``value`` as a float > 0: a wrong type is a TypeError (as ``check_int``'s), a value out
    of range (zero, negative, NaN) a ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive number, got {value!r} ({type(value).__name__}).")
    if not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}.")
    return float(value)


def parse_size_bytes(name: str, value: int | str) -> int:
    """Parse a byte count given as an int or a human string such as "20GB" or "512MiB"."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"{name} must be a positive size, got {value!r}.")
        return value
    match = _SIZE_RE.match(str(value)) if isinstance(value, str) else None
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _SIZE_UNITS:
        units = ", ".join(u for u in _SIZE_UNITS if u)
        raise ValueError(f"{name} must be a positive size like '20GB' (units: {units}), got {value!r}.")
    number = float(match.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(number):  # "9" * 400 parses as inf, which int() refuses with OverflowError
        raise ValueError(f"{name} must be a finite size like '20GB', got {value!r}: too large.")
    size_bytes = int(number)
    if size_bytes <= 0:
        raise ValueError(f"{name} must be a positive size, got {value!r}.")
    return size_bytes


def env_override(name: str, value: T | None, env_var: str, parse) -> T | None:
    """The argument when given, else the ``EPISODESTREAM_*`` variable parsed by ``parse``, else None.

    Read only when called (never at import) so a process can change it before building a dataset.
    """
    if value is not None:
        return value
    raw = os.environ.get(env_var)
    if raw is None or raw == "":
        return None
    try:
        return parse(raw)
    except (TypeError, ValueError) as error:
        raise ValueError(f"Environment variable {env_var}={raw!r} (for {name}) is invalid: {error}") from None


def unexpected_keywords(owner: str, unknown: Sequence[str], valid: Sequence[str],
                        synonyms: Mapping[str, str] | None = None) -> str:
    """The start of the TypeError for keywords ``owner()`` does not take: each with its closest
    valid one (Python's own error names neither the closest valid keyword nor the others).
    ``synonyms``: words users bring from elsewhere (DataLoader's ``num_workers``) -> the valid one."""
    synonyms = synonyms or {}
    described = []
    for key in unknown:
        close = difflib.get_close_matches(key, [*valid, *synonyms], n=1)
        meant = synonyms.get(close[0], close[0]) if close else None
        described.append(f"{key!r}" + (f" (did you mean {meant!r}?)" if meant else ""))
    plural = "s" if len(unknown) > 1 else ""
    return f"{owner}() got an unexpected keyword argument{plural} {', '.join(described)}."


P = ParamSpec("P")
R = TypeVar("R")


def refuses_unknown_keywords(synonyms: Mapping[str, str]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A decorator for a constructor: a keyword it does not take raises ``unexpected_keywords``'
    TypeError, listing the valid ones (the datasets' source options do the same,
    ``_runtime.source_options``)."""

    def wrap(init: Callable[P, R]) -> Callable[P, R]:
        owner = init.__qualname__.split(".")[0]
        names = [p.name for p in inspect.signature(init).parameters.values()
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]

        @functools.wraps(init)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            unknown = [key for key in kwargs if key not in names]
            if unknown:
                raise TypeError(f"{unexpected_keywords(owner, unknown, names, synonyms)} "
                                f"Valid keywords: {', '.join(names)}.")
            return init(*args, **kwargs)

        return checked

    return wrap
