"""Shared fixtures: tiny synthetic datasets built once per test session, and a thread police."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path

# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set (container images often set it):
# otherwise each xdist worker, and each pytest the suite starts, rewrites every test module's asserts
# from source again on every run (benchmarks/LOG.md, "The test suite"). The first run of a fresh
# checkout still pays it once per worker; compiling the package itself costs next to nothing.
sys.dont_write_bytecode = False

# One OpenMP thread per test process, as PyTorch gives each DataLoader worker. The suite runs one
# process per core (pytest-xdist, pyproject addopts), and PyTorch's default of a thread per core in
# every process oversubscribed the cores, its idle threads spinning: 96-100 s -> 84 s for the suite
# here, 140 -> 117 s of user CPU. Set before torch is first imported (OpenMP reads it once) and
# inherited by the subprocesses tests start; a value already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from filelock import FileLock  # noqa: E402


# The dataset writers (and with them episodestream and torch, ~1.7 CPU-s) are imported by the
# fixtures that use them, not here: pytest-xdist's controller loads this file for its hook before it
# starts the workers, and never builds a dataset, so importing them here delayed every worker's start.

CAMERAS = ("observation.images.front", "observation.images.wrist")
# Lengths chosen so that one episode is longer than the 100+ frame windows the parity tests use,
# and several are short enough that the pool turns over many times.
EPISODE_LENGTHS = (23, 140, 17, 41, 9, 60)
# Short and one-frame episodes, so that cuts fall inside, at the ends of and between episodes.
TABULAR_LENGTHS = (7, 1, 12, 3, 9, 1, 15, 4, 6, 2, 11, 5, 8, 1, 13, 3, 10, 6, 2, 14, 4, 7, 1, 9)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a venv without xdist (LeRobot's) must still run the tests
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one test process per core this process may use (xdist's own count is every core
    of the machine, not those this process may use). One more, to use the cores while part of the
    suite waits with the CPU idle, looked like a mistake: "3 workers" on 2 cores (issue 64 item 9).
    PYTEST_XDIST_AUTO_NUM_WORKERS, when set, still decides (xdist's own hook reads it)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return len(os.sched_getaffinity(0))


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """Collection imports torch, the package and every test module (~300k objects that live as long
    as the process): with the cyclic collector off meanwhile, those imports run no full collections
    (~0.4 CPU-s of each test process's start here), and ``gc.freeze()`` afterwards keeps every later
    full collection (and the 5 of pytest's unraisable-exception check at exit) from walking them
    again. Objects the tests make are collected as before (full collections rarer, below); only what
    collection imported is frozen.

    Paused here, not with the package's ``gc_paused()``: importing the package imports torch, which
    xdist's controller (it runs this hook but collects nothing) and a collection of modules that
    import neither (test_without_xdist's) would otherwise pay for."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
    if gc.isenabled():
        gc.collect()  # the imports' own garbage, once, so that it is not frozen with them
        gc.freeze()
    # Each full collection walks every object not frozen here: the modules tests import later
    # (torchcodec brings torch._dynamo, the S3 tests botocore) and what they cache. At CPython's
    # default, a full collection every tenth middle-generation one, those walks were most of each
    # test process's collector time. Ten times rarer: the young generations are collected as before,
    # and cyclic garbage old enough to reach the oldest one waits longer (a test that needs it gone
    # calls gc.collect()).
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)
    if "torch" in sys.modules:  # collection imported it (a run of torch-free modules never needs this)
        share_worker_tensors_through_files()


def share_worker_tensors_through_files() -> None:
    """DataLoader workers in this suite hand their batches' tensors over through shared-memory
    files. PyTorch's default on Linux passes a descriptor per tensor instead, each over its own
    authenticated socket connection to a thread of the worker: the suite runs ~200 multi-worker
    epochs of tiny batches, where that hand-over was a fifth of their CPU (benchmarks/LOG.md,
    "The suite's time: the workers' hand-over and the order of the tests"). The samples are the same bits either way;
    test_worker_start_methods streams an epoch through the default strategy, so the path users
    run stays tested."""
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy("file_system")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """The modules with slow or distributed tests first (each whole and in its own order): the
    longest tests (a real `accelerate launch`, benchmark runs) then start while the other processes
    still have short tests to take over, instead of one of them running alone at the end of the
    suite. Whole modules, so that no module-scoped fixture is set up twice."""
    first = {item.nodeid.split("::")[0] for item in items
             if item.get_closest_marker("slow") or item.get_closest_marker("distributed")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in first)


_MALLOC_TRIM = pytest.StashKey[Callable[[int], int] | None]()


def pytest_configure(config):
    # glibc's malloc_trim, from the process's own symbols (ctypes.util.find_library would start a
    # subprocess to look for libc); None where the C library has none (musl, macOS).
    trim = None
    if sys.platform.startswith("linux"):
        import ctypes

        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    config.stash[_MALLOC_TRIM] = trim


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """After each test, the heap's free pages go back to the kernel. glibc keeps what a test freed
    mapped (decode threads' arenas, holes between live blocks), so a test process grows from ~0.5 to
    ~1 GB resident over a run while ~0.5 GB is live, and every DataLoader worker it forks copies the
    page tables of all of it, faults on its pages copy-on-write and unmaps them at exit: that kernel
    work was ~30% of the multi-worker tests' CPU. Six alternating pairs of whole runs: less system
    time in all six, 5.3 CPU-s less at the median (benchmarks/LOG.md, "The heap trimmed after each
    test"). An earlier trimmer, dropped after four runs showed no difference, trimmed only past 64 MiB
    of growth."""
    yield
    trim = item.config.stash[_MALLOC_TRIM]
    if trim is not None:
        trim(0)


def pytest_unconfigure(config):
    """pytest's unraisable-exception check ends each test process with 5 full collections (it runs
    after this hook). One here, then a freeze: those 5 walk only what is made after it, not the
    hundreds of thousands of objects the tests left, which cost ~1 CPU-s a process. Finalisers
    that raise in this collection are still reported: the check's hook is still installed."""
    gc.collect()
    gc.freeze()


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder ``build(folder)`` writes, made once per test run. Under pytest-xdist each worker
    process would encode the same videos again: the first builds into the run's shared temporary
    folder and the others wait on its lock, then read the same files."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        root = tmp_path_factory.mktemp("datasets") / name
        build(root)
        return root
    shared = tmp_path_factory.getbasetemp().parent / "datasets-built-once"  # one per run, all workers
    shared.mkdir(exist_ok=True)
    root = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not root.exists():
            partial = shared / f"{name}.partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            partial.rename(root)  # whole or not at all: a failed build leaves no root behind
    return root


@pytest.fixture(scope="session")
def dataset_root(tmp_path_factory):
    """6 episodes, 2 cameras rolling over to new mp4 files at different episodes, 3 data files,
    and a PNG image feature stored in the parquet."""
    from episodestream.tools.synthetic import write_synthetic_dataset

    return built_once(tmp_path_factory, "main", lambda root: write_synthetic_dataset(
        root, num_episodes=len(EPISODE_LENGTHS), episode_length=EPISODE_LENGTHS, cameras=CAMERAS,
        image_keys=("observation.images.top",), max_episodes_per_data_file=2,
        max_episodes_per_video_file={CAMERAS[0]: 2, CAMERAS[1]: 4}, seed=0))


@pytest.fixture(scope="session")
def many_episodes_root(tmp_path_factory):
    """20 short episodes (5..15 frames), one camera: for coverage and split tests across consumers."""
    from episodestream.tools.synthetic import write_synthetic_dataset

    return built_once(tmp_path_factory, "many", lambda root: write_synthetic_dataset(
        root, num_episodes=20, episode_length=(5, 15), cameras=CAMERAS[:1], max_episodes_per_video_file=7, seed=3))


@pytest.fixture(scope="session")
def camera_less_root(tmp_path_factory):
    """24 camera-less episodes of TABULAR_LENGTHS frames (no video: written in ~0.1 s), for
    properties of the split, the schedule and resume that need metadata but never decode."""
    from episodestream.tools.synthetic import write_tabular_dataset

    return built_once(tmp_path_factory, "tabular", lambda root: write_tabular_dataset(
        root, num_episodes=len(TABULAR_LENGTHS), episode_length=list(TABULAR_LENGTHS), episodes_per_data_file=5))


@pytest.fixture(scope="session", autouse=True)
def private_download_permits(tmp_path_factory):
    """Node-wide download budgets live in /dev/shm by default, shared with every other process of
    the machine; give this test session its own so parallel sessions cannot throttle each other."""
    previous = os.environ.get("EPISODESTREAM_DOWNLOAD_PERMITS_DIR")
    os.environ["EPISODESTREAM_DOWNLOAD_PERMITS_DIR"] = str(tmp_path_factory.mktemp("permits"))
    yield
    if previous is None:
        del os.environ["EPISODESTREAM_DOWNLOAD_PERMITS_DIR"]
    else:
        os.environ["EPISODESTREAM_DOWNLOAD_PERMITS_DIR"] = previous


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory):
    """The map-style column cache (and remote sources without cache_dir) default to
    EPISODESTREAM_CACHE_DIR: keep the tests' copies out of the user's cache."""
    previous = os.environ.get("EPISODESTREAM_CACHE_DIR")
    os.environ["EPISODESTREAM_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if previous is None:
        del os.environ["EPISODESTREAM_CACHE_DIR"]
    else:
        os.environ["EPISODESTREAM_CACHE_DIR"] = previous


@pytest.fixture(autouse=True)
def thread_police():
    """Fail a test that leaves non-daemon threads running (leaked servers, readers, pools), or any
    of our decode threads (daemon threads, so that a loader nobody closed never blocks exit)."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()
              and (not t.daemon or t.name.startswith("episodestream-"))]
    for thread in leaked:
        thread.join(timeout=5)
    leaked = [t.name for t in leaked if t.is_alive()]
    assert not leaked, f"test left threads running: {leaked}"


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance of 2 CPUs for the tests of episodestream.ray and examples/ray, started once
    per test process and shut down at its end; the tests that use it skip where Ray is not installed
    (it is in the test extra)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'episodestream[ray]' (in the test extra)")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # no token notice: a local instance only this process uses
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
