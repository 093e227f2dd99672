"""The command line and the README's code, run as a user would."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from episodestream.tools.cli import main

REPO = Path(__file__).resolve().parents[1]


DEMO = ["demo", "--episodes", "3", "--episode-length", "20", "--height", "64", "--width", "96"]


def _check_demo_output(stdout: str, how: str) -> None:
    assert f"streaming 60 samples with {how}" in stdout
    assert "samples: 60 " in stdout
    assert re.search(r"throughput: [0-9.]+ samples/s, [0-9.]+ frames/s", stdout)


def test_demo_streams_and_reports_throughput(tmp_path):
    """The README's first command, as a user runs it (``python -m episodestream``, EpisodeLoader)."""
    result = subprocess.run([sys.executable, "-m", "episodestream", *DEMO, "--out", str(tmp_path / "demo"),
                             "--loader", "episode"], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr
    _check_demo_output(result.stdout, "EpisodeLoader")


def test_demo_streams_through_a_dataloader(tmp_path, capsys):
    # In this process: the entry point is checked above, and a second interpreter costs ~2 s.
    assert main([*DEMO, "--out", str(tmp_path / "demo"), "--loader", "dataloader"]) == 0
    _check_demo_output(capsys.readouterr().out, "a DataLoader")


def test_info_describes_the_dataset(dataset_root, capsys):
    assert main(["info", str(dataset_root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["episodes"], info["frames"], info["fps"]) == (6, 290, 30)
    front = info["cameras"]["observation.images.front"]
    assert (front["codec"], front["gop"], front["files"]) == ("av1", 2, 3)
    assert front["size_bytes"] == sum(p.stat().st_size for p in (dataset_root / "videos" / "observation.images.front").rglob("*.mp4"))
    assert info["image_keys"] == ["observation.images.top"]
    assert main(["info", str(dataset_root)]) == 0
    text = capsys.readouterr().out
    assert "camera observation.images.wrist: 96x64 av1 yuv420p GOP 2, 2 file(s)" in text


def test_errors_are_one_line_on_stderr_and_a_nonzero_exit(tmp_path, capsys):
    # `info` on a bad path printed a traceback; `cache ls|clear|unpin` on a missing folder exited 0 as if empty.
    (tmp_path / "not-a-dataset").mkdir()
    (tmp_path / "empty-cache").mkdir()
    cases = {("info", str(tmp_path / "missing")): str(tmp_path / "missing"),
             ("info", str(tmp_path / "not-a-dataset")): f"{tmp_path / 'not-a-dataset'}/meta/info.json not found",
             **{("cache", command, "--cache-dir", str(tmp_path / "no-cache")):
                f"no cache folder at {tmp_path / 'no-cache'} (given by --cache-dir)"
                for command in ("ls", "clear", "unpin")}}
    for argv, named in cases.items():
        assert main(list(argv)) == 1, argv
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.splitlines()) == 1, (argv, captured.err)
        assert captured.err.startswith(f"episodestream {' '.join(argv[:2 if argv[0] == 'cache' else 1])}: "), argv
        assert named in captured.err, (argv, captured.err)
    assert main(["cache", "ls", "--cache-dir", str(tmp_path / "empty-cache")]) == 0  # empty is not an error
    assert "total: 0 entries" in capsys.readouterr().out


def test_bench_is_the_benchmark_front_door(capsys):
    try:
        main(["bench", "--help"])
    except SystemExit as stop:
        assert stop.code == 0
    assert "--source" in capsys.readouterr().out


def test_readme_code_runs(dataset_root):
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block.replace("path/to/lerobot_dataset", str(dataset_root)), "README.md", "exec"), {})
