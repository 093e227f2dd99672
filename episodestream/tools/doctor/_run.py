"""``run_doctor``: every check on every selected episode, up front, in parallel, into one report.

Episodes are checked on ``jobs`` threads (reading parquet and decoding video release the GIL), each
given runs of consecutive episodes, so that a thread's open footers and decoders serve the
episodes that share its files (v3.0 keeps many episodes per file)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Protocol

from episodestream._base.options import check_choice, check_positive_float
from episodestream._format.episodes import EpisodeSelection
from episodestream._format.metadata import DatasetMeta
from episodestream._format.rows import DEFAULT_TOLERANCE_S
from episodestream._format.versions import load_metadata
from episodestream._runtime.core import select_episodes
from episodestream._runtime.sources import open_source
from episodestream._sample.builder import SampleBuilder
from episodestream._sample.video.backends import resolve_backend
from episodestream._sample.video.decoder_cache import MAX_DECODERS, DecoderCache
from episodestream.tools.doctor._checks import CHECKS
from episodestream.tools.doctor._dataset import check_stats
from episodestream.tools.doctor._episode import DECODE_MODES, Decode, EpisodeChecker, EpisodeOutcome
from episodestream.tools.doctor._report import CheckResult, DoctorReport, Failure

RUN_EPISODES_MAX = 64  # consecutive episodes a thread takes at a time


class EpisodeList(Protocol):
    """A list of episodes expanded against the dataset (the CLI's ``--episodes``)."""

    def indices(self, episode_index: Sequence[int], description: str) -> list[int]: ...


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run_doctor(source: str | os.PathLike, *, episodes: Sequence[int] | EpisodeList | None = None,
               decode: Decode = "ends", jobs: int | None = None, tolerance_s: float = DEFAULT_TOLERANCE_S,
               video_backend: str | None = None, progress: bool = False) -> DoctorReport:
    """Check ``source`` (a local dataset folder, v3.0 or v2.x) the way the stream reads it.

    Args:
        episodes: the episodes to check (default: every episode); ``ValueError`` for one the
            dataset does not have.
        decode: "ends" decodes each camera at every episode's first and last frames (and decodes
            its parquet images there); "all" at every frame.
        jobs: threads checking episodes (default: the cores this process may use).
        tolerance_s: how far a row's timestamp and a decoded frame may be from their time, as the
            datasets' ``tolerance_s`` (default 1e-4).
        video_backend: "torchcodec" or "pyav", as the datasets take it (default: torchcodec where it loads).
        progress: a tqdm bar of the episodes checked, on stderr.

    Returns:
        A ``DoctorReport``: per check, the episodes that pass and the first failures.

    Raises:
        ValueError: ``episodes``, ``decode``, ``jobs`` or ``tolerance_s`` invalid.
        OSError: the source cannot be opened (a path that is a file, a folder that is not there).
    """
    decode = check_choice("decode", decode, DECODE_MODES)
    jobs = default_jobs() if jobs is None else jobs
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"Invalid jobs ({jobs!r}). Supported values are integers >= 1.")
    tolerance_s = check_positive_float("tolerance_s", tolerance_s)
    start = time.perf_counter()
    results = {check.name: CheckResult(check.name) for check in CHECKS}
    files = open_source(source, revision=None)
    try:
        try:
            meta = load_metadata(files)
            builder = SampleBuilder(meta, offsets={}, tolerance_s=tolerance_s, return_uint8=True,
                                    image_transforms=None)  # refuses a depth camera's unreadable quantiser
        except (OSError, ValueError) as error:  # the reader's findings; anything else is a bug, raised
            results["metadata"].add_failure(Failure.of("metadata", error, root=files.description))
            for result in results.values():
                result.ran = result.name == "metadata"
            return DoctorReport(files.description, None, 0, 0, decode, jobs, time.perf_counter() - start, results)
        if episodes is not None and not isinstance(episodes, Sequence):
            episodes = episodes.indices(meta.episodes.episode_index.tolist(), files.description)
        selection = select_episodes(meta, episodes)
        try:
            check_stats(files, meta)
        except (OSError, ValueError) as error:
            results["stats"].add_failure(Failure.of("stats", error, root=files.description))
        open_video = resolve_backend(video_backend, "cpu", has_video=bool(meta.video_keys))
        capacity = max(1, min(MAX_DECODERS, 2 * len(meta.video_keys)))

        def checker() -> EpisodeChecker:
            return EpisodeChecker(files, meta, builder, DecoderCache(open_video, capacity=capacity), decode=decode,
                                  tolerance_s=tolerance_s)

        for outcome in _check_episodes(selection, checker, jobs, progress):
            _tally(results, outcome)
        _note_absent_features(results, meta)
    finally:
        files.close()
    for result in results.values():
        result.failures.sort(key=lambda f: (f.episode is None, f.episode or 0))
    return DoctorReport(files.description, meta.info.get("codebase_version"), len(selection),
                        int(selection.lengths.sum()), decode, jobs, time.perf_counter() - start, results)


def _check_episodes(selection: EpisodeSelection, make_checker, jobs: int, progress: bool):
    """Each selected episode's outcome, in the order runs finish (a run: consecutive episodes)."""
    from tqdm import tqdm

    size = max(1, min(RUN_EPISODES_MAX, -(-len(selection) // (4 * jobs))))
    runs = [selection[k:k + size] for k in range(0, len(selection), size)]
    local = threading.local()
    checkers: list[EpisodeChecker] = []
    lock = threading.Lock()

    def check_run(run: EpisodeSelection) -> list[EpisodeOutcome]:
        checker = getattr(local, "checker", None)
        if checker is None:
            checker = local.checker = make_checker()
            with lock:
                checkers.append(checker)
        return [checker.check(episode) for episode in run]

    bar = tqdm(total=len(selection), unit="episodes", desc="doctor", file=sys.stderr, disable=not progress)
    try:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="episodestream-doctor") as pool:
            pending: set[Future] = {pool.submit(check_run, run) for run in runs}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        outcomes = future.result()
                        bar.update(len(outcomes))
                        yield from outcomes
            finally:
                for future in pending:
                    future.cancel()
    finally:
        bar.close()
        for checker in checkers:
            checker.close()


def _tally(results: dict[str, CheckResult], outcome: EpisodeOutcome) -> None:
    for name, failure in outcome.results.items():
        if failure is None:
            results[name].passed_episodes += 1
        else:
            results[name].add_failure(failure)
    for name in outcome.skipped:
        results[name].skipped_episodes += 1


def _note_absent_features(results: dict[str, CheckResult], meta: DatasetMeta) -> None:
    """A check of features the dataset does not have passes trivially: say so, not '6/6 ok'."""
    has = {"images": bool(meta.image_keys), "video": bool(meta.video_keys),
           "language": any(f.dtype == "language" for f in meta.features.values())}
    for name, present in has.items():
        if not present:
            results[name].absent = True

