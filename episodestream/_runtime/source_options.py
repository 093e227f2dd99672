"""The options both datasets share (``SourceOptions``), documented once, and the check that refuses
any other keyword with the closest valid one.

``EpisodeStreamingDataset`` and ``EpisodeDataset`` spell every option out in their signatures (so
``help()`` and IDEs show them) and hand them to ``DatasetCore``, whose signature holds the same
defaults; ``tests/test_errors.py`` holds the three equal. ``refuses_unknown_keywords`` wraps their
constructors: Python's own TypeError for a misspelt keyword names neither the closest valid one nor
the others.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypedDict, TypeVar

if TYPE_CHECKING:
    from episodestream._remote.transport.config import ControllerConfig


class SourceOptions(TypedDict, total=False):
    """Options both datasets take as keywords (each optional; the default follows its name).

    What to read:
        revision (None): a Hub branch, tag or commit, resolved once to a commit (None for local
            folders).
        episodes (None: all): episode indices to use, or a predicate over ``meta/episodes``: a
            callable on each row's dict (``lambda row: row["length"] > 100``) or a pyarrow compute
            expression (``pc.field("success") == True``), evaluated once at construction.
            Honoured by the split, ``len`` and resume.
        keep_frames (None: every frame): ``{episode_index: [(start, end), ...]}`` half-open frame
            ranges (keys int or str), or the path of a JSON file of that shape. Only kept frames
            are sampled (counted in ``len``, split across ranks and workers, once per epoch);
            windows still read the episode's other frames. Episodes not named, or named with no
            range, are left out (never read or fetched).
        delta_timestamps (None): ``{feature_key: [seconds, ...]}`` windows, each a multiple of 1/fps.
        tolerance_s (1e-4): how far a decoded frame's time, or a delta's rounding, may be from the
            query.

    What a sample looks like:
        return_uint8 (False): video camera frames as uint8 CHW instead of float32 in [0, 1] (as LeRobot:
            not parquet image cameras, which stay float32, nor depth cameras).
        image_transforms (None): a callable applied to every camera frame (or window) after decoding,
            except depth cameras' (as LeRobot).
        depth_output_unit ("mm"): "mm" or "m", the unit depth cameras come out in (float32 (1, H, W),
            windows (T, 1, H, W)); their stats in ``meta.stats`` too. LeRobot's
            ``cfg.dataset.depth_output_unit``.
        video_backend (None): "torchcodec" (the default when it loads) or "pyav"; also
            ``EPISODESTREAM_VIDEO_BACKEND``.
        decode_device ("cpu"): "cpu", or "cuda"/"cuda:N" to decode on the GPU (NVDEC via
            torchcodec; frames come out on that device, so iterate in the main process,
            num_workers=0).

    Remote sources (given for a local folder, they are ignored with a warning):
        cache_dir (None): where fetched bytes live (default ``EPISODESTREAM_CACHE_DIR``, else the
            user's cache directory); shared, refcounted, by every process of the node.
            ``EpisodeDataset`` also keeps a local folder's column cache there.
        cache_limit (None): disk budget such as "20GB" (default ``EPISODESTREAM_CACHE_LIMIT``); a
            budget smaller than what one consumer keeps in flight is refused at construction, with
            the minimum.
        storage_options (None): fsspec options for bucket URLs (credentials, endpoint).
        token (None): the Hugging Face token (default: huggingface_hub's own).
        hub_endpoint (None): the Hugging Face Hub's endpoint (default: huggingface_hub's own).
        download_config (None): the download controller's knobs (node-wide permits, retries,
            per-request timeout): a ControllerConfig, a dict of its knobs (the rest from
            ``EPISODESTREAM_DOWNLOAD_*``) or None. See docs/download-controller.md.
    """

    revision: str | None
    episodes: Sequence[int] | Callable[[dict[str, Any]], Any] | Any | None
    keep_frames: Mapping[Any, Any] | str | os.PathLike | None
    delta_timestamps: Mapping[str, Sequence[float]] | None
    tolerance_s: float
    return_uint8: bool
    image_transforms: Callable | None
    depth_output_unit: str
    video_backend: str | None
    decode_device: str
    cache_dir: str | os.PathLike | None
    cache_limit: int | str | None
    storage_options: Mapping[str, Any] | None
    token: str | None
    hub_endpoint: str | None
    download_config: ControllerConfig | Mapping[str, Any] | None


SOURCE_OPTION_NAMES: tuple[str, ...] = tuple(SourceOptions.__annotations__)  # in the order documented


P = ParamSpec("P")
R = TypeVar("R")


def source_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``SourceOptions`` among a constructor's arguments (its ``locals()``), to hand on whole."""
    return {name: values[name] for name in SOURCE_OPTION_NAMES}


def refuses_unknown_keywords(init: Callable[P, R]) -> Callable[P, R]:
    """Wrap a dataset's ``__init__`` so that a keyword it does not take raises a TypeError naming the
    class, each such keyword with its closest valid one, its own keywords and the ``SourceOptions``
    (before anything is opened). ``inspect.signature`` and ``help()`` still show ``init``'s."""
    owner = init.__qualname__.split(".")[0]
    parameters = inspect.signature(init).parameters
    accepted = {name for name, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    own = [name for name in accepted if name != "self" and name not in SOURCE_OPTION_NAMES]
    own.sort(key=list(parameters).index)

    @functools.wraps(init)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        unknown = [key for key in kwargs if key not in accepted]
        if unknown:
            valid = own + list(SOURCE_OPTION_NAMES)
            described = []
            for key in unknown:
                close = difflib.get_close_matches(key, valid, n=1)
                described.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            plural = "s" if len(unknown) > 1 else ""
            raise TypeError(f"{owner}() got an unexpected keyword argument{plural} {', '.join(described)}. "
                            f"Valid keywords: {', '.join(own)} (its own) and {', '.join(SOURCE_OPTION_NAMES)} "
                            f"(SourceOptions).")
        return init(*args, **kwargs)

    return checked
