"""Windows that are valid but almost surely not what was meant: ``delta_timestamps`` written in frames
rather than seconds, and windows no frame of any selected episode fits. Both pass every check of
``delta_indices`` and would stream padded samples without a word; ``window_warnings`` says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

_SHOWN = 8  # offsets a message lists before "..."


def window_warnings(delta_timestamps: Mapping[str, Sequence[float]], offsets: Mapping[str, np.ndarray], *,
                    fps: int, longest_episode: int) -> list[str]:
    """What to warn about the windows ``delta_timestamps`` (seconds) that became ``offsets`` (frames),
    one message per kind of mistake; ``longest_episode`` is the longest selected episode's frames."""
    messages = []
    spans = {key: int(max(0, o.max()) - min(0, o.min())) + 1 for key, o in offsets.items()}
    in_frames = [key for key in offsets
                 if _looks_like_frames(delta_timestamps[key], fps, past_episodes=spans[key] > longest_episode)]
    if in_frames:
        messages.append(
            " ".join(f"delta_timestamps[{key!r}] = {_shown(delta_timestamps[key])} reads as "
                     f"{_shown(offsets[key].tolist())} frames at {fps} fps." for key in in_frames)
            + f" delta_timestamps offsets are seconds, not frames: for frame offsets k write "
            f"[k / {fps} for k in {_shown(delta_timestamps[in_frames[0]])}]. If whole seconds are meant, "
            f"ignore this warning.")
    # A sample at frame f of an episode of L frames reads f + o for every offset o, and f itself: one
    # is free of padding iff all of them fall in [0, L), which some f allows iff they span at most L frames.
    too_long = {key: span for key, span in spans.items() if span > longest_episode}
    if too_long:
        messages.append(
            " ".join(f"delta_timestamps[{key!r}] reads frame offsets {int(offsets[key].min())} to "
                     f"{int(offsets[key].max())} at {fps} fps, {span} frames with the sample's own."
                     for key, span in too_long.items())
            + f" The longest selected episode has {longest_episode} frames, so every sample of every episode "
            f"pads {'this window' if len(too_long) == 1 else 'these windows'} ({', '.join(f'{key}_is_pad' for key in too_long)} true where the episode's nearest "
            f"frame stands in). delta_timestamps offsets are seconds.")
    return messages


def _looks_like_frames(seconds: Sequence[float], fps: int, *, past_episodes: bool) -> bool:
    """Whole numbers, at least two of them nonzero, written as integers ([0, 1, 2], ``range(16)``) or
    reaching past every episode: frame offsets read as seconds. Windows of whole seconds are real
    (SARM's [-7.0, ..., 0.0]) and come as floats (``float(s)``, ``i / fps``, a config's ``-1.0``); a
    single whole second ([-1.0, 0.0]) is a common observation window; at 1 fps frames are seconds."""
    values = np.asarray(seconds, dtype=np.float64)
    whole = fps > 1 and bool(np.all(values == np.round(values))) and len(set(values[values != 0].tolist())) >= 2
    return whole and (past_episodes or all(isinstance(v, (int, np.integer)) for v in seconds))


def _shown(values: Sequence[float]) -> str:
    """``values`` as written (numpy numbers as Python's), the first ``_SHOWN`` of a long list."""
    shown = [v.item() if isinstance(v, np.generic) else v for v in values]
    return str(shown[:_SHOWN])[:-1] + ", ...]" if len(shown) > _SHOWN else str(shown)
