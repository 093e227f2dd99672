"""The README and docs/ as a newcomer reads them: in order, every command written one way, every page
indexed and every link resolving (issue 64 items 4-6, 8). Their code runs in test_cli."""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
EXAMPLES = sorted((REPO / "examples").glob("*/*.py"))
# Pages whose shell blocks a user pastes: the README, docs/, the benchmarks' READMEs.
PAGES = [README, *DOCS, *sorted((REPO / "benchmarks").glob("*/README.md"))]


def _sections(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, flags=re.M)


def test_the_readme_reads_what_why_commands_try_it_tasks_then_numbers():
    assert _sections(README.read_text()) == [
        "Why", "Set up and run", "Contents", "Try it", "Five things people do", "What a sample holds", "How fast",
        "Reference", "Layout"]


def test_the_readme_says_what_to_do_and_keeps_its_numbers_in_one_table():
    """The shuffle paragraph was ratios ("0.40 of a global shuffle's at 96 ... 1.05 ... 0.79") and never
    said the default needs no action (issue 64 item 4)."""
    text = README.read_text()
    before, numbers = text.split("## How fast")
    numbers = numbers.split("\n## ")[0]
    assert "The shuffle needs no action." in before and 'episode_pool_size="auto"' in before
    assert "| --- |" not in before and numbers.count("| --- |") == 1
    assert "[docs/benchmarks.md](docs/benchmarks.md)" in numbers
    for measured in ("1,952", "1,562", "0.96-1.01", "0.03-0.07"):  # the pool's numbers: in the table only
        assert measured not in before and measured in numbers, measured


def _shell_lines(page: Path) -> list[str]:
    """The commands of ``page``'s shell blocks (continuation lines joined, comments dropped)."""
    lines = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def _docstring_commands(script: Path) -> list[str]:
    """The commands an example's docstring shows (its indented lines before the first blank one)."""
    doc = script.read_text().split('"""')[1]
    first = doc.split("\n\n")[1]
    return [line.split("  #")[0].strip() for line in first.splitlines() if line.startswith("    ")]


def test_every_command_runs_the_venvs_python():
    """One convention, said once in the README: commands run ``.venv/bin/python`` from the repository root
    (the multi-process example said ``accelerate launch``: "accelerate: command not found" without an
    activated venv; docs/lerobot.md said a bare ``episodestream``; issue 64 item 6)."""
    commands = {f"{page.relative_to(REPO)}: {line}": line for page in PAGES for line in _shell_lines(page)}
    commands |= {f"{script.relative_to(REPO)}: {line}": line for script in EXAMPLES for line in _docstring_commands(script)}
    assert len(commands) > 30
    wrong = []
    for where, line in commands.items():
        for command in line.split("&&"):
            words = [w for w in shlex.split(command) if not re.match(r"^[A-Z_]+=", w)]  # VAR=value prefixes
            if words[0] not in ("bash", ".venv/bin/python"):  # bash: scripts/setup.sh, the SLURM launchers
                wrong.append(where)
    assert not wrong, "commands that do not run .venv/bin/python:\n" + "\n".join(wrong)
    assert "**How commands are written.**" in README.read_text()


def test_the_docs_index_lists_every_page_in_reading_order():
    index = (REPO / "docs" / "README.md").read_text()
    linked = re.findall(r"\]\(([\w-]+\.md)\)", index)
    assert set(linked) == {page.name for page in DOCS} - {"README.md"}, linked
    assert linked[:3] == ["usage.md", "lerobot.md", "resume.md"] and linked[-1] == "architecture.md"


def test_lab_notes_live_beside_the_benchmarks_and_every_link_resolves():
    """docs/usage.md sent users to docs/benchmarks-log.md, 3,362 lines of lab notes (issue 64 item 5)."""
    assert not (REPO / "docs" / "benchmarks-log.md").exists() and (REPO / "benchmarks" / "LOG.md").is_file()
    for page in [README, *DOCS]:
        text = page.read_text()
        assert "benchmarks-log" not in text, page
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to {target}, which is not there"


def test_the_readmes_resume_snippet_logs_the_line_it_quotes(dataset_root, caplog):
    """The README's resume snippet turns on INFO logging, which the line needs (issue 64 item 8), and
    the line it quotes is logged where the snippet says: at the resumed loader's first batch."""
    block = next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if "load_state_dict" in b)
    assert "logging.basicConfig(level=logging.INFO)" in block
    quoted = re.search(r'logs "(resumed epoch [^"]+)"', block).group(1)
    loads, first_batch = block.split("next(iter(resumed))")
    scope: dict = {}
    with caplog.at_level(logging.INFO, logger="episodestream"):
        exec(compile(loads.replace("path/to/lerobot_dataset", str(dataset_root)), "README.md", "exec"), scope)
        assert "resumed epoch" not in caplog.text  # not at the load: who reads it is not known yet
        exec("next(iter(resumed))", scope)
        scope["resumed"].close()
    assert quoted in caplog.text, caplog.text
