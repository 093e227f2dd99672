"""A valid tiny dataset, damaged one way at a time: each case ends in a clear error that names the
damaged file, or in samples that are still exactly right; never a silent wrong sample, never a hang.

"Exactly right" is judged from the ids the synthetic writer puts in every value and frame (state =
episode*1000 + frame + j/8, frames spell (episode, frame, camera)), not from our own code, and every
frame of every episode must come back once: a dropped or repeated frame is a wrong epoch.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodestream import DatasetFormatError, EpisodeDataset, EpisodeStreamingDataset, VideoDecodeError
from episodestream.tools.synthetic import write_synthetic_dataset
from episodestream.tools.synthetic import decode_frame_ids

from .conftest import built_once

FPS = 30
CAMERA = "observation.images.front"
IMAGE = "observation.images.top"
LENGTHS = (5, 8, 4, 6)  # episode 1 is longer than 5 frames, so it can lose 5 and keep some
STARTS = np.cumsum((0,) + LENGTHS)
CASE_TIMEOUT_S = 30  # a healthy case takes well under a second
CLEAR_ERRORS = (DatasetFormatError, VideoDecodeError)

INFO = "meta/info.json"
TASKS = "meta/tasks.parquet"
STATS = "meta/stats.json"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
DATA = ("data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet")  # episodes 0-1, 2-3
VIDEOS = tuple(f"videos/{CAMERA}/chunk-000/file-00{i}.mp4" for i in range(2))  # episodes 0-1, 2-3
FILES = (INFO, TASKS, STATS, EPISODES, *DATA, *VIDEOS)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    """4 episodes in 2 data files and 2 mp4 files of one camera, plus a PNG image feature."""
    return built_once(tmp_path_factory, "corruption-tiny", lambda root: write_synthetic_dataset(
        root, num_episodes=len(LENGTHS), episode_length=list(LENGTHS), cameras=(CAMERA,), image_keys=(IMAGE,),
        height=64, width=64, max_episodes_per_data_file=2, max_episodes_per_video_file=2, seed=0))


@pytest.fixture
def damaged(tiny_root, tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(tiny_root, root)
    return root


def _read_streaming(root: Path) -> list[dict]:
    return list(EpisodeStreamingDataset(root, seed=1, episode_pool_size=2))


def _read_map_style(root: Path) -> list[dict]:
    dataset = EpisodeDataset(root)
    try:
        return [dataset[i] for i in range(len(dataset))]
    finally:
        dataset.close()


FACES = {"streaming": _read_streaming, "map-style": _read_map_style}


def _outcome(read: Callable[[], list[dict]]) -> dict:
    """``{"samples": ...}`` or ``{"error": ...}``; fails the test if reading takes over CASE_TIMEOUT_S.

    A daemon thread rather than a subprocess: importing torch per case would cost seconds each.
    """
    result: dict = {}

    def target() -> None:
        try:
            result["samples"] = read()
        except Exception as error:  # noqa: BLE001 - judged by the caller
            result["error"] = error

    thread = threading.Thread(target=target, name="corruption-case", daemon=True)
    thread.start()
    thread.join(CASE_TIMEOUT_S)
    assert not thread.is_alive(), f"reading did not finish within {CASE_TIMEOUT_S} s"
    return result


def check_samples(samples: list[dict]) -> None:
    """Every value and frame says the sample's own (episode, frame), and each frame comes once."""
    seen = []
    for sample in samples:
        episode, frame = int(sample["episode_index"]), int(sample["frame_index"])
        where = f"sample (episode {episode}, frame {frame})"
        assert 0 <= episode < len(LENGTHS) and 0 <= frame < LENGTHS[episode], where
        assert int(sample["index"]) == STARTS[episode] + frame, where
        assert float(sample["timestamp"]) == np.float32(frame / FPS), where
        state = (episode * 1000 + frame + np.arange(6) / 8).astype(np.float32)
        assert np.array_equal(sample["observation.state"].numpy(), state), where
        assert np.array_equal(sample["action"].numpy(), state + np.float32(0.5)), where
        assert int(sample["task_index"]) == episode % 2 and sample["task"] == f"synthetic task {episode % 2}", where
        assert decode_frame_ids(sample[CAMERA]) == (episode, frame, 0), where
        assert decode_frame_ids(sample[IMAGE]) == (episode, frame, 1), where
        seen.append((episode, frame))
    assert sorted(seen) == [(e, f) for e, n in enumerate(LENGTHS) for f in range(n)]


def assert_clear_error_or_exact_samples(root: Path, relpath: str, *, match: str | None = None,
                                        must_fail: bool = False) -> None:
    """Both datasets either raise a clear error naming ``relpath`` (and matching ``match``) or yield
    exactly the right samples (only when not ``must_fail``)."""
    for face, read in FACES.items():
        result = _outcome(lambda read=read: read(root))
        if "samples" in result:
            assert not must_fail, f"{face}: {relpath} damaged, yet {len(result['samples'])} samples and no error"
            check_samples(result["samples"])
            continue
        error = result["error"]
        assert isinstance(error, CLEAR_ERRORS), f"{face}: {type(error).__name__}: {error}"
        assert f"{root}/{relpath}" in str(error), f"{face}: error does not name {relpath}: {error}"
        if match is not None:
            assert re.search(match, str(error)), f"{face}: {error!r} does not match {match!r}"


def assert_exact_samples(root: Path) -> None:
    for face, read in FACES.items():
        result = _outcome(lambda read=read: read(root))
        assert "samples" in result, f"{face}: {result.get('error')!r}"
        check_samples(result["samples"])


def test_the_fixture_has_the_files_the_cases_damage(tiny_root):
    assert sorted(p.relative_to(tiny_root).as_posix() for p in tiny_root.rglob("*") if p.is_file()) == sorted(FILES)


def test_undamaged_dataset_reads_exactly(tiny_root):
    assert_exact_samples(tiny_root)


# --- Truncation of every file kind at several points ---------------------------------------------

CUTS = {"empty": lambda size: 0, "half": lambda size: size // 2, "all_but_100_bytes": lambda size: max(0, size - 100)}


@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("relpath", FILES)
def test_truncated_file(damaged, relpath, cut):
    path = damaged / relpath
    data = path.read_bytes()
    path.write_bytes(data[:CUTS[cut](len(data))])
    # meta/stats.json is not read (LeRobot normalises with it, we do not): samples stay exact.
    assert_clear_error_or_exact_samples(damaged, relpath, must_fail=relpath != STATS)


# --- Damaged bytes inside a parquet file -------------------------------------------------------------

def _garble_footer(path: Path) -> None:
    """Overwrite the thrift footer but keep its length and the magic: pyarrow raises a bare OSError."""
    data = path.read_bytes()
    footer_len = struct.unpack("<i", data[-8:-4])[0]
    path.write_bytes(data[:-8 - footer_len] + b"\xff" * footer_len + data[-8:])


@pytest.mark.parametrize("relpath", [TASKS, EPISODES, DATA[1]])
def test_garbled_parquet_footer(damaged, relpath):
    _garble_footer(damaged / relpath)
    assert_clear_error_or_exact_samples(damaged, relpath, match="not a readable parquet file", must_fail=True)


# --- Rows and episode ranges that disagree (silent wrong data before they were checked) -------------

def _edit_parquet(path: Path, column: str, edit: Callable[[list], list], *, type_: pa.DataType | None = None) -> None:
    """Replace one column of a parquet file by ``edit(its values)``."""
    table = pq.read_table(path)
    values = edit(table.column(column).to_pylist())
    position = table.schema.get_field_index(column)
    table = table.set_column(position, column, pa.array(values, type_ or table.schema.field(column).type))
    pq.write_table(table, path)


def _setter(**changes: dict[int, object]) -> Callable[[Path], None]:
    """Set ``column[row] = value`` for ``changes = {column: {row: value}}`` in one parquet file."""
    def apply(path: Path) -> None:
        for column, rows in changes.items():
            _edit_parquet(path, column, lambda values, rows=rows: [rows.get(i, v) for i, v in enumerate(values)])
    return apply


def _shift_range(episode: int, *, start: int = 0, end: int = 0, length: int = 0) -> Callable[[Path], None]:
    return _setter(dataset_from_index={episode: STARTS[episode] + start},
                   dataset_to_index={episode: STARTS[episode + 1] + end},
                   length={episode: LENGTHS[episode] + length})


def _spans(episode: int, *, start: int = 0, end: int = 0) -> Callable[[Path], None]:
    """Move the episode's video span's ends by ``start`` and ``end`` frames."""
    first = STARTS[episode] - (STARTS[2] if episode >= 2 else 0)  # its first frame in its video file
    prefix = f"videos/{CAMERA}/"
    return _setter(**{prefix + "from_timestamp": {episode: (first + start) / FPS},
                      prefix + "to_timestamp": {episode: (first + LENGTHS[episode] + end) / FPS}})


def _both(*damages: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        for damage in damages:
            damage(path)
    return apply


def _copy_row(source: int, target: int) -> Callable[[Path], None]:
    """Replace row ``target`` of a data file with a copy of row ``source`` (every column)."""
    def apply(path: Path) -> None:
        table = pq.read_table(path)
        rows = table.to_pylist()
        rows[target] = dict(rows[source])
        pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    return apply


def _append_row(path: Path) -> None:
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table, table.slice(len(table) - 1)]), path)


def _as_strings(column: str) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        _edit_parquet(path, column, lambda values: [str(v) for v in values], type_=pa.string())
    return apply


def _edit_info(**changes) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return apply


# name: (file damaged, how, file the error names, what else it says). Data file-000 holds episode 0
# (rows 0-4, index 0-4) and episode 1 (rows 5-12, index 5-12).
INCONSISTENT = {
    "episode_range_overlaps_previous": (
        EPISODES, _shift_range(1, start=-2, end=-2), EPISODES,
        r"episode_index 1\).*dataset_from_index 3 .*episode \(0,.*overlap"),
    "middle_episode_length_shortened_by_5": (
        EPISODES, _shift_range(1, end=-5, length=-5), EPISODES,
        r"episode_index 2\).*dataset_from_index 13 .*skip rows"),
    # Its video span shortened alike, else the span check (a 6-frame span for 1 frame) fires first.
    "last_episode_length_shortened_by_5": (
        EPISODES, _both(_shift_range(3, end=-5, length=-5), _setter(**{f"videos/{CAMERA}/to_timestamp": {
            3: float((STARTS[3] - STARTS[2] + 1) / FPS)}})), DATA[1],
        r"holds 10 rows.*episodes in meta/episodes \(2, 3\) have 5 frames"),
    "length_disagrees_with_range": (
        EPISODES, _setter(length={2: 3}), EPISODES,
        r"episode_index 2\).*length 3 must .*dataset_to_index - dataset_from_index"),
    "episode_index_twice": (EPISODES, _setter(episode_index={3: 2}), EPISODES, r"episode_index 2 appears twice"),
    "null_length": (EPISODES, _setter(length={1: None}), EPISODES, r"column 'length' has 1 null value"),
    "null_data_file_index": (
        EPISODES, _setter(**{"data/file_index": {1: None}}), EPISODES,
        r"episode_index 1\).*path template 'data/.*' cannot be formatted with .*'file_index': None"),
    "row_replaced_by_a_copy_of_the_previous": (
        DATA[0], _copy_row(6, 7), DATA[0], r"episode_index 1\).*row 2 of the episode .*has index 6, expected 7"),
    "row_of_another_episode": (
        DATA[0], _setter(episode_index={9: 0}), DATA[0], r"episode_index 1\).*row 4 .*has episode_index 0, expected 1"),
    "frame_index_renumbered": (
        DATA[0], _setter(frame_index={3: 4}), DATA[0], r"episode_index 0\).*row 3 .*has frame_index 4, expected 3"),
    "extra_row_in_data_file": (DATA[0], _append_row, DATA[0], r"holds 14 rows.*\(0, 1\) have 13 frames"),
    "string_column_declared_float": (
        DATA[1], _as_strings("observation.state"), DATA[1],
        r"column 'observation.state' is stored as string.*dtype 'float32'"),
    "string_index_column": (DATA[0], _as_strings("index"), DATA[0], r"column 'index' is stored as string.*dtype 'int64'"),
    "data_path_not_a_string": (
        INFO, _edit_info(data_path=5), INFO, r"field 'data_path' must be a path template string, got 5"),
    # Attribute and index access in a template from a dataset: a bare AttributeError (issue 62 item 9).
    "data_path_with_attribute_access": (
        INFO, _edit_info(data_path="data/chunk-{chunk_index.foo}/file-{file_index:03d}.parquet"), INFO,
        r"field 'data_path' \('data/chunk-\{chunk_index\.foo\}/file-\{file_index:03d\}\.parquet'\) uses attribute or "
        r"index access \('chunk_index\.foo'\)"),
    "video_path_with_index_access": (
        INFO, _edit_info(video_path="videos/{video_key}/chunk-{chunk_index[0]}/file-{file_index:03d}.mp4"), INFO,
        r"field 'video_path' \('videos/\{video_key\}/chunk-\{chunk_index\[0\]\}/file-\{file_index:03d\}\.mp4'\) "
        r"uses attribute or index access \('chunk_index\[0\]'\)"),
    # Video spans (file-000.mp4 holds episodes 0 and 1, file-001.mp4 episodes 2 and 3): each used
    # to give the neighbouring frames, silently.
    "video_from_timestamp_one_frame_late": (
        EPISODES, _spans(1, start=1), EPISODES,
        rf"episode_index 1\): videos/{CAMERA}/from_timestamp and to_timestamp are 0\.2 and 0\.4333\d*, a span of "
        rf"0\.233333 s, but the episode's 8 frames at 30 fps \(.*/meta/info\.json\) last 0\.266667 s"),
    "video_span_of_a_file_s_last_episode_shifted_one_frame": (
        EPISODES, _spans(1, start=1, end=1), EPISODES,
        rf"episode_index 1\): videos/{CAMERA}/from_timestamp is 0\.2, but in .*/{VIDEOS[0]} the episode before it "
        r"\(episode_index 0\) ends at to_timestamp 0\.1666\d*: the spans leave a gap by 0\.0333333 s \(1 frames\)"),
    "video_span_of_a_file_s_first_episode_shifted_one_frame": (
        EPISODES, _spans(2, start=1, end=1), EPISODES,
        rf"episode_index 3\): videos/{CAMERA}/from_timestamp is 0\.1333\d*, but in .*/{VIDEOS[1]} the episode "
        r"before it \(episode_index 2\) ends at to_timestamp 0\.1666\d*: the spans overlap by 0\.0333333 s"),
    "video_span_before_the_file_starts": (
        EPISODES, _spans(0, start=-1, end=-1), EPISODES,
        rf"episode_index 0\): videos/{CAMERA}/from_timestamp is -0\.0333\d*, before the start of .*/{VIDEOS[0]}"),
    # Row 7 is episode 1's frame 2, given frame 3's time: its video frame would have been frame 3's.
    "timestamp_one_frame_off": (
        DATA[0], _setter(timestamp={7: float(np.float32(3 / FPS))}), DATA[0],
        r"episode_index 1\).*row 2 of the episode \(frame_index 2\) has timestamp 0\.1000000\d*, expected "
        r"frame_index / fps = 0\.0666667 s within tolerance_s=0\.0001 \(1 of its 8 rows differ\)"),
}


@pytest.mark.parametrize("case", list(INCONSISTENT))
def test_inconsistent_rows_and_ranges(damaged, case):
    relpath, damage, named, match = INCONSISTENT[case]
    damage(damaged / relpath)
    assert_clear_error_or_exact_samples(damaged, named, match=match, must_fail=True)


def _rows_of_lengths_5_then_7(path: Path) -> None:
    """Episode 1's frame 0 (row 5) gives its last value to frame 1: 5 values, then 7, 6 on average."""
    def edit(values: list) -> list:
        values[5], values[6] = values[5][:5], values[5][5:] + values[6]
        return values
    _edit_parquet(path, "observation.state", edit, type_=pa.list_(pa.float32()))


def _first_value_as_a_scalar(path: Path) -> None:
    _edit_parquet(path, "observation.state", lambda values: [v[0] for v in values], type_=pa.float32())


# name: (file damaged, how, what the error says, in any order: the file, episode, column, declared
# shape and what was stored). Flattened and re-cut, the first shifted values into the next frame; the
# second gave 0-dim values where meta.features says (6,). LeRobot's cast refuses both.
SHAPES_THAT_DISAGREE = {
    "list_rows_of_5_then_7_values_declared_6": (
        DATA[0], _rows_of_lengths_5_then_7,
        [r"episode_index 1\b", r"'observation\.state'", r"frame 0 holds 5 values", r"declares shape \[6\]"]),
    "scalar_column_declared_shape_6": (
        DATA[1], _first_value_as_a_scalar,
        [r"'observation\.state'", r"stored as a scalar column \(float\)", r"declares shape \[6\]"]),
}


@pytest.mark.parametrize("case", list(SHAPES_THAT_DISAGREE))
def test_values_that_disagree_with_the_declared_shape_are_refused(damaged, case):
    """Every path that makes arrays of a column (streaming, map-style, the stats pass) checks each row
    against info.json's shape (issue 62 items 3 and 4)."""
    relpath, damage, says = SHAPES_THAT_DISAGREE[case]
    damage(damaged / relpath)
    match = "".join(f"(?=.*{part})" for part in says)
    assert_clear_error_or_exact_samples(damaged, relpath, match=match, must_fail=True)
    with pytest.raises(DatasetFormatError, match=match) as raised:
        EpisodeDataset(damaged, cache_dir=damaged.parent / "cache").compute_stats()
    assert f"{damaged}/{relpath}" in str(raised.value)


def test_info_fps_that_is_not_the_datas_is_named(tmp_path):
    # Camera-less, so that only the rows' timestamps can tell (with video, the spans do first).
    from episodestream.tools.synthetic import write_tabular_dataset

    root = write_tabular_dataset(tmp_path / "tabular", num_episodes=3, episode_length=6, fps=FPS)
    _edit_info(fps=10)(root / INFO)
    assert_clear_error_or_exact_samples(root, INFO, must_fail=True, match=(
        r"data/chunk-000/file-000.parquet \(episode_index \d\): row 1 .* has timestamp 0\.033333\d*, expected "
        r"frame_index / fps = 0\.1 s .*; its timestamps step by 0\.0333333 s \(30 fps\), but .*/meta/info\.json "
        r"says fps 10"))


def test_a_video_file_whose_episodes_start_later_is_not_refused_at_load(damaged):
    # LeRobot's merges can write a file whose first episode starts after 0; its episodes still
    # follow each other back to back, and that is all the load-time check asks of them.
    later = 10 * FPS  # frames
    _both(_spans(2, start=later, end=later), _spans(3, start=later, end=later))(damaged / EPISODES)
    spans = EpisodeDataset(damaged).typed_meta.episodes[3].videos[CAMERA]
    assert (spans.relpath, spans.from_timestamp_s) == (VIDEOS[1], (later + LENGTHS[2]) / FPS)


# --- Changes a valid dataset may have: samples stay exact -----------------------------------------

def _image_column_first(path: Path) -> None:
    """Put the image struct (two parquet leaf columns) before ``index`` and fill its ``path``: the
    footer's column statistics are then not in arrow field order."""
    table = pq.read_table(path)
    images = [{"bytes": v["bytes"], "path": f"frame_{i:06d}.png"} for i, v in enumerate(table.column(IMAGE).to_pylist())]
    rest = table.drop_columns([IMAGE])
    table = pa.table({IMAGE: pa.array(images, table.schema.field(IMAGE).type),
                      **{name: rest.column(name) for name in rest.column_names}})
    pq.write_table(table, path, row_group_size=LENGTHS[0])


HARMLESS = {
    "stats_json_missing": (STATS, lambda path: path.unlink()),
    "data_rows_shuffled_within_file": (DATA[0], lambda path: pq.write_table(
        pq.read_table(path).take(np.random.default_rng(0).permutation(STARTS[2])), path)),
    "image_column_before_index": (DATA[0], _image_column_first),
}


@pytest.mark.parametrize("case", list(HARMLESS))
def test_harmless_changes_keep_samples_exact(damaged, case):
    relpath, change = HARMLESS[case]
    change(damaged / relpath)
    assert_exact_samples(damaged)


def test_episodes_files_of_mixed_integer_types_serve_predicates_weights_and_splits(damaged):
    """meta/episodes split over two files, ``length`` and ``data/file_index`` int64 in one and int32 in
    the other (files
    written by different LeRobot versions): the dataset loads, and predicates, weight columns and
    ``split_episodes(by=column)`` read the merged table too (issue 48 item 11: ``ArrowTypeError:
    Unable to merge``)."""
    import pyarrow.compute as pc

    from episodestream import split_episodes

    table = pq.read_table(damaged / EPISODES)
    (damaged / EPISODES).unlink()
    second = table.slice(2)
    for name in ("length", "data/file_index"):
        second = second.set_column(second.schema.get_field_index(name), name, second.column(name).cast(pa.int32()))
    pq.write_table(table.slice(0, 2), damaged / EPISODES)
    pq.write_table(second, damaged / "meta/episodes/chunk-000/file-001.parquet")
    assert len(EpisodeDataset(damaged)) == sum(LENGTHS)
    assert EpisodeStreamingDataset(damaged, episodes=pc.field("length") >= 6).episode_indices == [1, 3]
    assert len(EpisodeStreamingDataset(damaged, episode_weights="length")) == sum(n * n for n in LENGTHS)
    assert split_episodes(damaged, 0.5, by="data/file_index") == ([0, 2], [1, 3])  # one file's episodes each
