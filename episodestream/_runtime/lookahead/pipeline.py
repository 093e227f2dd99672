"""Plan decode groups in order on one thread at a time, decode them on several, hand them out in order.

The engine of ``EpisodeLoader`` and of ``EpisodeStreamingDataset(decode_threads=N)``.

Why threads: torchcodec's decode calls release the GIL (two threads on two cores decode nearly
twice the frames of one, benchmarks/LOG.md), so a process can use its cores for decoding without a
process boundary to cross, and batches can be built where the trainer is.

Why the standard library rather than torchdata.nodes or SPDL: the work is one stage whose threads
each keep their own decoders (a decoder must never be used by two threads at once), whose results
must come out in order, and whose writes go to batch memory chosen at planning time. A Condition and
a lock say exactly that in this module, without a dependency that would own the threads' state.

Determinism: planning (the pool schedule, reading rows, admitting video) runs under ``_plan_lock``,
one thread at a time, in the order of the single-threaded stream; each group gets its sequence
number and the stream position of its first sample while that lock is held. Threads only decode
and build, so the samples and their order never depend on thread timing or on the thread count.

Why the decode threads plan rather than a planning thread of its own: a thread that has just
decoded a group holds the GIL and plans the next without a hand-off, while a planner must win the
GIL from every busy decode thread for each group; tried, a planner made 32 threads slower than 16
(benchmarks/LOG.md, "A planning thread, tried and not kept").
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from episodestream._runtime.stream import ConsumerStream, DecoderSet, PlannedGroup
from episodestream._sample.builder import build_samples
from episodestream._base.tracing import trace_span


@dataclass
class DecodedGroup:
    """One planned group: its samples start at stream position ``first_sample``."""

    first_sample: int
    group: PlannedGroup
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.count = len(self.group.pendings)


def _failed(first_sample: int, error: BaseException) -> DecodedGroup:
    return DecodedGroup(first_sample, PlannedGroup([], []), error=error, done=True)


class GroupPipeline:
    """Decode the groups of ``groups`` on ``num_threads`` threads; ``next_group`` returns them in order.

    ``work(decoders, first_sample, group)`` runs in a decode thread with that thread's own
    decoders (from ``open_cache``, handed to ``close_cache`` when the thread ends: by default
    closed); its return value (or exception) is the group's result. Threads
    plan ahead only while fewer than ``allow(samples)`` samples are planned, which bounds memory.

    Wake-ups are targeted, so that more threads never cost more: the consumer waits on ``_ready``
    (woken when the group it waits for is done), idle threads on ``_room`` (woken one at a time:
    a thread that plans while room is left wakes the next, a baton pass), and a thread that has
    decoded a group goes straight on to plan the next without waiting to be woken.
    """

    def __init__(self, groups: Iterator[PlannedGroup], *, work: Callable[[DecoderSet, int, PlannedGroup], Any],
                 open_cache: Callable[[], DecoderSet], num_threads: int, allowed_samples: int,
                 close_cache: Callable[[DecoderSet], None] | None = None,
                 name: str = "episodestream-decode") -> None:
        self._groups = groups
        self._work = work
        self._open_cache = open_cache
        self._close_cache = close_cache
        self._plan_lock = threading.Lock()  # planning is sequential: one thread at a time, in stream order
        self._lock = threading.Lock()  # guards the state below; both conditions share it
        self._ready = threading.Condition(self._lock)  # the consumer: the head of the queue is done
        self._room = threading.Condition(self._lock)  # idle decode threads: room to plan
        self._queue: deque[DecodedGroup] = deque()  # planned, not yet handed out, in order
        self._planned_samples = 0
        self._allowed_samples = allowed_samples
        self._exhausted = False  # planning ended (the stream's end, or an error while planning)
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                         for i in range(num_threads)]
        # Daemon threads: a loader the trainer never closes must not keep the interpreter from
        # exiting. close() joins them; tests' thread police checks none outlives its loader.
        for thread in self._threads:
            thread.start()

    def allow(self, samples: int) -> None:
        """Let threads plan until ``samples`` samples (counted from the stream's start) are planned."""
        with self._lock:
            if samples > self._allowed_samples:
                self._allowed_samples = samples
                self._room.notify()  # one thread; it passes the baton on while room is left

    def next_group(self) -> DecodedGroup | None:
        """The next group in stream order, once decoded (None after the last). Raises the error
        that planning or decoding it raised, in the caller's thread."""
        with self._lock:
            self._ready.wait_for(lambda: self._stopping or (self._queue and self._queue[0].done)
                                 or (self._exhausted and not self._queue))
            if not self._queue or not self._queue[0].done:
                return None
            group = self._queue.popleft()
        if group.error is not None:
            raise group.error
        return group

    def close(self) -> None:
        """Stop planning, let groups being decoded finish, join the threads."""
        with self._lock:
            self._stopping = True
            self._ready.notify_all()
            self._room.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        close = getattr(self._groups, "close", None)
        if close is not None:
            close()

    # -- decode threads ---------------------------------------------------------------------------

    def _end(self, failed: DecodedGroup | None = None) -> None:
        """Planning is over (``failed`` carries its error): wake everyone to see it. Holds ``_lock``."""
        if failed is not None:
            self._queue.append(failed)
        self._exhausted = True
        self._ready.notify_all()
        self._room.notify_all()

    def _run(self) -> None:
        try:
            cache = self._open_cache()
        except BaseException as error:  # the consumer must hear of it, not wait for this thread
            with self._lock:
                self._end(_failed(self._planned_samples, error))
            return
        try:
            while (group := self._plan_next()) is not None:
                try:
                    group.result = self._work(cache, group.first_sample, group.group)
                except BaseException as error:  # handed to the consumer's thread by next_group
                    group.error = error
                with self._lock:
                    group.done = True
                    if self._queue and self._queue[0] is group:
                        self._ready.notify()  # only the head of the queue lets the consumer on
        finally:
            if self._close_cache is None:
                cache.close()
            else:
                self._close_cache(cache)

    def _has_room(self) -> bool:
        return self._stopping or self._exhausted or self._planned_samples < self._allowed_samples

    def _plan_next(self) -> DecodedGroup | None:
        while True:
            with self._lock:
                self._room.wait_for(self._has_room)
                if self._stopping or self._exhausted:
                    return None
            with self._plan_lock:
                with self._lock:  # another thread may have planned while this one waited for the lock
                    if self._stopping or self._exhausted:
                        return None
                    if self._planned_samples >= self._allowed_samples:
                        continue
                try:
                    planned = next(self._groups)
                except StopIteration:
                    with self._lock:
                        self._end()
                    return None
                except BaseException as error:
                    # Planning is sequential: nothing after a failed group can be planned.
                    with self._lock:
                        self._end(_failed(self._planned_samples, error))
                    return None
                with self._lock:
                    group = DecodedGroup(self._planned_samples, planned)
                    self._queue.append(group)
                    self._planned_samples += group.count
                    if self._planned_samples < self._allowed_samples:
                        self._room.notify()  # the baton: room is left for another thread to plan
                    return group


def split_opening(groups: Iterator[PlannedGroup], *, samples: int, part_size: int) -> Iterator[PlannedGroup]:
    """``groups`` with their first ``samples`` samples cut into parts of at most ``part_size`` (the
    rest of a group so cut stays one part), so that threads share the first batch's decode instead
    of one thread decoding a whole group while the others wait (``EpisodeLoader``: the first batch,
    in a part per thread). Samples and their order are unchanged: a group is a run of consecutive
    samples, and its evictions go with its last part (released once all its samples are decoded)."""
    seen = 0
    for group in groups:
        pendings = group.pendings
        if len(pendings) <= part_size:
            yield group
        else:
            head = min(len(pendings), samples - seen)  # this group's samples in the first batch
            bounds = sorted({*range(0, head, part_size), head, len(pendings)})
            for a, b in zip(bounds, bounds[1:]):
                yield PlannedGroup(pendings[a:b], group.evicted if b == len(pendings) else [])
        seen += len(pendings)
        if seen >= samples:
            break
    yield from groups  # past the first batch: as planned


def split_closing(groups: Iterator[PlannedGroup], *, from_sample: int, part_size: int) -> Iterator[PlannedGroup]:
    """``groups`` with their samples from stream position ``from_sample`` on (a pass's last ones)
    cut into parts of at most ``part_size``, so that the threads finish the pass nearly together
    instead of all but a few waiting idle while those decode their last whole groups
    (``EpisodeLoader``: the last decode group of each thread). Samples, their order and where
    evictions go are kept as ``split_opening`` keeps them."""
    seen = 0
    for group in groups:
        pendings = group.pendings
        start = from_sample - seen  # this group's first sample to cut (<= 0: all of it)
        seen += len(pendings)
        if seen <= from_sample or len(pendings) <= part_size:
            yield group
            continue
        bounds = sorted({0, *range(max(0, start), len(pendings), part_size), len(pendings)})
        for a, b in zip(bounds, bounds[1:]):
            yield PlannedGroup(pendings[a:b], group.evicted if b == len(pendings) else [])


def stream_samples(stream: ConsumerStream, *, decode_threads: int, group_size: int,
                   opened: list[DecoderSet] | None = None) -> Iterator[dict[str, Any]]:
    """A stream's samples, in order, for a dataset's (or mixture's) own ``__iter__``: groups built
    in this thread when ``decode_threads`` is 1, else on a ``GroupPipeline``; ``opened`` collects
    the decoders opened (for ``decoder_stats``). Marks the epoch finished after the last sample."""

    def open_decoders() -> DecoderSet:
        decoders = stream.open_decoders(decode_threads)
        if opened is not None:
            opened.append(decoders)  # list.append is atomic; read only for stats
        return decoders

    def build(decoders: DecoderSet, first_sample: int, group: PlannedGroup) -> list[dict[str, Any]]:
        if not group.pendings:
            return []
        with trace_span("build", cat="samples", samples=len(group.pendings)):
            return build_samples(stream.builder, decoders, group.pendings)

    if decode_threads == 1:  # no thread to hand groups to: build them here
        decoders = open_decoders()
        try:
            for group in stream.groups():
                yield from build(decoders, 0, group)
                stream.release(group)
        finally:
            decoders.close()
            stream.close()
        stream.finished()
        return
    # Enough groups in flight to keep every thread busy while the consumer takes samples.
    ahead = 2 * decode_threads * group_size
    pipeline = GroupPipeline(stream.groups(), work=build, open_cache=open_decoders,
                             num_threads=decode_threads, allowed_samples=ahead)
    try:
        done = 0
        while (decoded := pipeline.next_group()) is not None:
            done += decoded.count
            pipeline.allow(done + ahead)
            yield from decoded.result
            stream.release(decoded.group)
    finally:
        pipeline.close()
        stream.close()
    stream.finished()
