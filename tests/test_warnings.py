"""Every warning meant for the user is blamed on the user's line (``_base/warn.warn_user``): the
first frame outside the package, however many of its frames lie between, and whichever public
path reaches the warning; a warning raised on one of the package's own threads, with no user's
line, is blamed on the package's line that raised it."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable

import pytest
import torch

import episodestream
from episodestream import EpisodeDataset, EpisodeLoader, EpisodeStreamingDataset, split_episodes


def _through_a_helper(call: Callable[[], object]) -> object:
    """A user's own wrapper around the public API: its line, in this file, is still the user's."""
    return call()


class _UserDataset(EpisodeStreamingDataset):
    """A user's subclass: one more constructor frame between the user's line and the package's."""

    def __init__(self, source, **kwargs):
        super().__init__(source, **kwargs)


def _a_file(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    return blocked


def _mismatched_state(root) -> Callable[[], object]:
    state = EpisodeStreamingDataset(root, seed=3).state_dict()
    other = EpisodeStreamingDataset(root, seed=4)
    return lambda: other.load_state_dict(state, strict=False)


def _mismatched_loader_state(root) -> Callable[[], object]:
    state = EpisodeLoader(EpisodeStreamingDataset(root, seed=3), batch_size=2, num_threads=1).state_dict()
    other = EpisodeLoader(EpisodeStreamingDataset(root, seed=4), batch_size=2, num_threads=1)
    return lambda: other.load_state_dict(state, strict=False)


def _uneven_split(root) -> Callable[[], object]:
    frames = EpisodeStreamingDataset(root, episodes=[0]).num_frames
    dataset = EpisodeStreamingDataset(root, episodes=[0], world_size=frames + 1, rank=0)
    return lambda: list(dataset)


def _unwritable_column_cache(root, tmp_path) -> Callable[[], object]:
    dataset = EpisodeDataset(root, cache_dir=_a_file(tmp_path))
    return lambda: dataset[0]


def _unwritable_stats_cache(root, tmp_path) -> Callable[[], object]:
    dataset = EpisodeDataset(root, cache_dir=_a_file(tmp_path))
    return lambda: dataset.compute_stats()


# (name, the warning's category and message, what sets it up: given the dataset root and tmp_path, the call
# that warns). The calls reach the warning through call chains of different depths.
CASES: list[tuple[str, type[Warning], str, Callable[..., Callable[[], object]]]] = [
    ("strict_false_state", RuntimeWarning, "Loading anyway", lambda root, tmp: _mismatched_state(root)),
    ("strict_false_loader_state", RuntimeWarning, "Loading anyway", lambda root, tmp: _mismatched_loader_state(root)),
    ("buffer_size", DeprecationWarning, "episode_pool_size replaces it",
     lambda root, tmp: lambda: EpisodeStreamingDataset(root, buffer_size=1000)),
    ("buffer_size_subclass", DeprecationWarning, "episode_pool_size replaces it",
     lambda root, tmp: lambda: _UserDataset(root, buffer_size=1000)),
    ("remote_options_on_a_local_folder", UserWarning, "only apply to remote sources",
     lambda root, tmp: lambda: EpisodeStreamingDataset(root, cache_limit="1GB")),
    ("remote_options_on_a_local_folder_map_style", UserWarning, "only apply to remote sources",
     lambda root, tmp: lambda: EpisodeDataset(root, token="hf_x")),
    ("remote_options_on_a_local_split", UserWarning, "only apply to remote sources",
     lambda root, tmp: lambda: split_episodes(root, eval_fraction=0.25, token="hf_x")),
    ("uneven_split", RuntimeWarning, "frames for", lambda root, tmp: _uneven_split(root)),
    ("unwritable_column_cache", RuntimeWarning, "cannot write the column cache",
     lambda root, tmp: _unwritable_column_cache(root, tmp)),
    ("unwritable_stats_cache", RuntimeWarning, "cannot write the stats cache",
     lambda root, tmp: _unwritable_stats_cache(root, tmp)),
    ("window_in_frames", RuntimeWarning, "offsets are seconds, not frames",
     lambda root, tmp: lambda: EpisodeStreamingDataset(root, delta_timestamps={"action": [0, 1, 2]})),
    ("window_in_frames_map_style", RuntimeWarning, "offsets are seconds, not frames",
     lambda root, tmp: lambda: EpisodeDataset(root, delta_timestamps={"action": [0, 1, 2]})),
    ("moved_top_level_name", DeprecationWarning, "moved to episodestream.tools.tracing",
     lambda root, tmp: lambda: episodestream.load_trace),
]


def _caught(call: Callable[[], object], category: type[Warning], match: str) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    found = [w for w in caught if issubclass(w.category, category) and match in str(w.message)]
    assert found, [str(w.message) for w in caught]
    return found


@pytest.mark.parametrize("through_a_helper", [False, True], ids=["direct", "through_a_helper"])
@pytest.mark.parametrize("name,category,match,setup", CASES, ids=[case[0] for case in CASES])
def test_a_warning_blames_the_users_line(camera_less_root, tmp_path, name, category, match, setup, through_a_helper):
    call = setup(camera_less_root, tmp_path)
    found = _caught((lambda: _through_a_helper(call)) if through_a_helper else call, category, match)
    assert [(w.filename, w.category) for w in found] == [(__file__, category)] * len(found), name


@pytest.mark.skipif(torch.cuda.is_available(), reason="warns only where CUDA is not available")
def test_pin_memory_without_cuda_blames_the_users_line(camera_less_root):
    dataset = EpisodeStreamingDataset(camera_less_root)
    found = _caught(lambda: _through_a_helper(lambda: EpisodeLoader(dataset, batch_size=2, pin_memory=True)), RuntimeWarning,
                    "CUDA is not available")
    assert [w.filename for w in found] == [__file__]


def _package_function() -> Callable[[], None]:
    """A function whose frame is the package's (compiled under its folder), calling ``warn_user``."""
    from episodestream._base.warn import warn_user

    filename = os.path.join(os.path.dirname(episodestream.__file__), "_pretend_module.py")
    namespace = {"warn_user": warn_user}
    exec(compile("def raise_it():\n    warn_user('from the package', UserWarning)\n", filename, "exec"), namespace)
    return namespace["raise_it"]


def test_a_warning_on_a_package_thread_blames_the_package_line():
    raise_it = _package_function()
    called_here = _caught(raise_it, UserWarning, "from the package")
    assert [(w.filename, w.lineno) for w in called_here] == [(__file__, called_here[0].lineno)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread = threading.Thread(target=raise_it)  # the package's thread: no user's line on its stack
        thread.start()
        thread.join()
    assert [(w.filename, w.lineno) for w in caught] == [(raise_it.__code__.co_filename, 2)]
