"""One episode's checks, run by the readers the stream uses: its rows read and checked by
``RowReader`` (file, row count, ids, timestamps, dtypes, shapes, language), every frame's task, its
parquet images decoded and each camera's video decoded at the frames asked for, every frame checked
against its time (``decode_files``, depth cameras included). One ``EpisodeChecker`` per worker: it
keeps its data files' footers (and, for a local source, its decoders) open across the episodes it is
given."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from episodestream._format.files import DatasetFiles
from episodestream._format.metadata import DatasetMeta, EpisodeInfo
from episodestream._format.rows import EpisodeRows, RowReader
from episodestream._sample.builder import SampleBuilder, check_task_indices
from episodestream._sample.images import decode_image
from episodestream._format.mp4 import Mp4LayoutError
from episodestream._sample.video.decoder_cache import DecoderCache, decode_files
from episodestream.tools.doctor._checks import AFTER_ROWS, ROW_CHECKS, check_of
from episodestream.tools.doctor._frame_times import FrameTimes
from episodestream.tools.doctor._report import Failure

Decode = Literal["ends", "all"]
DECODE_MODES: tuple[Decode, ...] = ("ends", "all")
MATES_PER_READ = 16  # episodes of one data file whose rows are read in one call
FRAMES_PER_DECODE = 256  # frames asked of one file at once with --decode all (bounds the frames held)


@dataclass
class EpisodeOutcome:
    """Per check: None (passed) or its failure; ``skipped`` the checks that could not run."""

    episode_index: int
    results: dict[str, Failure | None] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)


class EpisodeChecker:
    def __init__(self, files: DatasetFiles, meta: DatasetMeta, builder: SampleBuilder, decoders: DecoderCache, *,
                 decode: Decode, tolerance_s: float) -> None:
        self.files, self.meta, self._builder = files, meta, builder
        self._reader = RowReader(files, meta, tolerance_s=tolerance_s)
        self._videos = files.episode_videos()
        self._decoders = decoders
        self._decode, self._tolerance_s = decode, tolerance_s
        self._frame_times = FrameTimes(fps=meta.fps, tolerance_s=tolerance_s)

    def check_run(self, episodes: Sequence[EpisodeInfo]) -> list[EpisodeOutcome]:
        """Each episode's outcome; the rows of up to ``MATES_PER_READ`` episodes of one data file read
        in one call, as the stream's pool reads file-mates (about half the time of a read each)."""
        outcomes, video = [], []
        for _, same_file in itertools.groupby(episodes, key=lambda episode: episode.data_relpath):
            group = list(same_file)
            for start in range(0, len(group), MATES_PER_READ):
                part = group[start:start + MATES_PER_READ]
                try:
                    rows: list[EpisodeRows | None] = list(self._reader.read_many(part)) if len(part) > 1 else [None]
                except Exception:  # noqa: BLE001 - a damaged file-mate: each is read alone, so an error names its own
                    rows = [None] * len(part)
                for episode, read in zip(part, rows):
                    outcome, for_video = self._check(episode, read)
                    outcomes.append(outcome)
                    if for_video is not None:
                        video.append((outcome, for_video))
        self._check_videos(video)
        return outcomes

    def _check(self, episode: EpisodeInfo, rows: EpisodeRows | None) -> tuple[EpisodeOutcome, EpisodeRows | None]:
        """Every check of ``episode`` but its video's (its ``rows`` read here unless given, read and
        checked already), and its rows where its video is to be checked."""
        outcome = EpisodeOutcome(episode.episode_index)
        relpaths = (episode.data_relpath, *(span.relpath for span in episode.videos.values()))

        def failed(check: str, error: BaseException) -> None:
            outcome.results[check] = Failure.of(check, error, episode=episode.episode_index, files=relpaths)

        try:
            if not self.files.knows_every_file:  # a remote v2.x source: the episode's files in one look-up
                self.files.look_up(relpaths)
        except Exception as error:  # noqa: BLE001 - the source could not say (a download error, named)
            failed("files", error)
            outcome.skipped.update(c for c in (*ROW_CHECKS, *AFTER_ROWS) if c != "files")
            return outcome, None
        missing = self._missing_videos(episode)
        try:
            rows = self._reader.read(episode) if rows is None else rows
        except Exception as error:  # every reader error is a finding, whatever its type
            failed(check_of(error, "rows"), error)
            outcome.results.setdefault("files", missing)  # read past its footer, the data file is there
            # The read stops at its first error: what it had not checked yet, and what needs the rows, is not known.
            outcome.skipped.update(c for c in (*ROW_CHECKS, *AFTER_ROWS) if c not in outcome.results)
            return outcome, None
        outcome.results.update({check: None for check in ROW_CHECKS})
        outcome.results["files"] = missing
        for check, run in (("tasks", lambda: check_task_indices(self.meta, episode.episode_index,
                                                                 rows.columns["task_index"])),
                           ("images", lambda: self._images(rows, self._frames(episode)))):
            try:
                run()
                outcome.results[check] = None
            except Exception as error:  # noqa: BLE001 - reported, with its type and message
                failed(check, error)
        if missing is not None:
            outcome.skipped.update(("frames", "video"))  # its file is missing: said once, under files
            return outcome, None
        outcome.results["video"] = None  # until a frame fails to decode
        if not episode.videos:
            outcome.results["frames"] = None
            return outcome, None
        # Held until the run's video is checked, which needs only the times: not a run's PNG images.
        return outcome, dataclasses.replace(rows, columns={"timestamp": rows.columns["timestamp"]}, strings={})

    def _frames(self, episode: EpisodeInfo) -> Sequence[int]:
        return range(episode.length) if self._decode == "all" else sorted({0, episode.length - 1})

    def _missing_videos(self, episode: EpisodeInfo) -> Failure | None:
        """The first of the episode's video files that is not there (the stream's decoder would fail
        to open it, or a remote source's ``EpisodeVideos.check`` refuse it)."""
        for key, span in episode.videos.items():
            try:
                if not self.files.exists(span.relpath):
                    raise FileNotFoundError(f"Video file {self.files.description}/{span.relpath} is missing "
                                            f"(episode_index {episode.episode_index} has its {key!r} frames there).")
            except Exception as error:  # noqa: BLE001
                return Failure.of("files", error, episode=episode.episode_index,
                                  files=(episode.data_relpath, span.relpath))
        return None

    def _images(self, rows: EpisodeRows, frames: Sequence[int]) -> None:
        for key in self.meta.image_keys:
            values = rows.strings[key]
            for frame in frames:  # named as a sample's image is named when it cannot be decoded
                decode_image(values[frame], f"{self.meta.description} episode {rows.episode.episode_index} "
                                            f"frame {frame} key {key!r}")

    def _check_videos(self, pending: list[tuple[EpisodeOutcome, EpisodeRows]]) -> None:
        """Decode the frames of ``pending`` episodes, their failures into their outcomes. With
        ``decode="ends"`` every episode's first frames, then every episode's last frames, each as the
        episode narrowed to that frame's bytes: a remote source fetches the span of that frame alone
        (from the keyframe before it), never the episode's whole span or a v2.x episode's whole file,
        and with a phase's episodes all admitted first, fetches them on its threads while the frames
        before are decoded (a check waits on the link). A local source reads in place."""
        phases: list[list[tuple[EpisodeOutcome, EpisodeRows, Sequence[int]]]]
        if self._decode == "all":  # one episode at a time: its whole span is in the cache meanwhile
            phases = [[(outcome, rows, self._frames(rows.episode))] for outcome, rows in pending]
        else:
            phases = [[(outcome, self._at(rows, 0), [0]) for outcome, rows in pending],
                      [(outcome, self._at(rows, rows.length - 1), [rows.length - 1]) for outcome, rows in pending
                       if rows.length > 1]]
        for phase in phases:
            for _, rows, _ in phase:
                self._videos.admit(rows.episode)  # a remote source starts fetching now, in the background
            for outcome, rows, frames in phase:
                try:
                    if "frames" not in outcome.results and "frames" not in outcome.skipped:
                        self._check_frame_times(outcome, rows)  # once an episode, in its first phase
                    if outcome.results.get("video") is None:  # one failure an episode: its first
                        self._decode_frames(rows, frames)
                except Exception as error:  # noqa: BLE001 - reported, with its type and message
                    episode = rows.episode
                    outcome.results["video"] = Failure.of("video", error, episode=episode.episode_index, files=(
                        episode.data_relpath, *(span.relpath for span in episode.videos.values())))
                finally:
                    self._videos.evict(rows.episode)

    def _check_frame_times(self, outcome: EpisodeOutcome, rows: EpisodeRows) -> None:
        """Every frame's time against each camera's frame times (``_frame_times``), the index read from
        the admitted episode's file; not checked where the index cannot be read (the decode says why)."""
        episode = rows.episode
        try:
            queries = self._builder.frame_queries(rows, range(episode.length), self._videos)
            for (key, span), query in zip(episode.videos.items(), queries):
                self._frame_times.check(span.relpath, query,
                                        functools.partial(self._videos.track, episode, key))
            outcome.results["frames"] = None
        except Mp4LayoutError:
            outcome.skipped.add("frames")
        except Exception as error:  # noqa: BLE001 - reported, with its type and message
            outcome.results["frames"] = Failure.of("frames", error, episode=episode.episode_index, files=(
                episode.data_relpath, *(span.relpath for span in episode.videos.values())))

    def _at(self, rows: EpisodeRows, frame: int) -> EpisodeRows:
        """``rows`` of the episode narrowed to ``frame``'s video bytes (``_narrowed``)."""
        return dataclasses.replace(rows, episode=_narrowed(rows.episode, frame, self.meta.fps))

    def _decode_frames(self, rows: EpisodeRows, frames: Sequence[int]) -> None:
        """Decode ``frames`` of every camera of an admitted episode as the stream decodes a sample's."""
        try:
            self._videos.check(rows.episode)
            for start in range(0, len(frames), FRAMES_PER_DECODE):
                queries = self._builder.frame_queries(rows, frames[start:start + FRAMES_PER_DECODE], self._videos)
                decode_files(self._decoders, queries, fps=self.meta.fps, tolerance_s=self._tolerance_s)
        finally:
            if not self.files.videos_stay_in_place:
                self._decoders.close()  # their files are the cache's, which may drop them once evicted

    def close(self) -> None:
        self._decoders.close()
        self._videos.close()


def _narrowed(episode: EpisodeInfo, frame: int, fps: int) -> EpisodeInfo:
    """``episode`` with each camera's needed part the one frame's time, ``[from + f / fps, + 1 / fps)``."""
    return dataclasses.replace(episode, videos={
        key: dataclasses.replace(span, needed_from_s=span.from_timestamp_s + frame / fps, whole_file=False,
                                 needed_to_s=min(span.to_timestamp_s, span.from_timestamp_s + (frame + 1) / fps))
        for key, span in episode.videos.items()})
