"""LeRobot 0.6 language annotations: the ``language_persistent`` / ``language_events`` columns.

Each frame's value is a list of rows (``list<struct<role, content, style, timestamp, camera,
tool_calls>>``; events have no ``timestamp``). LeRobot reads them through ``datasets`` with the
row fields declared as ``Value("string")``, ``Value("float32")`` and ``List(Json())`` and hands them
to a sample untouched (``hf_transform_to_torch`` skips them), so a sample holds, per column, a
Python list of dicts. ``language_values`` gives the same Python values from the Arrow column:

- the fields in LeRobot's order (``PERSISTENT_ROW_FIELDS`` / ``EVENT_ROW_FIELDS``), absent or null
  ones as None;
- ``timestamp`` rounded to float32 and back, as the ``Value("float32")`` cast gives it (LeRobot's
  own writer stores it as float64);
- each ``tool_calls`` item decoded as ``Json()`` decodes it: a JSON string (``pa.json_()`` or a
  plain string holding JSON) parsed, a struct (what LeRobot's writer infers) as its dict, with
  every field of the struct type (None where that call had none).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

# lerobot.datasets.language: the column names and each column's row fields, in LeRobot's order.
LANGUAGE_PERSISTENT = "language_persistent"
LANGUAGE_EVENTS = "language_events"
LANGUAGE_COLUMNS = (LANGUAGE_PERSISTENT, LANGUAGE_EVENTS)
PERSISTENT_ROW_FIELDS = ("role", "content", "style", "timestamp", "camera", "tool_calls")
EVENT_ROW_FIELDS = ("role", "content", "style", "camera", "tool_calls")

# The tool list ``meta.tools`` falls back to when info.json declares none (LeRobot's DEFAULT_TOOLS,
# its ``say`` tool's schema).
SAY_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "say",
        "description": "Speak a short utterance to the user via the TTS executor.",
        "parameters": {"type": "object",
                       "properties": {"text": {"type": "string", "description": "The verbatim text to speak."}},
                       "required": ["text"]},
    },
}
DEFAULT_TOOLS: tuple[dict[str, Any], ...] = (SAY_TOOL_SCHEMA,)


def is_language_type(arrow_type: pa.DataType) -> bool:
    """A list of structs, or of nulls (a file whose frames all have empty lists, as pyarrow infers it)."""
    if not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)):
        return False
    value = arrow_type.value_type
    return pa.types.is_struct(value) or pa.types.is_null(value)


def language_values(column: pa.ChunkedArray | pa.Array, name: str) -> list[Any]:
    """Each row's value of language column ``name`` as ``LeRobotDataset[i]`` gives it (module docstring)."""
    fields = PERSISTENT_ROW_FIELDS if name == LANGUAGE_PERSISTENT else EVENT_ROW_FIELDS
    out = []
    for frame in column.to_pylist():
        out.append(None if frame is None else [_row(row, fields) for row in frame])
    return out


def _row(row: dict[str, Any] | None, fields: tuple[str, ...]) -> dict[str, Any] | None:
    if row is None:
        return None
    out = {field: row.get(field) for field in fields}
    out.update((field, value) for field, value in row.items() if field not in out)
    if out.get("timestamp") is not None:
        out["timestamp"] = float(np.float32(out["timestamp"]))
    calls = out.get("tool_calls")
    if calls is not None:
        out["tool_calls"] = [_json_value(call) for call in calls]
    return out


def _json_value(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:  # a plain string, not JSON: ``Json()`` encodes and decodes it back to itself
            return value
    return value


def copy_rows(value: Any) -> Any:
    """A sample's own copy of a language value (lists and dicts copied, the rest shared): the held
    episode's rows serve every frame, and a caller that edits its sample must not change the next."""
    if isinstance(value, list):
        return [copy_rows(v) for v in value]
    if isinstance(value, dict):
        return {k: copy_rows(v) for k, v in value.items()}
    return value
