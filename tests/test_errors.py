"""Bad input gives errors that name the file, the field or key, and the value."""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings

import numpy as np
import pytest
import torch

from episodestream import (DatasetFormatError, EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset, SourceOptions,
                           VideoDecodeError)


@pytest.fixture
def copy_root(dataset_root, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(dataset_root, root)
    return root


def edit_info(root, **changes):
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    info.update(changes)
    path.write_text(json.dumps(info))


def test_missing_info_json(copy_root):
    (copy_root / "meta" / "info.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"meta/info.json not found"):
        EpisodeStreamingDataset(copy_root)


def test_the_meta_folder_given_as_the_root_is_named_as_such(dataset_root):
    with pytest.raises(FileNotFoundError, match=r"meta/meta/info.json not found: .* It looks like a dataset's "
                                                r"meta folder: pass the dataset's root, the folder above it\."):
        EpisodeStreamingDataset(dataset_root / "meta")
    with pytest.raises(FileNotFoundError, match=r"videos/meta/info.json not found") as elsewhere:
        EpisodeStreamingDataset(dataset_root / "videos")
    assert "meta folder" not in str(elsewhere.value)


def test_wrong_codebase_version(copy_root):
    edit_info(copy_root, codebase_version="v1.6")
    with pytest.raises(DatasetFormatError, match=r"info.json: field 'codebase_version' is 'v1.6'.*'v2.0', 'v2.1', 'v3.0'"):
        EpisodeDataset(copy_root)
    # A v3.0 layout that says v2.1 is read as v2.1, and has no episodes.jsonl.
    edit_info(copy_root, codebase_version="v2.1")
    with pytest.raises(FileNotFoundError, match=r"meta/episodes.jsonl not found"):
        EpisodeDataset(copy_root)


@pytest.mark.parametrize("change,message", [
    ({"fps": "fast"}, r"field 'fps' must be a positive integer, got 'fast'"),
    ({"features": {"timestamp": {"dtype": "float32", "shape": [1]}}}, r"features \['frame_index'.*are missing"),
    ({"data_path": "data/{chunk}/x.parquet"}, r"path template 'data/\{chunk\}/x.parquet' cannot be formatted"),
    ({"data_path": 5}, r"info.json: field 'data_path' must be a path template string, got 5"),
])
def test_malformed_info(copy_root, change, message):
    edit_info(copy_root, **change)
    with pytest.raises(DatasetFormatError, match=message):
        EpisodeDataset(copy_root)


def test_path_template_escaping_the_root(copy_root):
    edit_info(copy_root, video_path="../../{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
    with pytest.raises(ValueError, match="escapes the dataset root"):
        EpisodeDataset(copy_root)


def test_huggingface_cache_layout_with_files_symlinked_to_blobs(dataset_root, tmp_path):
    """What ``huggingface-cli download`` leaves: ``snapshots/<sha>/`` whose files are relative
    symlinks into ``../../blobs`` (issue 48 item 16: refused as "outside the dataset root"). A
    template that climbs out of the root is still refused, lexically."""
    repo = tmp_path / "datasets--user--name"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    for number, path in enumerate(sorted(p for p in dataset_root.rglob("*") if p.is_file())):
        blob = repo / "blobs" / f"blob{number:04d}"
        shutil.copyfile(path, blob)
        link = snapshot / path.relative_to(dataset_root)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    dataset = EpisodeDataset(snapshot)
    try:
        expected = EpisodeDataset(dataset_root)
        try:
            for index in (0, len(dataset) - 1):
                got, want = dataset[index], expected[index]
                assert all(torch.equal(got[k], want[k]) for k in want if isinstance(want[k], torch.Tensor))
        finally:
            expected.close()
    finally:
        dataset.close()
    edit_info_path = snapshot / "meta" / "info.json"
    info = json.loads(edit_info_path.read_text())
    edit_info_path.unlink()  # the snapshot's link, not the blob
    edit_info_path.write_text(json.dumps({**info, "data_path": "../../blobs/{chunk_index}-{file_index}.parquet"}))
    with pytest.raises(ValueError, match="escapes the dataset root"):
        EpisodeDataset(snapshot)


def _first_video(root):
    return sorted((root / "videos").rglob("*.mp4"))[0]


def test_missing_video_names_file_and_episode(copy_root):
    video = _first_video(copy_root)
    video.unlink()
    with pytest.raises(VideoDecodeError, match=rf"{video.name}.*episode 0 key"):
        list(EpisodeStreamingDataset(copy_root, shuffle=False))


def test_corrupt_video_names_file_and_episode(copy_root):
    video = _first_video(copy_root)
    video.write_bytes(b"\x00not an mp4" * 100)
    with pytest.raises(VideoDecodeError, match=rf"{video.name}.*episode 0 key"):
        EpisodeDataset(copy_root)[0]


def test_missing_data_file(copy_root):
    (copy_root / "data" / "chunk-000" / "file-001.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"data/chunk-000/file-001.parquet is missing"):
        list(EpisodeStreamingDataset(copy_root, shuffle=False, return_uint8=True))


def test_window_not_a_multiple_of_a_frame(dataset_root):
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\] has values \[0.01\] .*1/30"):
        EpisodeStreamingDataset(dataset_root, delta_timestamps={"action": [0.0, 0.01]})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), np.float32("nan")])
def test_window_not_finite(dataset_root, value):
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\] has non-finite values \[(nan|inf|-inf)\]"):
        EpisodeStreamingDataset(dataset_root, delta_timestamps={"action": [0.0, value]})


@pytest.mark.parametrize("deltas,error,message", [
    (0.5, TypeError, r"delta_timestamps must be a dict .*got 0.5"),
    ([0.0, 0.1], TypeError, r"delta_timestamps must be a dict .*got \[0.0, 0.1\]"),
    ({"action": None}, ValueError, r"delta_timestamps\['action'\] must be a non-empty list of seconds, got None"),
    ({"action": 0.1}, ValueError, r"delta_timestamps\['action'\] must be a non-empty list of seconds, got 0.1"),
    ({"action": ["0.1"]}, ValueError, r"delta_timestamps\['action'\] must be a list of numbers .*'0.1' is not one"),
    ({"action": [[0.0]]}, ValueError, r"delta_timestamps\['action'\] must be a list of numbers .*\[0.0\] is not one"),
    ({"action": [True]}, ValueError, r"delta_timestamps\['action'\] must be a list of numbers .*True is not one"),
])
def test_window_of_the_wrong_type(dataset_root, deltas, error, message):
    for dataset in (EpisodeStreamingDataset, EpisodeDataset):
        with pytest.raises(error, match=message):
            dataset(dataset_root, delta_timestamps=deltas)


def test_window_on_unknown_key(dataset_root):
    with pytest.raises(ValueError, match=r"delta_timestamps key 'actions' is not a feature.*'action'"):
        EpisodeDataset(dataset_root, delta_timestamps={"actions": [0.0]})


def _window_warnings(make, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make(*args, **kwargs)
    return [w for w in caught if issubclass(w.category, RuntimeWarning) and "delta_timestamps" in str(w.message)]


@pytest.mark.parametrize("dataset", [EpisodeStreamingDataset, EpisodeDataset])
def test_a_window_written_in_frames_warns_that_offsets_are_seconds(dataset_root, dataset):
    caught = _window_warnings(dataset, dataset_root, delta_timestamps={"action": [0, 1, 2], "observation.state": [0.0]})
    assert len(caught) == 1
    message = str(caught[0].message)
    assert re.search(r"delta_timestamps\['action'\] = \[0, 1, 2\] reads as \[0, 30, 60\] frames at 30 fps\. .*offsets are seconds, not frames.*"
                     r"\[k / 30 for k in \[0, 1, 2\]\]", message), message
    assert caught[0].filename == __file__  # the user's line, not the package's
    # Whole seconds written as floats are taken for frames only where the window overruns every episode.
    caught = _window_warnings(dataset, dataset_root, episodes=[2, 4], delta_timestamps={"action": [0.0, 1.0, 2.0]})
    assert [bool(re.search(r"reads as \[0, 30, 60\] frames", str(w.message))) for w in caught] == [True, False]
    assert "every sample of every episode pads" in str(caught[1].message)


@pytest.mark.parametrize("window", [[-1.0, 0.0], [0, 1], [-0.1, 0.0, 0.1], [k / 30 for k in range(-2, 5)], [0.0],
                                    [-30 / 30, 0.0, 30 / 30 + 1 / 30], [-2.0, -1.0, 0.0]])  # the last, SARM's kind
def test_windows_in_seconds_do_not_warn(dataset_root, window):
    assert _window_warnings(EpisodeStreamingDataset, dataset_root, delta_timestamps={"action": window}) == []


def test_a_window_longer_than_every_selected_episode_warns(dataset_root):
    # Episodes 2 and 4 have 17 and 9 frames: a window of 18 frames or more pads every sample of both.
    for window in ([0.0, 17 / 30], [-16 / 30, 1 / 30], [5 / 30, 17 / 30]):
        caught = _window_warnings(EpisodeDataset, dataset_root, episodes=[2, 4], delta_timestamps={"action": window})
        assert len(caught) == 1, window
        assert re.search(r"delta_timestamps\['action'\] reads frame offsets -?\d+ to \d+ at 30 fps, 18 frames.*longest selected episode has 17 frames.*"
                         r"every sample", str(caught[0].message)), str(caught[0].message)
    for window in ([0.0, 16 / 30], [-16 / 30, 0.0], [-8 / 30, 8 / 30]):  # one sample of episode 2 fits
        assert _window_warnings(EpisodeDataset, dataset_root, episodes=[2, 4], delta_timestamps={"action": window}) == []


def test_unknown_episodes(dataset_root):
    with pytest.raises(ValueError, match=r"episodes \[99\] are not in"):
        EpisodeStreamingDataset(dataset_root, episodes=[0, 99])


@pytest.mark.parametrize("episodes,bad", [
    ([True], "True"), ([0, 1.0], "1.0"), (["1"], "'1'"), (np.array([True, False]), "True"), (np.array([1.0]), "1.0"),
])
def test_episodes_must_be_ints(dataset_root, episodes, bad):
    # Python takes True for 1 and 1.0 == 1: unchecked, both quietly select episode 1.
    for dataset in (EpisodeStreamingDataset, EpisodeDataset):
        with pytest.raises(TypeError, match=rf"episodes must be a list of int episode indices, got {bad} "):
            dataset(dataset_root, episodes=episodes)


@pytest.mark.parametrize("episodes", [[np.int64(3), np.int32(1)], np.array([3, 1]), (1, 3)])
def test_episodes_may_be_numpy_ints(dataset_root, episodes):
    dataset = EpisodeDataset(dataset_root, episodes=episodes)
    assert dataset.episode_indices == [1, 3] and dataset.num_episodes == 2
    selected = [dataset.typed_meta.episodes[e] for e in dataset.episode_indices]
    assert all(type(ep.episode_index) is int for ep in selected)


def test_revision_with_local_folder(dataset_root):
    with pytest.raises(ValueError, match="revision='main' applies to Hub datasets"):
        EpisodeDataset(dataset_root, revision="main")


def test_a_missing_folder_is_not_mistaken_for_a_remote(tmp_path):
    # An absolute path that does not exist is no Hub repo id: the error says what was looked for,
    # without any network request.
    with pytest.raises(FileNotFoundError, match="neither an existing local folder"):
        EpisodeDataset(str(tmp_path / "nope"))


@pytest.mark.parametrize("dataset,typo,suggestion", [
    (EpisodeStreamingDataset, "cache_limt", "cache_limit"),
    (EpisodeStreamingDataset, "episode_pool", "episode_pool_size"),  # the class's own keyword
    (EpisodeDataset, "delta_timestamp", "delta_timestamps"),
    (EpisodeDataset, "column_caching", "column_cache"),
])
def test_an_unknown_keyword_names_the_class_a_close_match_and_the_valid_ones(dataset, typo, suggestion):
    # A file:// URL to nothing fails when the source is opened: the keyword is refused before that.
    with pytest.raises(TypeError) as caught:
        dataset("file:///no/such/dataset", **{typo: 1})
    message = str(caught.value)
    assert message.startswith(f"{dataset.__name__}() got an unexpected keyword argument {typo!r} "
                              f"(did you mean {suggestion!r}?). Valid keywords: source, "), message
    for valid in SourceOptions.__annotations__:
        assert valid in message, valid


def test_the_other_datasets_keywords_and_unlike_words_are_refused_too(dataset_root):
    with pytest.raises(TypeError, match=r"^EpisodeDataset\(\) got an unexpected keyword arguments "
                                        r"'episode_pool_size'.*, 'colour' *\. Valid keywords: source, column_cache \(its own\)"):
        EpisodeDataset(dataset_root, episode_pool_size=4, colour="red")
    with pytest.raises(TypeError, match=r"'column_cache'\. Valid keywords: source, episode_pool_size, shuffle"):
        EpisodeStreamingDataset(dataset_root, column_cache=False)


def test_source_options_are_documented_once_and_named_by_both_datasets():
    """help(SourceOptions) documents each key; help() on either dataset lists every key's name."""
    for key in SourceOptions.__annotations__:
        assert re.search(rf"^ +{key} \(", SourceOptions.__doc__, flags=re.M), key
        for dataset in (EpisodeStreamingDataset, EpisodeDataset):
            assert key in dataset.__doc__, (dataset.__name__, key)
    # The keys' documentation moved: the streaming dataset's docstring no longer repeats it.
    assert "resolved once to a commit" not in EpisodeStreamingDataset.__doc__


def test_source_options_document_the_defaults_the_code_uses():
    """Each key's documented default, ``key (default): ...`` (text after a colon in the parentheses
    is a gloss), is the default both datasets' signatures take from the one table."""
    import ast
    import inspect

    for dataset in (EpisodeStreamingDataset, EpisodeDataset):
        defaults = {name: parameter.default for name, parameter in inspect.signature(dataset).parameters.items()}
        for key in SourceOptions.__annotations__:
            documented = re.search(rf"^ +{key} \(([^)]*)\)", SourceOptions.__doc__, flags=re.M).group(1)
            assert ast.literal_eval(documented.split(":")[0]) == defaults[key], (key, documented, defaults[key])


def test_the_settings_table_of_the_usage_guide_states_the_signatures_defaults():
    """docs/usage.md's "Settings" table gives each argument's default (``all``, ``none`` and ``-``:
    None); each is the default of the datasets' signatures, so the table cannot drift from the code."""
    import ast
    import inspect
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "usage.md").read_text()
    table = text[text.index("| argument | default | purpose |"):].split("\n\n")[0]
    signatures = [inspect.signature(d).parameters for d in (EpisodeStreamingDataset, EpisodeDataset)]
    words = {"all": None, "none": None, "-": None}
    checked = []
    for row in table.splitlines()[2:]:
        names_cell, defaults_cell = row.split("|")[1:3]
        names = [n for n in re.findall(r"`(\w+)`", names_cell) if any(n in s for s in signatures)]
        stated = [d.strip().strip("`") for d in defaults_cell.split(",")]
        assert len(names) == len(stated), row
        for name, default in zip(names, stated):
            value = words[default] if default in words else ast.literal_eval(default)
            for parameters in signatures:
                if name in parameters:
                    assert parameters[name].default == value, (name, default, parameters[name].default)
            checked.append(name)
    assert {"episodes", "tolerance_s", "episode_pool_size", "column_cache"} <= set(checked), checked


@pytest.mark.parametrize("dataset", [EpisodeStreamingDataset, EpisodeDataset])
def test_both_datasets_spell_out_every_source_option_as_the_core_takes_it(dataset):
    """help() and IDEs show every keyword: each SourceOptions key is a keyword-only parameter of the
    dataset with the other dataset's default and SourceOptions' type, and nothing hides behind **kwargs."""
    import inspect

    def text(annotation) -> str:  # postponed annotations: strings, or ForwardRefs in the TypedDict
        return getattr(annotation, "__forward_arg__", annotation)

    shown = inspect.signature(dataset).parameters
    other = inspect.signature(EpisodeDataset if dataset is EpisodeStreamingDataset else EpisodeStreamingDataset).parameters
    assert not [p for p in shown.values() if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    for key, annotation in SourceOptions.__annotations__.items():
        assert shown[key].kind is inspect.Parameter.KEYWORD_ONLY, key
        assert shown[key].default == other[key].default, (key, shown[key].default, other[key].default)
        assert text(shown[key].annotation) == text(annotation) == text(other[key].annotation), key


@pytest.mark.parametrize("value,error", [("0.1", TypeError), (True, TypeError), (None, TypeError),
                                         (0, ValueError), (-1e-4, ValueError), (float("nan"), ValueError)])
def test_a_number_option_of_the_wrong_type_is_a_type_error_and_out_of_range_a_value_error(dataset_root, value, error):
    with pytest.raises(error, match=r"tolerance_s must be a positive number, got"):
        EpisodeDataset(dataset_root, tolerance_s=value)


@pytest.mark.parametrize("value", ["no", 0, 1, None])
def test_boolean_options_take_only_true_or_false(dataset_root, value):
    # bool("no") is True: a string or a number would silently pick a setting.
    with pytest.raises(TypeError, match=r"shuffle must be True or False"):
        EpisodeStreamingDataset(dataset_root, shuffle=value)
    with pytest.raises(TypeError, match=r"return_uint8 must be True or False"):
        EpisodeDataset(dataset_root, return_uint8=value)


def test_episode_loader_names_the_closest_keyword(dataset_root):
    dataset = EpisodeStreamingDataset(dataset_root)
    with pytest.raises(TypeError, match=r"^EpisodeLoader\(\) got an unexpected keyword argument 'num_worker' "
                                        r"\(did you mean 'num_threads'\?\)\. Valid keywords: dataset, batch_size, "
                                        r"num_threads, drop_last"):
        EpisodeLoader(dataset, 4, num_worker=2)
