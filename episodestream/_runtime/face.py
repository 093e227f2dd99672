"""``StreamingFace``: what the public streaming classes (``EpisodeStreamingDataset``, ``EpisodeMixture``)
share, written once: their epoch, length, iteration and resume calls, each handed to the face's
runtime (``StreamRuntime``). A face adds only its own construction and what it tells about itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, NoReturn

import torch.utils.data

from episodestream._base.options import check_bool, check_int
from episodestream._base.tracing import set_process_name, tracer_enabled
from episodestream._runtime.resume.epoch import raising
from episodestream._runtime.lookahead.pipeline import stream_samples
from episodestream._runtime.placement import current_world
from episodestream._runtime.stream import ConsumerStream
from episodestream._runtime.stream_runtime import StreamRuntime


class StreamingFace(torch.utils.data.IterableDataset):
    """The base of the public classes that stream: they hold their runtime in ``_runtime``."""

    _runtime: StreamRuntime
    _face: ClassVar[str]  # "dataset", "mixture": what messages and trace process names call it
    _by_index: ClassVar[str]  # where samples by index come from instead (``__getitem__``'s error)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration streams."""
        return self._runtime.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration streams (reaches persistent DataLoader workers too).

        Args:
            epoch (int): the epoch, 0 or more.

        Raises:
            TypeError: ``epoch`` is not an int.
            ValueError: ``epoch`` is negative.
        """
        self._runtime.set_epoch(check_int("epoch", epoch, minimum=0))

    def __len__(self) -> int:
        """Samples this rank yields in the next iteration.

        Returns:
            int: its share of the epoch, or what is left of a resumed epoch (assuming the saving
            run's num_workers).
        """
        return self._runtime.num_samples()

    def __getitem__(self, index: Any) -> NoReturn:
        """A stream has no samples by index (the error says where they are).

        Args:
            index (Any): any index.

        Raises:
            TypeError: always, naming the map-style twin (``EpisodeDataset``) or what to index instead.
        """
        # torch's Dataset.__getitem__ says only "Subclasses of Dataset should implement __getitem__".
        raise TypeError(f"{type(self).__name__} streams and cannot be indexed ({self._face}[{index!r}]): iterate it "
                        f"(for sample in {self._face}: ..., a DataLoader or an EpisodeLoader). {self._by_index}")

    def _refusal(self) -> BaseException | None:
        """An error the first ``next()`` raises instead of streaming (None: stream)."""
        return None

    def _decode_settings(self) -> dict[str, Any]:
        """``stream_samples``' threads and group size for this face."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Stream this consumer's share of the epoch the dataset is at (``epoch``), from where a
        loaded state left it; running to the end advances the epoch.

        Yields:
            dict[str, Any]: the samples, in this consumer's order.
        """
        # Not a generator itself: the epoch is marked started when the DataLoader asks for the
        # iterator, so a checkpoint taken before the first batch already names this epoch.
        runtime = self._runtime
        world = current_world(runtime.rank, runtime.world_size)
        if (refused := self._refusal()) is not None:
            return raising(refused)
        claim = runtime.claim(world)  # the epoch and what it resumes, read once from the shared record
        if tracer_enabled():
            name = "" if self._face == "dataset" else f"{self._face} "
            set_process_name(f"episodestream {name}rank {world.rank} worker {world.worker}")
        return self._samples(runtime.consumer_stream(world, claim))

    def _samples(self, stream: ConsumerStream) -> Iterator[dict[str, Any]]:
        position = self._runtime.position
        for sample in stream_samples(stream, **self._decode_settings()):
            position.samples_yielded += 1  # before the yield: a state taken once the sample is out counts it
            yield sample

    # -- resume -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This consumer's resume state.

        The trainer adds ``batches_consumed`` (batches taken from this epoch's loader, counted from
        the start of the epoch, across resumes), ``batch_size``, ``num_workers`` and ``drop_last``
        (``stream_state(loader, n)`` does) and passes the result to ``load_state_dict`` on restart;
        torchdata's StatefulDataLoader saves it as it is, per consumer.

        Returns:
            dict[str, Any]: a small JSON-serialisable state: the epoch, what identifies the stream
            (seed, fingerprint), its layout and this consumer's position.
        """
        return self._runtime.state_dict()

    def load_state_dict(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Resume from ``state``; the next iteration continues its epoch.

        Args:
            state (Mapping[str, Any]): a trainer's state (``stream_state``'s,
                ``EpisodeLoader.state_dict()``), continued exactly with the same ranks, workers and
                pool sizes, else elastically; or ``state_dict()`` itself (what StatefulDataLoader
                saves per consumer), which resumes the same consumer.
            strict (bool): refuse a state whose identity (seed, shuffle, fingerprint: source,
                revision, episode selection, windows, dataset size; a mixture's weights, stop and
                components) differs; False loads it anyway. Defaults to ``True``.

        Raises:
            TypeError: ``strict`` is not a bool, or ``state`` is not a state.
            ValueError: ``state`` is malformed, of another format, or (``strict``) of another stream.
        """
        strict = check_bool("strict", strict)
        saved = self._runtime.parse(state)
        if saved.consumer is not None:
            self._runtime.load_consumer_state(saved, strict=strict)
            return
        self._runtime.apply_state(self._runtime.check_state(saved, strict=strict))


def load_trainer_state(face: StreamingFace, state: Mapping[str, Any], *, num_workers: int) -> None:
    """``face.load_state_dict(state)`` for a trainer's state (``stream_state``'s), told the DataLoader
    ``num_workers`` that will iterate (lerobot-train knows it), so that the line it logs says whether
    the resume is exact or elastic rather than what it would be with the saved count."""
    runtime = face._runtime
    runtime.apply_state(runtime.check_state(runtime.parse(state)), num_workers=num_workers)


def runtime_of(face: object, *, needs: str = "EpisodeLoader needs") -> StreamRuntime:
    """``face``'s runtime; for anything that does not stream, a ``TypeError`` that starts with ``needs``."""
    if not isinstance(face, StreamingFace):
        raise TypeError(f"{needs} an EpisodeStreamingDataset (or another stream source, such as an "
                        f"EpisodeMixture), got {type(face).__name__}.")
    return face._runtime
