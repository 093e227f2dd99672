"""The command line and the README's code, run as a user would."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from episodestream.tools.cli import main

REPO = Path(__file__).resolve().parents[1]


DEMO = ["demo", "--episodes", "3", "--episode-length", "20", "--height", "64", "--width", "96"]


def _check_demo_output(stdout: str, how: str) -> None:
    assert "2 cameras 64x96 (HxW) AV1" in stdout  # --height 64 --width 96, as `info` prints sizes
    assert f"streaming 60 samples with {how}" in stdout
    assert "samples: 60 " in stdout
    # The pool's number says what it means (issue 64 item 10): 3 episodes pool at least 16, all of them.
    assert "episode pool 16 (more than the 3 episodes: each consumer shuffles its whole share" in stdout, stdout
    assert re.search(r"throughput: [0-9.]+ samples/s, [0-9.]+ frames/s", stdout)


def test_demo_streams_and_reports_throughput(tmp_path, capsys):
    """The README's first command (EpisodeLoader), in this process: a second interpreter costs ~2.5
    CPU-s of imports; the entry point is checked on its own below."""
    assert main([*DEMO, "--out", str(tmp_path / "demo"), "--loader", "episode"]) == 0
    _check_demo_output(capsys.readouterr().out, "EpisodeLoader")


def test_python_m_episodestream_runs_the_command_line():
    """``python -m episodestream``, as a user runs it, reaches the command line: the demo's options."""
    result = subprocess.run([sys.executable, "-m", "episodestream", "demo", "--help"], capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "usage: episodestream demo" in result.stdout and "--out" in result.stdout, result.stdout


def test_demo_streams_through_a_dataloader(tmp_path, capsys):
    assert main([*DEMO, "--out", str(tmp_path / "demo"), "--loader", "dataloader"]) == 0
    out = capsys.readouterr().out
    _check_demo_output(out, "a DataLoader")
    # Its frames/s is a decode cost: the video is textured as `bench` writes it, not flat blocks that
    # decode several times faster (issue 49 item 5; a flat frame holds ~18 grey levels).
    assert "textured frames" in out and "decoding and batching textured 64x96 AV1 video" in out
    from episodestream import EpisodeDataset

    dataset = EpisodeDataset(tmp_path / "demo", return_uint8=True)
    assert len(torch.unique(dataset[3][dataset.meta.camera_keys[0]])) > 50


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
    # Sizes read H x W, as LeRobot's shape (H, W, C) and as `demo` prints them.
    assert "camera observation.images.wrist: 64x96 (HxW) av1 yuv420p GOP 2, 2 file(s)" in text


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


# The README and the reference pages its sections moved to: their examples run as pasted.
RUNNABLE_DOCS = ("README.md", "docs/usage.md", "docs/curation.md", "docs/lerobot.md", "docs/v2x.md")


@pytest.mark.parametrize("page", RUNNABLE_DOCS)
def test_readme_code_runs(dataset_root, page):
    readme = (REPO / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, f"{page} has no python example"
    for block in blocks:
        exec(compile(block.replace("path/to/lerobot_dataset", str(dataset_root)), page, "exec"), {})


def test_demo_never_deletes_what_it_did_not_write(tmp_path, capsys):
    """``demo --out DIR`` deleted everything already in DIR (issue 48 item 1): a non-empty folder that
    is not a dataset the demo wrote is refused, naming it, and left as it was."""
    notes = tmp_path / "mine" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("a user's notes")
    assert main([*DEMO, "--out", str(notes.parent)]) == 1
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) == 1 and f"--out {notes.parent} is not empty (notes.txt)" in captured.err
    assert notes.read_text() == "a user's notes"
    # A folder the demo wrote is its own to replace; one where the user added a file is not.
    demo = tmp_path / "demo"
    assert main([*DEMO, "--out", str(demo)]) == 0
    assert main([*DEMO, "--out", str(demo)]) == 0
    (demo / "checkpoint.pt").write_bytes(b"weights")
    assert main([*DEMO, "--out", str(demo)]) == 1
    assert (demo / "checkpoint.pt").read_bytes() == b"weights"


def test_demo_writes_into_the_current_folder(tmp_path, monkeypatch, capsys):
    """``demo --out .`` in an empty folder staged inside ``.`` and then removed ``.`` (issue 62 item 8):
    a shutil traceback and no dataset. An existing empty folder (the current one too) is written into
    and stays; run again, the demo replaces only what it wrote there."""
    from episodestream import EpisodeDataset

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for _ in range(2):
        assert main([*DEMO, "--out", "."]) == 0
        capsys.readouterr()
        assert here.is_dir() and Path.cwd() == here
        assert {entry.name for entry in here.iterdir()} <= {".episodestream-demo", "meta", "data", "videos"}
        assert len(EpisodeDataset(here)) == 3 * 20
    (here / "notes.txt").write_text("a user's notes")
    assert main([*DEMO, "--out", "."]) == 1
    assert "--out . is not empty" in capsys.readouterr().err
    assert (here / "notes.txt").read_text() == "a user's notes" and (here / "meta").is_dir()


def test_episode_lists_refuse_reversed_open_and_oversized_ranges(dataset_root, capsys):
    """``0,5-3`` dropped the reversed range, ``3-`` meant episode 3 alone, and ``0-100000000000``
    built the whole list before any check (issue 48 item 6)."""
    for text, named in (("0,5-3", "'5-3' is a reversed range"), ("3-", "'3-' is an open range")):
        with pytest.raises(SystemExit):
            main(["stats", str(dataset_root), "--episodes", text, "--no-cache"])
        assert named in capsys.readouterr().err
    assert main(["stats", str(dataset_root), "--episodes", "0-100000000000", "--no-cache", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "--episodes '0-100000000000': '0-100000000000' goes past the last episode" in err
    assert "(episode indices 0..5, 6 episodes)" in err


def test_cli_usage_errors_are_one_line_and_exit_1(dataset_root, tmp_path, capsys):
    """``stats --out`` into a missing folder computed the stats, then printed a traceback; ``demo``
    with a zero count printed a traceback (issue 48 item 15)."""
    argvs = {("stats", str(dataset_root), "--no-cache", "--no-progress", "--out", str(tmp_path / "no/such/x.json")):
             f"--out {tmp_path / 'no/such/x.json'}: no folder {tmp_path / 'no/such'}",
             **{(*DEMO[:1], option, "0"): f"{option} must be an integer >= 1, got 0"
                for option in ("--episodes", "--batch-size", "--pool-size", "--num-threads")}}
    for argv, named in argvs.items():
        assert main(list(argv)) == 1, argv
        captured = capsys.readouterr()
        assert len(captured.err.splitlines()) == 1 and named in captured.err, (argv, captured.err)
        assert not (tmp_path / "no").exists()


def _options(parser) -> list[tuple[str, object]]:
    """(command, action) for every option and argument of every command but bench and lerobot-train,
    whose options are the benchmark's and LeRobot's."""
    import argparse

    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name not in ("bench", "lerobot-train"):
                    found += [(f"{name} {command}".strip(), option) for command, option in _options(sub)]
        elif not isinstance(action, argparse._HelpAction):
            found.append(("", action))
    return found


def test_every_option_says_what_it_does():
    from episodestream.tools.cli import build_parser

    options = _options(build_parser())
    assert len(options) > 30
    missing = [f"{command} {'/'.join(action.option_strings) or action.dest}" for command, action in options
               if not action.help]
    assert not missing, f"options without help text: {missing}"


def test_stats_help_names_every_version_it_reads(capsys):
    with pytest.raises(SystemExit):
        main(["stats", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "v3.0, v2.1 or v2.0" in help_text and "v3.0 dataset" not in help_text


def test_a_leading_tilde_is_the_home_folder(dataset_root, tmp_path, monkeypatch, capsys):
    """``info "~/data"`` (quoted, or ``--opt=~/...``: the shell leaves ``~`` alone) looked for a folder named ``~``."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "robot").symlink_to(dataset_root)
    assert main(["info", "~/robot", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 6
    assert main(["stats", "~/robot", "--cache-dir", "~/cache", "--no-progress", "--json"]) == 0
    assert "action" in json.loads(capsys.readouterr().out)
    assert (tmp_path / "cache" / "stats").is_dir()


def test_a_cached_stats_run_shows_no_bar_stuck_at_zero(dataset_root, tmp_path, capsys):
    command = ["stats", str(dataset_root), "--cache-dir", str(tmp_path / "cache"), "--json"]
    assert main(command) == 0
    assert "100%" in capsys.readouterr().err  # the first run reads every row
    assert main(command) == 0
    assert "0%" not in capsys.readouterr().err  # the second reads the cache: no rows, no bar


def test_cache_ls_and_clear_cover_the_column_and_stats_caches(dataset_root, tmp_path, capsys):
    """The column and stats caches under the cache folder were neither listed ("0 entries, 0 B") nor
    cleared (issue 49 item 6)."""
    from episodestream import EpisodeDataset

    cache = tmp_path / "cache"
    EpisodeDataset(dataset_root, cache_dir=cache)[0]  # builds the column copy of one data file
    assert main(["stats", str(dataset_root), "--cache-dir", str(cache), "--no-progress", "--json"]) == 0
    capsys.readouterr()
    on_disk = {kind: sum(p.stat().st_size for p in (cache / kind).rglob("*") if p.is_file())
               for kind in ("columns", "stats")}
    assert all(on_disk.values()), on_disk
    assert main(["cache", "ls", "--cache-dir", str(cache), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    for kind, size in on_disk.items():
        assert [entry["size_bytes"] for entry in listed[kind]] == [size], (kind, listed[kind])
        assert listed[kind][0]["source"].endswith(listed["columns"][0]["source"])  # one key per source
    assert main(["cache", "ls", "--cache-dir", str(cache), "--source", "no-such-source", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["columns"] == []
    assert main(["cache", "ls", "--cache-dir", str(cache)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"columns cache .*: 1 source\(s\), 1 file\(s\)", text) and "stats cache" in text
    assert main(["cache", "clear", "--cache-dir", str(cache)]) == 0
    text = capsys.readouterr().out
    assert "removed the columns cache of 1 source(s): 1 file(s)" in text, text
    assert "removed the stats cache of 1 source(s): 1 file(s)" in text, text
    assert not [p for p in cache.rglob("*") if p.is_file()]
    assert EpisodeDataset(dataset_root, cache_dir=cache)[0]["index"] == 0  # rebuilt when next needed


def test_cache_clear_deletes_only_what_episodestream_wrote(dataset_root, tmp_path, capsys):
    """A mistyped --cache-dir pointing into a project deleted every file under its columns/ and every
    stats/*.json (issue 62 item 1): only the files this package writes, recognised by name (and a
    stats file by its contents), are listed and cleared; a column folder goes only once empty."""
    from episodestream import EpisodeDataset

    project = tmp_path / "project"
    EpisodeDataset(dataset_root, cache_dir=project)[0]
    assert main(["stats", str(dataset_root), "--cache-dir", str(project), "--no-progress", "--json"]) == 0
    capsys.readouterr()
    column_copy, stats_file = sorted((p for p in project.rglob("*") if p.is_file()), key=lambda p: p.suffix)
    assert (column_copy.suffix, stats_file.suffix) == (".arrow", ".json")
    users = {"columns/notes.txt": "mine", "columns/results/run1.arrow": "mine",
             "columns/plots-0123abcd/figure.arrow": "mine",  # a folder named as ours, a file not
             f"columns/{column_copy.parent.name}/keep.txt": "mine",  # beside a column copy of ours
             "stats/results.json": "{\"loss\": 1}",
             "stats/0123456789abcdef0123.json": "{\"format\": 1, \"loss\": 1}",  # our name, not our contents
             "stats/0123456789abcdef0124.json": "not json"}
    for relpath, text in users.items():
        (project / relpath).parent.mkdir(parents=True, exist_ok=True)
        (project / relpath).write_text(text)
    assert main(["cache", "ls", "--cache-dir", str(project), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["files"], e["size_bytes"]) for kind in ("columns", "stats") for e in listed[kind]] == [
        (1, column_copy.stat().st_size), (1, stats_file.stat().st_size)]
    assert main(["cache", "clear", "--cache-dir", str(project)]) == 0
    capsys.readouterr()
    left = {str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()}
    assert left == set(users), left
    assert all((project / relpath).read_text() == text for relpath, text in users.items())
