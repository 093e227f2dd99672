"""The public classes' docstrings follow one convention (Google style, as Mosaic's STYLE_GUIDE asks) and
agree with the signatures they document, so that ``help()`` cannot drift from the code:

- a constructor's ``Args:`` names every keyword of its signature (the source options, ``**options``,
  once, each key documented in ``SourceOptions``) and nothing else, in the order of purpose; an argument
  with a default states it, ``Defaults to ``value``.``, equal to the signature's, one without does not;
- ``Raises:`` names exceptions that exist; each public method that takes arguments documents them in
  ``Args:`` the same way, and one that returns something has ``Returns:`` (or ``Yields:``);
- no docstring of the public faces states a measured number (a time, a rate, a speed-up): they age,
  and docs/benchmarks.md holds them with the command that measures them.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re

import pytest

import episodestream
from episodestream import (EpisodeDataset, EpisodeLoader, EpisodeMixture, EpisodeStreamingDataset, SourceOptions,
                           load_loader_state, split_episodes, stream_state)

CLASSES = [EpisodeStreamingDataset, EpisodeDataset, EpisodeLoader, EpisodeMixture]
SECTIONS = ("Args", "Returns", "Yields", "Raises")
_ENTRY = re.compile(r"^(?P<name>\*{0,2}\w+)(?: \((?P<type>[^)]*)\))?: ?(?P<text>.*)$")
_DEFAULT = re.compile(r"Defaults to ``(?P<value>.+?)``\.")


def sections(doc: str) -> dict[str, list[str]]:
    """``{section: its lines, dedented}`` for the Google-style sections of a docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    found: dict[str, list[str]] = {}
    current = None
    for line in lines:
        header = line.rstrip(":") if line.endswith(":") and not line.startswith(" ") else None
        if header in SECTIONS:
            assert header not in found, f"{header}: twice"
            current = found[header] = []
        elif current is not None and line.startswith("    "):
            current.append(line[4:])
        elif current is not None and line.strip():
            current = None  # back at the docstring's own indentation: the section ended
    return found


def entries(section: list[str]) -> dict[str, str]:
    """``{name: its whole text}`` of an ``Args:`` or ``Raises:`` section (continuation lines joined)."""
    found: dict[str, str] = {}
    name = None
    for line in section:
        if line.startswith(" "):
            assert name is not None, line
            found[name] += " " + line.strip()
            continue
        match = _ENTRY.match(line)
        assert match is not None, f"not an entry: {line!r}"
        name = match["name"]
        assert name not in found, f"{name}: twice"
        found[name] = match["text"]
    return found


def check_args(owner: str, doc: str, signature: inspect.Signature, options: set[str] = frozenset()) -> None:
    """``doc``'s ``Args:`` against ``signature`` (its ``options`` documented as one ``**options``)."""
    parameters = [p for p in signature.parameters.values() if p.name != "self" and p.name not in options]
    documented = entries(sections(doc).get("Args", []))
    expected = [p.name for p in parameters] + (["**options"] if options else [])
    assert sorted(documented) == sorted(expected), (owner, list(documented), expected)
    for parameter in parameters:
        stated = _DEFAULT.search(documented[parameter.name])
        if parameter.default is inspect.Parameter.empty:
            assert stated is None, (owner, parameter.name, "has no default, but the docstring states one")
        else:
            assert stated is not None, (owner, parameter.name, f"states no default ({parameter.default!r})")
            assert ast.literal_eval(stated["value"]) == parameter.default, (owner, parameter.name, stated["value"],
                                                                           parameter.default)


def check_raises(owner: str, doc: str) -> None:
    for name in entries(sections(doc).get("Raises", [])):
        assert hasattr(builtins, name) or hasattr(episodestream, name), (owner, name)


def public_methods(cls: type):
    """The methods a user calls on ``cls``, from ``cls`` and the package's classes it inherits
    (not torch's): public names, and the dunders a user reaches (``len``, indexing, iteration)."""
    seen = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("episodestream"):
            continue
        for name, member in vars(klass).items():
            if name in seen or not inspect.isfunction(member):
                continue
            seen.add(name)
            if not name.startswith("_") or name in ("__len__", "__getitem__", "__iter__"):
                yield name, member


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_public_class_documents_every_argument_with_the_default_its_signature_has(cls):
    options = set(SourceOptions.__annotations__) if cls in (EpisodeStreamingDataset, EpisodeDataset) else set()
    check_args(cls.__name__, cls.__doc__, inspect.signature(cls), options)
    assert "Raises" in sections(cls.__doc__), cls
    check_raises(cls.__name__, cls.__doc__)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_public_classs_methods_document_their_arguments_returns_and_raises(cls):
    for name, method in public_methods(cls):
        owner = f"{cls.__name__}.{name}"
        assert method.__doc__, owner
        signature = inspect.signature(method)
        check_args(owner, method.__doc__, signature)
        check_raises(owner, method.__doc__)
        returns = signature.return_annotation
        if returns not in ("None", None, inspect.Signature.empty, "NoReturn"):
            assert {"Returns", "Yields"} & set(sections(method.__doc__)), (owner, returns)


@pytest.mark.parametrize("function", [stream_state, load_loader_state, split_episodes], ids=lambda f: f.__name__)
def test_the_public_functions_document_their_arguments_too(function):
    check_args(function.__name__, function.__doc__, inspect.signature(function))
    check_raises(function.__name__, function.__doc__)


def test_the_checks_fail_on_a_docstring_that_drifts():
    """The checks above can fail: a missing argument, a wrong default, an unknown exception."""
    def f(a, *, b: int = 2) -> int:
        return a + b

    good = "Add.\n\nArgs:\n    a: a number.\n    b (int): another. Defaults to ``2``.\n\nReturns:\n    the sum.\n"
    check_args("f", good, inspect.signature(f))
    for bad in (good.replace("``2``", "``3``"), good.replace("    a: a number.\n", ""),
                good.replace(" Defaults to ``2``.", "")):
        with pytest.raises(AssertionError):
            check_args("f", bad, inspect.signature(f))
    with pytest.raises(AssertionError):
        check_raises("f", "F.\n\nRaises:\n    NoSuchError: never.\n")


_MEASURED = re.compile(r"(?<![\w.])\d[\d.,]*\s*(?:ms|µs|s|CPU-s|samples/s|frames/s|MB/s|GB/s|x|%)(?![\w])")


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_public_docstrings_state_no_measured_numbers(cls):
    docs = [(cls.__name__, cls.__doc__)] + [(f"{cls.__name__}.{n}", m.__doc__) for n, m in public_methods(cls)]
    for owner, doc in docs:
        found = _MEASURED.findall(doc or "")
        assert not found, (owner, found, "measured numbers belong in docs/benchmarks.md")
