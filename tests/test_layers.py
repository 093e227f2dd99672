"""The package's layers hold (import-linter's contracts in pyproject.toml) and no module imports
itself back through others (grimp, the graph import-linter builds on)."""

from pathlib import Path

import grimp
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the contracts live in pyproject.toml
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
