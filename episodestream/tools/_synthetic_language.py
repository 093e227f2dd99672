"""Language annotations for ``write_synthetic_dataset(language=True)``, laid out as LeRobot 0.6's
annotation pipeline writes them (``LanguageColumnsWriter`` and its executor's info.json update).

Per episode: ``language_persistent`` holds the same rows on every frame (a ``subtask`` row at 0 s and
a ``plan`` row at a time that is not a float32 number, which readers give as float32, as LeRobot
does), except every third episode (``episode_index % 3 == 2``), which has none, as an unannotated
episode has; ``language_events`` holds rows on the frames they fire at: frame 1 a ``say`` tool call
(style None, content None), frame 2 an ``interjection`` and, with a camera, a ``vqa`` row naming
it (in the writer's order); every other frame an empty list. Contents name their episode and frame. The Arrow types are
those LeRobot's writer infers from its Python rows (``timestamp`` float64, tool calls as structs);
they are given explicitly so that every episode of a data file has one schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from episodestream._format.language import LANGUAGE_EVENTS, LANGUAGE_PERSISTENT, SAY_TOOL_SCHEMA

_TOOL_CALL = pa.struct([("type", pa.string()), ("function", pa.struct([
    ("name", pa.string()), ("arguments", pa.struct([("text", pa.string())]))]))])
_COMMON = [("role", pa.string()), ("content", pa.string()), ("style", pa.string())]
_TAIL = [("camera", pa.string()), ("tool_calls", pa.list_(_TOOL_CALL))]
PERSISTENT_TYPE = pa.list_(pa.struct([*_COMMON, ("timestamp", pa.float64()), *_TAIL]))
EVENTS_TYPE = pa.list_(pa.struct([*_COMMON, *_TAIL]))


def language_features() -> dict[str, dict[str, Any]]:
    """info.json's entries for the two columns (LeRobot's ``language_feature_info``)."""
    return {key: {"dtype": "language", "shape": [1], "names": None} for key in (LANGUAGE_PERSISTENT, LANGUAGE_EVENTS)}


def language_tools() -> list[dict[str, Any]]:
    """info.json's ``tools``, as the annotation executor writes it: the ``say`` schema."""
    return [SAY_TOOL_SCHEMA]


def _row(role: str, content: str | None, style: str | None, *, camera: str | None = None,
         tool_calls: list | None = None, timestamp: float | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"role": role, "content": content, "style": style}
    if timestamp is not None:
        row["timestamp"] = timestamp
    return {**row, "camera": camera, "tool_calls": tool_calls}


def language_columns(episode_index: int, length: int, fps: int, cameras: Sequence[str]) -> dict[str, pa.Array]:
    """The episode's two columns, one entry per frame."""
    e = episode_index
    persistent = [] if e % 3 == 2 else [
        _row("user", f"episode {e} subtask", "subtask", timestamp=0.0),
        _row("assistant", f"episode {e} plan", "plan", timestamp=float(np.float64(length) / fps / 3))]
    events: list[list[dict[str, Any]]] = [[] for _ in range(length)]
    if length > 1:
        say = {"type": "function", "function": {"name": "say", "arguments": {"text": f"episode {e} frame 1"}}}
        events[1] = [_row("assistant", None, None, tool_calls=[say])]
    if length > 2:
        events[2] = [_row("user", f"episode {e} frame 2 interjection", "interjection")]
        if cameras:  # after the interjection: the writer sorts a frame's events by style
            events[2].append(_row("user", f"episode {e} frame 2 question", "vqa", camera=cameras[0]))
    return {LANGUAGE_PERSISTENT: pa.array([persistent] * length, PERSISTENT_TYPE),
            LANGUAGE_EVENTS: pa.array(events, EVENTS_TYPE)}
