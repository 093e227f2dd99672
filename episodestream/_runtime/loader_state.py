"""A torchdata ``StatefulDataLoader``'s state read back as a trainer's state, to resume elastically.

A StatefulDataLoader state holds one ``dataset.state_dict()`` per consumer (its workers', or the
main process's with ``num_workers=0``): each says how many samples that consumer yielded
(``_runtime.position``). torchdata hands each snapshot back to the worker of the same number and
refuses another worker count, and inside one worker the siblings' counts are out of reach. Here,
before any worker starts, all of them are: the DataLoader's in-order round robin gives each worker
whole batches in turn, so the counts add up to the batches the trainer took, and that is a
trainer's state (``stream_state``'s: ``batches_consumed``, ``batch_size``, ``num_workers``), which
resumes any world size and worker count (``_plan.resume``).

The batch size is the resuming loader's: a state does not record the saving loader's. That it was
the same is checked, not assumed: the trainer's state must put every saved consumer exactly where
its own snapshot says it is, or the conversion is refused.

torchdata's state layout is its own (private) format; what is read of it is named in ``_KEYS`` and
checked, and ``tests/test_stateful_dataloader.py`` runs it against the real package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from episodestream._base.world import World
from episodestream._plan.resume import Leg, ResumePoint, ResumeRequest, Resumption, read_request
from episodestream._plan.sampling import EpochPlan, Segment
from episodestream._runtime.dataset_source import DatasetSource
from episodestream._runtime.position import ConsumerPosition, is_consumer_state, without_consumer

# The parts of torchdata's state read here (stateful_dataloader.py's class constants, torchdata 0.11).
_KEYS = {"snapshot": "_snapshot", "main": "_main_snapshot", "workers": "_worker_snapshots",
         "num_workers": "_num_workers", "steps_since": "_steps_since_snapshot", "dataset": "dataset_state",
         "single_yielded": "_num_yielded"}


@dataclass(frozen=True)
class SavedLoader:
    """What a StatefulDataLoader state says: its consumers' dataset states, the ``num_workers`` it
    ran with, and the batches it yielded after those snapshots were taken."""

    consumers: tuple[Mapping[str, Any], ...]
    num_workers: int
    batches_after: int


def is_loader_state(state: Any) -> bool:
    """A StatefulDataLoader's ``state_dict()`` (multi-process or single-process layout)."""
    return isinstance(state, Mapping) and (_KEYS["snapshot"] in state or _KEYS["single_yielded"] in state)


def read_loader_state(state: Mapping[str, Any]) -> SavedLoader:
    """The consumers of a StatefulDataLoader ``state_dict()``, every part checked."""
    if _KEYS["single_yielded"] in state:  # num_workers=0: the main process's dataset state, current
        return SavedLoader((_dataset_state(state, "state"),), 0, 0)
    snapshot = state.get(_KEYS["snapshot"])
    if not isinstance(snapshot, Mapping) or not isinstance(snapshot.get(_KEYS["main"]), Mapping):
        raise ValueError(f"Not a StatefulDataLoader state: state[{_KEYS['snapshot']!r}][{_KEYS['main']!r}] is "
                         f"missing (keys: {sorted(state)}).")
    num_workers = snapshot[_KEYS["main"]].get(_KEYS["num_workers"])
    workers = snapshot.get(_KEYS["workers"])
    if not isinstance(num_workers, int) or not isinstance(workers, Mapping) or len(workers) != num_workers:
        raise ValueError(f"The StatefulDataLoader state names num_workers={num_workers!r} but holds "
                         f"{len(workers) if isinstance(workers, Mapping) else workers!r} worker snapshots.")
    consumers = tuple(_dataset_state(workers.get(f"worker_{w}"), f"worker_{w}'s snapshot") for w in range(num_workers))
    steps = state.get(_KEYS["steps_since"], 0)
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"state[{_KEYS['steps_since']!r}] must be a count of batches, got {steps!r}.")
    return SavedLoader(consumers, num_workers, steps)


def _dataset_state(part: Any, where: str) -> Mapping[str, Any]:
    dataset_state = part.get(_KEYS["dataset"]) if isinstance(part, Mapping) else None
    if not isinstance(dataset_state, Mapping) or not is_consumer_state(dataset_state):
        raise ValueError(f"The StatefulDataLoader state's {where} holds no EpisodeStreamingDataset state "
                         f"(got {dataset_state!r:.200}): was it saved by a loader over another dataset?")
    return dataset_state


def trainer_state(source: DatasetSource, saved: SavedLoader, *, batch_size: int, drop_last: bool) -> dict[str, Any]:
    """``saved`` as a trainer's state of ``source``: the batches its loader took this epoch, with
    ``batch_size`` and ``drop_last`` (the resuming loader's), checked against every consumer."""
    first = saved.consumers[0]
    common = without_consumer(first)
    for w, other in enumerate(saved.consumers[1:], start=1):
        if without_consumer(other) != common:
            raise ValueError(f"The StatefulDataLoader state's worker 0 and worker {w} describe different "
                             f"streams (epoch, seed, legs or dataset differ): it cannot be resumed as one.")
    positions = [ConsumerPosition.from_state(c["consumer"]) for c in saved.consumers]
    placed = _placed(positions, saved.num_workers)
    saved_legs = common.get("legs", [])
    if not isinstance(saved_legs, (list, tuple)):
        raise ValueError(f"state['legs'] must be a list of legs, got {saved_legs!r:.200}.")
    legs = tuple(Leg.from_state(leg, f"state['legs'][{i}]") for i, leg in enumerate(saved_legs))
    # Each worker's batches: whole ones, and its last partial one unless the loader dropped it.
    taken = sum(p.samples_yielded // batch_size if drop_last else -(-p.samples_yielded // batch_size)
                for p in positions)
    state = {**common, "batches_consumed": sum(leg.batches for leg in legs) + taken, "batch_size": batch_size,
             "num_workers": saved.num_workers, "drop_last": drop_last}
    _check_positions(source, state, legs, placed, saved.num_workers)
    state["batches_consumed"] += saved.batches_after  # round robin as well: whole batches after the snapshots
    return state


def _placed(positions: Sequence[ConsumerPosition], num_workers: int) -> list[ConsumerPosition]:
    """The consumers that had started (a worker's state before its first iteration names no place)."""
    placed = [p for p in positions if p.num_workers == max(1, num_workers)]
    for w, p in enumerate(positions):
        if p not in placed and p.samples_yielded:
            raise ValueError(f"Worker {w}'s snapshot is consumer {p.worker} of {p.num_workers} with "
                             f"{p.samples_yielded} samples, but the loader ran {num_workers} workers.")
    if len({(p.rank, p.world_size, p.epoch) for p in placed}) > 1:
        raise ValueError("The StatefulDataLoader state's workers name different ranks or epochs: "
                         + ", ".join(f"rank {p.rank} of {p.world_size} epoch {p.epoch}" for p in placed) + ".")
    return placed


def _check_positions(source: DatasetSource, state: Mapping[str, Any], legs: tuple[Leg, ...],
                     placed: Sequence[ConsumerPosition], num_workers: int) -> None:
    """The trainer's ``state`` must put every consumer where its snapshot says it is, under the
    saving run's layout; else the batch size (or ``drop_last``, or in-order delivery) differed."""
    if not placed:
        return
    rank, world_size, epoch = placed[0].rank, placed[0].world_size, placed[0].epoch
    segments = source.segments(epoch)
    pool = state["episode_pool_size"]
    trainer = Resumption(read_request(state, seed=source.settings.seed, shuffle=source.settings.shuffle),
                         segments, world_size=world_size, pool_size=pool).point(num_workers)
    snapshot = (Resumption(ResumeRequest(epoch, source.settings.seed, source.settings.shuffle, legs), segments,
                           world_size=world_size, pool_size=pool).point(num_workers) if legs else None)
    for p in placed:
        role, consumed, share = _snapshot_position(snapshot, legs, p, segments, source, num_workers)
        expected = (share if trainer is None else trainer.skips[rank][0][role] if trainer.skips is not None
                    else None)
        if expected != consumed:
            raise ValueError(
                f"The StatefulDataLoader state does not fit batch_size={state['batch_size']}, "
                f"drop_last={state['drop_last']}: worker {p.worker} yielded {p.samples_yielded} samples, which "
                f"the in-order round robin of {state['batches_consumed']} batches does not give it. Resume with "
                f"the batch size and drop_last the state was saved with (and in_order=True).")


def _snapshot_position(snapshot: ResumePoint | None, legs: tuple[Leg, ...], p: ConsumerPosition,
                       segments: Sequence[Segment], source: DatasetSource,
                       num_workers: int) -> tuple[int, int, int]:
    """The worker role ``p`` played, the samples of that role's share consumed (what its iteration
    skipped plus what it yielded), and the share's size."""
    world = World(p.rank, p.world_size, p.worker, max(1, num_workers))
    if snapshot is None and legs:
        return p.worker, p.samples_yielded, p.samples_yielded  # the legs had consumed the whole epoch
    plan = (snapshot.plan(p.world_size) if snapshot is not None else
            EpochPlan(segments, seed=source.settings.seed, epoch=p.epoch, shuffle=source.settings.shuffle,
                      world_size=p.world_size))
    role, skip = snapshot.share_for(plan, world) if snapshot is not None else (world, 0)
    return role.worker, skip + p.samples_yielded, plan.share(role).num_samples

