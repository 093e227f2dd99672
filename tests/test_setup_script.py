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


def _setup_without_python_312(tmp_path, *args: str, venv_python: str | None = None,
                              pyenv_python: bool = False) -> subprocess.CompletedProcess:
    """``setup.sh ARGS`` in a copy of the checkout's scripts/, on a PATH whose python3 is older than
    3.12 and that has no python3.12+ (nor apt-get, ffprobe or pip: nothing can be installed).
    ``venv_python``: an existing .venv on that older Python (with a file of the user's in it);
    ``pyenv_python``: a Python 3.12 stand-in where pyenv keeps its builds ($HOME/.pyenv/versions)."""
    import sys

    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    old = Path(sys.executable) if sys.version_info < (3, 12) else Path("/usr/bin/python3.11")
    if not old.exists():
        pytest.skip("no Python older than 3.12 here to stand for a distribution's python3")
    (bin_dir / "python3").symlink_to(old)
    for tool in ("dirname", "ls"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if venv_python:
        (tmp_path / ".venv" / "bin").mkdir(parents=True)
        (tmp_path / ".venv" / "bin" / "python").symlink_to(old)
        (tmp_path / ".venv" / "mine.txt").write_text("the user's")
    if pyenv_python:
        _fake_python(tmp_path / ".pyenv/versions/3.12.1/bin/python3", tmp_path / "fake-state")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    return subprocess.run([shutil.which("bash"), str(tmp_path / "scripts" / "setup.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_setup_lerobot_without_python_312_says_how_to_get_one_and_changes_nothing(tmp_path):
    """``setup.sh --lerobot`` needs Python >= 3.12 (LeRobot's floor): without one it installs nothing
    and says how to get one (issue 49 item 4, issue 64 item 3); an existing older .venv stays as it
    was, and the way on makes LeRobot's venv beside it (the message said 'rm -rf .venv' first, and the
    user who ran it had no venv at all when no Python 3.12 followed)."""
    result = _setup_without_python_312(tmp_path / "fresh", "--lerobot")
    assert result.returncode == 1, result.stderr
    assert "LeRobot needs Python >= 3.12" in result.stderr and "no Python >= 3.12 was found" in result.stderr
    assert "Nothing was installed" in result.stderr
    for way in ("uv python install 3.12", "pyenv install 3.12", "deadsnakes", "conda create -n py312 python=3.12"):
        assert way in result.stderr, way
    assert "pipx install uv" in result.stderr  # no venv yet to put uv in
    assert result.stderr.strip().endswith("PYTHON=/path/to/python3.12 bash scripts/setup.sh --lerobot")
    assert not (tmp_path / "fresh" / ".venv").exists()

    result = _setup_without_python_312(tmp_path / "old-venv", "--test", "--lerobot", venv_python="old")
    assert result.returncode == 1, result.stderr
    said = result.stderr
    assert "Nothing was changed: .venv is as it was" in said and "rm -rf" not in said
    assert ".venv/bin/python -m pip install uv; .venv/bin/uv python install 3.12" in said  # uv from the venv it has
    assert said.strip().endswith(
        "PYTHON=/path/to/python3.12 bash scripts/setup.sh --test --lerobot --venv .venv-lerobot  # beside .venv")
    assert (tmp_path / "old-venv" / ".venv" / "mine.txt").read_text() == "the user's"
    assert not (tmp_path / "old-venv" / ".venv-lerobot").exists()

    result = _setup_without_python_312(tmp_path / "typo", "--lerobt")
    assert result.returncode == 2 and "unknown option --lerobt (options: --test, --lerobot, --venv DIR)" in result.stderr


def test_setup_lerobot_uses_a_python_312_that_exists_and_says_so_before_any_removal(tmp_path):
    """A Python >= 3.12 that pyenv installed is found. Beside an older .venv, setup.sh changes nothing
    and gives the command with that interpreter: first LeRobot's venv beside .venv, then (second) the
    replacement, which removes .venv."""
    result = _setup_without_python_312(tmp_path / "old-venv", "--lerobot", venv_python="old", pyenv_python=True)
    assert result.returncode == 1, result.stderr
    found = tmp_path / "old-venv/.pyenv/versions/3.12.1/bin/python3"
    lines = result.stderr.strip().splitlines()
    assert "Nothing was changed: .venv is as it was" in lines[0]
    assert lines[1].startswith(f"setup: {found} is Python 3.12. Make LeRobot's venv beside .venv (nothing is removed")
    assert lines[2] == f"  PYTHON={found} bash scripts/setup.sh --lerobot --venv .venv-lerobot"
    assert lines[3].endswith(f"rm -rf .venv && PYTHON={found} bash scripts/setup.sh --lerobot") and len(lines) == 4
    assert (tmp_path / "old-venv" / ".venv" / "mine.txt").read_text() == "the user's"
    # A folder of the user's named as the venv is refused, untouched.
    mine = tmp_path / "old-venv" / "notes"
    mine.mkdir()
    (mine / "a.txt").write_text("notes")
    result = _setup_without_python_312(tmp_path / "again", "--lerobot", "--venv", str(mine))
    assert result.returncode == 1 and f"{mine} is not a virtual environment" in result.stderr
    assert [p.name for p in mine.iterdir()] == ["a.txt"]


FAKE_PYTHON = r'''#!{python}
"""A stand-in for a Python 3.12 and the venvs made from it: answers setup.sh's probes, makes a venv
as a copy of itself, and logs each pip install (installing only what the log says) in $FAKE_STATE."""
import json, os, shutil, sys
from pathlib import Path

state = Path({state!r})
state.mkdir(parents=True, exist_ok=True)
log, installed = state / "pip.log", state / "installed.json"
have = json.loads(installed.read_text()) if installed.exists() else {{}}
args = sys.argv[1:]
if args[:2] == ["-m", "venv"]:
    dest = Path(args[-1])
    (dest / "bin").mkdir(parents=True)
    shutil.copy(sys.argv[0], dest / "bin" / "python")
    (dest / "pyvenv.cfg").write_text("home = fake\n")
    sys.exit(0)
if args[:2] == ["-m", "pip"]:
    with log.open("a") as out:
        out.write(json.dumps(args[2:]) + "\n")
    if "--index-url" in args and os.environ.get("FAKE_CPU_INDEX_DOWN"):
        sys.exit(1)
    if "--index-url" in args:
        have.update(torch="2.11.0+cpu", cuda=None, torchvision="0.26.0+cpu")
    elif "torch" not in have and any(a.startswith("-e") or a.startswith(".[") for a in args):
        have.update(torch="2.11.0", cuda="12.8", torchvision="0.26.0")
    installed.write_text(json.dumps(have))
    sys.exit(0)
code = args[1] if args[:1] == ["-c"] else ""
if "version_info <" in code:
    sys.exit(0)
if '"%d.%d"' in code:
    print("3.12")
elif "sys.executable" in code:
    print(sys.argv[0])
elif "purelib" in code:
    print("")
elif "import torchvision" in code:
    if "torchvision" not in have:
        sys.exit(1)
    print("torchvision==" + have["torchvision"].split("+")[0])
elif "import torch" in code:
    if "torch" not in have:
        sys.exit(1)
    if "torch.version.cuda" in code:
        print(have["torch"], "CUDA " + have["cuda"] if have["cuda"] else "CPU build")
    elif "print" in code:
        print("torch==" + have["torch"].split("+")[0])
'''


def _fake_python(path: Path, state: Path) -> Path:
    import sys

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE_PYTHON.format(python=sys.executable, state=str(state)))
    path.chmod(0o755)
    return path


def _setup_with_a_fake_python(tmp_path, *args: str, gpu: bool = False, cpu_index_down: bool = False):
    """``setup.sh ARGS`` through to its end with a stand-in Python 3.12 as python3 (``_fake_python``):
    what it asks pip to install, in order. ``gpu``: an ``nvidia-smi`` that lists a GPU is on PATH."""
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver: setup.sh sees a GPU whatever PATH holds")
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_python(bin_dir / "python3", tmp_path / "state")
    for tool in ("dirname", "ls", "uname", "du", "cut"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "ffprobe").write_text("#!/bin/sh\nexit 0\n")  # FFmpeg is there: no apt-get
    (bin_dir / "ffprobe").chmod(0o755)
    if gpu:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    if cpu_index_down:
        env["FAKE_CPU_INDEX_DOWN"] = "1"
    result = subprocess.run([shutil.which("bash"), str(tmp_path / "scripts" / "setup.sh"), *args], env=env,
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    log = tmp_path / "state" / "pip.log"
    import json

    installs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, [[a for a in i if a not in ("-q", "--disable-pip-version-check", "--root-user-action=ignore")]
                    for i in installs]


def test_setup_lerobot_installs_the_cpu_build_of_torch_without_a_gpu(tmp_path):
    """issue 64 item 3: ``setup.sh --lerobot`` on a CPU-only machine installed PyPI's CUDA build of torch
    (a 5.5 GB venv against 1.5 GB). Without an NVIDIA GPU, torch and torchvision come from PyTorch's
    CPU index, within LeRobot's bounds, and the extra's install keeps them (pinned)."""
    result, installs = _setup_with_a_fake_python(tmp_path / "cpu", "--lerobot")
    assert result.returncode == 0, result.stderr
    assert installs[0] == ["install", "--retries", "1", "--timeout", "30", "--index-url",
                           "https://download.pytorch.org/whl/cpu", "torch>=2.7,<2.12", "torchvision>=0.22,<0.27"]
    assert installs[1] == ["install", "-e", ".[lerobot]", "torch==2.11.0", "torchvision==0.26.0"]
    assert "no NVIDIA GPU here: installing PyTorch's CPU build" in result.stderr
    assert "LeRobot installed (torch 2.11.0+cpu CPU build" in result.stderr

    # With a GPU: the extra picks torch from the package index (its CUDA build), nothing from the CPU index.
    result, installs = _setup_with_a_fake_python(tmp_path / "gpu", "--lerobot", gpu=True)
    assert result.returncode == 0, result.stderr
    assert installs == [["install", "-e", ".[lerobot]"]]
    assert "LeRobot installed (torch 2.11.0 CUDA 12.8" in result.stderr

    # The CPU index unreachable: said, and the default build installed instead (the run finishes).
    result, installs = _setup_with_a_fake_python(tmp_path / "offline", "--lerobot", cpu_index_down=True)
    assert result.returncode == 0, result.stderr
    assert "--index-url" in installs[0] and installs[1] == ["install", "-e", ".[lerobot]"]
    assert "the CPU build could not be installed from https://download.pytorch.org/whl/cpu" in result.stderr
    assert "bundles CUDA (~4 GB more)" in result.stderr

    # The plain set-up is as it was: torch pinned, no CPU index.
    result, installs = _setup_with_a_fake_python(tmp_path / "plain")
    assert result.returncode == 0, result.stderr
    assert installs[0] == ["install", "torch==2.13.0"] and not any("--index-url" in i for i in installs)
