"""The seam between what streams samples (a dataset, a mixture) and what pulls them (the loaders).

A runtime (``stream_runtime.StreamRuntime``) opens, per consumer and epoch, a ``ConsumerStream``:
decode groups planned in stream order (rows read, video admitted, frames still to decode), the one
``GroupBuilder`` that decodes and finishes them, and fresh decoders for each decode thread. The
dataset's own ``__iter__`` and ``EpisodeLoader`` both pull from it, so neither reaches into the
other's internals. What a group's decoders are, and what its evictions are, is the stream's
business: a loader hands them back to the stream's builder and ``release`` untouched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from episodestream._sample.builder import PendingSample
from episodestream._sample.chw import FrameWrites
from episodestream._sample.video.decoder_cache import DecoderCache


@dataclass
class PlannedGroup:
    """Samples planned together: tabular part built, video still to decode."""

    pendings: list[PendingSample]
    evicted: list[Any]  # what ``release`` frees once these are decoded (the stream's own tokens)


class DecoderSet(Protocol):
    """One decode thread's decoders, as the stream's builder uses them (its share of the consumer's
    ``DecoderCache``, or a mixture's shares of every component's); one thread's at a time."""

    def caches(self) -> list[DecoderCache]: ...  # the caches it reads through, for their stats

    def close(self) -> None: ...


class GroupBuilder(Protocol):
    """What decodes and finishes a stream's samples: ``SampleBuilder``, or a mixture's."""

    @property
    def frame_dtype(self) -> Any: ...  # torch.dtype of camera frames

    @property
    def writes_in_place(self) -> bool: ...

    def decode(self, decoders: Any, pendings: Sequence[PendingSample]) -> dict[str, Any]: ...

    def frame_writer(self, out: Any, frames_nhwc: Any) -> FrameWrites: ...

    def tabular(self, pending: PendingSample) -> dict[str, Any]: ...

    def finish(self, pending: PendingSample, frames: Sequence[Any]) -> dict[str, Any]: ...


def summed_stats(decoder_sets: Sequence[DecoderSet]) -> dict[str, int]:
    """The stats (hits, misses, evictions, open, capacity) of the caches the decoder sets read
    through, each cache counted once (a consumer's threads share theirs), summed key by key."""
    caches = {id(cache): cache for decoders in list(decoder_sets)  # a copy: threads append theirs as they start
              for cache in decoders.caches()}
    totals: dict[str, int] = {}
    for cache in caches.values():
        for key, value in cache.stats().items():
            totals[key] = totals.get(key, 0) + value
    return totals


class ConsumerStream(ABC):
    """One consumer's pass over its share of an epoch, as loaders pull it.

    ``groups()`` plans in stream order and is called from one thread at a time (the pipeline's
    planning lock); ``builder`` and ``open_decoders`` are used by decode threads; ``release`` runs
    in the consumer's thread once a group's samples are handed out in order.
    """

    num_samples: int  # samples this pass emits
    num_cameras: int  # camera keys per sample (sizes batch memory)
    group_size: int  # samples per planned group, at most (sizes how far ahead threads plan)
    builder: GroupBuilder  # decodes and finishes every group's samples
    # Whether decoders from open_decoders() may serve the next pass of the same runtime (its video
    # files stay where they are, unchanged: ``DatasetFiles.videos_stay_in_place``).
    decoders_outlive_pass: bool

    @abstractmethod
    def groups(self) -> Iterator[PlannedGroup]:
        """The planned groups, in stream order."""

    @abstractmethod
    def open_decoders(self, threads: int = 1) -> DecoderSet:
        """One of ``threads`` decode threads' share of the pass's decoders (one cache the threads
        share, within the consumer's budget: ``_runtime.core.DatasetCore.decoder_cache``); called
        from each thread as it starts."""

    @abstractmethod
    def release(self, group: PlannedGroup) -> None:
        """``group``'s samples are decoded: release the video of the episodes it evicted."""

    @abstractmethod
    def finished(self) -> None:
        """The pass's last sample was handed out: its epoch is done."""

    @abstractmethod
    def close(self) -> None:
        """Release what the pass holds (cached video); safe to call twice."""


@dataclass(frozen=True)
class CheckedState:
    """A validated resume state: its epoch, whether that epoch is already finished, and what the
    source that checked it needs to apply it (opaque to loaders)."""

    epoch: int
    finished: bool
    request: Any
    consumed_batches: int = 0  # batches of ``epoch`` the state took, from its start across legs
