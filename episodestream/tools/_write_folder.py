"""Writing a dataset folder safely, shared by the synthetic writers: a non-empty ``root`` is refused
unless ``overwrite``; the folder is built in a sibling temporary folder and renamed into place, so a
crash never leaves a half-written dataset where a complete one is expected."""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import Callable


def invalid(name: str, value, valid: str) -> ValueError:
    return ValueError(f"Invalid {name} ({value!r}). Valid values are {valid}.")


def check_root(root: pathlib.Path, *, overwrite: bool) -> None:
    """Refuse a non-empty ``root`` (before any work) unless ``overwrite``."""
    if root.exists() and (not root.is_dir() or any(root.iterdir())) and not overwrite:
        raise invalid("root", str(root), "a new or empty folder; this one is not empty (overwrite=True replaces it)")


def write_into_place(root: pathlib.Path, write: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """``write(staging)`` into a sibling temporary folder, then replace ``root`` with it."""
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        write(staging)
        if root.is_dir():
            shutil.rmtree(root)
        elif root.exists():
            root.unlink()
        staging.rename(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root
