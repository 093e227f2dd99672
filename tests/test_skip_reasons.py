"""A skip reason tells any reader what to install or set: it names no folder of the machines this
project was developed on (the with_lerobot tests once pointed to a LeRobot venv under /tmp)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
_MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|tmp|root|home|Users)/")


def _skip_reasons(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string literal inside a pytest.skip / importorskip / skipif call."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "skip", "importorskip", "skipif", "xfail"):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
                    found.append((inner.lineno, inner.value))
    return found


def test_no_skip_reason_names_a_path_of_our_machines():
    offending = [f"{path.relative_to(TESTS)}:{line}: {text!r}" for path in sorted(TESTS.rglob("*.py"))
                 for line, text in _skip_reasons(ast.parse(path.read_text())) if _MACHINE_PATH.search(text)]
    assert not offending, offending
