"""``run_doctor``: every check on every selected episode, up front, in parallel, into one report.

Episodes are checked by ``jobs`` worker processes (threads where the platform cannot fork), each
given runs of consecutive episodes, so that a worker's open footers and decoders serve the
episodes that share its files (v3.0 keeps many episodes per file)."""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np

from episodestream._base.fork_safety import freeze_inherited_objects_in_forked_children

from episodestream._base.options import check_choice, check_positive_float
from episodestream._format.episodes import EpisodeSelection
from episodestream._format.files import SourceStats
from episodestream._format.metadata import DatasetMeta
from episodestream._format.rows import DEFAULT_TOLERANCE_S
from episodestream._format.versions import load_metadata
from episodestream._runtime.core import select_episodes
from episodestream._runtime.sources import open_source
from episodestream._sample.builder import SampleBuilder
from episodestream._sample.video.backends import resolve_backend
from episodestream._sample.video.decoder_cache import MAX_DECODERS, DecoderCache
from episodestream._base.cores import usable_cores
from episodestream.tools.doctor._checks import CHECKS
from episodestream.tools.doctor._dataset import check_stats
from episodestream.tools.doctor._episode import DECODE_MODES, Decode, EpisodeChecker, EpisodeOutcome
from episodestream.tools.doctor._report import CheckResult, DoctorReport, Failure

RUN_EPISODES_MAX = 64  # consecutive episodes a thread takes at a time


class WorkerDied(RuntimeError):
    """A worker process ended without a result (killed, or crashed in native code)."""


class EpisodeList(Protocol):
    """A list of episodes expanded against the dataset (the CLI's ``--episodes``)."""

    def indices(self, episode_index: Sequence[int], description: str) -> list[int]: ...


def default_jobs() -> int:
    return usable_cores()


def run_doctor(source: str | os.PathLike, *, episodes: Sequence[int] | EpisodeList | None = None,
               decode: Decode = "ends", jobs: int | None = None, tolerance_s: float = DEFAULT_TOLERANCE_S,
               video_backend: str | None = None, revision: str | None = None,
               cache_dir: str | os.PathLike | None = None, hub_endpoint: str | None = None,
               storage_options: Mapping[str, Any] | None = None, progress: bool = False) -> DoctorReport:
    """Check ``source`` (v3.0 or v2.x: a local folder, a URL or a Hub repo id) the way the stream reads it.

    A remote source is read as the datasets read it, through the node cache and the download
    controller: its metadata, each episode's row groups and, per camera, the mp4's header and the
    bytes of the frames decoded (``decode="all"``: the episode's whole span).

    Args:
        episodes: the episodes to check (default: every episode); ``ValueError`` for one the
            dataset does not have.
        decode: "ends" decodes each camera at every episode's first and last frames (and decodes
            its parquet images there); "all" at every frame.
        jobs: worker processes checking episodes (default: the cores this process may use; 1: in this process).
        tolerance_s: how far a row's timestamp and a decoded frame may be from their time, as the
            datasets' ``tolerance_s`` (default 1e-4).
        video_backend: "torchcodec" or "pyav", as the datasets take it (default: torchcodec where it loads).
        revision: a Hub dataset's branch, tag or commit (default: main).
        cache_dir: a remote source's node cache folder (default: ``EPISODESTREAM_CACHE_DIR``, else
            the user's cache folder).
        hub_endpoint, storage_options: as the datasets take them (a Hub mirror; fsspec options for
            bucket URLs).
        progress: a tqdm bar of the episodes checked, on stderr.

    Returns:
        A ``DoctorReport``: per check, the episodes that pass and the first failures.

    Raises:
        ValueError: ``episodes``, ``decode``, ``jobs`` or ``tolerance_s`` invalid.
        OSError: the source cannot be opened (a path that is a file, no such folder, repo or server).
        CacheFullError: a remote source's cache cannot hold an episode per job.
    """
    decode = check_choice("decode", decode, DECODE_MODES)
    jobs = default_jobs() if jobs is None else jobs
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"Invalid jobs ({jobs!r}). Supported values are integers >= 1.")
    tolerance_s = check_positive_float("tolerance_s", tolerance_s)
    start = time.perf_counter()
    results = {check.name: CheckResult(check.name) for check in CHECKS}
    files = open_source(source, revision=revision, cache_dir=cache_dir, hub_endpoint=hub_endpoint,
                        storage_options=storage_options)
    try:
        try:
            meta = load_metadata(files)
            builder = SampleBuilder(meta, offsets={}, tolerance_s=tolerance_s, return_uint8=True,
                                    image_transforms=None)  # refuses a depth camera's unreadable quantiser
        except (OSError, ValueError) as error:  # the reader's findings; anything else is a bug, raised
            results["metadata"].add_failure(Failure.of("metadata", error, root=files.description))
            for result in results.values():
                result.ran = result.name == "metadata"
            return DoctorReport(files.description, None, 0, 0, decode, jobs, time.perf_counter() - start, results,
                                files.stats())
        if episodes is not None and not isinstance(episodes, Sequence):
            episodes = episodes.indices(meta.episodes.episode_index.tolist(), files.description)
        selection = select_episodes(meta, episodes)
        files.check_cache_budget(meta, episodes_in_flight=jobs)  # each job holds one episode's bytes at a time
        try:
            check_stats(files, meta)
        except (OSError, ValueError) as error:
            results["stats"].add_failure(Failure.of("stats", error, root=files.description))
        open_video = resolve_backend(video_backend, "cpu", has_video=bool(meta.video_keys))
        capacity = max(1, min(MAX_DECODERS, 2 * len(meta.video_keys)))

        def checker() -> EpisodeChecker:
            return EpisodeChecker(files, meta, builder, DecoderCache(open_video, capacity=capacity), decode=decode,
                                  tolerance_s=tolerance_s)

        fetched: dict[int, SourceStats] = {}  # each worker process's reads, by its pid
        for outcome in _check_episodes(selection, checker, jobs, progress, fetched):
            _tally(results, outcome)
        _note_absent_features(results, meta)
        fetched[os.getpid()] = files.stats()  # this process's: the metadata, and episodes checked here
    finally:
        files.close()
    for result in results.values():
        result.failures.sort(key=lambda f: (f.episode is None, f.episode or 0))
    return DoctorReport(files.description, meta.info.get("codebase_version"), len(selection),
                        int(selection.lengths.sum()), decode, jobs, time.perf_counter() - start, results,
                        _combine(list(fetched.values()), lambda a, b: a + b))


def _check_episodes(selection: EpisodeSelection, make_checker: Callable[[], EpisodeChecker], jobs: int,
                    progress: bool, fetched: dict[int, SourceStats]) -> Iterator[EpisodeOutcome]:
    """Each selected episode's outcome, in the order runs finish (a run: consecutive episodes); what
    each worker process read from the source so far into ``fetched``, by its pid."""
    from tqdm import tqdm

    size = max(1, min(RUN_EPISODES_MAX, -(-len(selection) // (4 * jobs))))
    runs = [selection.rows[k:k + size] for k in range(0, len(selection), size)]
    bar = tqdm(total=len(selection), unit="episodes", desc="doctor", file=sys.stderr, disable=not progress)
    try:
        if jobs == 1 or len(runs) == 1:
            checker = make_checker()
            try:
                for run in runs:
                    outcomes = _check_run(checker, run)
                    bar.update(len(outcomes))
                    yield from outcomes
            finally:
                checker.close()
            return
        with _pool(min(jobs, len(runs)), make_checker) as submit:
            pending: set[Future] = {submit(run) for run in runs}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        try:
                            outcomes, pid, stats = future.result()
                        except BrokenProcessPool as error:  # which episode it was checking died with it
                            raise WorkerDied(
                                f"a worker process ended without its result ({error}): killed (out of memory?) or "
                                f"crashed (in a video decoder?). Run again with --jobs 1 to meet the crash in this "
                                f"process, at its episode (the progress bar says how far it got).") from error
                        if pid is not None:
                            fetched[pid] = stats
                        bar.update(len(outcomes))
                        yield from outcomes
            finally:
                for future in pending:
                    future.cancel()
    finally:
        bar.close()


def _check_run(checker: EpisodeChecker, rows: np.ndarray) -> list[EpisodeOutcome]:
    return checker.check_run([checker.meta.episodes.at(int(row)) for row in rows])


# A run's outcomes, and the pid of the worker process that checked it with what that process has read
# from the source so far (None, None from a thread of this process, whose reads this process counts).
RunResult = tuple[list[EpisodeOutcome], "int | None", "SourceStats | None"]
Submit = Callable[[np.ndarray], "Future[RunResult]"]


@contextmanager
def _pool(jobs: int, make_checker: Callable[[], EpisodeChecker]) -> Iterator[Submit]:
    """``submit(rows)``: the run's outcomes, checked by one of ``jobs`` worker processes forked from
    this one where the platform forks (checking rows is Python work that holds the GIL about half of
    each episode's time, so threads stop scaling at about two cores), each with the source and
    metadata it inherited and readers and decoders of its own; else by ``jobs`` threads."""
    if "fork" in multiprocessing.get_all_start_methods():
        freeze_inherited_objects_in_forked_children()  # a forked child must not free the parent's garbage
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"), initializer=_start_worker,
                                 initargs=(make_checker,)) as processes:  # inherited by the fork, not pickled
            yield lambda rows: processes.submit(_check_in_worker, rows)
        return
    local, made, lock = threading.local(), [], threading.Lock()

    def in_thread(rows: np.ndarray) -> RunResult:
        checker = getattr(local, "checker", None)
        if checker is None:
            checker = local.checker = make_checker()
            with lock:
                made.append(checker)
        return _check_run(checker, rows), None, None

    try:
        with ThreadPoolExecutor(jobs, thread_name_prefix="episodestream-doctor") as threads:
            yield lambda rows: threads.submit(in_thread, rows)
    finally:
        for checker in made:
            checker.close()


# A worker process's checker, made by its initializer: set in worker processes only, never in the
# process that runs ``run_doctor`` (a run goes to a worker as its episodes' rows, a few bytes).
_worker_checker: EpisodeChecker | None = None
_worker_inherited = SourceStats()  # the source's counts the fork inherited (the parent's reads)


def _start_worker(make_checker: Callable[[], EpisodeChecker]) -> None:
    global _worker_checker, _worker_inherited
    _worker_checker = make_checker()
    _worker_inherited = _worker_checker.files.stats()


def _check_in_worker(rows: np.ndarray) -> RunResult:
    assert _worker_checker is not None, "called in a worker process only"
    outcomes = _check_run(_worker_checker, rows)
    return outcomes, os.getpid(), _combine([_worker_checker.files.stats(), _worker_inherited], lambda a, b: a - b)


def _combine(stats: list[SourceStats], how: Callable[[int, int], int]) -> SourceStats:
    """``how`` applied field by field, left to right (sums, or a difference of two)."""
    names = [f.name for f in dataclasses.fields(SourceStats)]
    return functools.reduce(lambda a, b: SourceStats(**{n: how(getattr(a, n), getattr(b, n)) for n in names}),
                            stats[1:], stats[0]) if stats else SourceStats()


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

