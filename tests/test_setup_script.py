"""``bash scripts/setup.sh`` on a distribution's Python (PEP 668, "externally managed": pip refuses
to install into it) makes and uses ``.venv``, and the README's first command then works exactly as
written, in a fresh clone with only /usr/bin/python3 on PATH. Slow: pip installs torch and the rest
into the new venv (from this machine's local wheel index), then the demo encodes video."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_test_command():
    ci = [line for line in (REPO / ".ci/run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [_readme_commands()[1]]


@pytest.mark.slow
def test_setup_on_an_externally_managed_python_uses_a_venv(tmp_path):
    # ~100 s here (pip unpacks torch into the new venv): more than the whole suite's budget, so it
    # runs when asked for, e.g. EPISODESTREAM_TEST_SETUP_SH=1 .venv/bin/python -m pytest tests/test_setup_script.py
    if os.environ.get("EPISODESTREAM_TEST_SETUP_SH") != "1":
        pytest.skip("takes ~100 s (installs torch into a fresh venv); set EPISODESTREAM_TEST_SETUP_SH=1 to run it")
    if not SYSTEM_PYTHON.exists():
        pytest.skip("no /usr/bin/python3 here (a distribution's Python) to run setup.sh with")
    stdlib = subprocess.run([str(SYSTEM_PYTHON), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    if not (Path(stdlib) / "EXTERNALLY-MANAGED").exists():
        pytest.skip(f"{SYSTEM_PYTHON} is not externally managed (no {stdlib}/EXTERNALLY-MANAGED): nothing to show")
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot clone the checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    # Only the system's tools on PATH: python3 is Debian's; ffprobe is there already (else apt runs).
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV", "CONDA"))}
    env["PATH"] = "/usr/bin:/bin"
    env["HOME"] = str(tmp_path / "home")
    assert subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], env=env, capture_output=True,
                          text=True).stdout.strip() in ("/usr/bin/python3", "/bin/python3")
    refused = subprocess.run(["python3", "-m", "pip", "install", "--dry-run", "-q", "tqdm"], env=env,
                             capture_output=True, text=True, cwd=clone)
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr + refused.stdout
    demo_command = _readme_commands()[0]  # bash scripts/setup.sh && .venv/bin/python -m episodestream demo
    result = subprocess.run(["bash", "-c", demo_command], env=env, capture_output=True, text=True, cwd=clone,
                            timeout=1500)
    assert result.returncode == 0, f"{demo_command!r} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "creating the virtual environment .venv" in result.stderr and "samples/s" in result.stdout
    venv_python = clone / ".venv/bin/python"  # run outside the clone: the venv's install, not the folder, answers
    where = subprocess.run([str(venv_python), "-c", "import episodestream, sys; print(episodestream.__file__, sys.prefix)"],
                           env=env, capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert where == [str(clone / "episodestream/__init__.py"), str(clone / ".venv")]


def _setup_without_python_312(tmp_path, *args: str, venv_python: str | None = None) -> subprocess.CompletedProcess:
    """``setup.sh ARGS`` in a copy of the checkout's scripts/, on a PATH whose python3 is older than
    3.12 and that has no python3.12+ (nor apt-get, ffprobe or pip: nothing can be installed)."""
    import sys

    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    old = Path(sys.executable) if sys.version_info < (3, 12) else Path("/usr/bin/python3.11")
    if not old.exists():
        pytest.skip("no Python older than 3.12 here to stand for a distribution's python3")
    (bin_dir / "python3").symlink_to(old)
    for tool in ("dirname",):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if venv_python:
        (tmp_path / ".venv" / "bin").mkdir(parents=True)
        (tmp_path / ".venv" / "bin" / "python").symlink_to(old)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    return subprocess.run([shutil.which("bash"), str(tmp_path / "scripts" / "setup.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_setup_lerobot_without_python_312_says_the_one_line_to_run(tmp_path):
    """``setup.sh --lerobot`` needs Python >= 3.12 (LeRobot's floor): without one it installs nothing
    and prints what to run (issue 49 item 4); an existing older .venv is named too."""
    result = _setup_without_python_312(tmp_path / "fresh", "--lerobot")
    assert result.returncode == 1, result.stderr
    assert "LeRobot needs Python >= 3.12" in result.stderr and "no python3.12 or newer is on PATH" in result.stderr
    assert result.stderr.strip().endswith("then run: PYTHON=python3.12 bash scripts/setup.sh --lerobot")
    assert not (tmp_path / "fresh" / ".venv").exists()
    result = _setup_without_python_312(tmp_path / "old-venv", "--test", "--lerobot", venv_python="old")
    assert result.returncode == 1 and result.stderr.strip().endswith(
        "rm -rf .venv && PYTHON=python3.12 bash scripts/setup.sh --lerobot"), result.stderr
    result = _setup_without_python_312(tmp_path / "typo", "--lerobt")
    assert result.returncode == 2 and "unknown option --lerobt (options: --test, --lerobot)" in result.stderr
