"""``EpisodeMixture``: several ``EpisodeStreamingDataset`` streamed as one weighted, resumable stream.

The planning (counts, passes, interleaving, resume) is ``_mixing``; this module runs it: each
component's steps through that component's own pool and decoder, the samples interleaved in the
consumer's order, keys renamed, ``dataset_index`` added. See ``docs/mixtures.md``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch.utils.data

from episodestream._runtime.epoch import SharedEpoch, StaleWorkerCopy, raising
from episodestream._plan.mixing import (
    LegPlan,
    MixLeg,
    MixResume,
    Source,
    initial_passes,
    plan_mixture_resume,
    rank_counts,
)
from episodestream._plan.mix_options import check_stop, check_weights
from episodestream._runtime.mixture_meta import MixtureMeta
from episodestream._runtime.mixture_stream import MixtureStream
from episodestream._runtime.renames import check_renames
from episodestream._base.options import check_bool, check_int
from episodestream._runtime.pipeline import stream_samples
from episodestream._plan.resume import BeyondEpochError, chain_legs
from episodestream._plan.sampling import Step
from episodestream._runtime.stream import CheckedState, ConsumerStream
from episodestream._base.world import World, current_world
from episodestream.streaming import EpisodeStreamingDataset
from episodestream._base.tracing import set_process_name, tracer_enabled

MIXTURE_STATE_FORMAT = "episodestream.mixture_state/1"


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _feature_table(dataset: EpisodeStreamingDataset, rename: Mapping[str, str]) -> dict[str, str]:
    """Each (renamed) feature's dtype, shape and window length, as text to compare and to show."""
    offsets = dataset._core.offsets
    table = {}
    for key, feature in dataset.typed_meta.features.items():
        window = f", window of {len(offsets[key])}" if key in offsets else ""
        table[rename.get(key, key)] = f"{feature.dtype} {list(feature.shape)}{window}"
    return table


def _check_features(datasets, renames) -> None:
    tables = [_feature_table(d, r) for d, r in zip(datasets, renames)]
    keys = list(dict.fromkeys(k for t in tables for k in t))
    lines = []
    for key in keys:
        seen = [t.get(key, "missing") for t in tables]
        if len(set(seen)) > 1:
            lines.append(f"{key!r}: " + "; ".join(f"dataset {i} ({d.typed_meta.description}) {s}"
                                                   for i, (d, s) in enumerate(zip(datasets, seen))))
    if lines:
        raise ValueError("The datasets of a mixture must give the same keys, dtypes, shapes and window lengths "
                         "(after rename=); these differ:\n  " + "\n  ".join(lines))


class EpisodeMixture(torch.utils.data.IterableDataset):
    """Streams several ``EpisodeStreamingDataset`` as one stream, mixed by weight, resumable.

    What to mix:
        datasets: the components (local folders, Hub ids and URLs alike), each built with its own
            options (windows, pool size, shuffle, seed); they must share rank and world size.
        weights: each component's share of the samples (positive; normalised). Default: in
            proportion to their frames, which makes the mixture a shuffled concatenation.
        rename: a list aligned with ``datasets`` of ``{its key: mixture key}`` dicts (or None), so
            that cameras named differently meet under one key. After renaming, every component must
            give the same keys, dtypes, shapes and window lengths (else one ValueError lists them).

    What an epoch is (see docs/mixtures.md):
        stop: "all" (default): the epoch lasts until every component has run to its end at least
            once (components weighted above their share repeat, each pass freshly permuted);
            "first": until the first component runs to its end (the others are cut short);
            an int: that many samples per epoch across all ranks.

    Determinism:
        seed: with the epoch, fixes each component's pass permutations and every consumer's
            interleaving (drawn from (seed, epoch, rank, worker)).

    Every rank yields ``len(self)`` samples per epoch; each sample is its component's sample (keys
    renamed) plus ``dataset_index``, an int64 tensor: the component's position in ``datasets``.
    """

    def __init__(self, datasets: Sequence[EpisodeStreamingDataset], weights: Sequence[float] | None = None, *,
                 seed: int = 0, stop: str | int = "all",
                 rename: Sequence[Mapping[str, str] | None] | None = None) -> None:
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
        self.rank, self.world_size = datasets[0].rank, datasets[0].world_size
        self.weights = check_weights(weights, len(datasets))
        self.seed = check_int("seed", seed, minimum=0)
        self.stop = check_stop(stop)
        self.rank_counts()  # an epoch too large to plan is refused now, not at len() or the first sample
        self._renames = check_renames(rename, [d.typed_meta.features for d in datasets],
                                      [d.typed_meta.description for d in datasets])
        _check_features(self.datasets, self._renames)
        dtypes = [str(d._core.builder.frame_dtype).removeprefix("torch.") for d in self.datasets]
        if len(set(dtypes)) > 1:
            raise ValueError(f"The datasets of a mixture must give camera frames of one dtype (return_uint8 alike); "
                             f"they give {dtypes}.")
        self._epoch = SharedEpoch()
        self._loads_seen = 0
        self._resume_request: tuple[int, tuple[MixLeg, ...]] | None = None  # (epoch, legs)
        self._resume_points: dict[int, MixResume | None] = {}
        self._legs: dict[tuple, LegPlan] = {}
        self._meta: MixtureMeta | None = None

    def __getstate__(self) -> dict:
        # DataLoader workers rebuild leg plans (episode permutations) rather than unpickle them.
        return {**self.__dict__, "_legs": {}}

    # -- what it is -------------------------------------------------------------------------------

    @property
    def meta(self) -> MixtureMeta:
        """Per-source metadata (``meta.sources``) and stats aggregated by frames (``meta.stats``)."""
        if self._meta is None:
            frames = [d.num_frames for d in self.datasets]
            weights = self.weights or tuple(f / sum(frames) for f in frames)
            self._meta = MixtureMeta(sources=[d.meta for d in self.datasets], renames=self._renames,
                                     weights=weights, frames=frames)
        return self._meta

    @property
    def pool_sizes(self) -> tuple[int, ...]:
        return tuple(d.episode_pool_size for d in self.datasets)

    def _sources(self) -> list[Source]:
        return [Source(tuple(d._core.whole_episodes()), d.seed, d.shuffle) for d in self.datasets]

    @property
    def epoch(self) -> int:
        return self._epoch.get()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration streams (reaches persistent DataLoader workers too)."""
        self._epoch.set(check_int("epoch", epoch, minimum=0))

    def rank_counts(self) -> list[int]:
        """Samples each component gives every rank in a fresh epoch."""
        return rank_counts([d.num_frames for d in self.datasets], world_size=self.world_size,
                           weights=self.weights, stop=self.stop)

    def __len__(self) -> int:
        """Samples this rank yields in the next iteration (what is left, after a resume, assuming the
        saving run's num_workers)."""
        epoch = self.epoch
        request = self._resume_request
        if request is None or request[0] != epoch:
            return sum(self.rank_counts())
        workers = request[1][-1].num_workers
        point = self._resume_point(workers)
        if point is None:
            return 0
        leg = self._leg(point, epoch, workers)
        skipped = sum(point.skips[self.rank][0]) if point.skips is not None else 0
        return leg.samples_per_rank - skipped

    def _leg(self, point: MixResume | None, epoch: int, num_workers: int) -> LegPlan:
        key = (epoch, max(1, num_workers), None if point is None else point.leg_index)
        if key not in self._legs:
            sources = self._sources()
            passes = (initial_passes(sources, self.rank_counts(), self.world_size) if point is None
                      else point.passes)
            self._legs[key] = LegPlan(sources, passes, seed=self.seed, epoch=epoch,
                                      leg=0 if point is None else point.leg_index, world_size=self.world_size,
                                      num_workers=num_workers, pool_sizes=self.pool_sizes)
        return self._legs[key]

    def _resume_point(self, num_workers: int) -> MixResume | None:
        epoch, legs = self._resume_request
        key = max(1, num_workers)
        if key not in self._resume_points:
            self._resume_points[key] = plan_mixture_resume(
                self._sources(), seed=self.seed, epoch=epoch, weights=self.weights, stop=self.stop, legs=legs,
                world_size=self.world_size, num_workers=key, pool_sizes=self.pool_sizes)
        return self._resume_points[key]

    # -- streaming --------------------------------------------------------------------------------

    def consumer_plan(self, world: World, epoch: int) -> tuple[np.ndarray, list[Iterator[Step]]]:
        """One consumer's interleave order (the component of each sample it yields) and each
        component's steps, tabular-free; in the epoch a state was loaded for, what is left."""
        request = self._resume_request
        point = self._resume_point(world.num_workers) if request and request[0] == epoch else None
        if request and request[0] == epoch and point is None:
            return np.zeros(0, np.int64), [iter(()) for _ in self.datasets]
        leg = self._leg(point, epoch, world.num_workers)
        role, skip = point.role_for(world) if point else (world, 0)
        consumer = leg.consumer(role)
        skips = consumer.counts_before(skip)
        return consumer.order()[skip:], [consumer.steps(i, skips[i]) for i in range(len(self.datasets))]

    def consumer_stream(self, world: World, epoch: int) -> ConsumerStream:
        """Open ``world``'s pass over ``epoch`` for a loader to pull (see ``_stream``); marks the
        epoch started."""
        self._epoch.start(epoch)
        order, steps = self.consumer_plan(world, epoch)
        counts = np.bincount(order, minlength=len(self.datasets)).tolist()
        streams = [d._stream(s, count, epoch) for d, s, count in zip(self.datasets, steps, counts)]
        return MixtureStream(streams, order, renames=self._renames,
                             group_size=min(d.decode_group_size for d in self.datasets),
                             finished=lambda: self._epoch.finished(epoch))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        world = current_world(self.rank, self.world_size)
        try:
            epoch = self._epoch.for_iteration(self._loads_seen, "mixture")
        except StaleWorkerCopy as error:
            return raising(error)  # from the first next(), where the trainer hears of it
        if tracer_enabled():
            set_process_name(f"episodestream mixture rank {world.rank} worker {world.worker}")
        return self._samples(self.consumer_stream(world, epoch))

    def _samples(self, stream: ConsumerStream) -> Iterator[dict[str, Any]]:
        """The stream's samples in order, decoded on ``decode_threads`` threads (the components' most)."""
        return stream_samples(stream, decode_threads=max(d.decode_threads for d in self.datasets),
                              group_size=max(d.decode_group_size for d in self.datasets))

    def close(self) -> None:
        """Release the components' holds on remote sources' cached metadata."""
        for dataset in self.datasets:
            dataset.close()

    # -- resume -----------------------------------------------------------------------------------

    def _components_state(self) -> list[dict[str, Any]]:
        return [{"seed": d.seed, "shuffle": d.shuffle, "fingerprint": d._fingerprint()} for d in self.datasets]

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable state; the trainer adds ``batches_consumed``, ``batch_size``,
        ``num_workers`` and ``drop_last`` (``stream_state(loader, n)`` does) and passes it to
        ``load_state_dict`` on restart."""
        started = self._epoch.started()
        epoch = self._epoch.get() if started is None else started
        request = self._resume_request
        legs = request[1] if request is not None and request[0] == epoch else ()
        return {"format": MIXTURE_STATE_FORMAT, "epoch": epoch, "seed": self.seed,
                "weights": None if self.weights is None else list(self.weights), "stop": self.stop,
                "world_size": self.world_size, "pool_sizes": list(self.pool_sizes),
                "legs": [leg.to_state() for leg in legs], "components": self._components_state()}

    def load_state_dict(self, state: Mapping[str, Any], *, strict: bool = True) -> None:
        """Resume from ``state`` (``state_dict()`` plus the trainer's fields); the next iteration
        continues that epoch, exactly with the same ranks, workers and pool sizes, else elastically.
        A state whose seed, weights, stop or components differ is refused unless ``strict=False``."""
        self.apply_state(self.check_state(state, strict=strict))

    def check_state(self, state: Mapping[str, Any], *, strict: bool = True) -> CheckedState:
        """Check ``state`` and work out where it resumes, changing nothing (``load_state_dict`` is
        this then ``apply_state``; ``EpisodeLoader`` checks its own settings in between)."""
        if not isinstance(state, Mapping) or state.get("format") != MIXTURE_STATE_FORMAT:
            raise ValueError(f"Not an episodestream mixture state (expected format {MIXTURE_STATE_FORMAT!r}): "
                             f"{state!r:.200}")
        for key in ("batches_consumed", "batch_size", "num_workers"):
            if key not in state:
                raise ValueError(f"The state lacks {key!r}: add what the trainer knows, e.g. "
                                 f"stream_state(loader, batches_consumed).")
        saved_components = state.get("components")
        if not isinstance(saved_components, list) or len(saved_components) != len(self.datasets):
            raise ValueError(f"state['components'] must list {len(self.datasets)} components (this mixture's), "
                             f"got {saved_components!r:.200}.")
        checks = [("seed", state.get("seed"), self.seed),
                  ("weights", state.get("weights"), None if self.weights is None else list(self.weights)),
                  ("stop", state.get("stop"), self.stop)]
        for i, (saved, now) in enumerate(zip(saved_components, self._components_state())):
            saved = saved if isinstance(saved, Mapping) else {}
            checks += [(f"components[{i}].{k}", saved.get(k), v) for k, v in now.items() if k != "fingerprint"]
            checks += [(f"components[{i}].fingerprint.{k}", (saved.get("fingerprint") or {}).get(k), v)
                       for k, v in now["fingerprint"].items()]
        mismatches = [f"{name}: saved {saved!r}, this mixture {now!r}" for name, saved, now in checks
                      if _jsonable(saved) != _jsonable(now)]
        if mismatches:
            message = "The mixture state does not match this mixture: " + "; ".join(mismatches) + "."
            if strict:
                raise ValueError(message + " Pass strict=False to load it anyway.")
            warnings.warn(message + " Loading anyway (strict=False).", RuntimeWarning, stacklevel=3)
        epoch = check_int("state['epoch']", state.get("epoch"), minimum=0)
        batch_size = check_int("state['batch_size']", state["batch_size"], minimum=1)
        batches = check_int("state['batches_consumed']", state["batches_consumed"], minimum=0)
        pools = state.get("pool_sizes")
        if not isinstance(pools, list) or len(pools) != len(self.datasets):
            raise ValueError(f"state['pool_sizes'] must list {len(self.datasets)} ints, got {pools!r:.200}.")
        current = MixLeg(check_int("state['world_size']", state.get("world_size"), minimum=1),
                         check_int("state['num_workers']", state["num_workers"], minimum=0),
                         tuple(check_int(f"state['pool_sizes'][{i}]", p, minimum=1) for i, p in enumerate(pools)),
                         batch_size, 0, check_bool("state['drop_last']", state.get("drop_last", False)))
        legs = chain_legs(state, current, batches, MixLeg.from_state)
        current = legs[-1]
        try:
            point = plan_mixture_resume(self._sources(), seed=self.seed, epoch=epoch, weights=self.weights,
                                        stop=self.stop, legs=legs, world_size=current.world_size,
                                        num_workers=current.num_workers, pool_sizes=current.pool_sizes)
        except BeyondEpochError as beyond:
            message = (f"state['batches_consumed']={batches} is more than epoch {epoch} of the mixture has "
                       f"({batches - current.batches + beyond.available} batches of {batch_size} per rank). "
                       f"It counts the batches taken in the saved epoch, not a global step.")
            if strict or beyond.leg_index != len(legs) - 1:
                raise ValueError(message) from None
            warnings.warn(message + " Treating the epoch as finished (strict=False).", RuntimeWarning, stacklevel=3)
            point = None
        return CheckedState(epoch, point is None, (epoch, legs))

    def apply_state(self, checked: CheckedState) -> None:
        """Make a ``check_state`` result the position the next iteration starts from."""
        request, done = checked.request, checked.finished
        self._resume_request = None if done else request
        self._resume_points = {}
        self._legs = {}
        self._epoch.set(request[0] + 1 if done else request[0])
        self._loads_seen = self._epoch.state_loaded()
