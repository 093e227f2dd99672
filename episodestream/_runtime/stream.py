"""The seam between what streams samples (a dataset, a mixture) and what pulls them (the loaders).

A *stream source* (``EpisodeStreamingDataset``, ``EpisodeMixture``) opens, per consumer and epoch, a
``ConsumerStream``: decode groups planned in stream order (rows read, video admitted, frames still
to decode), the ``SampleBuilder`` that finishes each group's samples, and one thread's decoders.
The dataset's own ``__iter__`` and ``EpisodeLoader`` both pull from it, so neither reaches into
the other's internals, and a mixture plugs in by giving a stream whose groups come from several
sources (``PlannedGroup.source`` says which).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from episodestream._sample.builder import PendingSample
from episodestream._format.metadata import EpisodeInfo


@dataclass
class PlannedGroup:
    """Samples planned together from one source: tabular part built, video still to decode."""

    pendings: list[PendingSample]
    evicted: list[EpisodeInfo]  # episodes whose video may be released once these are decoded
    source: int = 0  # which of the stream's sources planned it (a mixture's component)


class DecoderSet(Protocol):
    """What a source's builder decodes with: a ``DecoderCache``, or a mixture's bundle of them."""

    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...


class GroupBuilder(Protocol):
    """What decodes and finishes a source's samples: ``SampleBuilder``, or a mixture's wrapper."""

    @property
    def frame_dtype(self) -> Any: ...  # torch.dtype of camera frames

    @property
    def writes_in_place(self) -> bool: ...

    def decode(self, cache: Any, pendings: Sequence[PendingSample]) -> dict[str, Any]: ...

    def write_frame(self, out: Any, frame_uint8: Any) -> None: ...

    def finish(self, pending: PendingSample, frames: Sequence[Any]) -> dict[str, Any]: ...

    def build(self, cache: Any, pendings: Sequence[PendingSample]) -> list[dict[str, Any]]: ...


class Decoders:
    """One thread's decoders, one set per source: a decoder is never shared between threads."""

    def __init__(self, caches: Sequence[DecoderSet]) -> None:
        self._caches = list(caches)

    def __getitem__(self, source: int) -> Any:  # the source's builder knows what it gets
        return self._caches[source]

    def stats(self) -> dict[str, int]:
        return summed_stats(self._caches)

    def close(self) -> None:
        for cache in self._caches:
            cache.close()


def summed_stats(decoder_sets: Sequence[DecoderSet]) -> dict[str, int]:
    """The decoder sets' ``stats()`` (hits, misses, evictions), summed key by key."""
    totals: dict[str, int] = {}
    for decoders in list(decoder_sets):  # a copy: decode threads append theirs as they start
        for key, value in decoders.stats().items():
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
    num_sources: int = 1  # the sources whose groups it interleaves; ``PlannedGroup.source`` < this

    @abstractmethod
    def groups(self) -> Iterator[PlannedGroup]:
        """The planned groups, in stream order."""

    @abstractmethod
    def builder(self, source: int) -> GroupBuilder:
        """What decodes and finishes the samples of ``source``'s groups."""

    @abstractmethod
    def open_decoders(self) -> Decoders:
        """Fresh decoder caches for one decode thread, one per source."""

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
