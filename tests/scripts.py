"""Benchmark and example scripts loaded as modules into the test process: running one there costs
~2 s of CPU less than another interpreter importing torch again."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """The script at ``path`` as a module named after its file. ``sys.path`` is restored afterwards:
    scripts put their own folder first, to import their helper modules."""
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def run_main(path: Path, argv: list[str]) -> None:
    """``main(argv)`` of the script at ``path``, which must return 0 (its entry point is ``sys.exit(main())``)."""
    assert load_script(path).main(argv) == 0
