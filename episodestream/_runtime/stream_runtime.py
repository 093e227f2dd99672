"""The package-internal component API: what loaders and mixtures drive.

A public streaming class (``EpisodeStreamingDataset``, ``EpisodeMixture``) is a face: it checks its
arguments and holds one ``StreamRuntime``, its runtime. ``EpisodeLoader`` and ``EpisodeMixture`` reach
a face's runtime only through ``runtime_of``, never through its privates, and the faces keep their
public surface to what users call (iterate, ``len``, ``set_epoch``, ``state_dict`` /
``load_state_dict``). A runtime's resume half (saving, checking and applying states) is
``_runtime.resume.resumable``'s, written once for datasets and mixtures.
"""

from __future__ import annotations

from abc import abstractmethod

from episodestream._base.world import World
from episodestream._runtime.resume.epoch import Claim
from episodestream._runtime.resume.resumable import Resumable
from episodestream._runtime.stream import ConsumerStream


class StreamRuntime(Resumable):
    """One streaming face's runtime: its epoch, its consumers' streams and its resume position."""

    @property
    def epoch(self) -> int:
        """The epoch the next iteration streams."""
        return self.shared_epoch.get()

    def set_epoch(self, epoch: int) -> None:
        self.shared_epoch.set(epoch)

    @abstractmethod
    def num_samples(self) -> int:
        """Samples this rank yields in the next iteration (what ``len(face)`` says)."""

    @abstractmethod
    def consumer_stream(self, world: World, claim: Claim) -> ConsumerStream:
        """Open ``world``'s pass over ``claim``'s epoch (``claim``: what ``Resumable.claim`` read of the
        resume record), marking the epoch started."""
