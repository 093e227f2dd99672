"""A torchdata ``StatefulDataLoader``'s state read back as a trainer's state, to resume elastically.

A StatefulDataLoader state holds one ``dataset.state_dict()`` per consumer (its workers', or the
main process's with ``num_workers=0``): each says how many samples that consumer yielded
(``_runtime.resume.position``). torchdata hands each snapshot back to the worker of the same number and
refuses another worker count, and inside one worker the siblings' counts are out of reach. Here,
before any worker starts, all of them are: the DataLoader's in-order round robin gives each worker
whole batches in turn, so the counts add up to the batches the trainer took, and that is a
trainer's state (``stream_state``'s: ``batches_consumed``, ``batch_size``, ``num_workers``), which
resumes any world size and worker count (``_plan.resume``).

The batch size is the resuming loader's: a state does not record the saving loader's. That it was
the same is checked, not assumed: the trainer's state must put every saved consumer exactly where
its own snapshot says it is, or the conversion is refused.

torchdata's state layout is its own (private) format; what is read of it is named by ``private_apis.torchdata_state_keys`` and
checked, and ``tests/test_stateful_dataloader.py`` runs it against the real package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from episodestream._base.world import World
from episodestream._runtime.private_apis import torchdata_state_keys
from episodestream._plan.saved_state import ConsumerPosition, SavedState, TrainerCount
from episodestream._runtime.stream_runtime import StreamRuntime


def _keys() -> dict[str, str]:
    """The parts of torchdata's state read here (``private_apis.torchdata_state_keys``: checked)."""
    return torchdata_state_keys()


@dataclass(frozen=True)
class SavedLoader:
    """What a StatefulDataLoader state says: its consumers' dataset states (parsed: each has its
    ``consumer``), the ``num_workers`` it ran with, and the batches it yielded after those snapshots
    were taken."""

    consumers: tuple[SavedState, ...]
    num_workers: int
    batches_after: int


def read_loader_state(state: Mapping[str, Any], runtime: StreamRuntime) -> SavedLoader:
    """The consumers of a StatefulDataLoader ``state_dict()`` over ``runtime``, every part checked."""
    if _keys()["single_yielded"] in state:  # num_workers=0: the main process's dataset state, current
        return SavedLoader((_dataset_state(state, "state", runtime),), 0, 0)
    snapshot = state.get(_keys()["snapshot"])
    if not isinstance(snapshot, Mapping) or not isinstance(snapshot.get(_keys()["main"]), Mapping):
        raise ValueError(f"Not a StatefulDataLoader state: state[{_keys()['snapshot']!r}][{_keys()['main']!r}] is "
                         f"missing (keys: {sorted(state)}).")
    num_workers = snapshot[_keys()["main"]].get(_keys()["num_workers"])
    workers = snapshot.get(_keys()["workers"])
    if not isinstance(num_workers, int) or not isinstance(workers, Mapping) or len(workers) != num_workers:
        raise ValueError(f"The StatefulDataLoader state names num_workers={num_workers!r} but holds "
                         f"{len(workers) if isinstance(workers, Mapping) else workers!r} worker snapshots.")
    consumers = tuple(_dataset_state(workers.get(f"worker_{w}"), f"worker_{w}'s snapshot", runtime)
                      for w in range(num_workers))
    steps = state.get(_keys()["steps_since"], 0)
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"state[{_keys()['steps_since']!r}] must be a count of batches, got {steps!r}.")
    return SavedLoader(consumers, num_workers, steps)


def _dataset_state(part: Any, where: str, runtime: StreamRuntime) -> SavedState:
    dataset_state = part.get(_keys()["dataset"]) if isinstance(part, Mapping) else None
    # A per-consumer state (``dataset.state_dict()``): a consumer's position, no trainer's count.
    if (not isinstance(dataset_state, Mapping) or "consumer" not in dataset_state
            or "batches_consumed" in dataset_state):
        raise ValueError(f"The StatefulDataLoader state's {where} holds no EpisodeStreamingDataset state "
                         f"(got {dataset_state!r:.200}): was it saved by a loader over another dataset?")
    return runtime.parse(dataset_state)


def trainer_state(runtime: StreamRuntime, saved: SavedLoader, *, batch_size: int, drop_last: bool) -> SavedState:
    """``saved`` as a trainer's state of ``runtime``: the batches its loader took this epoch, with
    ``batch_size`` and ``drop_last`` (the resuming loader's), checked against every consumer."""
    common = saved.consumers[0].stream()
    for w, other in enumerate(saved.consumers[1:], start=1):
        if other.stream() != common:
            raise ValueError(f"The StatefulDataLoader state's worker 0 and worker {w} describe different "
                             f"streams (epoch, seed, legs or dataset differ): it cannot be resumed as one.")
    positions = [c.consumer for c in saved.consumers if c.consumer is not None]
    placed = _placed(positions, saved.num_workers)
    # Each worker's batches: whole ones, and its last partial one unless the loader dropped it.
    taken = sum(p.samples_yielded // batch_size if drop_last else -(-p.samples_yielded // batch_size)
                for p in positions)
    count = TrainerCount(batches_consumed=common.earlier_batches + taken, batch_size=batch_size,
                         num_workers=saved.num_workers, drop_last=drop_last)
    _check_positions(runtime, common.with_trainer(count), common, placed, saved.num_workers)
    # Round robin as well: whole batches after the snapshots.
    return common.with_trainer(replace(count, batches_consumed=count.batches_consumed + saved.batches_after))


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


def _check_positions(runtime: StreamRuntime, state: SavedState, snapshot: SavedState,
                     placed: Sequence[ConsumerPosition], num_workers: int) -> None:
    """The trainer's ``state`` must put every consumer where its ``snapshot`` (the legs its iteration
    continued, and what it yielded since) says it is, under the saving run's layout; else the batch
    size (or ``drop_last``, or in-order delivery) differed."""
    if not placed:
        return
    rank, world_size = placed[0].rank, placed[0].world_size
    workers = max(1, num_workers)
    # The trainer's state: what each worker role's share had given when the snapshots were taken.
    trainer = [runtime.position_under(state, World(rank, world_size, w, workers)) for w in range(workers)]
    consumed_by_role = {at[0]: at[1] for at in trainer if at is not None}
    for p in placed:
        at = runtime.position_under(snapshot, World(rank, world_size, p.worker, workers))
        role, consumed, share = (p.worker, p.samples_yielded, p.samples_yielded) if at is None else \
            (at[0], at[1] + p.samples_yielded, at[2])
        expected = share if trainer[0] is None else consumed_by_role.get(role)
        if expected != consumed:
            assert state.trainer is not None  # trainer_state made it a trainer's
            raise ValueError(
                f"The StatefulDataLoader state does not fit batch_size={state.trainer.batch_size}, "
                f"drop_last={state.trainer.drop_last}: worker {p.worker} yielded {p.samples_yielded} samples, which "
                f"the in-order round robin of {state.trainer.batches_consumed} batches does not give it. Resume with "
                f"the batch size and drop_last the state was saved with (and in_order=True).")
