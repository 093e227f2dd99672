"""The Ray Train example's training loop against the same loop under ``accelerate launch``, on the same
CPUs, side by side in one run (issue 63 item 2: Ray's samples/s within 0.9 of Accelerate's).

    .venv/bin/python benchmarks/ray/benchmark_ray_train.py --rounds 2

Both routes run, per rank, the loop of examples/ray/train_ray.py through its own functions: ``build``
(an ``EpisodeStreamingDataset`` that reads its rank and world size from the process group, an
``EpisodeLoader`` with ``--num-threads`` decode threads, the example's ``TinyPolicy``), the model wrapped in
DDP, AdamW, and ``train_step`` (forward, MSE loss, backward with the gradients all-reduced over gloo,
optimizer step) for ``--steps`` steps of ``--batch-size`` samples (the epoch restarts if the steps outrun
it). Routes:

  - ray: a fresh process runs ``ray.init(num_cpus=--workers)`` and a ``TorchTrainer`` of ``--workers``
    CPU workers (``prepare_model`` wraps the model);
  - accelerate: ``ACCELERATE_USE_CPU=true .venv/bin/python -m accelerate.commands.launch --multi_gpu
    --num_processes N --num_cpu_threads_per_process 1``, each process an ``Accelerator(cpu=True)`` whose
    ``prepare(model, optimizer)`` wraps the model. (``accelerate launch --cpu`` starts one process
    whatever ``--num_processes`` says, its several-process CPU route being mpirun; the multi-process
    launcher with ``ACCELERATE_USE_CPU`` is how Accelerate puts N processes on the CPU, joined by gloo.)

Routes alternate over ``--rounds`` rounds, each run a fresh process tree. A sample is one row of a
batch (one frame index of one episode: both cameras decoded, one fed to the model). Each rank stamps the
wall clock at the end of every step (after ``optimizer.step()``). Steady-state samples/s is all ranks'
samples of steps ``--warmup``+1 to ``--steps`` over the time from the end of step ``--warmup`` to the end
of the last step (the latest rank's stamps): start-up (interpreter, imports, Ray's or torchrun's
start, the process group, opening the dataset, the first batches) is excluded. Start-up is reported
apart: from the launch of the route's command to the end of the first step on the latest rank.
Checkpoints are not taken (the example's ``ray.train.report`` of a checkpoint every 5 steps would add
Ray-only work to one side): this measures the loop. Each rank also reports its torch intra-op threads.
A route's run that fails, times out (``--timeout``) or trains other than ``--steps`` x ``--batch-size``
x ``--workers`` samples is reported on stderr and left out (its round has no ratio); the other runs go
on, and the benchmark exits 1.

The dataset: ``write_synthetic_dataset`` (``--episodes`` x ``--length`` frames, 2 cameras 64x96, AV1,
the example's defaults), written once under ``--cache-dir``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ray" / "train_ray.py"
ROUTES = ("ray", "accelerate")


def load_example():
    """examples/ray/train_ray.py as a module, outside ``sys.modules``: cloudpickle then ships the
    functions that use it to Ray's workers by value."""
    spec = importlib.util.spec_from_file_location("train_ray_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed_loop(config: dict, wrap) -> dict:
    """The example's loop on this rank for ``config["steps"]`` steps; ``wrap(model, optimizer)`` is the
    launcher's DDP wrapping. Returns the wall-clock end of each step and the samples of each."""
    import torch

    example = load_example()
    dataset, loader, model, camera = example.build(config)
    model, optimizer = wrap(model, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3))
    ends: list[float] = []
    sizes: list[int] = []
    while len(ends) < config["steps"]:
        for batch in loader:
            example.train_step(model, optimizer, batch, camera)
            ends.append(time.time())
            sizes.append(len(batch["index"]))
            if len(ends) >= config["steps"]:
                break
    loader.close()
    return {"ends": ends, "sizes": sizes, "torch_threads": torch.get_num_threads(), "epoch": dataset.epoch}


def ray_worker(config: dict) -> None:
    """What each Ray Train worker runs."""
    import ray.train
    import ray.train.torch

    def wrap(model, optimizer):
        model = ray.train.torch.prepare_model(model)
        return model, optimizer(model)

    rank = ray.train.get_context().get_world_rank()
    result = timed_loop(config, wrap)
    (Path(config["out"]) / f"rank{rank}.json").write_text(json.dumps(result))


def accelerate_worker(config: dict) -> None:
    """What each process under ``accelerate launch`` runs."""
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == config["workers"], accelerator.num_processes

    def wrap(model, optimizer):
        model = accelerator.prepare(model)  # the model first: the optimizer on the wrapped parameters
        return model, accelerator.prepare(optimizer(model))

    result = timed_loop(config, wrap)
    (Path(config["out"]) / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
    accelerator.wait_for_everyone()
    accelerator.end_training()
    # As examples/scaling does: a gloo group left to the interpreter's exit now and then aborted a rank
    # there ("terminate called without an active exception", SIGABRT) after its steps were done: gloo
    # frees a finished collective's work on its own thread, which needs the GIL.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def run_ray(config: dict) -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=config["workers"], include_dashboard=False, log_to_driver=False)
    trainer = TorchTrainer(ray_worker, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=config["workers"], use_gpu=False),
                           run_config=RunConfig(name="bench", storage_path=str(Path(config["out"]) / "ray")))
    trainer.fit()
    ray.shutdown()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def commands(args, config_file: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each route's command line and the environment variables it adds."""
    worker = [__file__, "--config", str(config_file)]
    return {
        "ray": ([sys.executable, *worker, "--worker", "ray"], {}),
        "accelerate": ([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                        "--num_processes", str(args.workers), "--num_machines", "1",
                        "--num_cpu_threads_per_process", "1", "--mixed_precision", "no",
                        "--dynamo_backend", "no", "--main_process_port", "{port}",
                        *worker, "--worker", "accelerate"], {"ACCELERATE_USE_CPU": "true"}),
    }


def measure(ranks: list[dict], launched: float, warmup: int) -> dict:
    first = max(r["ends"][0] for r in ranks)
    begin = max(r["ends"][warmup - 1] for r in ranks)
    end = max(r["ends"][-1] for r in ranks)
    window = sum(sum(r["sizes"][warmup:]) for r in ranks)
    return {"samples_per_s": window / (end - begin), "startup_s": first - launched,
            "samples": sum(sum(r["sizes"]) for r in ranks), "steps": [len(r["ends"]) for r in ranks],
            "torch_threads": [r["torch_threads"] for r in ranks], "timed_s": end - begin,
            "step_ms_median": statistics.median(1000 * (b - a) for r in ranks
                                                for a, b in zip(r["ends"][warmup - 1:], r["ends"][warmup:]))}


def run_route(route: str, args, config: dict, scratch: Path) -> dict:
    out = scratch / f"{route}-{time.monotonic_ns()}"
    out.mkdir()
    config_file = out / "config.json"
    config_file.write_text(json.dumps({**config, "out": str(out)}))
    command, extra = commands(args, config_file)[route]
    command = [word.replace("{port}", str(_free_port())) for word in command]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "ACCELERATE_USE_CPU")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    launched = time.time()
    process = subprocess.Popen(command, env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        stdout, stderr = process.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        import psutil  # Ray's and Accelerate's dependency

        # A run past --timeout is killed with its workers (torchrun puts each in its own session).
        for child in [*psutil.Process(process.pid).children(recursive=True), psutil.Process(process.pid)]:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        process.communicate()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"{route} failed ({process.returncode}):\n{stdout[-2000:]}\n{stderr[-4000:]}")
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(args.workers)]
    result = {"route": route, **measure(ranks, launched, args.warmup), "load_average": os.getloadavg()[0]}
    expected = args.steps * args.batch_size * args.workers
    if result["samples"] != expected:
        raise RuntimeError(f"{route} trained {result['samples']} samples, not {expected}")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "episodestream-bench",
                        help="where the synthetic dataset is written once")
    parser.add_argument("--episodes", type=int, default=40, help="episodes of the dataset (default 40)")
    parser.add_argument("--length", type=int, default=60, help="frames per episode (default 60)")
    parser.add_argument("--workers", type=int, default=2, help="Ray workers / accelerate processes (default 2)")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per step per rank (default 8)")
    parser.add_argument("--num-threads", type=int, default=1, help="EpisodeLoader decode threads per rank (default 1)")
    parser.add_argument("--steps", type=int, default=600, help="steps per rank (default 600)")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the steady state (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--routes", default=",".join(ROUTES), help="the routes to run, comma-separated")
    parser.add_argument("--timeout", type=float, default=300, help="seconds a route's run may take (default 300)")
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)  # a route's worker reads its config
    parser.add_argument("--worker", choices=ROUTES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        config = json.loads(args.config.read_text())
        (run_ray if args.worker == "ray" else accelerate_worker)(config)
        return 0
    if not 0 < args.warmup < args.steps:
        parser.error("--warmup must be at least 1 and below --steps")
    routes = args.routes.split(",")
    root = args.cache_dir / f"ray-train-{args.episodes}x{args.length}"
    if not (root / "meta" / "info.json").exists():
        from episodestream.tools.synthetic import write_synthetic_dataset

        print(f"writing {args.episodes} x {args.length} frames at {root}", file=sys.stderr)
        write_synthetic_dataset(root, num_episodes=args.episodes, episode_length=args.length, overwrite=True)
    config = {"dataset": str(root), "seed": 0, "batch_size": args.batch_size, "num_threads": args.num_threads,
              "steps": args.steps, "workers": args.workers}
    with tempfile.TemporaryDirectory(prefix="ray-train-bench-") as scratch:
        for route, (command, extra) in commands(args, Path(scratch) / "<route>" / "config.json").items():
            if route in routes:
                prefix = " ".join(f"{k}={v}" for k, v in extra.items())
                print(f"{route}: {prefix + ' ' if prefix else ''}{shlex.join(command)}")
        results: dict[str, list[dict]] = {route: [] for route in routes}
        ratios: list[float] = []
        failures = 0
        for index in range(args.rounds):
            done: dict[str, dict] = {}
            for route in routes:
                try:
                    done[route] = run_route(route, args, config, Path(scratch))
                except (RuntimeError, subprocess.TimeoutExpired) as error:  # the other runs still count
                    failures += 1
                    print(f"round {index + 1}: {route} failed: {error}", file=sys.stderr, flush=True)
                    continue
                results[route].append(done[route])
                print(json.dumps({"round": index + 1, **done[route]}), flush=True)
            if set(ROUTES) <= set(done):
                ratios.append(done["ray"]["samples_per_s"] / done["accelerate"]["samples_per_s"])
                print(f"round {index + 1}: ray / accelerate = {ratios[-1]:.3f}", flush=True)
    print(f"\n| route ({args.workers} workers, batch {args.batch_size}, {args.steps} steps, {args.warmup} warm-up) "
          "| samples/s per round | median | start-up per round (s) |")
    print("| --- | --- | --- | --- |")
    for route, runs in results.items():
        if runs:
            rates = ", ".join(f"{r['samples_per_s']:.0f}" for r in runs)
            startups = ", ".join(f"{r['startup_s']:.1f}" for r in runs)
            print(f"| {route} | {rates} | {statistics.median(r['samples_per_s'] for r in runs):.0f} | {startups} |")
    if ratios:
        print(f"\nray / accelerate per round: {', '.join(f'{r:.3f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.3f}")
    if failures:
        print(f"{failures} run(s) failed: see above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
