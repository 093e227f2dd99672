"""``collate``: LeRobot 0.6.1's ``lerobot_collate_fn`` for episodestream samples (and any samples).

LeRobot's trainer collates a dataset with language columns with ``lerobot.utils.collate.
lerobot_collate_fn``, which (its code, not its docstring) drops ``None`` samples, drops the raw
``language_persistent`` / ``language_events`` columns, keeps the messages that LeRobot's
``render_messages_processor`` renders from them (``messages``, ``message_streams``,
``target_message_indices``) as plain lists with one entry per sample, and ``default_collate``s the
rest. ``collate`` gives that batch, so that ``DataLoader(..., collate_fn=episodestream.collate)``
and ``EpisodeLoader`` batch as LeRobot's trainer does. ``language_columns="keep"`` keeps the raw
columns too, as lists like the messages (``default_collate`` cannot collate them: rows of
different lengths, None fields).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from torch.utils.data._utils.collate import default_collate

from episodestream._base.options import check_choice
from episodestream._format.language import LANGUAGE_COLUMNS

LanguageColumns = Literal["drop", "keep"]
LANGUAGE_COLUMN_CHOICES: tuple[LanguageColumns, ...] = ("drop", "keep")

# lerobot.utils.collate._PYTHON_LIST_KEYS: what render_messages_processor puts in a sample.
MESSAGE_KEYS = ("messages", "message_streams", "target_message_indices")


def check_language_columns(value: Any) -> LanguageColumns:
    """``language_columns`` validated: "drop" (LeRobot's batches) or "keep"."""
    return check_choice("language_columns", value, LANGUAGE_COLUMN_CHOICES)


def listed_keys(language_columns: LanguageColumns) -> tuple[str, ...]:
    """The keys a batch keeps as a plain list of the samples' values."""
    return MESSAGE_KEYS + LANGUAGE_COLUMNS if language_columns == "keep" else MESSAGE_KEYS


def dropped_keys(language_columns: LanguageColumns) -> tuple[str, ...]:
    """The keys a batch leaves out."""
    return LANGUAGE_COLUMNS if language_columns == "drop" else ()


def collate_values(key: str, values: list[Any], language_columns: LanguageColumns = "drop") -> Any:
    """One key's values of a batch's samples, collated: a listed key's (``listed_keys``) as the list
    itself, the rest by ``default_collate``. The caller leaves out ``dropped_keys``."""
    return values if key in listed_keys(language_columns) else default_collate(values)


def collate(batch: Sequence[Any], *, language_columns: LanguageColumns = "drop") -> Any:
    """A DataLoader's ``collate_fn`` that gives LeRobot 0.6.1's batch (``lerobot_collate_fn``'s).

    Args:
        batch: the samples (dicts, as episodestream's and LeRobot's datasets give them; other
            samples go to ``default_collate``).
        language_columns: "drop" (default) leaves ``language_persistent`` / ``language_events``
            out of the batch, as LeRobot's collate does; "keep" keeps each as a plain list with
            one entry per sample, that sample's list of row dicts. To keep them in a DataLoader:
            ``collate_fn=functools.partial(episodestream.collate, language_columns="keep")``.

    Returns:
        ``default_collate`` of the samples without the ``None`` ones (None when all are), except
        that ``messages``, ``message_streams`` and ``target_message_indices`` (what LeRobot's
        ``render_messages_processor`` renders) are plain lists with one entry per sample, and the
        language columns as ``language_columns`` says. ``EpisodeLoader`` batches the same way.

    Raises:
        ValueError: ``language_columns`` is neither; or some samples of the batch carry a listed
            key and others do not (LeRobot refuses such a batch too: a shorter list than the
            tensors would pair the wrong samples).

    >>> loader = torch.utils.data.DataLoader(dataset, batch_size=8, collate_fn=episodestream.collate)
    """
    language_columns = check_language_columns(language_columns)
    batch = [sample for sample in batch if sample is not None]
    if not batch:
        return None
    first = batch[0]
    listed, dropped = listed_keys(language_columns), dropped_keys(language_columns)
    special = listed + dropped
    if not isinstance(first, Mapping) or not any(key in sample for sample in batch for key in special):
        return default_collate(batch)
    for key in listed:
        carried = sum(key in sample for sample in batch)
        if 0 < carried < len(batch):
            raise ValueError(f"Inconsistent batch: {carried}/{len(batch)} samples carry {key!r}; every sample in "
                             f"a batch must agree (LeRobot's lerobot_collate_fn refuses it too).")
    return {key: collate_values(key, [sample[key] for sample in batch], language_columns)
            for key in first if key not in dropped}
