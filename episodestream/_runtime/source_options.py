"""The options both datasets share (``SourceOptions``), declared once: their names, types and
documentation in the ``TypedDict``, their defaults in ``SOURCE_OPTION_DEFAULTS`` beside it.

``EpisodeStreamingDataset``, ``EpisodeDataset`` and ``DatasetCore`` take them as
``**options: Unpack[SourceOptions]`` (IDEs and type checkers show every key), and
``takes_source_options`` gives each constructor a signature that spells every option out as a
keyword with its default and type (so ``help()`` and ``inspect`` show them too), fills the defaults
and refuses any other keyword with the closest valid one (Python's own TypeError for a misspelt
keyword names neither the closest valid one nor the others).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypedDict, TypeVar

from episodestream._base.options import unexpected_keywords

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
# Each option's default, by the groups ``SourceOptions`` documents them in (its docstring states each
# default in parentheses; a test holds them equal). Everything else (the constructors' signatures,
# ``open_source``'s fill-in of what a caller left out) is derived from this one table.
SOURCE_OPTION_GROUPS: Mapping[str, Mapping[str, Any]] = {
    "What to read": {"revision": None, "episodes": None, "keep_frames": None, "delta_timestamps": None,
                     "tolerance_s": 1e-4},
    "What a sample looks like": {"return_uint8": False, "image_transforms": None, "depth_output_unit": "mm",
                                 "video_backend": None, "decode_device": "cpu"},
    "Remote sources": {"cache_dir": None, "cache_limit": None, "storage_options": None, "token": None,
                       "hub_endpoint": None, "download_config": None},
}
SOURCE_OPTION_DEFAULTS: Mapping[str, Any] = {name: default for group in SOURCE_OPTION_GROUPS.values()
                                             for name, default in group.items()}
# The options only a remote source uses (``open_source`` passes them on; a local folder warns of them).
REMOTE_OPTION_NAMES: tuple[str, ...] = tuple(SOURCE_OPTION_GROUPS["Remote sources"])
assert tuple(SOURCE_OPTION_DEFAULTS) == SOURCE_OPTION_NAMES, "SOURCE_OPTION_GROUPS must follow SourceOptions"


P = ParamSpec("P")
R = TypeVar("R")


def takes_source_options(init: Callable[P, R]) -> Callable[P, R]:
    """Wrap a constructor ``__init__(self, source, *, <its own keywords>, **options)`` (``options``:
    the ``SourceOptions``): its signature lists every option as a keyword-only parameter with its
    declared type and default; a call gets every option, defaults filled; a keyword it does not take
    raises a TypeError naming the class, each such keyword with its closest valid one, its own
    keywords and the ``SourceOptions`` (before anything is opened)."""
    owner = init.__qualname__.split(".")[0]
    parameters = inspect.signature(init).parameters
    own = [p for p in parameters.values() if p.kind is not p.VAR_KEYWORD]
    if len(own) == len(parameters):
        raise TypeError(f"{init.__qualname__} must take the source options as **options")
    # The TypedDict's annotations are ForwardRefs (postponed): shown as the text they hold.
    options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=SOURCE_OPTION_DEFAULTS[name],
                                 annotation=getattr(annotation, "__forward_arg__", annotation))
               for name, annotation in SourceOptions.__annotations__.items()]
    accepted = {p.name for p in own} | set(SOURCE_OPTION_NAMES)
    own_names = [p.name for p in own if p.name != "self"]

    @functools.wraps(init)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        unknown = [key for key in kwargs if key not in accepted]
        if unknown:
            raise TypeError(f"{unexpected_keywords(owner, unknown, own_names + list(SOURCE_OPTION_NAMES))} "
                            f"Valid keywords: {', '.join(own_names)} (its own) and {', '.join(SOURCE_OPTION_NAMES)} "
                            f"(SourceOptions).")
        for name, default in SOURCE_OPTION_DEFAULTS.items():
            kwargs.setdefault(name, default)
        return init(*args, **kwargs)

    checked.__signature__ = inspect.Signature(own + options)  # type: ignore[attr-defined]
    return checked
