"""The package's layers hold (import-linter's contracts in pyproject.toml) and no module imports
itself back through others (grimp, the graph import-linter builds on)."""

import logging
import subprocess
import sys
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the contracts live in pyproject.toml
    # lint_imports configures its logging with dictConfig, which disables every logger made before
    # it (episodestream's among them): the tests this process ran next captured none of their records.
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            monkeypatch.setattr(logger, "disabled", logger.disabled)
    passed = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    assert passed == 0, capsys.readouterr().out  # lint-imports' exit code; its report says which contract broke


def cycles(graph) -> list[list[str]]:
    """One chain per module pair that imports each other, directly or through others."""
    found = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                found.append([module, *back])
    return found


def test_no_module_imports_itself_back():
    # Type-only imports count: grimp reads them too, so a cycle under TYPE_CHECKING shows here.
    graph = grimp.build_graph("episodestream", cache_dir=None)
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    assert cycles(graph) == []
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert ["pkg.a", "pkg.b", "pkg.c", "pkg.a"] in cycles(graph)


def test_moved_tooling_still_imports_from_the_top_with_a_warning():
    import warnings

    import episodestream
    from episodestream.tools import synthetic, tracing

    for name, module in [("write_synthetic_dataset", synthetic), ("enable_tracer", tracing),
                         ("disable_tracer", tracing), ("load_trace", tracing), ("set_process_name", tracing)]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert getattr(episodestream, name) is getattr(module, name)
        assert [w.category for w in caught] == [DeprecationWarning], name
        assert f"{module.__name__}.{name}" in str(caught[0].message)
    assert name not in episodestream.__all__


def test_the_public_modules_export_sorted_lists_of_what_they_define():
    import episodestream
    import episodestream.remote
    import episodestream.tools.tracing
    import episodestream.video

    for module in (episodestream, episodestream.remote, episodestream.video, episodestream.tools.tracing):
        assert module.__all__ == sorted(module.__all__), module.__name__
        assert all(hasattr(module, name) for name in module.__all__), module.__name__
    assert not [name for name in episodestream.__all__ if name.startswith("_")]


def test_the_command_line_and_the_tracer_start_without_torch():
    """``import episodestream`` loads its public names on first use, so the command line's help and
    a spawned process that only traces do not import torch (~1.5 CPU-s, torchcodec ~1.2 more)."""
    code = ("import sys, episodestream, episodestream.tools.cli, episodestream.tools.tracing; "
            "print(sorted(m for m in ('torch', 'torchcodec', 'pyarrow') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout
