"""``episodestream.ray.read_episodes``: Ray read tasks stream the epoch with our machinery; every frame
once, the datasets' values, an order fixed by (seed, epoch, num_tasks)."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray", reason="Ray is not installed: pip install 'episodestream[ray]' (in the test extra)")

from episodestream import EpisodeDataset, EpisodeLoader, EpisodeMixture, EpisodeStreamingDataset  # noqa: E402
from episodestream.ray import collate_fn, read_episodes, read_mixture  # noqa: E402

from .conftest import EPISODE_LENGTHS  # noqa: E402

WINDOWS = {"action": [-0.1, 0.0, 0.1], "observation.images.front": [-0.1, 0.0]}


@pytest.fixture
def ordered(ray_cluster):
    """Blocks in task order, so that a dataset's whole order can be compared across runs."""
    context = ray_cluster.data.DataContext.get_current()
    before = context.execution_options.preserve_order
    context.execution_options.preserve_order = True
    yield
    context.execution_options.preserve_order = before


def pairs(dataset) -> list[tuple[int, int]]:
    rows = dataset.select_columns(["episode_index", "frame_index"]).take_all()
    return [(int(row["episode_index"]), int(row["frame_index"])) for row in rows]


@pytest.mark.slow
def test_every_frame_once_with_the_map_style_datasets_values(dataset_root, ray_cluster):
    reference = EpisodeDataset(dataset_root, delta_timestamps=WINDOWS)
    starts = [sum(EPISODE_LENGTHS[:e]) for e in range(len(EPISODE_LENGTHS))]
    where = {(e, f): starts[e] + f for e, length in enumerate(EPISODE_LENGTHS) for f in range(length)}
    dataset = read_episodes(dataset_root, num_tasks=3, rows_per_block=16, delta_timestamps=WINDOWS, seed=5)
    seen = []
    for batch in dataset.iter_torch_batches(batch_size=32, collate_fn=collate_fn()):
        for j in range(len(batch["index"])):
            key = (int(batch["episode_index"][j]), int(batch["frame_index"][j]))
            seen.append(key)
            expected = reference[where[key]]
            assert list(batch) == list(expected)  # the same keys, in the same order
            for name, value in expected.items():
                got = batch[name][j]
                if isinstance(value, torch.Tensor):
                    assert got.dtype == value.dtype and torch.equal(got, value), (key, name)
                else:
                    assert got == value, (key, name)
    assert sorted(seen) == sorted(where)  # every frame of the epoch, each once


def test_order_follows_seed_epoch_and_tasks(camera_less_root, ordered):
    first = pairs(read_episodes(camera_less_root, num_tasks=3, seed=7, epoch=1, rows_per_block=5))
    assert pairs(read_episodes(camera_less_root, num_tasks=3, seed=7, epoch=1, rows_per_block=8)) == first
    assert pairs(read_episodes(camera_less_root, num_tasks=3, seed=8, epoch=1)) != first
    assert pairs(read_episodes(camera_less_root, num_tasks=3, seed=7, epoch=2)) != first
    # Task t streams what EpisodeStreamingDataset(rank=t, world_size=3) streams, without the fill-in
    # a short rank adds at its end; in task order (preserve_order) the tasks' rows follow each other.
    frames = len(EpisodeStreamingDataset(camera_less_root))
    expected = []
    for rank in range(3):
        share = EpisodeStreamingDataset(camera_less_root, rank=rank, world_size=3, seed=7)
        share.set_epoch(1)
        rows = (rank + 1) * frames // 3 - rank * frames // 3
        expected += [(int(s["episode_index"]), int(s["frame_index"])) for s in share][:rows]
    assert first == expected
    assert len(set(first)) == len(first) == frames


def test_curation_and_weights_every_anchor_once(camera_less_root, ray_cluster):
    options = {"episodes": [0, 2, 3, 6, 9, 12, 19], "episode_weights": {2: 3, 6: 0.5, 12: 0},
               "keep_frames": {0: [[1, 5]], 19: [[0, 7]]}, "seed": 3}
    single = EpisodeStreamingDataset(camera_less_root, rank=0, world_size=1, **options)
    expected = collections.Counter((int(s["episode_index"]), int(s["frame_index"])) for s in single)
    for tasks in (1, 4):
        got = collections.Counter(pairs(read_episodes(camera_less_root, num_tasks=tasks, **options)))
        assert got == expected, tasks


def test_more_tasks_than_frames(camera_less_root, ray_cluster):
    got = pairs(read_episodes(camera_less_root, num_tasks=5, episodes=[1, 5]))  # two one-frame episodes
    assert sorted(got) == [(1, 0), (5, 0)]


def test_blocks_reach_the_consumer_as_the_tasks_yield_them(dataset_root, ray_cluster):
    """Ray merges a read task's blocks up to the DataContext's target_max_block_size (128 MiB by default)
    unless the dataset's own context sets it below one block: then each block a consumer gets holds
    rows_per_block rows (each task's last the rest), and the process's context is left as it was."""
    context = ray_cluster.data.DataContext.get_current()
    before = context.target_max_block_size
    dataset = read_episodes(dataset_root, num_tasks=2, rows_per_block=8, seed=3)
    sizes = [len(block["index"]) for block in dataset.iter_batches(batch_size=None, batch_format="numpy")]
    shares = (sum(EPISODE_LENGTHS) // 2, sum(EPISODE_LENGTHS) - sum(EPISODE_LENGTHS) // 2)
    assert sorted(sizes) == sorted(size for rows in shares for size in [8] * (rows // 8) + [rows % 8] if size)
    assert dataset.context.target_max_block_size < before == context.target_max_block_size

    context.target_max_block_size = 1024  # a user's smaller target is kept
    try:
        assert read_episodes(dataset_root, num_tasks=2, rows_per_block=8).context.target_max_block_size == 1024
    finally:
        context.target_max_block_size = before


def test_a_mixture_streams_what_its_ranks_would(dataset_root, many_episodes_root, ordered):
    """read_mixture: task t yields rank t's mixture, the same samples in the same order, values and all."""
    components = [{"source": dataset_root, "episodes": [0, 2, 4], "seed": 1},
                  {"source": many_episodes_root, "episodes": [1, 3, 5, 7], "seed": 2}]
    options = {"weights": [0.6, 0.4], "keys": "intersection", "seed": 3}
    dataset = read_mixture(components, num_tasks=2, rows_per_block=8, **options)
    got = list(dataset.iter_torch_batches(batch_size=1000, collate_fn=collate_fn()))
    assert len(got) == 1
    got = got[0]
    expected = []
    for rank in range(2):
        mixture = EpisodeMixture([EpisodeStreamingDataset(rank=rank, world_size=2, **c) for c in components], **options)
        expected += list(EpisodeLoader(mixture, batch_size=1000))
    assert list(got) == list(expected[0])
    for key, value in got.items():
        want = [v for batch in expected for v in (batch[key] if isinstance(batch[key], list) else batch[key])]
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, torch.stack(want)), key
        else:
            assert value == want, key


def test_read_mixture_refuses_what_is_not_a_list_of_sources(camera_less_root):
    with pytest.raises(TypeError, match="source"):
        read_mixture([{"episodes": [0]}])
    with pytest.raises(TypeError, match="rank"):
        read_mixture([{"source": camera_less_root, "rank": 0}])


def test_collate_keeps_uint8_on_request(dataset_root, ray_cluster):
    dataset = read_episodes(dataset_root, num_tasks=2, episodes=[2])
    batch = next(iter(dataset.iter_torch_batches(batch_size=4, collate_fn=collate_fn(return_uint8=True))))
    front = batch["observation.images.front"]
    assert front.dtype == torch.uint8 and front.shape[1:] == (3, 64, 96)
    assert batch["observation.images.top"].dtype == torch.float32  # a parquet image stays as the dataset gives it
    numpy_batch = next(iter(dataset.iter_batches(batch_size=4, batch_format="numpy")))
    assert torch.equal(collate_fn()(numpy_batch)["observation.images.front"], front.float() / 255)


@pytest.mark.parametrize("keyword", ["rank", "world_size", "return_uint8", "decode_threads"])
def test_keywords_a_task_sets_itself_are_refused(camera_less_root, keyword):
    with pytest.raises(TypeError, match=keyword):
        read_episodes(camera_less_root, **{keyword: 1})


def test_an_unknown_keyword_is_refused_before_ray_runs(camera_less_root):
    with pytest.raises(TypeError, match="episode_pool"):
        read_episodes(camera_less_root, episode_pool=4)


def test_importing_the_package_imports_no_ray():
    code = "import sys, episodestream, episodestream.ray; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_the_usage_pages_ray_example_runs(dataset_root, ray_cluster):
    """docs/usage.md's Ray example (fenced ``python ray``: test_cli runs the page's plain python blocks
    where Ray may be absent) runs as pasted."""
    page = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
    blocks = re.findall(r"```python ray\n(.*?)```", page.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block.replace("path/to/lerobot_dataset", str(dataset_root)), "docs/usage.md", "exec"), {})


def test_the_public_functions_document_their_arguments():
    import inspect

    from .test_docstrings import check_args, check_raises

    for function in (read_episodes, read_mixture, collate_fn):
        signature = inspect.signature(function)
        variadic = {p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD}
        check_args(function.__name__, function.__doc__, signature, variadic)
        check_raises(function.__name__, function.__doc__)
