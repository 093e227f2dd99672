"""``EpisodeLoader``: batches built in the trainer's process on decode threads, and the stream position.

A DataLoader worker process collates every batch into fresh shared memory and hands it over; on a
machine with few cores that costs more than decoding (benchmarks/LOG.md). This loader keeps the
rank's one consumer in the trainer's process: the schedule and rows are planned in order, decode
groups run on threads (torchcodec releases the GIL), and each frame is written, converted, straight
into its slot of the batch tensor. The batches equal ``DataLoader(dataset, batch_size,
num_workers=0)``'s, key for key and bit for bit, whatever ``num_threads``.

Because the loader hands out the batches, it knows the position: ``state_dict()`` needs nothing
from the trainer.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from episodestream._base.warn import warn_user
from episodestream._plan.saved_state import TrainerCount
from episodestream._runtime.batch_memory import BatchMemory
from episodestream._runtime.decoder_spares import DecoderSpares
from episodestream._base.options import check_bool, check_int, refuses_unknown_keywords
from episodestream._runtime.lookahead.pipeline import GroupPipeline, split_closing, split_opening
from episodestream._runtime.stream import ConsumerStream, DecoderSet, PlannedGroup
from episodestream._sample.builder import PendingSample, finish_decoded
from episodestream._sample.chw import FrameWrites, flush_all
from episodestream._sample.collate import LanguageColumns, check_language_columns, collate_values, dropped_keys
from episodestream._sample.collate import collate as collate_samples
from episodestream._runtime.face import StreamingFace, runtime_of
from episodestream._base.world import World
from episodestream._sample.video.decoder_cache import FrameQuery
from episodestream._base.cores import usable_cores

_MAX_DEFAULT_THREADS = 16


class EpisodeLoader:
    """Batches of an ``EpisodeStreamingDataset``, built in this process, with the stream position.

    Iterating yields the epoch the dataset is at and advances it at the end, as a DataLoader over
    the dataset does; ``set_epoch`` selects one. ``state_dict()`` / ``load_state_dict()`` save and
    restore the position exactly (elastically when the world size changes). ``close()``, or
    dropping the iterator, stops the threads and releases cached video; a local dataset's decoders
    stay open for the next pass's threads until ``close()``. The arguments, by purpose: what to
    load (``dataset``, ``batch_size``, ``drop_last``, ``language_columns``), and how fast, with what memory
    (``num_threads``, ``prefetch_batches``, ``pin_memory``).

    Args:
        dataset (EpisodeStreamingDataset | EpisodeMixture): what to load; its rank and world size
            (explicit, or from torch.distributed) say which share of each epoch this process streams.
        batch_size (int): samples per batch.
        drop_last (bool): drop the epoch's last batch when it is smaller than ``batch_size``.
            Defaults to ``False``.
        num_threads (int | None): decode threads (None: the cores this process may use, at most
            16). Each keeps its own decoders; batches do not depend on it. Defaults to ``None``.
        prefetch_batches (int): batches being built or ready ahead of the one the trainer takes
            (at least 1). Each costs one batch of memory; so does each further ``batch_size``
            samples the threads may plan beyond them (one decode group per thread, so that every
            thread has a group to decode). Defaults to ``2``.
        pin_memory (bool): allocate batches in pinned (page-locked) memory when CUDA is available,
            so ``.to("cuda", non_blocking=True)`` copies asynchronously; ignored with a warning
            otherwise. Defaults to ``False``.
        language_columns (str): "drop" leaves LeRobot 0.6's ``language_persistent`` /
            ``language_events`` out of the batches, as LeRobot's trainer (``lerobot_collate_fn``)
            does; "keep" keeps each as a list with one entry per sample (``episodestream.collate``).
            Defaults to ``"drop"``.

    Yields:
        dict[str, Any]: batches, equal to ``DataLoader(dataset, batch_size, num_workers=0)``'s key
        for key and bit for bit.

    Raises:
        TypeError: ``dataset`` does not stream, an argument of the wrong type, or a DataLoader
            keyword (``num_workers``, ``prefetch_factor``: the error names this loader's own).
        ValueError: an argument out of range.
    """

    # DataLoader's words for what this loader calls otherwise (it decodes on threads, not workers).
    @refuses_unknown_keywords({"num_workers": "num_threads", "prefetch_factor": "prefetch_batches"})
    def __init__(self, dataset: StreamingFace, batch_size: int, *, num_threads: int | None = None,
                 drop_last: bool = False, pin_memory: bool = False, prefetch_batches: int = 2,
                 language_columns: LanguageColumns = "drop") -> None:
        self._runtime = runtime_of(dataset)
        self.dataset = dataset
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.num_threads = (min(usable_cores(), _MAX_DEFAULT_THREADS) if num_threads is None
                            else check_int("num_threads", num_threads, minimum=1))
        self.drop_last = check_bool("drop_last", drop_last)
        self.language_columns = check_language_columns(language_columns)
        pin_memory = check_bool("pin_memory", pin_memory)
        self.prefetch_batches = check_int("prefetch_batches", prefetch_batches, minimum=1)
        self.pin_memory = pin_memory and torch.cuda.is_available()
        if pin_memory and not self.pin_memory:
            warn_user("EpisodeLoader(pin_memory=True): CUDA is not available, so batches are not pinned.",
                      RuntimeWarning)
        # (epoch, batches handed out of it counted from its start, the runtime's loads when counted):
        # the position this loader knows; before it hands a batch (or after a load into the dataset
        # itself) the position is the runtime's resume point (``_resume_base``).
        self._consumed: tuple[int, int, int] | None = None
        self._current: weakref.ref[_Iteration] | None = None
        self._memory: BatchMemory | None = None  # sized by the first stream's cameras
        self._spares = DecoderSpares()  # decoders a pass's threads leave for the next pass's

    def __len__(self) -> int:
        """Batches the next iteration yields.

        Returns:
            int: the epoch's batches, or what is left of a resumed epoch after a load.
        """
        samples = self._runtime.num_samples()
        return samples // self.batch_size if self.drop_last else math.ceil(samples / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration streams.

        Args:
            epoch (int): the epoch, 0 or more.

        Raises:
            TypeError: ``epoch`` is not an int.
            ValueError: ``epoch`` is negative.
        """
        self._runtime.set_epoch(check_int("epoch", epoch, minimum=0))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Start a pass over the epoch the dataset is at (closing the pass before, whose next
        ``next()`` raises saying so).

        Yields:
            dict[str, Any]: the batches, in order.

        Raises:
            ValueError: the dataset resumes an epoch saved with another ``batch_size``.
        """
        self._close_current(superseded_by="a newer iter(loader)")
        runtime = self._runtime
        world = World(runtime.rank, runtime.world_size)
        claim = runtime.claim(world)
        epoch = claim.epoch
        stream = runtime.consumer_stream(world, claim)
        if self._memory is None:
            # Batches being built or ready, the one the trainer holds and the one it just let go
            # of, per camera: enough to reuse memory in a steady loop without holding more.
            in_flight = math.ceil(self._samples_ahead(stream) / self.batch_size) + 1
            self._memory = BatchMemory(capacity=(in_flight + 2) * max(1, stream.num_cameras))
        base = self._resume_base(epoch)
        self._consumed = (epoch, base, runtime.loads())
        iteration = _Iteration(self, epoch, stream, base, self._memory, self._spares)
        self._current = weakref.ref(iteration)
        return iteration

    def _samples_ahead(self, stream: ConsumerStream) -> int:
        """How far past the batch the trainer takes the threads may plan: ``prefetch_batches`` and
        a decode group for each thread, so that no thread waits while another plans."""
        return self.prefetch_batches * self.batch_size + self.num_threads * stream.group_size

    def close(self) -> None:
        """Stop the current iteration: join its threads, release its cached video and close the
        decoders kept for the next pass (a later iteration opens new ones)."""
        self._close_current()
        self._spares.close()

    def __enter__(self) -> EpisodeLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_current(self, superseded_by: str | None = None) -> None:
        """Close the live iteration; ``superseded_by`` says what replaced it, and its next ``next()``
        raises saying so (a silently ended pass would be a short epoch, then repeated)."""
        iteration = self._current() if self._current is not None else None
        if iteration is not None:
            iteration.close(superseded_by=superseded_by)
        self._current = None

    # -- position ---------------------------------------------------------------------------------

    def _handed(self, epoch: int, batches: int) -> None:
        self._consumed = (epoch, batches, self._runtime.loads())

    def _resume_base(self, epoch: int) -> int:
        """Batches of ``epoch`` consumed before this loader's next pass: what the loaded state (into
        the loader or into the dataset itself) says, else 0. A state saved with another batch size
        cannot be continued in batches of this one."""
        resumed = self._runtime.resumed_batches(epoch)
        if resumed is None:
            return 0
        batch_size, batches = resumed
        if batches and batch_size != self.batch_size:  # nothing consumed: nothing to continue
            raise ValueError(f"The dataset resumes epoch {epoch} from a state saved with batch_size={batch_size}; "
                             f"this loader has batch_size={self.batch_size}. Resume that epoch with "
                             f"batch_size={batch_size} (a batch count cannot be continued in other batch sizes); "
                             f"later epochs may use any.")
        return batches

    def state_dict(self) -> dict[str, Any]:
        """The stream state at the batches handed out so far.

        Returns:
            dict[str, Any]: a state ``load_state_dict`` on a new loader (any ``num_threads``; the same
            or another world size) continues after the batches handed out; the same format as
            ``stream_state`` for a DataLoader, so either can resume the other.
        """
        saved = self._runtime.saved_state()
        consumed = self._consumed
        if consumed is not None and consumed[0] == saved.epoch and consumed[2] == self._runtime.loads():
            batches = consumed[1]
        else:
            batches = self._resume_base(saved.epoch)
        # The batches handed out say where it stands: no consumer's position.
        count = TrainerCount(batches_consumed=batches, batch_size=self.batch_size, num_workers=0,
                             drop_last=self.drop_last)
        return saved.with_trainer(count).to_state(self._runtime.state_spec)

    def load_state_dict(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Resume from ``state``; the next iteration continues the saved epoch.

        Args:
            state (Mapping[str, Any]): this loader's ``state_dict()``, or ``stream_state`` of a
                DataLoader.
            strict (bool): refuse a state of another stream; see
                ``EpisodeStreamingDataset.load_state_dict`` for what must match. Defaults to ``True``.

        Raises:
            TypeError: ``strict`` is not a bool, or ``state`` is not a state.
            ValueError: ``state`` is malformed or (``strict``) of another stream, or was saved partway
                through its epoch with another ``batch_size``.
        """
        strict = check_bool("strict", strict)
        saved = self._runtime.parse(state)
        checked = self._runtime.check_state(saved, strict=strict)
        # A state that took no batch of its epoch (saved before any) starts it afresh: any batch size.
        assert saved.trainer is not None  # check_state refuses a state without a trainer's count
        saved_batch_size = saved.trainer.batch_size
        if not checked.finished and checked.consumed_batches and saved_batch_size != self.batch_size:
            raise ValueError(f"The state was saved with batch_size={saved_batch_size} partway through epoch "
                             f"{checked.epoch}; this loader has batch_size={self.batch_size}. Resume that epoch "
                             f"with batch_size={saved_batch_size} (a batch count cannot be continued in other "
                             f"batch sizes); later epochs may use any.")
        self._close_current(superseded_by="loader.load_state_dict()")
        self._runtime.apply_state(checked)  # logged at the next iter(), where this loader's one consumer starts
        self._consumed = None  # the loaded state's position is the runtime's now (``_resume_base``)


class _BatchBuffer:
    """One batch being written by decode threads: camera frames in place, numeric tabular values
    into one array per key, the rest (strings, images) per sample.

    Writing a sample's numbers into the batch's arrays and making one tensor per key per batch is
    what ``default_collate`` of per-sample tensors gives (the same dtype, shape and values: the
    shape and dtype of every value are checked against the array), at a fraction of its cost per
    frame: the per-value tensors and their stacking were most of the trainer thread's work.
    """

    def __init__(self, size: int) -> None:
        self.frames: dict[str, torch.Tensor] = {}
        self.arrays: dict[str, np.ndarray | torch.Tensor] = {}  # the same memory, as written to
        self.video_keys: list[str] | None = None  # the first sample's order, as default_collate keeps
        # The tabular keys in the samples' order, each with the array of its numbers ((size, *value
        # shape)), or None for what stays per sample (strings, images).
        # (key, batch array or None for values collated as they are, its per-sample shape, its dtype)
        self.layout: list[tuple[str, np.ndarray | None, tuple[int, ...] | None, np.dtype | None]] | None = None
        self.others: list[dict[str, Any] | None] = [None] * size  # the rest of each sample's tabular part
        self.items: list[dict[str, Any] | None] = [None] * size  # whole samples (not written in place)
        self.lock = threading.Lock()

    def frame_out(self, key: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *,
                  memory: BatchMemory, pin_memory: bool, query: FrameQuery) -> np.ndarray | torch.Tensor:
        """The batch's frames of ``key``, allocated by the first sample written: a numpy view of the
        tensor on CPU (numpy indexing costs a fraction of torch's per frame), else the tensor."""
        with self.lock:
            out = self.frames.get(key)
            if out is None:
                out = self.frames[key] = memory.empty((len(self.items), *shape), dtype=dtype, device=device,
                                                      pin_memory=pin_memory)
                self.arrays[key] = out.numpy() if out.device.type == "cpu" else out
        if tuple(out.shape[1:]) != shape:
            raise ValueError(f"{query.path} ({query.who}): frames of shape {list(shape)} cannot join a batch "
                             f"whose {key!r} frames are {list(out.shape[1:])} (a DataLoader could not stack "
                             f"them either).")
        return self.arrays[key]

    def write_tabular(self, slot: int, tabular: dict[str, Any], who: str | Callable[[], str]) -> None:
        """Sample ``slot``'s tabular part (``GroupBuilder.tabular``): numbers into the batch's arrays.
        ``who`` names the sample in errors (a callable is called only then: this runs per sample)."""
        layout = self.layout
        if layout is None:
            with self.lock:
                if self.layout is None:
                    # The first sample written sets the keys, their order and the arrays (with
                    # each array's per-sample shape and dtype, checked against every later sample).
                    arrays = [(key, np.empty((len(self.others), *value.shape), dtype=value.dtype)
                               if isinstance(value, (np.ndarray, np.generic)) else None)
                              for key, value in tabular.items()]
                    self.layout = [(key, out, None if out is None else out.shape[1:], None if out is None else out.dtype)
                                   for key, out in arrays]
                layout = self.layout
        if len(tabular) != len(layout):
            self._refuse_keys(tabular, who)
        if any(entry[0] != name for entry, name in zip(layout, tabular)) and set(tabular) == {e[0] for e in layout}:
            # The same keys in another order (a union mixture's fill-ins follow each component's
            # own keys): default_collate takes the first sample's order and looks the others up.
            tabular = {entry[0]: tabular[entry[0]] for entry in layout}
        others: dict[str, Any] = {}
        for (key, out, shape, dtype), (name, value) in zip(layout, tabular.items()):
            if key != name:
                self._refuse_keys(tabular, who)
            if out is None:
                if isinstance(value, (np.ndarray, np.generic)):
                    raise ValueError(f"{_named(who)}: {key!r} is an array here but not in its batch's first sample.")
                others[key] = value
            # Without the check numpy would broadcast a smaller value, or cast another dtype, silently.
            elif (type(value) is np.ndarray and value.shape == shape
                  and (value.dtype is dtype or value.dtype == dtype)):
                out[slot] = value
            elif isinstance(value, np.generic) and value.shape == shape and value.dtype == dtype:
                out[slot] = value  # a numpy scalar (a mixture's, say): the same value as a 0-d array
            else:
                shown = (f"{value.dtype} of shape {list(value.shape)}" if isinstance(value, (np.ndarray, np.generic))
                         else type(value).__name__)
                raise ValueError(f"{_named(who)}: {key!r} is {shown} but its batch's are {out.dtype} of shape "
                                 f"{list(out.shape[1:])} (a DataLoader could not stack them either).")
        self.others[slot] = others

    def _refuse_keys(self, tabular: dict[str, Any], who: str | Callable[[], str]) -> None:
        batch = sorted(entry[0] for entry in self.layout or ())
        raise ValueError(f"{_named(who)}: the sample's keys {sorted(tabular)} differ from its batch's {batch} "
                         f"(a DataLoader could not collate them either).")

    def tabular_batch(self, count: int, language_columns: LanguageColumns = "drop") -> dict[str, Any]:
        """The tabular keys of the batch's first ``count`` samples, as ``episodestream.collate``
        gives them (``default_collate``'s, the language columns as ``language_columns`` says)."""
        batch: dict[str, Any] = {}
        others = self.others[:count]
        dropped = dropped_keys(language_columns)
        for key, values, _, _ in self.layout or ():
            if key in dropped:
                continue
            # The arrays are this batch's alone (never reused): the tensors can share them.
            batch[key] = (torch.from_numpy(values[:count]) if values is not None
                          else collate_values(key, [sample[key] for sample in others],  # type: ignore[index]
                                              language_columns))
        return batch


def _named(who: str | Callable[[], str]) -> str:
    return who if isinstance(who, str) else who()


def _who(pending: PendingSample) -> str:
    return pending.queries[0].who if pending.queries else "a sample"


class _BatchWriter:
    """What decode threads run: decode a group and write its samples into their batches.

    Kept apart from ``_Iteration`` so that the threads never hold the iteration the trainer holds:
    dropping it closes them.
    """

    def __init__(self, stream: ConsumerStream, *, batch_size: int, num_batches: int, pin_memory: bool,
                 memory: BatchMemory, language_columns: LanguageColumns) -> None:
        self._builder = stream.builder
        self._language_columns = language_columns
        # Frames go straight into batch memory unless image_transforms must see each sample.
        self._in_place = stream.builder.writes_in_place
        self._memory = memory
        self._batch_size = batch_size
        self._num_batches = num_batches
        self._pin_memory = pin_memory
        self._buffers: dict[int, _BatchBuffer] = {}
        self._lock = threading.Lock()

    def buffer(self, index: int) -> _BatchBuffer:
        with self._lock:
            buffer = self._buffers.get(index)
            if buffer is None:
                buffer = self._buffers[index] = _BatchBuffer(self._batch_size)
            return buffer

    def take(self, index: int) -> _BatchBuffer:
        with self._lock:
            return self._buffers.pop(index)

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()

    def write_group(self, decoders: DecoderSet, first_sample: int, group: PlannedGroup) -> None:
        # Samples past the last batch (the tail drop_last drops) are neither decoded nor kept.
        pendings = group.pendings[:max(0, self._num_batches * self._batch_size - first_sample)]
        if not pendings:
            return
        builder = self._builder
        decoded = builder.decode(decoders, pendings)
        if not self._in_place:
            for offset, pending in enumerate(pendings):
                index, slot = divmod(first_sample + offset, self._batch_size)
                self.buffer(index).items[slot] = finish_decoded(builder, pending, decoded)
            return
        # Per file and source (decoded, or kept for their turn: ``DecodedFile.source``): its (N, H, W, C) frames.
        file_frames: dict[tuple[str, bool], np.ndarray | torch.Tensor] = {}
        # Per (batch, camera, file): the batch's frames of that camera and the writes from that
        # file into them, set up once (shape and layout checks included), not once per frame, and
        # written in one call per group, every camera and batch together (``chw.flush_all``).
        targets: dict[tuple[int, str, str, bool], tuple[np.ndarray | torch.Tensor, FrameWrites]] = {}
        # Each decoded frame is converted once per group: a window padded at an episode's edge,
        # or overlapping another sample's, copies the frame already written (a plain copy of the
        # converted frame costs under half the conversion in float32), after the writes.
        written: dict[tuple[str, bool, int], tuple[FrameWrites, int]] = {}
        copies: list[tuple[FrameWrites, int, FrameWrites, int]] = []

        for offset, pending in enumerate(pendings):
            index, slot = divmod(first_sample + offset, self._batch_size)
            buffer = self.buffer(index)
            for key, windowed, query in zip(pending.video_keys, pending.windowed, pending.queries):
                path = query.path
                source, row_of = decoded[path].source(query)
                kept = source is not decoded[path].frames
                target = targets.get((index, key, path, kept))
                if target is None:
                    frames = file_frames.get((path, kept))
                    if frames is None:
                        # numpy on CPU: indexing it costs a fraction of torch's per frame
                        frames = file_frames[path, kept] = source.numpy() if source.device.type == "cpu" else source
                    chw = (frames.shape[3], frames.shape[1], frames.shape[2])
                    shape = (len(query.timestamps_s), *chw) if windowed else chw
                    # uint8 frames become the builder's dtype; a depth camera's float32 depth stays float32.
                    dtype = builder.frame_dtype if source.dtype == torch.uint8 else source.dtype
                    out_all = buffer.frame_out(key, shape, dtype, source.device,
                                               memory=self._memory, pin_memory=self._pin_memory, query=query)
                    writes = builder.frame_writer(out_all, frames)
                    targets[index, key, path, kept] = (out_all, writes)
                else:
                    if windowed and target[0].shape[1] != len(query.timestamps_s):
                        raise ValueError(f"{path} ({query.who}): a window of {len(query.timestamps_s)} frames "
                                         f"cannot join a batch whose {key!r} windows are {target[0].shape[1]} "
                                         f"frames long.")
                    writes = target[1]
                stamps = query.timestamps_s
                first_frame = slot * len(stamps) if windowed else slot
                for step, stamp in enumerate(stamps if windowed else stamps[:1]):
                    row = row_of[stamp]
                    first = written.get((path, kept, row))
                    if first is None:
                        writes.add(first_frame + step, row)
                        written[path, kept, row] = (writes, first_frame + step)
                    else:
                        copies.append((writes, first_frame + step, *first))
            if slot == 0:
                buffer.video_keys = list(pending.video_keys)
            # The frames are in place: the rest, as finish() gives it.
            buffer.write_tabular(slot, builder.tabular(pending), functools.partial(_who, pending))
        flush_all(writes for _, writes in targets.values())
        for to, to_frame, source_writes, source_frame in copies:
            place, converted = to.frame(to_frame), source_writes.frame(source_frame)
            if isinstance(place, np.ndarray):
                np.copyto(place, converted)
            else:  # accelerator memory: ``converted`` is a tensor too (as_tensor returns it as it is)
                place.copy_(torch.as_tensor(converted))

    def collate(self, buffer: _BatchBuffer, count: int) -> dict[str, Any]:
        """The batch as ``episodestream.collate`` of its samples would give it (frames already in place)."""
        buffer.arrays.clear()  # the numpy views written through: lend() needs the tensors alone
        if not self._in_place:
            batch = collate_samples(buffer.items[:count], language_columns=self._language_columns)
        else:
            batch = {key: self._memory.lend(buffer.frames[key], count) for key in buffer.video_keys or ()}
            batch.update(buffer.tabular_batch(count, self._language_columns))
        if self._pin_memory:
            batch = {k: v.pin_memory() if isinstance(v, torch.Tensor) and not v.is_pinned() else v
                     for k, v in batch.items()}
        return batch


class _Iteration(Iterator[dict[str, Any]]):
    """One pass over an epoch's share (what ``iter(loader)`` returns)."""

    def __init__(self, loader: EpisodeLoader, epoch: int, stream: ConsumerStream, base_batches: int,
                 memory: BatchMemory, spares: DecoderSpares) -> None:
        self._loader = loader
        self._epoch = epoch
        self._base = base_batches
        self._batch_size = loader.batch_size
        self._num_samples = num_samples = stream.num_samples
        self._num_batches = (num_samples // loader.batch_size if loader.drop_last
                             else math.ceil(num_samples / loader.batch_size))
        self._next = 0  # the next batch to hand out
        self._done_samples = 0  # samples decoded, in order, from the start of this pass
        self._error: BaseException | None = None
        self._closed = False
        self._superseded_by: str | None = None
        self._stream = stream
        self._ahead = loader._samples_ahead(stream)
        self._writer = _BatchWriter(stream, batch_size=loader.batch_size, num_batches=self._num_batches,
                                    pin_memory=loader.pin_memory, memory=memory,
                                    language_columns=loader.language_columns)
        # The first batch split over the threads: a group larger than its share (v2.x's default
        # of 32, a batch of 32 on 2 threads) would leave all but one thread idle until it is out.
        groups = split_opening(stream.groups(), samples=loader.batch_size,
                               part_size=math.ceil(loader.batch_size / loader.num_threads))
        # And the pass's last decode group per thread in quarters: whole groups there would leave
        # threads idle at the end of every pass while the last few decode (benchmarks/LOG.md).
        tail = loader.num_threads * stream.group_size
        groups = split_closing(groups, from_sample=num_samples - tail,
                               part_size=math.ceil(stream.group_size / 4))
        # Nothing the threads hold may refer to this object (see _BatchWriter).
        open_cache: Callable[[], DecoderSet] = functools.partial(stream.open_decoders, loader.num_threads)
        close_cache = None
        if stream.decoders_outlive_pass:  # the threads of the next pass take over these decoders
            open_cache = functools.partial(spares.take, open_cache)
            close_cache = spares.give_back
        self._pipeline = GroupPipeline(
            groups, work=self._writer.write_group, open_cache=open_cache, close_cache=close_cache,
            num_threads=loader.num_threads, allowed_samples=self._ahead)
        if self._num_batches == 0:
            self._finish()

    def __len__(self) -> int:
        return self._num_batches - self._next

    def __next__(self) -> dict[str, Any]:
        if self._error is not None:
            raise RuntimeError(f"This pass over epoch {self._epoch} stopped at batch {self._base + self._next} "
                               f"after an error (above); loader.state_dict() resumes at that batch.") from self._error
        if self._superseded_by is not None:
            raise RuntimeError(f"This pass over epoch {self._epoch} was replaced by {self._superseded_by} after "
                               f"{self._base + self._next} batches and ends here; iterate the newer pass (one "
                               f"iteration at a time: a second iter(loader) starts the epoch's pass anew).")
        if self._closed:
            raise StopIteration
        index = self._next
        wanted = min((index + 1) * self._batch_size, self._num_samples)
        try:
            while self._done_samples < wanted:
                group = self._pipeline.next_group()
                if group is None and self._closed:
                    raise RuntimeError(f"EpisodeLoader was closed (loader.close(), from another thread) while this "
                                       f"pass waited for batch {self._base + index} of epoch {self._epoch}; "
                                       f"loader.state_dict() resumes at that batch.")
                if group is None:
                    raise RuntimeError(f"The stream of epoch {self._epoch} ended after {self._done_samples} of "
                                       f"{self._num_samples} samples (a bug: please report it).")
                self._done_samples += group.count
                self._stream.release(group.group)
            batch = self._writer.collate(self._writer.take(index), wanted - index * self._batch_size)
        except BaseException as error:
            # Nothing of the failed batch was handed out: the position stays before it.
            self._error = error
            self.close()
            raise
        self._next += 1
        self._loader._handed(self._epoch, self._base + self._next)
        self._pipeline.allow(self._next * self._batch_size + self._ahead)
        if self._next == self._num_batches:
            self._finish()
        return batch

    def _finish(self) -> None:
        """The last batch is handed out: the epoch is done, as when a DataLoader's pass ends."""
        self._stream.finished()
        self.close()

    def close(self, *, superseded_by: str | None = None) -> None:
        if self._closed:
            return
        self._superseded_by = superseded_by
        self._closed = True
        try:
            self._pipeline.close()
        finally:
            self._writer.clear()
            self._stream.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit modules may be gone; nothing is left to release then
            pass
