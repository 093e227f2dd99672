"""``collate``: PyTorch's ``default_collate`` for samples, with language annotations kept per sample.

A language column's value (``language_persistent`` / ``language_events``) is a list of dicts whose
length differs from frame to frame; ``default_collate`` would refuse lists of different lengths and
transpose lists of equal ones, so a batch keeps them as a plain list with one entry per sample.
LeRobot 0.6.1's ``lerobot_collate_fn`` drops these columns from its batches instead; we keep them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch.utils.data._utils.collate import default_collate

from episodestream._format.language import LANGUAGE_COLUMNS


def collate_values(key: str, values: list[Any]) -> Any:
    """One key's values of a batch's samples, collated: a language column's as the list itself."""
    return values if key in LANGUAGE_COLUMNS else default_collate(values)


def collate(batch: Sequence[Any]) -> Any:
    """A DataLoader's ``collate_fn`` for episodestream samples (and any samples): what
    ``default_collate`` gives, except that each language column (``language_persistent``,
    ``language_events``) becomes a plain Python list with one entry per sample, that sample's list
    of row dicts. LeRobot 0.6.1's own ``lerobot_collate_fn`` drops the language columns from the
    batch; this keeps them. ``EpisodeLoader`` batches the same way.

    >>> loader = torch.utils.data.DataLoader(dataset, batch_size=8, collate_fn=episodestream.collate)
    """
    if not batch or not isinstance(batch[0], Mapping) or not any(key in batch[0] for key in LANGUAGE_COLUMNS):
        return default_collate(batch)
    return {key: collate_values(key, [sample[key] for sample in batch]) for key in batch[0]}
