"""EpisodeLoader: the DataLoader's batches, bit for bit, built on threads in this process; its position."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import defaultdict

import pytest
import torch
import torch.utils.data

from episodestream import EpisodeLoader, EpisodeStreamingDataset, VideoDecodeError, stream_state
from episodestream._sample.builder import SampleBuilder
from episodestream.testing import faults

from .conftest import CAMERAS

WINDOWS = {"action": [-0.1, 0.0, 0.1], CAMERAS[0]: [-2 / 30, 0.0], "observation.images.top": [0.0, 1 / 30]}


def reference_batches(root, batch_size, *, epochs=1, drop_last=False, **kwargs):
    dataset = EpisodeStreamingDataset(root, **kwargs)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=0, drop_last=drop_last)
    return [list(loader) for _ in range(epochs)]


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert list(a) == list(b), "same keys in the same order"
        for key in a:
            if isinstance(b[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


def indices(batches):
    return [int(i) for batch in batches for i in batch["index"]]


@pytest.mark.parametrize("options", [
    {},
    {"delta_timestamps": WINDOWS},
    {"return_uint8": True, "delta_timestamps": WINDOWS},
    {"image_transforms": lambda frames: frames[..., ::2, ::2] * 2},
], ids=["float32", "windows", "uint8-windows", "transforms"])
def test_batches_equal_the_dataloaders_bit_for_bit(dataset_root, options):
    # Every episode but the 140-frame one: 150 frames, still across every video file of both cameras.
    options = {"episodes": [0, 2, 3, 4, 5], **options}
    expected = reference_batches(dataset_root, 7, epochs=2, seed=5, **options)
    for num_threads in (1, 3):
        dataset = EpisodeStreamingDataset(dataset_root, seed=5, **options)
        loader = EpisodeLoader(dataset, 7, num_threads=num_threads)
        got = [list(loader), list(loader)]  # the epoch advances by itself, as with a DataLoader
        assert dataset.epoch == 2
        for epoch in range(2):
            assert_same_batches(got[epoch], expected[epoch])


def test_drop_last_and_batch_sizes_across_decode_groups(dataset_root):
    for batch_size, group in ((5, 3), (64, 8), (1, 4)):
        expected = reference_batches(dataset_root, batch_size, drop_last=True, seed=1, decode_group_size=group,
                                     return_uint8=True)[0]
        dataset = EpisodeStreamingDataset(dataset_root, seed=1, decode_group_size=group, return_uint8=True)
        loader = EpisodeLoader(dataset, batch_size, num_threads=2, drop_last=True)
        assert len(loader) == len(expected)
        assert_same_batches(list(loader), expected)


@pytest.mark.parametrize("delta_timestamps", [None, WINDOWS], ids=["single", "windows"])
def test_the_samples_do_not_depend_on_the_decode_group_size(dataset_root, delta_timestamps):
    # What lets decode_group_size's default be chosen for speed alone: groups of 1 (each sample
    # built alone), the default 16 and one larger than the batch give the same batches, from a
    # DataLoader over the dataset and from EpisodeLoader's threads alike.
    options = dict(seed=4, episode_pool_size=3, delta_timestamps=delta_timestamps, return_uint8=True)
    expected = reference_batches(dataset_root, 6, decode_group_size=1, **options)[0]
    assert len(expected) > 3
    for group in (16, 40):
        assert_same_batches(reference_batches(dataset_root, 6, decode_group_size=group, **options)[0], expected)
    dataset = EpisodeStreamingDataset(dataset_root, decode_group_size=16, **options)
    assert_same_batches(list(EpisodeLoader(dataset, 6, num_threads=3)), expected)
    assert EpisodeStreamingDataset(dataset_root).decode_group_size == 16


class _ThreadCheckingReader:
    """Records which threads use each decoder (ids, not id(): a closed decoder's id is reused),
    and every call that began while another thread was inside one on the same decoder."""

    serial = itertools.count()

    def __init__(self, inner, users, overlaps=None):
        self.inner, self.users, self.key = inner, users, next(self.serial)
        self.overlaps = overlaps if overlaps is not None else []
        self._inside = 0
        self._lock = threading.Lock()

    def frames_played_at(self, seconds):
        self.users[self.key].add(threading.get_ident())
        with self._lock:
            self._inside += 1
            if self._inside > 1:
                self.overlaps.append(self.key)
        try:
            time.sleep(0.0005)  # a window in which a second thread's call would overlap this one
            return self.inner.frames_played_at(seconds)
        finally:
            with self._lock:
                self._inside -= 1

    def close(self):
        self.inner.close()


def test_many_threads_many_epochs_same_stream_and_no_decoder_used_by_two_threads_at_once(many_episodes_root):
    """A decoder is never used by two threads at once (the threads share one cache, lending each
    decoder to one at a time); a local dataset's decoders serve the next pass's threads (not
    reopened per pass)."""
    expected = reference_batches(many_episodes_root, 6, epochs=3, seed=9, decode_group_size=1, return_uint8=True)
    dataset = EpisodeStreamingDataset(many_episodes_root, seed=9, decode_group_size=1, return_uint8=True)
    users, overlaps = defaultdict(set), []
    faults.wrap_video_readers(dataset, lambda reader, path: _ThreadCheckingReader(reader, users, overlaps))
    loader = EpisodeLoader(dataset, 6, num_threads=8, prefetch_batches=3)
    passes = []
    for epoch in range(3):
        users.clear()
        assert_same_batches(list(loader), expected[epoch])
        passes.append({key: set(threads) for key, threads in users.items()})
    loader.close()
    assert overlaps == [], f"decoders {sorted(set(overlaps))} were used by two threads at once"
    threads_used = set().union(*passes[0].values())
    assert len(threads_used) > 1, "decoding ran on several threads"
    reused = set(passes[0]) & set(passes[2])
    assert reused, "no decoder of the first pass served the third"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataset_decode_threads_keep_the_stream(many_episodes_root, num_workers):
    def stream(decode_threads):
        dataset = EpisodeStreamingDataset(many_episodes_root, seed=2, decode_group_size=2, return_uint8=True,
                                          decode_threads=decode_threads)
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=num_workers)
        return [list(loader) for _ in range(2)]

    single, threaded = stream(1), stream(3)
    for epoch in range(2):
        assert_same_batches(threaded[epoch], single[epoch])


def _new_loader(root, *, num_threads=2, batch_size=4, **kwargs):
    kwargs.setdefault("episodes", list(range(8)))
    kwargs.setdefault("return_uint8", True)
    # Groups of 8 across batches of 4 (groups spanning batches; the fault tests' call counts).
    kwargs.setdefault("decode_group_size", 8)
    dataset = EpisodeStreamingDataset(root, seed=3, episode_pool_size=3, **kwargs)
    return EpisodeLoader(dataset, batch_size, num_threads=num_threads)


@pytest.mark.parametrize("threads_before,threads_after", [(2, 2), (1, 4)])
def test_state_dict_resumes_exactly_at_any_point(many_episodes_root, threads_before, threads_after):
    uninterrupted_loader = _new_loader(many_episodes_root)
    epoch0, epoch1 = list(uninterrupted_loader), list(uninterrupted_loader)
    n = len(epoch0)
    for taken in (0, 1, n // 2, n - 1, n):
        loader = _new_loader(many_episodes_root, num_threads=threads_before)
        iterator = iter(loader)
        consumed = list(itertools.islice(iterator, taken))
        state = json.loads(json.dumps(loader.state_dict()))  # what a checkpoint file holds
        assert state["batches_consumed"] == taken and state["epoch"] == 0
        del iterator
        resumed_loader = _new_loader(many_episodes_root, num_threads=threads_after)
        resumed_loader.load_state_dict(state)
        assert len(resumed_loader) == (n - taken if taken < n else len(epoch1))
        resumed = list(resumed_loader)
        if taken == n:  # the epoch was finished: the resumed run starts the next one
            assert_same_batches(resumed, epoch1)
            continue
        assert_same_batches(consumed + resumed, epoch0)
        assert_same_batches(list(resumed_loader), epoch1)  # then a full next epoch


def test_a_resumed_run_saves_and_resumes_again(many_episodes_root):
    epoch0 = list(_new_loader(many_episodes_root))
    first = _new_loader(many_episodes_root)
    part1 = list(itertools.islice(iter(first), 3))
    second = _new_loader(many_episodes_root)
    second.load_state_dict(first.state_dict())
    assert second.state_dict()["batches_consumed"] == 3  # before iterating, the loaded position
    part2 = list(itertools.islice(iter(second), 4))
    state = second.state_dict()
    assert state["batches_consumed"] == 7
    third = _new_loader(many_episodes_root)
    third.load_state_dict(state)
    assert_same_batches(part1 + part2 + list(third), epoch0)


def test_elastic_resume_from_two_ranks_covers_the_epoch_once(many_episodes_root):
    consumed, states = [], []
    for rank in range(2):
        loader = _new_loader(many_episodes_root, rank=rank, world_size=2)
        consumed += indices(itertools.islice(iter(loader), 3))
        states.append(loader.state_dict())
    assert states[0] == states[1]
    resumed_loader = _new_loader(many_episodes_root)
    resumed_loader.load_state_dict(states[0])
    resumed = indices(resumed_loader)
    everything = indices(_new_loader(many_episodes_root, num_threads=1))
    assert not set(consumed) & set(resumed), "nothing consumed is emitted again"
    assert set(consumed) | set(resumed) == set(everything)
    assert len(consumed) + len(resumed) - len(everything) <= 2  # fill-ins only


def test_resumes_a_dataloader_state_and_the_dataloader_resumes_its_state(many_episodes_root):
    everything = set(indices(_new_loader(many_episodes_root, num_threads=1)))
    dataset = _new_loader(many_episodes_root).dataset
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2)
    consumed = indices(itertools.islice(iter(dataloader), 5))
    loader = _new_loader(many_episodes_root)
    loader.load_state_dict(stream_state(dataloader, 5))  # 2 workers -> the loader: elastic
    part = indices(itertools.islice(iter(loader), 2))
    state = loader.state_dict()
    back = _new_loader(many_episodes_root).dataset
    back.load_state_dict(state)
    rest = [int(i) for batch in torch.utils.data.DataLoader(back, batch_size=4, num_workers=2)
            for i in batch["index"]]
    assert sorted(consumed + part + rest) == sorted(everything)


def test_resuming_mid_epoch_with_another_batch_size_is_refused(many_episodes_root):
    loader = _new_loader(many_episodes_root)
    list(itertools.islice(iter(loader), 2))
    other = _new_loader(many_episodes_root, batch_size=8)
    with pytest.raises(ValueError, match="batch_size=4 partway through epoch 0"):
        other.load_state_dict(loader.state_dict())
    assert len(list(other)) == len(other.dataset) // 8 + 1 == 10  # nothing was loaded: a whole epoch 0
    finished = _new_loader(many_episodes_root)
    list(finished)
    other.load_state_dict(finished.state_dict())  # a finished epoch: the next may use any batch size
    assert other.dataset.epoch == 1


def test_set_epoch_and_len(many_episodes_root):
    loader = _new_loader(many_episodes_root)
    frames = len(loader.dataset)
    assert len(loader) == -(-frames // 4)
    loader.set_epoch(5)
    expected = reference_batches(many_episodes_root, 4, epochs=6, seed=3, episode_pool_size=3, return_uint8=True,
                                 episodes=list(range(8)))[5]
    assert_same_batches(list(loader), expected)
    assert loader.dataset.epoch == 6
    assert loader.state_dict()["epoch"] == 5 and loader.state_dict()["batches_consumed"] == len(expected)


class _FailingReader:
    """Fails the ``fail_at``-th decode call of the whole test (counted across threads)."""

    def __init__(self, inner, counter, fail_at):
        self.inner, self.counter, self.fail_at = inner, counter, fail_at

    def frames_played_at(self, seconds):
        with self.counter["lock"]:
            self.counter["calls"] += 1
            fail = self.counter["calls"] == self.fail_at
        if fail:
            raise RuntimeError("injected decoder failure")
        return self.inner.frames_played_at(seconds)

    def close(self):
        self.inner.close()


def test_a_decode_error_surfaces_in_the_trainer_and_loses_no_sample(many_episodes_root):
    epoch0 = list(_new_loader(many_episodes_root))
    loader = _new_loader(many_episodes_root, num_threads=3)
    counter = {"lock": threading.Lock(), "calls": 0}
    faults.wrap_video_readers(loader.dataset, lambda reader, path: _FailingReader(reader, counter, fail_at=9))
    taken = []
    with pytest.raises(VideoDecodeError, match=r"\.mp4 at .*injected decoder failure") as caught:
        for batch in loader:
            taken.append(batch)
    assert "episode" in str(caught.value)  # names the file and the episode that asked
    assert 0 < len(taken) < len(epoch0)
    state = loader.state_dict()
    assert state["batches_consumed"] == len(taken)
    resumed = _new_loader(many_episodes_root)
    resumed.load_state_dict(state)
    assert_same_batches(taken + list(resumed), epoch0)


def _episodestream_threads():
    return [t for t in threading.enumerate() if t.name.startswith("episodestream-decode")]


class _RecordingVideos:
    def __init__(self, inner, closed):
        self.inner, self.closed = inner, closed

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def close(self):
        self.closed.append(True)
        self.inner.close()


def test_dropping_or_closing_mid_epoch_joins_threads_and_releases_video(many_episodes_root):
    loader = _new_loader(many_episodes_root, num_threads=3)
    closed = []
    faults.wrap_episode_videos(loader.dataset, lambda videos: _RecordingVideos(videos, closed))
    iterator = iter(loader)
    next(iterator)
    assert len(_episodestream_threads()) == 3
    del iterator  # dropped mid-epoch
    assert not _episodestream_threads() and closed == [True]
    with loader:
        next(iter(loader))
    assert not _episodestream_threads() and closed == [True, True]
    # A new iteration of a loader closes the one before it.
    first = iter(loader)
    next(first)
    second = iter(loader)
    assert len(_episodestream_threads()) == 3 and closed == [True] * 3
    next(second)
    loader.close()
    assert not _episodestream_threads() and closed == [True] * 4


def test_a_local_datasets_decoders_stay_open_between_passes_until_the_loader_closes(many_episodes_root):
    loader = _new_loader(many_episodes_root, num_threads=3)
    readers = faults.count_video_readers(loader.dataset)
    expected = reference_batches(many_episodes_root, 4, epochs=2, seed=3, episode_pool_size=3,
                                 episodes=list(range(8)), return_uint8=True, decode_group_size=8)
    first = list(loader)
    assert_same_batches(first, expected[0])
    after_first = len(readers.opened)
    assert after_first > 0 and readers.closed == [], "the first pass's decoders are kept for the next"
    assert_same_batches(list(loader), expected[1])
    assert len(readers.opened) < 2 * after_first, "the second pass reopened its files"
    assert not _episodestream_threads()
    loader.close()
    assert readers.open_now() == [] and len(readers.closed) == len(readers.opened), "close() closes each kept once"
    # A closed loader iterates again, with decoders of its own.
    assert len(list(loader)) == len(first)
    assert len(readers.opened) > after_first and readers.open_now()
    loader.close()
    assert readers.open_now() == []


def test_arguments_are_validated(many_episodes_root):
    dataset = EpisodeStreamingDataset(many_episodes_root)
    for kwargs, error in (({"num_threads": 0}, "num_threads must be >= 1"),
                          ({"prefetch_batches": 0}, "prefetch_batches must be >= 1"),
                          ({"drop_last": "no"}, "drop_last must be True or False")):
        with pytest.raises((ValueError, TypeError), match=error):
            EpisodeLoader(dataset, 4, **kwargs)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        EpisodeLoader(dataset, 0)
    with pytest.raises(TypeError, match=r"needs an EpisodeStreamingDataset \(or another stream source.*got list"):
        EpisodeLoader([1, 2], 4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the warning given without CUDA")
def test_pin_memory_without_cuda_warns_and_is_ignored(many_episodes_root):
    with pytest.warns(RuntimeWarning, match="CUDA is not available"):
        loader = EpisodeLoader(EpisodeStreamingDataset(many_episodes_root), 4, pin_memory=True)
    assert not loader.pin_memory


@pytest.mark.needs_cuda
def test_pin_memory_gives_pinned_batches(dataset_root):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU and a CUDA build of torch; this machine has none")
    expected = reference_batches(dataset_root, 8, seed=0, delta_timestamps=WINDOWS)[0]
    loader = EpisodeLoader(EpisodeStreamingDataset(dataset_root, seed=0, delta_timestamps=WINDOWS), 8,
                           pin_memory=True)
    got = list(loader)
    assert all(v.is_pinned() for batch in got for v in batch.values() if isinstance(v, torch.Tensor))
    assert_same_batches(got, expected)


def test_batch_memory_is_reused_only_once_nothing_refers_to_it(many_episodes_root):
    camera = CAMERAS[0]
    loader = _new_loader(many_episodes_root, num_threads=2, return_uint8=False)  # float32: what reuse is for
    expected = [b[camera].clone() for b in _reference_float_batches(many_episodes_root)]
    kept = {}
    for i, batch in enumerate(loader):
        assert torch.equal(batch[camera], expected[i]), i
        if i == 1:
            kept["tensor"] = batch[camera]
        elif i == 2:
            kept["view"] = batch[camera][1:3]
        elif i == 3:
            kept["numpy"] = batch[camera].numpy()
    assert loader._memory.reused > 0, "batches the trainer dropped are reused"
    assert torch.equal(kept["tensor"], expected[1])
    assert torch.equal(kept["view"], expected[2][1:3])
    assert torch.equal(torch.from_numpy(kept["numpy"]), expected[3])


def _reference_float_batches(root):
    return reference_batches(root, 4, seed=3, episode_pool_size=3, episodes=list(range(8)))[0]


def test_a_thread_that_cannot_start_its_decoders_fails_the_pass_not_hangs(many_episodes_root):
    loader = _new_loader(many_episodes_root, num_threads=2)

    def broken_cache(working_set):
        raise OSError("no decoders today")

    faults.replace_decoder_cache(loader.dataset, broken_cache)
    with pytest.raises(OSError, match="no decoders today"):
        list(loader)
    assert not _episodestream_threads() and loader.state_dict()["batches_consumed"] == 0


def test_batch_memory_reuses_only_what_nothing_holds():
    from episodestream._runtime.batch_memory import BatchMemory

    memory = BatchMemory(capacity=4)
    options = dict(dtype=torch.float32, device=torch.device("cpu"), pin_memory=False)
    first = memory.empty((2, 3), **options)
    held = memory.lend(first, 2)  # the trainer keeps it
    second = memory.empty((2, 3), **options)
    assert second.data_ptr() != first.data_ptr() and memory.reused == 0
    addresses = (first.data_ptr(), second.data_ptr())
    del first  # the loader's own tensor: held by the test, it would be memory the trainer can reach
    extra = second.numpy()  # something besides the tensor holds the memory when it is lent
    dropped = memory.lend(second, 2)
    del dropped, second
    assert memory.empty((2, 3), **options).data_ptr() not in addresses
    del extra, held
    assert memory.empty((2, 3), **options).data_ptr() == addresses[0] and memory.reused == 1


@pytest.mark.parametrize("handle", ["untyped_storage", "base", "typed_storage"])
def test_batch_memory_is_not_reused_while_the_trainer_holds_it_through_its_storage(handle):
    # Handles that reach the memory without being a tensor view of it: a later batch must not be
    # written over them.
    import warnings

    from episodestream._runtime.batch_memory import BatchMemory

    memory = BatchMemory(capacity=4)
    options = dict(dtype=torch.float32, device=torch.device("cpu"), pin_memory=False)
    first = memory.empty((2, 3), **options)
    address = first.data_ptr()
    lent = memory.lend(first, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # .storage() is deprecated
        if handle == "base":
            held = lent._base
        else:
            held = lent.untyped_storage() if handle == "untyped_storage" else lent.storage()
    del first, lent
    assert memory.empty((2, 3), **options).data_ptr() != address and memory.reused == 0
    del held
    assert memory.empty((2, 3), **options).data_ptr() == address and memory.reused == 1


@pytest.mark.parametrize("return_uint8", [False, True])
@pytest.mark.parametrize("contiguous", [False, True])  # the compiled kernel takes only the contiguous one
def test_frame_writer_equals_finish_conversion_for_every_byte_value(many_episodes_root, return_uint8, contiguous):
    meta = EpisodeStreamingDataset(many_episodes_root).typed_meta
    builder = SampleBuilder(meta, offsets={}, tolerance_s=1e-4, return_uint8=return_uint8, image_transforms=None)
    frame = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 16).expand(3, 16, 16)
    out = torch.zeros((2, 3, 16, 16), dtype=builder.frame_dtype)
    frames_nhwc = frame.permute(1, 2, 0)[None].expand(2, 16, 16, 3).numpy()
    frames_nhwc = frames_nhwc.copy() if contiguous else frames_nhwc
    writes = builder.frame_writer(out.numpy(), frames_nhwc)
    writes.add(1, 1)
    assert not out.any(), "written before flush"
    writes.flush()
    expected = builder._image(frame.clone())
    assert out.dtype == expected.dtype and torch.equal(out[1], expected) and not out[0].any()
    assert torch.equal(out[1, 0].flatten(), frame[0].flatten() / 255.0 if not return_uint8 else frame[0].flatten())


def test_a_second_iterator_makes_the_first_one_raise_not_end_short(many_episodes_root):
    # A "show one batch" callback inside the training loop used to end the live pass silently: a
    # short epoch, then repeated.
    loader = _new_loader(many_episodes_root)
    first = iter(loader)
    next(first)
    second = iter(loader)
    next(second)
    with pytest.raises(RuntimeError, match=r"replaced by a newer iter\(loader\) after 1 batches"):
        next(first)
    assert len(list(second)) == len(loader) - 1  # the newer pass runs on, whole
    loader.close()


def test_load_state_dict_while_iterating_makes_the_live_pass_raise(many_episodes_root):
    loader = _new_loader(many_episodes_root)
    live = iter(loader)
    next(live), next(live)
    loader.load_state_dict(loader.state_dict())
    with pytest.raises(RuntimeError, match=r"replaced by loader.load_state_dict\(\)"):
        next(live)
    loader.close()


class _SlowReader:
    def __init__(self, inner, delay_s):
        self.inner, self.delay_s = inner, delay_s

    def frames_played_at(self, seconds):
        threading.Event().wait(self.delay_s)
        return self.inner.frames_played_at(seconds)

    def close(self):
        self.inner.close()


def test_close_from_another_thread_while_the_trainer_waits_says_the_loader_was_closed(many_episodes_root):
    loader = _new_loader(many_episodes_root)
    faults.wrap_video_readers(loader.dataset, lambda reader, path: _SlowReader(reader, delay_s=1.0))
    iterator = iter(loader)
    closer = threading.Timer(0.2, loader.close)  # a watchdog, say
    closer.start()
    with pytest.raises(RuntimeError, match=r"EpisodeLoader was closed \(loader.close\(\), from another thread\) "
                                           r"while this pass waited for batch 0 of epoch 0"):
        next(iterator)
    closer.join()
    assert not _episodestream_threads() and loader.state_dict()["batches_consumed"] == 0


@pytest.mark.parametrize("built", ["after", "before"])
def test_a_loader_counts_from_a_state_loaded_into_the_dataset_itself(many_episodes_root, built):
    # The loader used to count from 0 when the dataset itself took the state: its next state_dict
    # then pointed at the epoch's start, and resuming from it repeated samples.
    reference = _new_loader(many_episodes_root)
    iterator = iter(reference)
    for _ in range(3):
        next(iterator)
    state = reference.state_dict()
    rest = [batch["index"].tolist() for batch in iterator]
    reference.close()

    dataset = _new_loader(many_episodes_root).dataset
    loader = EpisodeLoader(dataset, 4, num_threads=2) if built == "before" else None
    dataset.load_state_dict(state)
    loader = loader or EpisodeLoader(dataset, 4, num_threads=2)
    assert loader.state_dict()["batches_consumed"] == 3  # before its first batch: the loaded position
    iterator = iter(loader)
    got = [next(iterator)["index"].tolist()]
    assert got == rest[:1] and loader.state_dict()["batches_consumed"] == 4
    loader.close()

    again = _new_loader(many_episodes_root)
    again.load_state_dict(loader.state_dict())
    assert [batch["index"].tolist() for batch in again] == rest[1:]  # nothing repeated, nothing skipped


def test_a_state_loaded_into_the_dataset_with_another_batch_size_is_refused_by_the_loader(many_episodes_root):
    reference = _new_loader(many_episodes_root)
    iterator = iter(reference)
    next(iterator)
    state = reference.state_dict()
    reference.close()
    dataset = _new_loader(many_episodes_root).dataset
    dataset.load_state_dict(state)
    with pytest.raises(ValueError, match=r"saved with batch_size=4; this loader has batch_size=8"):
        iter(EpisodeLoader(dataset, 8, num_threads=2))



def test_a_resumed_epoch_is_whole_when_selected_again_after_it_ran_to_its_end(many_episodes_root):
    # The resume point used to outlive its epoch: set_epoch back to it streamed only the remainder.
    reference = _new_loader(many_episodes_root)
    whole = [batch["index"].tolist() for batch in reference]
    loader = _new_loader(many_episodes_root)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = loader.state_dict()
    loader.close()

    resumed = _new_loader(many_episodes_root)
    resumed.load_state_dict(state)
    assert [batch["index"].tolist() for batch in resumed] == whole[3:]
    resumed.set_epoch(0)
    assert len(resumed) == len(whole) and len(resumed.dataset) == sum(map(len, whole))
    assert [batch["index"].tolist() for batch in resumed] == whole

    # The dataset alone (iterated in this process) likewise.
    dataset = _new_loader(many_episodes_root).dataset
    dataset.load_state_dict(state)
    first = [int(sample["index"]) for sample in dataset]
    assert first == sum(whole, [])[12:]
    dataset.set_epoch(0)
    assert [int(sample["index"]) for sample in dataset] == sum(whole, [])


def test_batch_tabular_values_equal_default_collate_and_refuse_what_it_could_not_stack():
    import numpy as np
    from torch.utils.data import default_collate

    from episodestream._sample.builder import as_tensor
    from episodestream.loader import _BatchBuffer

    samples = [{"state": np.arange(3, dtype=np.float32) + i, "index": np.array(i), "flag": np.bool_(i % 2),
                "window_is_pad": np.array([i == 0, False]), "note": f"s{i}", "words": ["a", f"b{i}"]}
               for i in range(3)]
    buffer = _BatchBuffer(4)
    for slot in (2, 0, 1):  # threads write slots in any order
        buffer.write_tabular(slot, samples[slot], "sample")
    batch = buffer.tabular_batch(3)
    expected = default_collate([{k: as_tensor(v) for k, v in s.items()} for s in samples])
    assert list(batch) == list(expected)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert batch[key].dtype == value.dtype and torch.equal(batch[key], value), key
        else:
            assert batch[key] == value, key

    for wrong, message in [({**samples[0], "state": np.zeros(4, np.float32)}, r"'state' is float32 of shape \[4\]"),
                           ({**samples[0], "state": np.zeros(3, np.float64)}, r"'state' is float64 of shape \[3\]"),
                           ({**samples[0], "index": 3}, r"'index' is int but"),
                           ({k: v for k, v in samples[0].items() if k != "note"}, r"keys .* differ"),
                           ({**samples[0], "extra": np.zeros(1)}, r"keys .* differ")]:
        with pytest.raises(ValueError, match=message):
            buffer.write_tabular(3, wrong, "episode 7 key 'cam'")
    # The loader names the sample through a callable, called only for an error (it runs per sample).
    calls = []

    def who():
        calls.append(1)
        return "episode 9 key 'wrist'"

    buffer.write_tabular(3, samples[0], who)
    assert calls == []
    with pytest.raises(ValueError, match=r"^episode 9 key 'wrist': 'state' is float32 of shape \[4\]"):
        buffer.write_tabular(3, {**samples[0], "state": np.zeros(4, np.float32)}, who)
    with pytest.raises(ValueError, match=r"^episode 9 key 'wrist': the sample's keys"):
        buffer.write_tabular(3, {**samples[0], "extra": np.zeros(1)}, who)
    assert calls == [1, 1]
