"""Depth cameras as LeRobot 0.6 records them: which features are depth maps, how their 12-bit codes were
quantised, the unit they were recorded in, and their statistics in the unit samples come out in.

A depth feature carries ``"is_depth_map": true`` in its info (older writers: ``"video.is_depth_map"``
there or in ``video_info``). A depth *video* holds 12-bit codes (``gray12le`` HEVC by default),
quantised from metres with the parameters stored in its info (``video.depth_min`` / ``video.depth_max``
/ ``video.shift`` / ``video.use_log``, LeRobot's defaults where absent); a depth *image* in parquet is a
TIFF in ``depth_unit`` (uint16 mm or float32 m). LeRobot returns both as float32 (1, H, W) in its
``depth_output_unit`` ("mm" by default) and rescales their stats to that unit
(``LeRobotDatasetMetadata.rescale_depth_stats``); this module holds those rules, with no decoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from episodestream._base.options import check_choice

DepthUnit = Literal["mm", "m"]
DEPTH_UNITS: tuple[DepthUnit, ...] = ("mm", "m")
DEFAULT_DEPTH_UNIT: DepthUnit = "mm"  # LeRobot's ``cfg.dataset.depth_output_unit`` default
MM_PER_METRE = 1000.0


@dataclass(frozen=True)
class DepthCoding:
    """How a depth video's codes map back to depth (LeRobot's ``DepthEncoderConfig`` fields, metres)."""

    depth_min_m: float = 0.01
    depth_max_m: float = 10.0
    shift_m: float = 3.5
    use_log: bool = True


def is_depth(info: Mapping[str, Any] | None, video_info: Mapping[str, Any] | None = None) -> bool:
    """Whether a feature with this ``info`` (and legacy ``video_info``) is a depth map, as LeRobot's
    ``depth_keys`` decides."""
    info, video_info = info or {}, video_info or {}
    return bool(info.get("is_depth_map") or info.get("video.is_depth_map") or video_info.get("video.is_depth_map"))


def check_depth_unit(depth_output_unit: Any) -> DepthUnit:
    return check_choice("depth_output_unit", depth_output_unit, DEPTH_UNITS)


def coding_of(info: Mapping[str, Any] | None, where: str) -> DepthCoding:
    """The quantiser of a depth video from its feature's ``info`` (defaults where a field is absent,
    as LeRobot's ``DepthEncoderConfig.from_video_info``)."""
    info = info or {}
    values: dict[str, Any] = {}
    for field, name in (("depth_min_m", "depth_min"), ("depth_max_m", "depth_max"), ("shift_m", "shift")):
        value = info.get(f"video.{name}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ValueError(f"{where}: info 'video.{name}' must be a finite number of metres, got {value!r}")
        values[field] = float(value)
    use_log = info.get("video.use_log")
    if use_log is not None:
        if not isinstance(use_log, bool):
            raise ValueError(f"{where}: info 'video.use_log' must be true or false, got {use_log!r}")
        values["use_log"] = use_log
    coding = DepthCoding(**values)
    if coding.use_log and coding.depth_min_m + coding.shift_m <= 0:
        raise ValueError(f"{where}: depth_min + shift must be positive for logarithmic quantisation, got "
                         f"{coding.depth_min_m} + {coding.shift_m}")
    return coding


def stored_unit(info: Mapping[str, Any] | None) -> str | None:
    """The unit a depth feature was recorded in (its info's ``depth_unit``), None when unrecorded."""
    unit = (info or {}).get("depth_unit")
    return unit if unit in DEPTH_UNITS else None


def unit_factor(stored: str | None, output: DepthUnit) -> float | None:
    """What stats recorded in ``stored`` are multiplied by to be in ``output``; None: as they are."""
    if stored is None or stored == output:
        return None
    return MM_PER_METRE if stored == "m" else 1.0 / MM_PER_METRE


def in_unit(values: Any, stored: str | None, output: DepthUnit) -> Any:
    """Depth image ``values`` recorded in ``stored`` in ``output`` units, as LeRobot's reader converts them:
    multiplied by 1000 from metres, *divided* by 1000 from millimetres (not multiplied by 0.001, which
    rounds differently in float32)."""
    if stored is None or stored == output:
        return values
    return values * MM_PER_METRE if stored == "m" else values / MM_PER_METRE


def rescaled_stats(stats: Mapping[str, Mapping[str, Any]], infos: Mapping[str, Mapping[str, Any] | None],
                   output: DepthUnit) -> dict[str, Any]:
    """``stats`` with each depth feature's entries (all but ``count``) in ``output`` units, as
    LeRobot's ``rescale_depth_stats``; ``infos`` maps the depth features to their info."""
    out = dict(stats)
    for key, info in infos.items():
        factor = unit_factor(stored_unit(info), output)
        if factor is None or key not in stats:
            continue
        out[key] = {name: value if name == "count" else value * factor for name, value in stats[key].items()}
    return out
