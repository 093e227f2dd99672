"""``EpisodeMixture(keys=...)``: the mixture's own features, reconciled from its components' once.

``keys="same"`` keeps today's rule (identical keys, dtypes, shapes and windows; ``check_same_features``
lists the differences). ``"union"`` keeps every key of any component, ``"intersection"`` the keys
every component has. Under both, for each mixture key, over the components that have it:

- a vector (or any numeric feature) narrower on its last axis than the widest component's is
  zero-padded there, and every sample carries ``<key>_dim_mask`` (bool, the mixture's last-axis
  width, True = a real dimension) for every key some component pads;
- under ``"union"``, a component without the key gives zeros of the mixture's shape and dtype (a
  camera: a zero frame; a string: ``""``; a language column: ``[]``, no rows), with ``<key>_is_pad`` all True where the key is
  windowed, and every sample carries ``<key>_is_missing`` (a bool scalar) for every key some
  component lacks;
- cameras must have one size unless ``resize={key: (height, width)}`` names the size to resize to
  (never silently); their channel count must agree;
- what cannot be reconciled is an error naming the component, its key and the mixture key: a
  camera beside a number or a string (or a language column beside either), different dtypes, different ranks or inner axes, windows of
  different lengths (or a window beside none).

Every sample also carries ``robot_type``, its component's ``info.json`` string ("" when absent).
``mixture_schema`` builds the schema from the components' runtimes, with the checks that come before
it (``keys="same"``) and after it (one camera frame dtype). The per-component work is a ``ComponentAdapter``, applied by ``mixture.stream`` to each planned
sample (padding, fill-ins, masks: tabular, cheap) and to each finished one (resizes).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from episodestream._format.dtypes import is_numeric, sample_dtype
from episodestream._format.language import LANGUAGE_COLUMNS

if TYPE_CHECKING:
    from episodestream._runtime.dataset_runtime import DatasetRuntime

KEY_MODES = ("same", "union", "intersection")
DIM_MASK_SUFFIX = "_dim_mask"
MISSING_SUFFIX = "_is_missing"
PAD_SUFFIX = "_is_pad"
_CAMERA, _NUMBER, _STRING, _LANGUAGE = "camera", "number", "string", "language"


def _kind(dtype: str) -> str:
    if dtype in ("video", "image"):
        return _CAMERA
    if dtype == "language":  # lists of row dicts (never windowed): not a string, whatever info.json's shape
        return _LANGUAGE
    return _STRING if dtype == "string" else _NUMBER


@dataclass(frozen=True)
class ComponentView:
    """What the schema needs of one component: its (renamed) features and windows."""

    description: str
    features: Mapping[str, Any]  # mixture key -> _format.metadata.Feature
    names: Mapping[str, Any]  # mixture key -> info.json "names"
    windows: Mapping[str, int]  # mixture key -> window length, for windowed keys
    robot_type: str
    own_keys: Mapping[str, str]  # mixture key -> the component's own key (before rename=)
    specs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # mixture key -> info.json dict


@dataclass(frozen=True)
class MixtureKey:
    """One key of the mixture: its kind, dtype, shape (info.json's, per frame) and window length,
    and each component's last-axis width (None: the component lacks the key)."""

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    window: int | None
    widths: tuple[int | None, ...]
    depth: bool = False  # a depth camera: float32 frames whatever return_uint8

    @property
    def padded(self) -> bool:
        return self.kind == _NUMBER and any(w is not None and w != self.shape[-1] for w in self.widths)

    @property
    def missing(self) -> bool:
        return any(w is None for w in self.widths)


def camera_chw(shape: Sequence[int], info: Mapping[str, Any]) -> tuple[int, int, int]:
    """A camera feature's (channels, height, width), from info.json's shape and names."""
    names = info.get("names") if isinstance(info, Mapping) else None
    if isinstance(names, (list, tuple)) and len(names) == 3 and names[0] in ("channels", "channel"):
        return int(shape[0]), int(shape[1]), int(shape[2])
    return int(shape[2]), int(shape[0]), int(shape[1])  # LeRobot writes (height, width, channels)


class MixtureSchema:
    """The mixture's keys and each component's adapter (see the module docstring)."""

    def __init__(self, components: Sequence[ComponentView], *, keys: str,
                 resize: Mapping[str, tuple[int, int]] | None, camera_sizes: Sequence[Mapping[str, tuple]]) -> None:
        self.mode = keys
        self.components = list(components)
        self._camera_chw = [dict(c) for c in camera_sizes]  # per component: camera key -> (C, H, W)
        every = list(dict.fromkeys(k for c in components for k in c.features))
        if keys == "intersection":
            every = [k for k in every if all(k in c.features for c in components)]
        resize = dict(resize or {})
        cameras = sorted(k for k in every if any(_kind(c.features[k].dtype) == _CAMERA
                                                 for c in components if k in c.features))
        unknown = sorted(set(resize) - set(cameras))
        if unknown:
            raise ValueError(f"resize names {unknown}, which are not camera keys of the mixture (its cameras: "
                             f"{cameras}).")
        for key, target in resize.items():
            if (not isinstance(target, (tuple, list)) or len(target) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in target)):
                raise ValueError(f"resize[{key!r}] must be (height, width), two positive ints, got {target!r}.")
        self.keys = {key: self._reconcile(key, resize) for key in every}
        self.resize = resize
        self.adapters = [ComponentAdapter(self, i) for i in range(len(components))]

    def _reconcile(self, key: str, resize: Mapping[str, tuple[int, int]]) -> MixtureKey:
        having = [(i, c) for i, c in enumerate(self.components) if key in c.features]
        first_i, first = having[0]
        head = first.features[key]

        def clash(i: int, why: str) -> ValueError:
            own = self.components[i].own_keys.get(key, key)
            return ValueError(
                f"Mixture key {key!r}: dataset {i} ({self.components[i].description}) key {own!r} "
                f"({self.components[i].features[key].dtype} {list(self.components[i].features[key].shape)}"
                f"{_window_text(self.components[i].windows.get(key))}) cannot join dataset {first_i} "
                f"({first.description}) ({head.dtype} {list(head.shape)}{_window_text(first.windows.get(key))}): "
                f"{why}. Rename one of them (rename=) or leave it out (keys='intersection' keeps only shared keys).")

        kind = _kind(head.dtype)
        if kind == _LANGUAGE and key not in LANGUAGE_COLUMNS:
            raise ValueError(
                f"Mixture key {key!r}: dataset {first_i} ({first.description}) renames its language column "
                f"{first.own_keys.get(key, key)!r} onto it; language columns keep their names "
                f"({', '.join(LANGUAGE_COLUMNS)}): batches (EpisodeLoader, episodestream.collate) and LeRobot "
                f"know them by name.")
        for i, c in having[1:]:
            f = c.features[key]
            if _kind(f.dtype) != kind:
                raise clash(i, f"a {_kind(f.dtype)} beside a {kind}")
            if c.windows.get(key) != first.windows.get(key):
                raise clash(i, "windows of different lengths (delta_timestamps steps) do not stack")
            if kind == _NUMBER:
                # Samples hold every float as float32 and every integer as int64 (LeRobot's rule), so only
                # those kinds must agree: float64 beside float32 is one dtype in the samples.
                if sample_dtype(f.dtype) != sample_dtype(head.dtype):
                    raise clash(i, f"different dtypes in samples ({sample_dtype(f.dtype)} and "
                                   f"{sample_dtype(head.dtype)}); cast one of the datasets")
                if len(f.shape) != len(head.shape):
                    raise clash(i, f"different ranks ({len(f.shape)} and {len(head.shape)})")
                if tuple(f.shape[:-1]) != tuple(head.shape[:-1]):
                    raise clash(i, "shapes differ on an axis other than the last (only the last is padded)")
        widths: list[int | None] = [None] * len(self.components)
        if kind == _CAMERA:
            sizes = {i: self._camera_chw[i][key] for i, _ in having}
            channels = {chw[0] for chw in sizes.values()}
            if len(channels) > 1:
                i = next(i for i, chw in sizes.items() if chw[0] != sizes[first_i][0])
                raise clash(i, "cameras with different channel counts")
            target = resize.get(key)
            if target is not None:
                chw = (sizes[first_i][0], int(target[0]), int(target[1]))
            else:
                if len(set(sizes.values())) > 1:
                    i = next(i for i, s in sizes.items() if s != sizes[first_i])
                    raise clash(i, f"cameras of different sizes ({list(sizes[i])} and {list(sizes[first_i])} as "
                                   f"C, H, W); pass resize={{{key!r}: (height, width)}} to resize them (never "
                                   f"done silently)")
                chw = sizes[first_i]
            for i, _ in having:
                widths[i] = chw[2]
            shape = chw
        elif kind == _NUMBER:
            width = max(int(c.features[key].shape[-1]) if c.features[key].shape else 1 for _, c in having)
            for i, c in having:
                widths[i] = int(c.features[key].shape[-1]) if c.features[key].shape else 1
            shape = (*tuple(head.shape[:-1]), width) if head.shape else ()
        else:
            shape = tuple(head.shape)
            for i, _ in having:
                widths[i] = 0
        return MixtureKey(key, kind, head.dtype, tuple(shape), first.windows.get(key), tuple(widths),
                          depth=bool(getattr(head, "depth", False)))

    # -- what the mixture says about itself -------------------------------------------------------

    def features(self) -> dict[str, dict[str, Any]]:
        """The mixture's feature table, info.json style: the first component's dict with the
        mixture's dtype, shape and names (padded with "pad")."""
        table = {}
        for key, m in self.keys.items():
            first = next(c for c in self.components if key in c.features)
            spec: dict[str, Any] = {**first.specs.get(key, {}), "dtype": m.dtype}  # "info" and the rest kept
            if m.kind == _CAMERA:
                c, h, w = m.shape
                spec["shape"] = (h, w, c)  # tuples, as dataset.meta.features gives them
                spec["names"] = ["height", "width", "channels"]
            else:
                spec["shape"] = tuple(m.shape)
                spec["names"] = _padded_names(first.names.get(key), m.shape[-1] if m.shape else 0) if m.padded \
                    else first.names.get(key)
            table[key] = spec
        return table

    def frames_in_place(self) -> bool:
        """Whether ``EpisodeLoader`` may write decoded frames straight into batch memory: not when a
        camera is resized, missing from a component (its zero frame is part of the finished
        sample) or a video in one component and PNG images in another."""
        for key, m in self.keys.items():
            if m.kind != _CAMERA:
                continue
            dtypes = {c.features[key].dtype for c in self.components if key in c.features}
            if key in self.resize or m.missing or len(dtypes) > 1:
                return False
        return True

    def added_keys(self) -> list[str]:
        """Keys every sample carries besides the features: masks, and ``robot_type``."""
        out = [f"{k}{DIM_MASK_SUFFIX}" for k, m in self.keys.items() if m.padded]
        out += [f"{k}{MISSING_SUFFIX}" for k, m in self.keys.items() if m.missing]
        return [*out, "robot_type"]


def _window_text(window: int | None) -> str:
    return "" if window is None else f", window of {window}"


def _padded_names(names: Any, width: int) -> Any:
    """info.json names of a padded feature: the widest component's list, "pad" for the rest."""
    if isinstance(names, Mapping) and len(names) == 1:
        (axis, values), = names.items()
        return {axis: _padded_names(values, width)}
    if isinstance(names, (list, tuple)):
        return [*names, *["pad"] * (width - len(names))][:width] if len(names) < width else list(names)
    return names


def _zeros(m: MixtureKey, frame_dtype: torch.dtype) -> Any:
    """A missing key's value: as the sample's planned values are (numpy for numbers, a tensor for a
    camera frame, as a decoded PNG image is; strings; a new empty list of language rows)."""
    shape = (m.window,) if m.window is not None else ()
    if m.kind == _LANGUAGE:
        return []  # a frame without annotations, as LeRobot's writer leaves one
    if m.kind == _STRING:
        return [""] * m.window if m.window is not None else ""
    if m.kind == _CAMERA:
        # A depth camera's frames are float32 depth whatever return_uint8 (as the present ones are).
        return torch.zeros((*shape, *m.shape), dtype=torch.float32 if m.depth else frame_dtype)
    # A (1,) feature's value is a 0-dim array in a sample (LeRobot's scalars), so is its fill-in.
    value_shape = () if tuple(m.shape) == (1,) else m.shape
    return np.zeros((*shape, *value_shape), dtype=sample_dtype(m.dtype))


@dataclass
class ComponentAdapter:
    """What one component's samples need to become mixture samples (built once, applied per sample)."""

    schema: MixtureSchema
    index: int
    pads: dict[str, int] = field(default_factory=dict)  # key -> zeros to add on the last axis
    dim_masks: dict[str, np.ndarray] = field(default_factory=dict)
    missing: dict[str, MixtureKey] = field(default_factory=dict)  # keys to fill with zeros
    present_flags: list[str] = field(default_factory=list)  # <key>_is_missing False
    drop: set[str] = field(default_factory=set)  # own keys the mixture leaves out
    resizes: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        schema, i = self.schema, self.index
        component = schema.components[i]
        for key, m in schema.keys.items():
            width = m.widths[i]
            if m.padded:
                real = np.zeros(m.shape[-1], bool)
                real[:width or 0] = True
                self.dim_masks[key] = real
            if width is None:
                self.missing[key] = m
            elif m.kind == _NUMBER and width != m.shape[-1]:
                self.pads[key] = m.shape[-1] - width
            if m.missing and width is not None:
                self.present_flags.append(key)
            if m.kind == _CAMERA and width is not None and key in schema.resize:
                if schema._camera_chw[i][key][1:] != m.shape[1:]:
                    self.resizes[key] = (m.shape[1], m.shape[2])
        self.drop = {k for k in component.features if k not in schema.keys}
        self.robot_type = component.robot_type

    def added_keys(self) -> set[str]:
        """The keys ``adapt_item`` adds that are not the component's own (masks, fill-ins, robot_type)."""
        out = {f"{k}{DIM_MASK_SUFFIX}" for k in self.dim_masks} | {"robot_type"}
        out |= {f"{k}{MISSING_SUFFIX}" for k in [*self.missing, *self.present_flags]}
        out |= set(self.missing) | {f"{k}{PAD_SUFFIX}" for k, m in self.missing.items() if m.window is not None}
        return out

    def adapt_item(self, item: dict[str, Any], frame_dtype: torch.dtype) -> dict[str, Any]:
        """A planned sample's tabular part (keys already the mixture's) as the mixture's; values
        stay as planned values are (numpy arrays, strings, image tensors)."""
        for key in self.drop:
            item.pop(key, None)
            item.pop(f"{key}{PAD_SUFFIX}", None)
        for key, extra in self.pads.items():
            value = np.asarray(item[key])
            item[key] = np.concatenate([value, np.zeros((*value.shape[:-1], extra), value.dtype)], axis=-1)
        for key, mask in self.dim_masks.items():
            item[f"{key}{DIM_MASK_SUFFIX}"] = mask.copy()
        for key, m in self.missing.items():
            item[key] = _zeros(m, frame_dtype)
            if m.window is not None:
                item[f"{key}{PAD_SUFFIX}"] = np.ones(m.window, dtype=bool)
            item[f"{key}{MISSING_SUFFIX}"] = np.array(True)
        for key in self.present_flags:
            item[f"{key}{MISSING_SUFFIX}"] = np.array(False)
        item["robot_type"] = self.robot_type
        return item

    def resized(self, sample: dict[str, Any]) -> dict[str, Any]:
        """A finished sample with its cameras resized to the mixture's sizes (``resize=``)."""
        for key, size in self.resizes.items():
            sample[key] = resize_frames(sample[key], size)
        return sample


def resize_frames(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(C, H, W) or (T, C, H, W) frames resized to ``size`` by bilinear interpolation with
    antialiasing (torch's ``interpolate``); uint8 frames are rounded back to uint8."""
    batch = frames.unsqueeze(0) if frames.ndim == 3 else frames
    floats = batch if batch.is_floating_point() else batch.to(torch.float32)
    out = torch.nn.functional.interpolate(floats, size=size, mode="bilinear", antialias=True, align_corners=False)
    if not batch.is_floating_point():
        out = out.round_().clamp_(0, 255).to(batch.dtype)
    return out[0] if frames.ndim == 3 else out


def mixture_schema(components: Sequence[DatasetRuntime], renames: Sequence[Mapping[str, str]], *, keys: str,
                   resize: Mapping[str, tuple[int, int]] | None) -> MixtureSchema:
    """The mixture's schema over its components' runtimes (``keys``: one of ``KEY_MODES``, checked by
    the caller): under ``"same"`` every component must give the same features first
    (``check_same_features``), and every component must give camera frames of one dtype."""
    if keys == "same":
        check_same_features(components, renames, resized=set(resize or ()))
    schema = MixtureSchema([_view(c, r) for c, r in zip(components, renames)], keys=keys, resize=resize,
                           camera_sizes=[_camera_sizes(c, r) for c, r in zip(components, renames)])
    dtypes = [str(c.builder.frame_dtype).removeprefix("torch.") for c in components]
    if len(set(dtypes)) > 1:
        raise ValueError(f"The datasets of a mixture must give camera frames of one dtype (return_uint8 alike); "
                         f"they give {dtypes}.")
    return schema


def check_same_features(components: Sequence[DatasetRuntime], renames: Sequence[Mapping[str, str]],
                        resized: Collection[str] = ()) -> None:
    """``keys="same"``: one ValueError listing every key whose dtype, shape or window length differs
    between the components (or that some lack), after ``rename=``."""
    tables = [_feature_table(c, r, resized) for c, r in zip(components, renames)]
    every = list(dict.fromkeys(k for t in tables for k in t))
    lines = []
    for key in every:
        seen = [t.get(key, "missing") for t in tables]
        if len(set(seen)) > 1:
            lines.append(f"{key!r}: " + "; ".join(f"dataset {i} ({c.core.meta.description}) {s}"
                                                   for i, (c, s) in enumerate(zip(components, seen))))
    if lines:
        raise ValueError("The datasets of a mixture must give the same keys, dtypes, shapes and window lengths "
                         "(after rename=); these differ:\n  " + "\n  ".join(lines))


def _feature_table(component: DatasetRuntime, rename: Mapping[str, str],
                   resized: Collection[str] = ()) -> dict[str, str]:
    """Each (renamed) feature's dtype, shape and window length, as text to compare and to show
    (a camera that ``resize=`` names without its size)."""
    offsets = component.offsets
    table = {}
    for key, feature in component.core.meta.features.items():
        window = f", window of {len(offsets[key])}" if key in offsets else ""
        target = rename.get(key, key)
        shape = "resized" if target in resized else list(feature.shape)
        # A sample's dtype, not the stored one: float64 beside float32 mix (both come out float32).
        dtype = sample_dtype(feature.dtype) if is_numeric(feature.dtype) else feature.dtype
        table[target] = f"{dtype} {shape}{window}"
    return table


def _view(component: DatasetRuntime, rename: Mapping[str, str]) -> ComponentView:
    typed, meta = component.core.meta, component.core.lerobot_meta
    names = meta.names
    return ComponentView(
        description=typed.description,
        features={rename.get(k, k): f for k, f in typed.features.items()},
        names={rename.get(k, k): names.get(k) for k in typed.features},
        windows={rename.get(k, k): len(v) for k, v in component.offsets.items()},
        robot_type=str(typed.info.get("robot_type") or ""),
        own_keys={rename.get(k, k): k for k in typed.features},
        specs={rename.get(k, k): dict(meta.features[k]) for k in typed.features})


def _camera_sizes(component: DatasetRuntime, rename: Mapping[str, str]) -> dict[str, tuple[int, int, int]]:
    typed, meta = component.core.meta, component.core.lerobot_meta
    return {rename.get(k, k): camera_chw(typed.features[k].shape, meta.features[k]) for k in typed.camera_keys}
