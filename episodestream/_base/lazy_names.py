"""A module's names that load on first use (PEP 562's module ``__getattr__``), from a table."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(module_name: str, defined_in: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``module_name`` that imports each name of ``defined_in``
    (name -> the module defining it) when first asked for: so that importing the module does not
    import what its names need (fsspec, torch) until a caller uses one."""

    def __getattr__(name: str) -> Any:
        module = defined_in.get(name)
        if module is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
