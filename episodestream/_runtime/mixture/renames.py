"""``EpisodeMixture(rename=...)``: each component's ``{its key: mixture key}``, checked once.

A rename that makes two keys meet in one sample loses one of them without a word: the dict of the
sample keeps the last value written. So a mixture refuses, naming ``rename[i]``, the keys and the
target: two keys renamed onto one; a key renamed onto one the component already has and does not
rename away itself (a swap ``{a: b, b: a}`` is fine); a key renamed onto one every mixture sample
has (``dataset_index``, ``task``, the frame ids), or onto ``<key>_is_pad``, the name of a window's
padding mask.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

# Keys every mixture sample carries besides the renamed features: the component's position, the
# task string, and the ids of the frame (LeRobot's always-present features).
RESERVED_KEYS = ("dataset_index", "task", "index", "episode_index", "frame_index", "timestamp", "task_index")
PAD_SUFFIX = "_is_pad"


def check_renames(rename: Sequence[Mapping[str, str] | None] | None, features: Sequence[Collection[str]],
                  descriptions: Sequence[str]) -> list[dict[str, str]]:
    """One ``{key: mixture key}`` dict per component (``features[i]`` its keys), or ValueError."""
    if rename is None:
        return [{} for _ in features]
    if isinstance(rename, Mapping) or not isinstance(rename, Sequence) or len(rename) != len(features):
        raise ValueError(f"rename must be a list of {len(features)} dicts (or None), one per dataset, got {rename!r}.")
    return [_check_one(index, dict(mapping or {}), set(keys), description)
            for index, (mapping, keys, description) in enumerate(zip(rename, features, descriptions))]


def _check_one(index: int, mapping: dict[str, str], keys: set[str], description: str) -> dict[str, str]:
    where = f"rename[{index}]"
    unknown = sorted(set(mapping) - keys)
    if unknown:
        raise ValueError(f"{where} names keys that {description} does not have: {unknown} "
                         f"(its features: {sorted(keys)}).")
    wrong = [(key, target) for key, target in mapping.items() if not isinstance(target, str) or not target]
    if wrong:
        raise ValueError(f"{where} renames {wrong[0][0]!r} onto {wrong[0][1]!r}: a mixture key must be a non-empty "
                         f"string.")
    by_target: dict[str, list[str]] = {}
    for key, target in mapping.items():
        by_target.setdefault(target, []).append(key)
    for target, sources in by_target.items():
        if len(sources) > 1:
            raise ValueError(f"{where} renames {' and '.join(map(repr, sources))} "
                             f"{'both' if len(sources) == 2 else 'all'} onto {target!r}: the mixture's "
                             f"samples would keep one of them and drop the others. Give each its own key.")
    for key, target in mapping.items():
        if target == key:
            continue
        if target in RESERVED_KEYS:
            raise ValueError(f"{where} renames {key!r} onto {target!r}, a key every mixture sample has "
                             f"({', '.join(RESERVED_KEYS)}); pick another key.")
        if target.endswith(PAD_SUFFIX):
            raise ValueError(f"{where} renames {key!r} onto {target!r}: keys ending in {PAD_SUFFIX!r} are the "
                             f"padding masks of windows (a window of '<key>' gives '<key>{PAD_SUFFIX}'); pick "
                             f"another key.")
        if target in keys and target not in mapping:
            raise ValueError(f"{where} renames {key!r} onto {target!r}, which {description} already has and does "
                             f"not rename away: one of the two would be dropped. Rename {target!r} too (a swap "
                             f"{{{key!r}: {target!r}, {target!r}: {key!r}}} is fine) or pick another key.")
    return mapping
