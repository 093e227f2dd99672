"""Benchmark and example scripts loaded as modules into the test process: running one there costs
~2 s of CPU less than another interpreter importing torch again."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from unittest import mock


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


def run_own_commands_in_process(script: ModuleType, monkeypatch) -> list[list[str]]:
    """Make ``script`` run each command it starts of itself (``[sys.executable, its file, *args]``,
    through ``subprocess.run``) by calling its own ``main(args)`` in this process, under the
    command's environment and with its stdout captured: the benchmark's fresh-process route (the
    command it builds, the entry point, the row it reads back) without another interpreter
    importing torch and torchcodec (~3 CPU-s each here) to run the same code. Returns the commands,
    in the order they ran."""
    commands: list[list[str]] = []

    def run(command, *, env=None, check=False, **options):
        assert command[:2] == [sys.executable, script.__file__], command
        commands.append(command)
        with (mock.patch.dict(os.environ, env if env is not None else {}, clear=env is not None),
              contextlib.redirect_stdout(io.StringIO()) as out):
            code = script.main(command[2:])
        if check and code:
            raise subprocess.CalledProcessError(code, command)
        return subprocess.CompletedProcess(command, code, stdout=out.getvalue(), stderr="")

    monkeypatch.setattr(script, "subprocess", SimpleNamespace(run=run))  # the script's name only
    return commands
