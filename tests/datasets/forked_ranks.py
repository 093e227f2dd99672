"""Two ranks of a function forked from the test process, in the environment `accelerate launch`
gives a multi-process CPU run (gloo, env:// rendezvous).

Each rank of a real `accelerate launch` is a fresh interpreter importing torch, torchcodec and
accelerate again: ~2 s of CPU per rank and ~1 s for the launcher, where a fork costs ~0.1 s
(benchmarks/LOG.md, "The test suite"). One test per behaviour still goes through the real
launcher (test_streaming_distributed's first leg); the others fork.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import traceback
from collections.abc import Callable

NUM_PROCESSES = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(target: Callable[[], object], rank: int, port: int) -> None:
    code = 1
    try:
        # What torch.distributed.run (under accelerate launch --multi_gpu with ACCELERATE_USE_CPU)
        # sets in each rank's environment.
        os.environ.update({
            "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "WORLD_SIZE": str(NUM_PROCESSES),
            "LOCAL_WORLD_SIZE": str(NUM_PROCESSES), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "ACCELERATE_USE_CPU": "true", "ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO",
            "OMP_NUM_THREADS": "1"})
        # Accelerate keeps its process layout in class-level state, which the fork copied from this
        # test process (a one-process Accelerator, if an earlier test made one): start from none.
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        target()
        code = 0
    except BaseException:  # noqa: BLE001  (reported on stderr, where pytest shows it, and by the exit code)
        traceback.print_exc()
    finally:
        # No interpreter teardown in a forked child: the test process's atexit handlers and
        # fixtures are not the child's to run.
        os._exit(code)


def run_forked_ranks(target: Callable[[], object], *, timeout_s: float = 240) -> None:
    """Run ``target()`` in ``NUM_PROCESSES`` forked ranks of one gloo group; fail unless all exit 0."""
    context = multiprocessing.get_context("fork")
    port = free_port()
    processes = [context.Process(target=_rank, args=(target, rank, port))
                 for rank in range(NUM_PROCESSES)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout_s)
    stuck = [rank for rank, process in enumerate(processes) if process.is_alive()]
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
    assert not stuck, f"ranks {stuck} did not finish within {timeout_s} s"
    codes = [process.exitcode for process in processes]
    assert codes == [0] * NUM_PROCESSES, f"ranks exited with {codes} (their tracebacks are in the captured stderr)"
