"""Small datasets written by LeRobot 0.6's own writer (``LeRobotDataset.create`` / ``add_frame`` /
``save_episode`` / ``finalize``) with every feature type it has beyond RGB video: a depth camera (HEVC
``gray12le``, log-quantised, B-frames), depth images in parquet (uint16 mm and float32 m TIFF), a PNG
image camera, float64 / int32 / bool features, a (2, 3) float32 feature (an ``Array2D`` column), and
HEVC RGB video with B-frames; and a dataset with LeRobot 0.6's language columns, written by its
annotation pipeline's own code (``write_language_dataset``). Imported only by tests that already know
LeRobot is importable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from lerobot.configs.video import RGBEncoderConfig
from lerobot.datasets.lerobot_dataset import LeRobotDataset

HEIGHT, WIDTH, FPS = 64, 96, 10
LENGTHS = (14, 9, 17)
RGB, DEPTH, STILL = "observation.images.rgb", "observation.images.depth", "observation.images.still"
DEPTH_MM, DEPTH_M = "observation.images.depth_mm", "observation.images.depth_m"


def _camera(channels: int, dtype: str, *, depth: bool = False) -> dict:
    spec = {"dtype": dtype, "shape": (HEIGHT, WIDTH, channels), "names": ["height", "width", "channels"]}
    return {**spec, "info": {"is_depth_map": True}} if depth else spec


_TABULAR = {
    "observation.state": {"dtype": "float64", "shape": (3,), "names": None},
    "action": {"dtype": "float32", "shape": (2, 3), "names": None},
    "counter": {"dtype": "int32", "shape": (1,), "names": None},
    "flag": {"dtype": "bool", "shape": (1,), "names": None},
}


def _depth_mm(rng, episode: int, frame: int) -> np.ndarray:
    """Depth in mm over a ramp: 400..7000 mm, every value different, changing each frame."""
    ramp = np.linspace(400, 7000, HEIGHT * WIDTH).reshape(HEIGHT, WIDTH, 1)
    return (ramp + 37 * frame + 500 * episode + rng.integers(0, 30, (HEIGHT, WIDTH, 1))).astype(np.uint16)


def _tabular(rng, episode: int, frame: int) -> dict:
    return {"observation.state": rng.normal(size=3) * 1e3 + 1 / 3,
            "action": rng.normal(size=(2, 3)).astype(np.float32),
            "counter": np.array([frame * 7 + episode], np.int32),
            "flag": np.array([frame % 3 == 0]),
            "task": f"task {episode % 2}"}


def write_video_dataset(root: Path, *, rgb_codec: str = "av1") -> Path:
    """RGB video (``rgb_codec``: "av1", LeRobot's default, or "hevc" with B-frames), a depth video
    camera (LeRobot's default depth encoder), a PNG image camera and the tabular features."""
    features = {RGB: _camera(3, "video"), DEPTH: _camera(1, "video", depth=True), STILL: _camera(3, "image"),
                **_TABULAR}
    encoder = RGBEncoderConfig(vcodec="hevc") if rgb_codec == "hevc" else None
    dataset = LeRobotDataset.create("local/features", fps=FPS, features=features, root=root, use_videos=True,
                                    rgb_encoder=encoder)
    rng = np.random.default_rng(0)
    for episode, length in enumerate(LENGTHS):
        for frame in range(length):
            dataset.add_frame({RGB: rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8),
                               DEPTH: _depth_mm(rng, episode, frame),
                               STILL: rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8),
                               **_tabular(rng, episode, frame)})
        dataset.save_episode()
    dataset.finalize()
    return root


def write_depth_image_dataset(root: Path) -> Path:
    """Depth as images in parquet (no video): a uint16 mm camera and a float32 m camera."""
    features = {DEPTH_MM: _camera(1, "image", depth=True), DEPTH_M: _camera(1, "image", depth=True), **_TABULAR}
    dataset = LeRobotDataset.create("local/depth-images", fps=FPS, features=features, root=root, use_videos=False)
    rng = np.random.default_rng(1)
    for episode, length in enumerate(LENGTHS):
        for frame in range(length):
            mm = _depth_mm(rng, episode, frame)
            dataset.add_frame({DEPTH_MM: mm, DEPTH_M: (mm.astype(np.float32) / 1000 + np.float32(1e-4)),
                               **_tabular(rng, episode, frame)})
        dataset.save_episode()
    dataset.finalize()
    return root


LANGUAGE_KEYS = ("language_persistent", "language_events")
LANGUAGE_CAMERA = "observation.images.front"
LANGUAGE_LENGTHS = (6, 4, 7)


def _annotations(episode: int, unannotated: tuple[int, ...]) -> tuple[list[dict], dict[int, list[dict]]]:
    """Episode ``episode``'s persistent rows and its events by frame, as the writer normalises them."""
    from lerobot.annotations.steerable_pipeline.writer import (
        _normalize_event_row,
        _normalize_persistent_row,
        speech_atom,
    )

    if episode in unannotated:  # an episode the pipeline left unannotated
        return [], {}
    persistent = [_normalize_persistent_row(r) for r in (
        {"role": "user", "content": f"ep {episode} subtask", "style": "subtask", "timestamp": 0.0},
        {"role": "assistant", "content": f"ep {episode} plan", "style": "plan", "timestamp": 0.1234567},
        {"role": "assistant", "content": "memory", "style": "memory", "timestamp": 0.3})]
    louder = {"type": "function", "function": {"name": "say", "arguments": {"text": "ok", "volume": 0.5}}}
    events = {
        1: [_normalize_event_row(speech_atom(0.1, f"ep {episode} hello"))],
        3: [_normalize_event_row({"role": "user", "content": "stop", "style": "interjection", "tool_calls": [louder]}),
            _normalize_event_row({"role": "user", "content": "what is there?", "style": "vqa",
                                  "camera": LANGUAGE_CAMERA})],
    }
    return persistent, events


def write_language_dataset(root: Path, *, json_tool_calls: bool = False, unannotated: tuple[int, ...] = (1,),
                           lengths: tuple[int, ...] = LANGUAGE_LENGTHS) -> Path:
    """A video dataset (``observation.state``, ``action``, one camera) written by
    ``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` / ``finalize``, then the annotation
    pipeline's last steps on it, with its own code: ``LanguageColumnsWriter._materialize_table`` (the
    rows normalised by the writer's ``_normalize_persistent_row`` / ``_normalize_event_row``, events
    bucketed on the frame whose timestamp they fire at) rewriting each data file with
    ``write_table_one_row_group_per_episode``, and ``Executor._ensure_annotation_metadata_in_info``
    adding the features and ``tools`` to info.json. Episodes ``unannotated`` have no rows.
    ``json_tool_calls``: ``tool_calls`` items stored as JSON strings (LeRobot's canonical
    ``pa.json_()`` type)."""
    from lerobot.annotations.steerable_pipeline.executor import Executor
    from lerobot.annotations.steerable_pipeline.writer import LanguageColumnsWriter
    from lerobot.datasets.io_utils import write_table_one_row_group_per_episode
    from lerobot.datasets.language import language_events_arrow_type, language_persistent_arrow_type

    features = {"observation.state": {"dtype": "float32", "shape": (3,), "names": None},
                "action": {"dtype": "float32", "shape": (2,), "names": None},
                LANGUAGE_CAMERA: {"dtype": "video", "shape": (64, 64, 3), "names": ["height", "width", "channels"]}}
    dataset = LeRobotDataset.create("local/language", fps=FPS, features=features, root=root, use_videos=True)
    rng = np.random.default_rng(0)
    for episode, length in enumerate(lengths):
        for frame in range(length):
            dataset.add_frame({"observation.state": np.full(3, episode * 100 + frame, np.float32),
                               "action": rng.normal(size=2).astype(np.float32),
                               LANGUAGE_CAMERA: rng.integers(0, 255, (64, 64, 3), dtype=np.uint8),
                               "task": f"task {episode % 2}"})
        dataset.save_episode()
    dataset.finalize()
    for path in sorted(root.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        episodes = table.column("episode_index").to_pylist()
        frames = table.column("frame_index").to_pylist()
        persistent = [_annotations(e, unannotated)[0] for e in episodes]
        events = [_annotations(e, unannotated)[1].get(f, []) for e, f in zip(episodes, frames)]
        table = LanguageColumnsWriter()._materialize_table(table, persistent, events, drop_old=True)
        if json_tool_calls:  # the canonical types: tool calls as JSON text
            for key, canonical in zip(LANGUAGE_KEYS, (language_persistent_arrow_type(), language_events_arrow_type())):
                rows = [[{**r, "tool_calls": None if r["tool_calls"] is None else
                          [json.dumps(c) for c in r["tool_calls"]]} for r in frame]
                        for frame in table.column(key).to_pylist()]
                as_text = pa.array(rows, _with_text_tool_calls(canonical))
                table = table.set_column(table.column_names.index(key), key, as_text.cast(canonical))
        write_table_one_row_group_per_episode(table, path)
    Executor._ensure_annotation_metadata_in_info(root)
    return root


def _with_text_tool_calls(list_type: pa.ListType) -> pa.ListType:
    row = list_type.value_type
    fields = [pa.field(f.name, pa.list_(pa.string())) if f.name == "tool_calls" else f for f in row]
    return pa.list_(pa.struct(fields))
