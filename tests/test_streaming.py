"""The streaming semantics: split, coverage, equal counts, determinism, epochs, pool, decoder cache."""

from __future__ import annotations

import collections
import functools
import multiprocessing
import warnings

import pytest
import torch.utils.data

from episodestream import EpisodeDataset, EpisodeStreamingDataset, SourceStats

from .conftest import EPISODE_LENGTHS
from .stream_model import expected_samples, pair


def stream_indices(root, *, rank=0, world_size=1, num_workers=0, epoch=None, **kwargs) -> list[int]:
    dataset = EpisodeStreamingDataset(root, rank=rank, world_size=world_size, return_uint8=True, **kwargs)
    if epoch is not None:
        dataset.set_epoch(epoch)
    # The index is taken in the worker: two ints cross the process boundary, not the sample's tensors.
    return list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=_index))


def _index(sample) -> int:
    return int(sample["index"])


def scheduled(root, *, num_workers, epoch, **kwargs) -> list[tuple[int, int]]:
    """The (episode, frame) pairs a DataLoader yields in ``epoch``, from the schedule alone (the
    model is checked against real DataLoaders in test_stream_properties): a reference that costs
    no worker processes and no decoding."""
    return expected_samples(EpisodeStreamingDataset(root, **kwargs), num_workers=num_workers, epoch=epoch)


def test_every_frame_once_and_equal_counts(many_episodes_root):
    """Decoded, 2 ranks of 2 workers; test_stream_properties checks this on the schedule for
    hundreds of layouts and episode selections."""
    world_size, num_workers = 2, 2
    dataset = EpisodeStreamingDataset(many_episodes_root, world_size=world_size, rank=0)
    total = dataset.num_frames
    per_rank = [stream_indices(many_episodes_root, rank=r, world_size=world_size, num_workers=num_workers,
                               episode_pool_size=3, seed=7) for r in range(world_size)]
    assert [len(indices) for indices in per_rank] == [len(dataset)] * world_size
    assert len(dataset) == -(-total // world_size)
    counts = collections.Counter(i for indices in per_rank for i in indices)
    assert set(counts) == set(range(total))
    # Only fill-ins repeat: as many extra samples as ranks times len() exceeds the frames.
    assert sum(c - 1 for c in counts.values()) == world_size * len(dataset) - total
    # Each repeat stays on its rank (a rank repeats its own frames).
    for r, indices in enumerate(per_rank):
        others = set().union(*(set(x) for k, x in enumerate(per_rank) if k != r))
        repeated = [i for i, c in collections.Counter(indices).items() if c > 1]
        assert not set(repeated) & others


def test_same_seed_same_stream_other_seed_or_epoch_another(many_episodes_root):
    dataset = EpisodeStreamingDataset(many_episodes_root, seed=11, return_uint8=True)
    first = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, collate_fn=pair))
    # The decoded stream is the one (seed, epoch) schedule: nothing else orders it.
    assert first == scheduled(many_episodes_root, num_workers=2, epoch=0, seed=11)
    assert first != scheduled(many_episodes_root, num_workers=2, epoch=0, seed=12)
    epoch1 = scheduled(many_episodes_root, num_workers=2, epoch=1, seed=11)
    assert epoch1 != first and sorted(epoch1) == sorted(first)


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_epoch_advances_by_itself(many_episodes_root, num_workers, persistent):
    dataset = EpisodeStreamingDataset(many_episodes_root, seed=4, return_uint8=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers,
                                         persistent_workers=persistent, collate_fn=pair)
    epochs = [list(loader) for _ in range(3)]
    assert dataset.epoch == 3
    for epoch, streamed in enumerate(epochs):
        assert streamed == scheduled(many_episodes_root, num_workers=num_workers, epoch=epoch, seed=4)
    assert epochs[0] != epochs[1] != epochs[2]


def test_set_epoch_reaches_persistent_workers(many_episodes_root):
    dataset = EpisodeStreamingDataset(many_episodes_root, seed=4, return_uint8=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True,
                                         collate_fn=pair)
    list(loader)
    dataset.set_epoch(7)
    assert list(loader) == scheduled(many_episodes_root, num_workers=2, epoch=7, seed=4)


def test_shuffle_false_is_in_order(dataset_root):
    indices = stream_indices(dataset_root, shuffle=False)
    assert indices == list(range(sum(EPISODE_LENGTHS)))


def test_pool_mixes_episodes_uniformly(many_episodes_root):
    """With a pool, consecutive samples come from several episodes; with a pool of 1, from one."""
    def switches(pool):
        dataset = EpisodeStreamingDataset(many_episodes_root, episode_pool_size=pool, seed=1, return_uint8=True)
        episodes = [int(s["episode_index"]) for s in dataset]
        return sum(a != b for a, b in zip(episodes, episodes[1:]))
    assert switches(1) == 19  # 20 episodes, one after the other
    assert switches(8) > 60


def test_uneven_split_warns_once_and_still_yields_equal_counts(many_episodes_root):
    frames = EpisodeStreamingDataset(many_episodes_root, episodes=[0]).num_frames
    world_size = frames + 1  # one rank more than frames: the last rank owns nothing

    def make(rank):
        return EpisodeStreamingDataset(many_episodes_root, episodes=[0], world_size=world_size, rank=rank,
                                       return_uint8=True)
    with pytest.warns(RuntimeWarning, match=rf"{frames} frames for {world_size} consumers"):
        first = list(make(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only consumer 0 (rank 0, worker 0) warns
        last = list(make(frames))
    assert len(first) == len(last) == 1
    assert int(last[0]["episode_index"]) == 0  # a fill-in repeating a frame of the epoch


def test_decoder_cache_is_sized_to_the_pool_and_reports(dataset_root):
    dataset = EpisodeStreamingDataset(dataset_root, episode_pool_size=2, seed=0, decode_group_size=1)
    assert dataset.decoder_stats() is None
    count = sum(1 for _ in dataset)
    stats = dataset.decoder_stats()
    assert stats["capacity"] == 2 * len(dataset.typed_meta.video_keys)
    # One lookup per camera per sample, but for the frames kept for their turn: every pair of frames
    # 2q, 2q+1 of an episode that one GOP holds (read from the files' sample tables here; the
    # fixture's episodes start on a keyframe only where they start at an even frame of their file)
    # serves one of its two frames from its mate's decode.
    assert stats["hits"] + stats["misses"] + stats["pair_frames_served"] == 2 * count
    assert stats["pair_frames_served"] == stats["pair_frames_kept"] == _one_gop_pairs(dataset_root) > 0
    assert stats["misses"] >= 5 and stats["hits"] > stats["misses"]


def _one_gop_pairs(root) -> int:
    """Pairs of frames (2q, 2q+1) of an episode shown in one GOP of its camera's file, over cameras."""
    import numpy as np

    from episodestream._format.files import LocalFiles
    from episodestream._format.metadata import load_metadata
    from episodestream._format.mp4 import read_local_track

    meta, count = load_metadata(LocalFiles(root)), 0
    for index in meta.episodes:
        episode = meta.episodes[index]
        for video in episode.videos.values():
            track = read_local_track(str(root / video.relpath))
            gop = np.cumsum(track.is_sync)
            first = int(np.searchsorted(track.pts_s, video.from_timestamp_s + 1e-4, side="right")) - 1
            pairs = np.arange(0, episode.length - 1, 2) + first
            count += int(np.sum(gop[pairs] == gop[pairs + 1]))
    return count


@pytest.mark.parametrize("episodes", [None, [4, 1]])
def test_num_frames_and_num_episodes_count_the_selection(dataset_root, episodes):
    chosen = range(len(EPISODE_LENGTHS)) if episodes is None else episodes
    frames = sum(EPISODE_LENGTHS[e] for e in chosen)  # the lengths the fixture wrote
    streaming = EpisodeStreamingDataset(dataset_root, episodes=episodes, rank=1, world_size=2)
    mapped = EpisodeDataset(dataset_root, episodes=episodes)
    for dataset in (streaming, mapped):
        assert (dataset.num_frames, dataset.num_episodes) == (frames, len(chosen))
        assert dataset.episode_indices == sorted(chosen)
    assert len(mapped) == frames and len(streaming) == -(-frames // 2)  # per rank


def test_a_local_folder_is_read_in_place_and_costs_no_fetches(dataset_root):
    streaming = EpisodeStreamingDataset(dataset_root, episodes=[0, 2], return_uint8=True)
    mapped = EpisodeDataset(dataset_root, episodes=[0, 2], return_uint8=True)
    assert len(list(streaming)) == len(streaming)
    assert [int(mapped[i]["index"]) for i in (0, len(mapped) - 1)] == [0, sum(EPISODE_LENGTHS[:3]) - 1]  # episode 0's first frame, 2's last
    for dataset in (streaming, mapped):
        assert dataset.source_stats() == SourceStats(0, 0, 0, 0, 0)
        assert dataset.node_cache_dir is None and dataset.resolved_source == str(dataset_root.resolve())


def test_buffer_size_is_deprecated(dataset_root):
    with pytest.warns(DeprecationWarning, match="episode_pool_size replaces it"):
        EpisodeStreamingDataset(dataset_root, buffer_size=1000)


def test_indexing_a_streaming_dataset_points_to_the_map_style_twin(dataset_root):
    dataset = EpisodeStreamingDataset(dataset_root)
    with pytest.raises(TypeError, match=r"EpisodeStreamingDataset streams and cannot be indexed \(dataset\[0\]\).*"
                                        r"EpisodeDataset\(source, \.\.\.\)\[i\]"):
        dataset[0]


def test_rank_defaults_and_validation(dataset_root):
    dataset = EpisodeStreamingDataset(dataset_root)
    assert (dataset.rank, dataset.world_size) == (0, 1)
    with pytest.raises(ValueError, match="rank must be <= 1"):
        EpisodeStreamingDataset(dataset_root, rank=2, world_size=2)
    with pytest.raises(ValueError, match="both rank and world_size"):
        EpisodeStreamingDataset(dataset_root, rank=0)
    with pytest.raises(ValueError, match="episode_pool_size must be >= 1, got 0"):
        EpisodeStreamingDataset(dataset_root, episode_pool_size=0)
    with pytest.raises(ValueError, match=r"Invalid video_backend \('ffmpeg'\). Supported values are 'torchcodec', 'pyav'"):
        EpisodeStreamingDataset(dataset_root, video_backend="ffmpeg")


def test_pipeline_is_traced_across_workers(many_episodes_root, tmp_path):
    from episodestream.tools.tracing import disable_tracer, enable_tracer, load_trace

    path = tmp_path / "trace.json"
    enable_tracer(path, level="basic")
    try:
        dataset = EpisodeStreamingDataset(many_episodes_root, episodes=[0, 1, 2, 3], return_uint8=True)
        samples = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2))
    finally:
        disable_tracer()
    events = load_trace(path)
    by_name = collections.defaultdict(set)
    for event in events:
        by_name[event["name"]].add(event["pid"])
    assert len(by_name["admit"]) == 2 and len(by_name["decode"]) == 2  # both workers traced
    admits = [e for e in events if e["name"] == "admit"]
    # An episode cut between the two workers is admitted by both.
    assert {e["args"]["episode"] for e in admits} == {0, 1, 2, 3} and 4 <= len(admits) <= 5
    assert sum(e["args"]["frames"] for e in events if e["name"] == "decode") == len(samples)
    assert not any(e["name"] == "plan" for e in events), "detailed spans are off at level basic"


def test_decode_device_is_validated(dataset_root):
    with pytest.raises(ValueError, match=r"Invalid decode_device \('gpu'\). Supported values are 'cpu', 'cuda'"):
        EpisodeStreamingDataset(dataset_root, decode_device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            EpisodeStreamingDataset(dataset_root, decode_device="cuda")


@pytest.mark.needs_cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with CUDA builds of torch and "
                    "torchcodec; this machine has none")
def test_cuda_decoding_gives_the_cpu_frames(dataset_root):
    from episodestream.tools.synthetic import decode_frame_ids

    gpu = EpisodeStreamingDataset(dataset_root, decode_device="cuda", seed=0, return_uint8=True)
    for sample in gpu:
        camera = gpu.typed_meta.video_keys[0]
        assert sample[camera].device.type == "cuda"
        assert decode_frame_ids(sample[camera].cpu())[:2] == (int(sample["episode_index"]), int(sample["frame_index"]))


def _second_worker_waits(go, worker_id):
    if worker_id == 1:
        assert go.wait(timeout=120), "the test never let the second worker start"


def test_a_late_worker_streams_the_same_epoch(many_episodes_root):
    """Regression: a worker starting after its sibling finished its share (one batch, within the
    loader's prefetch) and advanced the shared counter must still stream that epoch."""
    dataset = EpisodeStreamingDataset(many_episodes_root, episodes=[0, 1], seed=2, return_uint8=True)
    go = multiprocessing.get_context("fork").Event()
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=2, multiprocessing_context="fork",
                                         worker_init_fn=functools.partial(_second_worker_waits, go))

    def one_epoch():
        go.clear()
        streamed = []
        for batch in loader:
            streamed += [(int(e), int(f)) for e, f in zip(batch["episode_index"], batch["frame_index"])]
            # Worker 0's whole share fits one batch: it has run to its end (and advanced the shared
            # epoch) when that batch arrives. Only now does worker 1 start.
            go.set()
        return streamed

    first = one_epoch()
    assert sorted(first) == sorted(scheduled(many_episodes_root, num_workers=0, epoch=0, episodes=[0, 1], seed=2))
    assert len(first) == len(set(first)) == len(dataset)
    second = one_epoch()
    assert sorted(second) == sorted(first) and second != first  # epoch 1: the same frames, reshuffled


def test_a_dataloader_built_each_epoch_with_a_fixed_generator_still_advances(many_episodes_root):
    """Regression: the DataLoader's base seed repeats when it is rebuilt each epoch with a seeded
    generator; the epoch must advance (and set_epoch be obeyed) all the same."""
    dataset = EpisodeStreamingDataset(many_episodes_root, seed=4, return_uint8=True)

    def one_epoch():
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                             generator=torch.Generator().manual_seed(0), collate_fn=pair)
        return list(loader)

    epochs = [one_epoch() for _ in range(3)]
    assert dataset.epoch == 3
    for epoch, streamed in enumerate(epochs):
        assert streamed == scheduled(many_episodes_root, num_workers=2, epoch=epoch, seed=4)
    dataset.set_epoch(7)
    assert one_epoch() == scheduled(many_episodes_root, num_workers=2, epoch=7, seed=4)


def test_worker_counts_change_between_iterations(many_episodes_root):
    dataset = EpisodeStreamingDataset(many_episodes_root, seed=4, return_uint8=True)
    for epoch, workers in enumerate((2, 3, 0, 1, 2)):
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers, collate_fn=pair)
        assert list(loader) == scheduled(many_episodes_root, num_workers=workers, epoch=epoch, seed=4)
    assert dataset.epoch == 5


def test_a_wide_pool_reads_the_rows_of_the_episodes_it_emits_from(camera_less_root, monkeypatch):
    """Rows are read at an episode's first emit, not when the pool admits it, together with a few
    pooled episodes of its data file that wait too (``READ_TOGETHER`` at a file's first read, twice
    as many at each next), in one read: a pool of every episode, fresh or resumed, reads before its
    first sample only a few episodes of the file that sample needs (each read counted, and each
    episode read once), and the stream is the one reading every row at admission gives."""
    from episodestream._sample.holds import READ_TOGETHER, READ_TOGETHER_MAX
    from episodestream.testing import faults

    monkeypatch.setattr("episodestream._sample.holds.READ_TOGETHER", 2)  # fewer than a file's episodes here
    dataset = EpisodeStreamingDataset(camera_less_root, episode_pool_size=25, seed=4, decode_group_size=1)
    reads = faults.count_row_reads(dataset)  # each read: the episodes it read
    files = {info.episode_index: info.data_relpath for info in dataset.typed_meta.episodes.values()}
    assert max(list(files.values()).count(f) for f in set(files.values())) > 4
    assert (READ_TOGETHER, READ_TOGETHER_MAX) == (4, 256)
    stream = iter(dataset)
    first = next(stream)
    assert len(reads) == 1 and reads[0][0] == int(first["episode_index"]) and len(reads[0]) <= 2
    assert {files[e] for e in reads[0]} == {files[int(first["episode_index"])]}  # one file
    rest = [(int(s["episode_index"]), int(s["frame_index"])) for s in stream]
    read = [e for r in reads for e in r]
    assert len(set(read)) == len(read) == len({e for e, _ in rest} | {read[0]})  # each episode read once
    assert len(reads) < len(read)  # in fewer reads than episodes
    # A file's next read takes at most twice as many as its last, as far as it has them waiting (the
    # pool's ramp holds a few at the first reads).
    for file in set(files.values()):
        sizes = [len(r) for r in reads if files[r[0]] == file]
        assert all(size <= 2 * 2 ** k for k, size in enumerate(sizes)) and sum(sizes) == list(files.values()).count(file), (file, sizes)

    resumed = EpisodeStreamingDataset(camera_less_root, episode_pool_size=25, seed=4, decode_group_size=1)
    reads = faults.count_row_reads(resumed)
    resumed.load_state_dict({**dataset.state_dict(), "batches_consumed": 40, "batch_size": 1, "num_workers": 0})
    again = iter(resumed)
    sample = next(again)
    assert len(reads) == 1 and reads[0][0] == int(sample["episode_index"])
    assert [(int(sample["episode_index"]), int(sample["frame_index"]))] + [
        (int(s["episode_index"]), int(s["frame_index"])) for s in again] == rest[39:]
