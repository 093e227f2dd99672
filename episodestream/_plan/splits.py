"""Held-out episode splits, as arithmetic over episode indices and their group keys."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

# Spawn keys here have two entries and start with this tag (see ``_plan.curation``).
_SPLIT_TAG = 0x73706C  # "spl"


def held_out_split(episodes: Sequence[int], groups: Sequence[Hashable], eval_fraction: float, *,
                   seed: int | None = None) -> tuple[list[int], list[int]]:
    """``(train, eval)``: episodes grouped by ``groups`` (one key per episode, groups in order of
    first appearance), ``ceil(n * eval_fraction)`` of each group of ``n`` held out.

    ``seed=None`` holds out each group's last episodes, in ``episodes``' order, and returns both
    lists group by group: LeRobot's ``make_train_eval_datasets`` split, element for element. With a
    seed the held-out episodes of each group are drawn from (seed, group number) and both lists
    come sorted.
    """
    by_group: dict[Hashable, list[int]] = {}
    for episode, key in zip(episodes, groups):
        by_group.setdefault(key, []).append(int(episode))
    train: list[int] = []
    held_out: list[int] = []
    for number, members in enumerate(by_group.values()):
        n_eval = math.ceil(len(members) * eval_fraction)
        if seed is not None:
            rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_SPLIT_TAG, number)))
            members = [members[i] for i in rng.permutation(len(members)).tolist()]
        train.extend(members[: len(members) - n_eval])
        held_out.extend(members[len(members) - n_eval:])
    if seed is not None:
        train.sort()
        held_out.sort()
    return train, held_out
