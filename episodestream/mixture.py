"""``EpisodeMixture``: several ``EpisodeStreamingDataset`` streamed as one weighted, resumable stream.

The planning (counts, passes, interleaving, resume) is ``_plan.mixing``; this module runs it: each
component's steps through that component's own pool and decoder, the samples interleaved in the
consumer's order, keys renamed, ``dataset_index`` added. See ``docs/mixtures.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from episodestream._base.options import check_choice, check_int
from episodestream._plan.mix_options import check_stop, check_weights
from episodestream._runtime.dataset_runtime import DatasetRuntime
from episodestream._runtime.mixture.meta import MixtureMeta
from episodestream._runtime.mixture.schema import KEY_MODES, mixture_schema
from episodestream._runtime.mixture.runtime import MixtureRuntime
from episodestream._runtime.mixture.stats import MixtureStats, row_weights
from episodestream._runtime.mixture.renames import check_renames
from episodestream._runtime.face import StreamingFace, runtime_of
from episodestream.streaming import EpisodeStreamingDataset

def _component(dataset: EpisodeStreamingDataset) -> DatasetRuntime:
    component = runtime_of(dataset, needs="EpisodeMixture needs")
    assert isinstance(component, DatasetRuntime)  # EpisodeStreamingDataset's runtime, checked by the caller
    return component


class EpisodeMixture(StreamingFace):
    """Streams several ``EpisodeStreamingDataset`` as one stream, mixed by weight, resumable.

    Every rank yields ``len(self)`` samples per epoch. The arguments, by purpose: what to mix
    (``datasets``, ``weights``, ``rename``, ``keys``, ``resize``), what an epoch is (``stop``; see
    docs/mixtures.md) and determinism (``seed``).

    Args:
        datasets (Sequence[EpisodeStreamingDataset]): the components (local folders, Hub ids and
            URLs alike), each built with its own options (windows, pool size, shuffle, seed); they
            must share rank and world size.
        weights (Sequence[float] | None): each component's share of the samples (positive;
            normalised). None: in proportion to their frames, which makes the mixture a shuffled
            concatenation. Defaults to ``None``.
        rename (Sequence[Mapping[str, str] | None] | None): a list aligned with ``datasets`` of
            ``{its key: mixture key}`` dicts (or None), so that cameras named differently meet under
            one key (applied before ``keys``). Defaults to ``None``.
        keys (str): which keys a sample has when the components' schemas differ (docs/mixtures.md,
            "Mixtures across schemas"): "same": every component must give the same keys, dtypes,
            shapes and window lengths (else one ValueError lists the differences); "union": every
            key of any component, zeros plus ``<key>_is_missing`` where a component lacks it;
            "intersection": only the keys every component has. Under both, a numeric feature
            narrower than the widest component's is zero-padded on its last axis, with a
            ``<key>_dim_mask``. Defaults to ``"same"``.
        resize (Mapping[str, tuple[int, int]] | None): ``{mixture camera key: (height, width)}``:
            resize that camera's frames (torch's bilinear ``interpolate`` with antialiasing) where a
            component's differ; cameras of different sizes are refused otherwise. Defaults to ``None``.
        stop (str | int): "all": the epoch lasts until every component has run to its end at least
            once (components weighted above their share repeat, each pass freshly permuted);
            "first": until the first component runs to its end (the others are cut short); an int:
            that many samples per epoch across all ranks. Defaults to ``"all"``.
        seed (int): with the epoch, fixes each component's pass permutations and every consumer's
            interleaving (drawn from (seed, epoch, rank, worker)). Defaults to ``0``.

    Yields:
        dict[str, Any]: each sample is its component's sample (keys renamed, reconciled by
        ``keys``) plus ``dataset_index``, an int64 tensor: the component's position in
        ``datasets``, and ``robot_type``, the component's info.json string.

    Raises:
        TypeError: ``datasets`` is not a non-empty list of ``EpisodeStreamingDataset``, or an
            argument of the wrong type.
        ValueError: components of different ranks or world sizes, schemas ``keys`` cannot
            reconcile, camera frames of different dtypes, a bad weight, ``stop``, ``rename`` or
            ``resize``, or an epoch too large to plan.
    """

    _runtime: MixtureRuntime

    def __init__(self, datasets: Sequence[EpisodeStreamingDataset], weights: Sequence[float] | None = None, *,
                 seed: int = 0, stop: str | int = "all",
                 rename: Sequence[Mapping[str, str] | None] | None = None, keys: str = "same",
                 resize: Mapping[str, tuple[int, int]] | None = None) -> None:
        super().__init__()
        if isinstance(datasets, EpisodeStreamingDataset) or not isinstance(datasets, Sequence) or not datasets:
            raise TypeError(f"datasets must be a non-empty list of EpisodeStreamingDataset, got {datasets!r:.200}.")
        wrong = [type(d).__name__ for d in datasets if not isinstance(d, EpisodeStreamingDataset)]
        if wrong:
            raise TypeError(f"datasets must be EpisodeStreamingDataset objects, got {wrong[0]}.")
        places = {(d.rank, d.world_size) for d in datasets}
        if len(places) > 1:
            raise ValueError(f"The datasets of a mixture must share rank and world_size, got {sorted(places)}.")
        self.datasets = list(datasets)
        weights, seed, stop = check_weights(weights, len(datasets)), check_int("seed", seed, minimum=0), check_stop(stop)
        renames = check_renames(rename, [d.typed_meta.features for d in datasets],
                                [d.typed_meta.description for d in datasets])
        keys = check_choice("keys", keys, KEY_MODES)
        if resize is not None and not isinstance(resize, Mapping):
            raise TypeError(f"resize must be a dict {{camera key: (height, width)}}, got {resize!r:.200}.")
        components = [_component(d) for d in self.datasets]
        schema = mixture_schema(components, renames, keys=keys, resize=resize)
        self._runtime = MixtureRuntime(components, weights=weights, seed=seed, stop=stop,
                                     renames=renames, schema=schema)
        self._runtime.rank_counts()  # an epoch too large to plan is refused now, not at len() or the first sample
        self._meta: MixtureMeta | None = None

    # How it mixes, as constructed (read-only: the runtime holds them).
    weights = property(lambda self: self._runtime.weights)
    seed = property(lambda self: self._runtime.seed)
    stop = property(lambda self: self._runtime.stop)
    keys = property(lambda self: self._runtime.schema.mode)
    rank = property(lambda self: self._runtime.rank)
    world_size = property(lambda self: self._runtime.world_size)

    # -- what it is -------------------------------------------------------------------------------

    @property
    def meta(self) -> MixtureMeta:
        """Per-source metadata (``meta.sources``), the mixture's features, and its exact stats
        (``meta.stats``, weighted by each component's share of the epoch; ``meta.component_stats``)."""
        if self._meta is None:
            frames = [d.num_frames for d in self.datasets]
            # Unweighted, components mix by their anchors (kept frames times episode weights).
            anchors = [c.num_anchors() for c in self._runtime.components]
            weights = self.weights or tuple(a / sum(anchors) for a in anchors)
            source = self._runtime
            exact = MixtureStats(source.components, source.schema, source.renames,
                                 row_weights(source.rank_counts(), anchors, weighted=self.weights is not None))
            self._meta = MixtureMeta(sources=[d.meta for d in self.datasets], renames=source.renames,
                                     weights=weights, frames=frames, features=source.schema.features(), stats=exact)
        return self._meta

    @property
    def pool_sizes(self) -> tuple[int, ...]:
        return self._runtime.pool_sizes

    def rank_counts(self) -> list[int]:
        """Samples each component gives every rank in a fresh epoch.

        Returns:
            list[int]: one count per component, in the order of ``datasets``.
        """
        return self._runtime.rank_counts()

    # -- streaming --------------------------------------------------------------------------------

    _face = "mixture"
    _by_index = ("For samples by index, index each component's map-style twin, EpisodeDataset(source, ...)[i] "
                 "(the same source options, the same samples).")

    def _decode_settings(self) -> dict[str, Any]:
        # Decoded on the components' most threads, in their largest groups.
        return {"decode_threads": max(d.decode_threads for d in self.datasets),
                "group_size": max(d.decode_group_size for d in self.datasets)}

    def close(self) -> None:
        """Release the components' holds on remote sources' cached metadata."""
        for dataset in self.datasets:
            dataset.close()

