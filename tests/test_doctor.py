"""``episodestream doctor``: clean datasets exit 0 (v3.0, v2.1, v2.0, depth and language); each kind of
damage the corruption tests build exits 1, failing the right check for the right episodes with the
message the stream raises for it; ``--json`` is one JSON object; ``--episodes`` limits the check."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodestream.tools.cli import main

from .conftest import built_once
from .test_corruption import (CUTS, DATA, EPISODES, FILES, HARMLESS, INCONSISTENT, INFO, SHAPES_THAT_DISAGREE, STATS,
                              TASKS, VIDEOS, _edit_info, _garble_footer, _setter, _spans, tiny_root)
from .test_v2x_corruption import AT_CONSTRUCTION, EPISODES_STATS, _edit_line, tiny_v20, tiny_v21

__all__ = ["tiny_root", "tiny_v20", "tiny_v21"]  # the fixtures, shared with the corruption tests


def doctor(root: Path, capsys, *options: str, jobs: int = 1) -> tuple[int, dict]:
    """Exit code and the parsed ``--json`` report of ``episodestream doctor root options``: in this
    process by default (``jobs`` > 1 forks worker processes, ~0.1 s each)."""
    code = main(["doctor", str(root), "--json", "--no-progress", "--jobs", str(jobs), *options])
    return code, json.loads(capsys.readouterr().out)


def failed(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"] if check["ran"] and not check["passed"]}


def failing_episodes(check: dict) -> set[int | None]:
    return {failure["episode"] for failure in check["failures"]}


@pytest.fixture
def damaged(tiny_root, tmp_path) -> Path:
    root = tmp_path / "damaged"
    shutil.copytree(tiny_root, root)
    return root


# --- Clean datasets --------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def depth_and_language_root(tmp_path_factory) -> Path:
    from episodestream.tools.synthetic import write_synthetic_dataset

    return built_once(tmp_path_factory, "doctor-depth-language", lambda root: write_synthetic_dataset(
        root, num_episodes=3, episode_length=[4, 6, 3], cameras=("observation.images.front",),
        depth_cameras=("observation.images.depth",), height=64, width=64, language=True,
        max_episodes_per_video_file=2, seed=0))


@pytest.fixture(scope="session")
def hevc_root(tmp_path_factory) -> Path:
    """HEVC with B-frames and open GOPs (LeRobot's depth and vcodec="hevc" cameras): presentation order
    is not decode order, and the mp4's edit list shifts every frame's time."""
    from episodestream.tools.synthetic import write_synthetic_dataset

    return built_once(tmp_path_factory, "doctor-hevc", lambda root: write_synthetic_dataset(
        root, num_episodes=3, episode_length=[9, 14, 5], cameras=("observation.images.front",), codec="hevc",
        max_episodes_per_video_file=2, seed=0))


@pytest.mark.parametrize("fixture", ["tiny_root", "dataset_root", "tiny_v21", "tiny_v20", "depth_and_language_root",
                                     "hevc_root"])
def test_clean_datasets_exit_0(fixture, request, capsys):
    root = request.getfixturevalue(fixture)
    code, report = doctor(root, capsys, "--decode", "all", jobs=2)  # every frame decoded, its time as the index says
    assert (code, failed(report)) == (0, {})
    assert report["clean"] and report["episodes"] > 0
    episode_checks = [c for c in report["checks"] if c["scope"] == "episode" and not c["absent"]]
    assert all(c["episodes_passed"] == report["episodes"] for c in episode_checks)
    if fixture == "depth_and_language_root":
        assert {c["name"] for c in episode_checks} >= {"language", "video"}


def test_the_text_report_of_a_clean_dataset(tiny_root, capsys):
    assert main(["doctor", str(tiny_root), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"rows +4/4 ok", out) and re.search(r"video +4/4 ok", out), out
    assert out.rstrip().endswith("no defects found")


def test_decode_all_and_jobs_give_the_same_report(tiny_root, capsys):
    reports = [doctor(tiny_root, capsys, *options, jobs=jobs)[1] for options, jobs in (([], 1), (["--decode", "all"], 3))]
    assert reports[1]["decode"] == "all"
    assert [c for c in reports[0]["checks"]] == [c for c in reports[1]["checks"]]


# --- v3.0 damage: the cases test_corruption builds ------------------------------------------------

# case: (check that fails, episodes it fails for; None for a metadata error that names no episode).
INCONSISTENT_FOUND = {
    "episode_range_overlaps_previous": ("metadata", {1}),
    "middle_episode_length_shortened_by_5": ("metadata", {2}),
    "last_episode_length_shortened_by_5": ("rows", {2, 3}),
    "length_disagrees_with_range": ("metadata", {2}),
    "episode_index_twice": ("metadata", {None}),
    "null_length": ("metadata", {None}),
    "null_data_file_index": ("metadata", {1}),
    "row_replaced_by_a_copy_of_the_previous": ("rows", {1}),
    "row_of_another_episode": ("rows", {1}),
    "frame_index_renumbered": ("rows", {0}),
    "extra_row_in_data_file": ("rows", {0, 1}),
    "string_column_declared_float": ("dtypes", {2, 3}),
    "string_index_column": ("dtypes", {0, 1}),
    "data_path_not_a_string": ("metadata", {None}),
    "data_path_with_attribute_access": ("metadata", {None}),
    "video_path_with_index_access": ("metadata", {None}),
    "video_from_timestamp_one_frame_late": ("metadata", {1}),
    "video_span_of_a_file_s_last_episode_shifted_one_frame": ("metadata", {1}),
    "video_span_of_a_file_s_first_episode_shifted_one_frame": ("metadata", {3}),
    "video_span_before_the_file_starts": ("metadata", {0}),
    "timestamp_one_frame_off": ("timestamps", {1}),
}


def test_every_inconsistency_case_has_an_expectation():
    assert set(INCONSISTENT_FOUND) == set(INCONSISTENT)


def assert_found(report: dict, check: str, episodes: set, *, names: str | None = None,
                 also: dict[str, set] | None = None) -> None:
    """Only ``check`` fails (and the checks ``also`` names), for exactly ``episodes`` (each of ``also``
    for its own); each first failure names the file ``names``."""
    found = failed(report)
    expected = {check: episodes, **(also or {})}
    assert set(found) == set(expected), {name: c["failures"][:1] for name, c in found.items()}
    for name, episodes in expected.items():
        assert failing_episodes(found[name]) == episodes, found[name]["failures"]
        if found[name]["scope"] == "episode":
            assert found[name]["episodes_failed"] == len(episodes)
        if names is not None:
            assert found[name]["failures"][0]["file"] == names, found[name]["failures"][0]
        assert found[name]["what_to_do"]


@pytest.mark.parametrize("case", list(INCONSISTENT))
def test_inconsistent_rows_and_ranges(damaged, capsys, case):
    """The same message the stream raises (test_corruption's pattern for the case), under the right check."""
    relpath, damage, named, match = INCONSISTENT[case]
    damage(damaged / relpath)
    code, report = doctor(damaged, capsys)
    check, episodes = INCONSISTENT_FOUND[case]
    assert code == 1
    assert_found(report, check, episodes, names=named)
    assert any(re.search(match, f["message"]) for f in failed(report)[check]["failures"]), failed(report)[check]


@pytest.mark.parametrize("case", list(SHAPES_THAT_DISAGREE))
def test_values_that_disagree_with_the_declared_shape(damaged, capsys, case):
    relpath, damage, says = SHAPES_THAT_DISAGREE[case]
    damage(damaged / relpath)
    code, report = doctor(damaged, capsys)
    assert code == 1
    assert_found(report, "dtypes", {1} if relpath == DATA[0] else {2, 3}, names=relpath)
    message = failed(report)["dtypes"]["failures"][0]["message"]
    assert all(re.search(part, message) for part in says), message


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


# What each file of the tiny dataset fails when damaged: the check, and the episodes (None: dataset-wide).
FAILS_WHEN_DAMAGED = {INFO: ("metadata", {None}), TASKS: ("metadata", {None}), EPISODES: ("metadata", {None}),
                      STATS: ("stats", {None}), DATA[0]: ("files", {0, 1}), DATA[1]: ("files", {2, 3}),
                      VIDEOS[0]: ("video", {0, 1}), VIDEOS[1]: ("video", {2, 3})}


def test_every_file_of_the_tiny_dataset_has_an_expectation():
    assert set(FAILS_WHEN_DAMAGED) == set(FILES)


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("relpath", FILES)
def test_truncated_file(damaged, capsys, relpath, cut):
    """test_corruption's truncations: every file kind cut at several points."""
    path = damaged / relpath
    data = path.read_bytes()
    path.write_bytes(data[:CUTS[cut](len(data))])
    code, report = doctor(damaged, capsys)
    assert code == 1
    assert_found(report, *FAILS_WHEN_DAMAGED[relpath], names=relpath)
    if FAILS_WHEN_DAMAGED[relpath][0] == "metadata":  # nothing else can run without it
        assert [c["name"] for c in report["checks"] if not c["ran"]] == [c["name"] for c in report["checks"][1:]]


# (file, how, check, episodes): files removed, or their parquet footer garbled (test_corruption's).
FILE_DAMAGE = [
    (STATS, "removed", "stats", {None}), (TASKS, "garbled", "metadata", {None}), (EPISODES, "garbled", "metadata", {None}),
    (DATA[1], "removed", "files", {2, 3}), (DATA[1], "garbled", "files", {2, 3}), (VIDEOS[1], "removed", "files", {2, 3}),
]
HOW: dict[str, Callable[[Path], None]] = {"removed": Path.unlink, "garbled": _garble_footer}


@pytest.mark.parametrize("relpath,how,check,episodes", FILE_DAMAGE, ids=[f"{how}-{p}" for p, how, *_ in FILE_DAMAGE])
def test_damaged_files(damaged, capsys, relpath, how, check, episodes):
    HOW[how](damaged / relpath)
    code, report = doctor(damaged, capsys, jobs=2)  # failures come back from worker processes
    assert code == 1
    assert_found(report, check, episodes, names=relpath)


@pytest.mark.parametrize("case", [case for case in HARMLESS if case != "stats_json_missing"])
def test_harmless_changes_are_clean(damaged, capsys, case):
    """test_corruption's changes a valid dataset may have (the stream's samples stay exact)."""
    relpath, change = HARMLESS[case]
    change(damaged / relpath)
    code, report = doctor(damaged, capsys)
    assert (code, failed(report)) == (0, {})


def test_a_video_file_whose_episodes_start_later_than_their_frames(damaged, capsys):
    """Spans moved 10 s later in file-001.mp4, back to back still: the metadata passes (LeRobot's merges
    write such files), and the frames are not where the spans say, as the stream's decoder finds."""
    later = 10 * 30  # frames
    _spans(2, start=later, end=later)(damaged / EPISODES)
    _spans(3, start=later, end=later)(damaged / EPISODES)
    code, report = doctor(damaged, capsys)
    assert code == 1
    assert_found(report, "video", {2, 3}, names=VIDEOS[1], also={"frames": {2, 3}})


@pytest.fixture(scope="session")
def video_at_15_fps(tmp_path_factory) -> Path:
    """One camera at 15 fps, 0.47 s: as long as file-000.mp4 of the tiny dataset (13 frames at 30 fps)."""
    from episodestream.tools.synthetic import write_synthetic_dataset

    root = built_once(tmp_path_factory, "doctor-15-fps", lambda root: write_synthetic_dataset(
        root, num_episodes=1, episode_length=7, fps=15, cameras=("observation.images.front",), seed=0))
    return next(root.rglob("*.mp4"))


def test_a_video_at_another_frame_rate_fails_at_frames_the_ends_do_not_show(damaged, video_at_15_fps, capsys):
    """file-000.mp4 re-encoded at 15 fps: every other frame of episodes 0 and 1 has no frame at its time.
    Episode 0's first and last frames (0 and 4: 0 and 2/15 s) do, so decoding them passes: its video's
    frame times (the mp4's index) fail it at frame 1, with no decoding."""
    shutil.copyfile(video_at_15_fps, damaged / VIDEOS[0])
    code, report = doctor(damaged, capsys)
    assert code == 1
    assert_found(report, "frames", {0, 1}, names=VIDEOS[0], also={"video": {1}})
    first = failed(report)["frames"]["failures"][0]["message"]
    assert "2 of the 5 frames of episode 0 key 'observation.images.front' have no frame" in first, first
    assert "(1, 0.033333, 0.0)" in first, first


def test_a_video_shorter_than_its_spans_fails_at_the_last_frame(damaged, capsys):
    """file-000.mp4 replaced by file-001.mp4: 10 frames where episodes 0 and 1 need 13. Episode 0's
    frames are there (another episode's images: only the frames themselves could tell); episode 1's
    first frame is too, its last is not."""
    shutil.copyfile(damaged / VIDEOS[1], damaged / VIDEOS[0])
    code, report = doctor(damaged, capsys)
    assert code == 1
    assert_found(report, "video", {1}, names=VIDEOS[0], also={"frames": {1}})  # the index says so too
    assert "for episode 1 key 'observation.images.front'" in failed(report)["video"]["failures"][0]["message"]


DEPTH_VIDEO = "videos/observation.images.depth/chunk-000/file-000.mp4"  # all 3 episodes


def _language_as_strings(root: Path) -> None:
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    column = table.schema.get_field_index("language_persistent")
    values = pa.array([str(v) for v in table.column(column).to_pylist()])
    pq.write_table(table.set_column(column, "language_persistent", values), path)


# (damage, check, episodes, what the first failure says)
DEPTH_AND_LANGUAGE_DAMAGE = {
    "depth_video_truncated": (lambda root: _truncate(root / DEPTH_VIDEO), "video", {0, 1, 2},
                              "for episode 0 key 'observation.images.depth'"),
    "language_stored_as_strings": (_language_as_strings, "language", {0, 1, 2},
                                   "column 'language_persistent' is stored as string, but info.json declares "
                                   "dtype 'language'"),
}


@pytest.mark.parametrize("case", list(DEPTH_AND_LANGUAGE_DAMAGE))
def test_damaged_depth_and_language(depth_and_language_root, tmp_path, capsys, case):
    damage, check, episodes, says = DEPTH_AND_LANGUAGE_DAMAGE[case]
    root = tmp_path / "damaged"
    shutil.copytree(depth_and_language_root, root)
    damage(root)
    code, report = doctor(root, capsys)
    assert code == 1
    assert_found(report, check, episodes)
    assert says in failed(report)[check]["failures"][0]["message"]


def test_stats_that_are_not_finite(damaged, capsys):
    stats = json.loads((damaged / STATS).read_text())
    stats["observation.state"]["std"][2] = float("nan")
    stats["action"] = 5.0  # a feature without statistics by name: read, and finite
    (damaged / STATS).write_text(json.dumps(stats))  # JSON's NaN, as Python's json writes it
    code, report = doctor(damaged, capsys)
    assert code == 1
    assert_found(report, "stats", {None}, names=STATS)
    assert ("feature 'observation.state' statistic 'std' is not finite"
            in failed(report)["stats"]["failures"][0]["message"])


def test_a_task_index_past_the_tasks(damaged, capsys):
    _setter(task_index={6: 7})(damaged / DATA[0])  # episode 1's frame 1
    code, report = doctor(damaged, capsys)
    assert code == 1
    assert_found(report, "tasks", {1})
    assert re.search(r"episode 1 frame 1: task_index 7 is not in meta/tasks.parquet \(2 tasks\)",
                     failed(report)["tasks"]["failures"][0]["message"])


def test_a_fps_that_is_not_the_datas_fails_every_episode_s_timestamps(tmp_path, capsys):
    from episodestream.tools.synthetic import write_tabular_dataset

    root = write_tabular_dataset(tmp_path / "tabular", num_episodes=3, episode_length=6, fps=30)
    _edit_info(fps=10)(root / INFO)
    code, report = doctor(root, capsys)
    assert code == 1
    assert_found(report, "timestamps", {0, 1, 2})
    assert "says fps 10" in failed(report)["timestamps"]["failures"][0]["message"]


# --- v2.x damage: the cases test_v2x_corruption builds ------------------------------------------

@pytest.mark.parametrize("case,damage,error,message", AT_CONSTRUCTION, ids=[c[0] for c in AT_CONSTRUCTION])
def test_damaged_v21_metadata(tiny_v21, tmp_path, capsys, case, damage, error, message):
    root = tmp_path / "damaged"
    shutil.copytree(tiny_v21, root)
    damage(root)
    code, report = doctor(root, capsys)
    check = "stats" if "episodes_stats" in message else "metadata"
    assert code == 1
    assert set(failed(report)) == {check}, failed(report)
    failure = failed(report)[check]["failures"][0]
    assert (failure["error"], re.search(message, failure["message"]) is not None) == (error.__name__, True), failure


def test_v21_length_that_disagrees_with_its_rows_names_the_episode(tiny_v21, tmp_path, capsys):
    root = tmp_path / "damaged"
    shutil.copytree(tiny_v21, root)
    _edit_line("meta/episodes.jsonl", 2, lambda r: {**r, "length": 7})(root)  # the file holds 8 rows
    code, report = doctor(root, capsys)
    assert code == 1
    rows = failed(report)["rows"]
    # Episode 1's file holds 8 rows for 7 frames; episodes 2 and 3 start past where the lengths say,
    # and their errors name episode 1 as the one to fix.
    assert failing_episodes(rows) == {1, 2, 3}
    assert all("episode 1 is listed with length 7" in f["message"] for f in rows["failures"][1:]), rows


def test_v20_without_stats(tiny_v20, tmp_path, capsys):
    root = tmp_path / "damaged"
    shutil.copytree(tiny_v20, root)
    (root / STATS).unlink()
    code, report = doctor(root, capsys)
    assert (code, set(failed(report))) == (1, {"stats"})


def test_v21_episode_stats_that_are_not_finite(tiny_v21, tmp_path, capsys):
    root = tmp_path / "damaged"
    shutil.copytree(tiny_v21, root)
    _edit_line(EPISODES_STATS, 2, lambda r: {**r, "stats": {**r["stats"], "action": {
        **r["stats"]["action"], "mean": [float("nan")] + r["stats"]["action"]["mean"][1:]}}})(root)  # JSON's NaN
    code, report = doctor(root, capsys)
    assert (code, set(failed(report))) == (1, {"stats"})
    assert "feature 'action' statistic 'mean' is not finite" in failed(report)["stats"]["failures"][0]["message"]


# --- Options ----------------------------------------------------------------------------------------

def test_episodes_limits_the_check(damaged, capsys):
    _setter(frame_index={3: 4})(damaged / DATA[0])  # episode 0
    code, report = doctor(damaged, capsys, "--episodes", "1-3")
    assert (code, report["episodes"], failed(report)) == (0, 3, {})
    assert all(c["episodes_passed"] == 3 for c in report["checks"] if c["scope"] == "episode" and not c["absent"])
    code, report = doctor(damaged, capsys, "--episodes", "0,2")
    assert (code, report["episodes"]) == (1, 2)
    assert_found(report, "rows", {0})


def test_json_on_stdout_and_the_progress_bar_on_stderr(tiny_root, capsys):
    assert main(["doctor", str(tiny_root), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["clean"] is True
    assert "episodes" in err  # the bar, drawn on stderr


@pytest.mark.parametrize("argv", [["--episodes", "9"], ["--jobs", "0"], ["--decode", "some"]])
def test_usage_errors_exit_2(tiny_root, argv):
    try:
        code = main(["doctor", str(tiny_root), "--no-progress", *argv])
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    assert code == 2


def test_a_worker_process_that_dies_is_one_line_and_exit_2(tiny_root, capsys, monkeypatch):
    """A worker killed (out of memory) or crashed in native code (a decoder) leaves no result: the
    command says so in one line, and how to find the episode."""
    import os

    from episodestream.tools.doctor import _episode

    monkeypatch.setattr(_episode.EpisodeChecker, "check_run", lambda self, episodes: os._exit(3))  # in the fork
    assert main(["doctor", str(tiny_root), "--no-progress", "--jobs", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "WorkerDied: a worker process ended without its result" in err, err
    assert "--jobs 1" in err


def test_a_folder_that_is_not_there_exits_2(tmp_path, capsys):
    assert main(["doctor", str(tmp_path / "nothing"), "--no-progress"]) == 2
    assert "is neither an existing local folder" in capsys.readouterr().err


def test_the_doctor_benchmark_runs(tmp_path, monkeypatch, capsys):
    """benchmarks/scale/benchmark_doctor.py on a tiny layout, its doctor command run in this process."""
    import contextlib
    import io
    import subprocess
    from types import SimpleNamespace

    from .scripts import load_script

    script = load_script(Path(__file__).resolve().parents[1] / "benchmarks/scale/benchmark_doctor.py")

    def run(command, **options):
        assert command[1:4] == ["-m", "episodestream", "doctor"], command
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(command[3:])
        return subprocess.CompletedProcess(command, code, stdout=out.getvalue(), stderr="")

    monkeypatch.setattr(script, "subprocess", SimpleNamespace(run=run))
    assert script.main(["--episodes", "30", "--episode-length", "3", "6", "--data-dir", str(tmp_path),
                        "--jobs", "1", "--remote", "--latency-ms", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\| tabular-30-3-6 \| local \| 30 \| 1 \| ends \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| 0, 0.0 \|", out)
    assert re.search(r"\| tabular-30-3-6 \| remote \(1 ms, 50 MB/s\) \| 30 \| 1 \| ends \| [0-9.]+ \| [0-9.]+ "
                     r"\| [0-9.]+ \| [1-9][0-9,]*, [0-9.]+ \|", out), out


# --- Remote sources: through the node cache and the download controller ------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_root):
    """A loopback HTTP server of three datasets: v3.0 and v2.1 of 3 textured episodes of 90 frames (an
    episode's two frames are a small part of its video), and the tiny v3.0 one with two kinds of damage."""
    from episodestream.testing import HttpServer
    from episodestream.tools.synthetic import write_synthetic_dataset

    root = tmp_path_factory.mktemp("served")
    for version in ("v3.0", "v2.1"):
        write_synthetic_dataset(root / version, version=version, num_episodes=3, episode_length=90,
                                cameras=("observation.images.front",), texture=True, seed=0)
    shutil.copytree(tiny_root, root / "damaged")
    _setter(frame_index={3: 4})(root / "damaged" / DATA[0])  # episode 0
    (root / "damaged" / VIDEOS[1]).unlink()  # episodes 2 and 3
    with HttpServer(root) as server:
        yield root, server


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_a_remote_source_fetches_the_decoded_frames_bytes_not_whole_videos(served, tmp_path, capsys, version):
    root, server = served
    video_bytes = sum(path.stat().st_size for path in (root / version).rglob("*.mp4"))
    fetched = {}
    for decode in ("ends", "all"):
        code, report = doctor(server.url_for(version), capsys, "--decode", decode, "--cache-dir",
                              str(tmp_path / decode))
        assert (code, report["episodes"], failed(report)) == (0, 3, {}), failed(report)
        fetched[decode] = report["fetched"]["cache_miss_bytes"]  # mp4 headers and spans, metadata
    assert fetched["ends"] < video_bytes / 2 < fetched["all"], (fetched, video_bytes)


def test_a_remote_source_s_damage_is_found_as_a_local_one_s(served, tmp_path, capsys):
    root, server = served
    local = doctor(root / "damaged", capsys)[1]
    code, remote = doctor(server.url_for("damaged"), capsys, "--cache-dir", str(tmp_path / "cache"), jobs=2)
    assert code == 1
    assert set(failed(remote)) == set(failed(local)) == {"files", "rows"}
    for name, check in failed(remote).items():
        assert failing_episodes(check) == failing_episodes(failed(local)[name]) == ({0} if name == "rows" else {2, 3})
        assert [f["file"] for f in check["failures"]] == [f["file"] for f in failed(local)[name]["failures"]]
