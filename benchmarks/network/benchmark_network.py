"""The adaptive download budget against a static budget and fixed concurrencies, on shaped links.

Four links, each a ``ShapingProxy`` in front of a ``FakeHub`` (both in a server subprocess, so
their CPU does not share this process's GIL) serving random files of 200 KB - 2 MB (video spans):

    a  shared: 10 MB/s for all connections, 429 (Retry-After: 1) beyond 8 requests in flight
    b  far: 2 MB/s per connection, 50 ms before each request, 100 MB/s in all (needs concurrency)
    c  loopback: no shaping at all
    d  fast to slow: b's link with 5 MB/s per connection, then, half-way, a's shared 10 MB/s link

Each file's first 4 KiB is read once per configuration (as the datasets read an mp4's box headers
once per file), then whole files, round-robin. On each link, in one run: the adaptive controller (``ControllerConfig.from_env`` defaults), a
static budget as common loaders pick it (bytes in flight / median file size, clamped to 32..512)
and a sweep of fixed budgets. Every configuration reads through the same path as the datasets:
``ChunkedReader`` -> ``DownloadFetch`` -> ``RetryPolicy.call`` -> one ranged GET (retries, backoff,
``Retry-After``, timeouts) under node-wide ``NodePermits``; static and fixed budgets only replace
the controller by a constant budget. A pool with more threads than the budget can use always has
reads queued, so the budget, not the caller, limits concurrency.

Reported per configuration: goodput (bytes of completed reads / s) and its fraction of the link's
cap, requests, 429s (all and after the warm-up), failed reads, and the budget and requests in
flight over time (``permits.png``). Results go to ``--output-dir`` as ``results.json`` and
``results.csv``; the goals are checked and printed.

    python benchmarks/network/benchmark_network.py --output-dir /tmp/netbench          # ~9 min
    python benchmarks/network/benchmark_network.py --output-dir /tmp/netbench --quick  # ~2.5 min
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# huggingface_hub reads these when first imported: no telemetry, no Xet, nothing leaves the host.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

from episodestream._remote.transport.reader import ChunkedReader
from episodestream._remote.transport.config import ControllerConfig
from episodestream._remote.transport.download import DownloadFetch
from episodestream._remote.transport.permits import NodePermits
from episodestream._remote.source.resolve import list_source, resolve_source

MB = 1e6
REPO = "bench/spans"
STATIC_BYTES_IN_FLIGHT = 64 * 1024 * 1024  # what a static loader keeps in flight: 64 MiB / median file
STATIC_RANGE = (32, 512)
SAMPLE_EVERY_S = 0.2
POOL_SPARE_THREADS = 8  # threads beyond the largest budget a configuration can reach
SETTLE_S = 2.0  # link d: the slow phase is measured from this long after the drop
STRAGGLER_JOIN_S = 15.0
HEADER_BLOCK_BYTES = 4096  # RemoteVideos reads mp4 box headers in blocks of this size


# ---------------------------------------------------------------------------------------------
# Links


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    link: dict  # LinkSettings for the whole run, or for the first half when ``then`` is set
    cap_bytes_per_s: float | None  # what the link can carry (None: unshaped)
    then: dict | None = None  # LinkSettings from half-way on
    then_cap_bytes_per_s: float | None = None
    then_in_flight_limit: int | None = None  # the budget "follows the link down" once at or below this


SHARED = dict(rate_bytes_per_s=10 * MB, max_in_flight=8, retry_after_s=1)
SCENARIOS = (
    Scenario("a", "a: 10 MB/s shared, 429 beyond 8 in flight", SHARED, 10 * MB),
    Scenario("b", "b: 2 MB/s per connection, 50 ms, 100 MB/s total",
             dict(rate_bytes_per_s=100 * MB, per_connection_rate_bytes_per_s=2 * MB, latency_s=0.05), 100 * MB),
    Scenario("c", "c: loopback, unshaped", {}, None),
    Scenario("d", "d: fast (5 MB/s per connection, 20 ms) then 10 MB/s shared",
             dict(rate_bytes_per_s=100 * MB, per_connection_rate_bytes_per_s=5 * MB, latency_s=0.02), 100 * MB,
             then=SHARED, then_cap_bytes_per_s=10 * MB, then_in_flight_limit=SHARED["max_in_flight"]),
)


def _serve(root: str, connection) -> None:
    """The server subprocess: a FakeHub and one ShapingProxy at a time, driven by ``connection``."""
    from episodestream.testing import FakeHub, LinkSettings, ShapingProxy

    with FakeHub(root) as hub:
        proxy = None
        try:
            while True:
                command, argument = connection.recv()
                if command == "link":  # a fresh proxy per configuration: stragglers hit the old one
                    if proxy is not None:
                        proxy.stop()
                    proxy = ShapingProxy(hub.url, settings=LinkSettings(**argument)).start()
                    connection.send(proxy.url)
                elif command == "update":
                    proxy.update(**argument)
                    connection.send(None)
                elif command == "counters":
                    stats = proxy.stats()
                    connection.send({"requests": stats.requests, "throttled_429": stats.throttled_429,
                                     "injected_503": stats.injected_503, "resets": stats.resets,
                                     "bytes_sent": stats.bytes_sent, "peak_in_flight": stats.peak_in_flight})
                elif command == "in_flight":
                    connection.send(_binned_in_flight(proxy.stats().in_flight_series, argument))
                elif command == "stop":
                    connection.send(None)
                    return
        finally:
            if proxy is not None:
                proxy.stop()


def _binned_in_flight(series: list[tuple[float, int]], bin_s: float) -> list[tuple[float, int]]:
    """The most requests in flight per bin (the series holds every change)."""
    if not series:
        return []
    start, bins = series[0][0], {}
    for t, n in series:
        key = int((t - start) / bin_s)
        bins[key] = max(bins.get(key, 0), n)
    return [(key * bin_s, bins[key]) for key in sorted(bins)]


class Server:
    def __init__(self, root: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(str(root), child), daemon=True)
        self._lock = threading.Lock()

    def __enter__(self) -> Server:
        self._process.start()
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            self.call("stop")
        finally:
            self._process.join(10)

    def call(self, command: str, argument: Any = None) -> Any:
        with self._lock:
            self._connection.send((command, argument))
            return self._connection.recv()


# ---------------------------------------------------------------------------------------------
# Budgets


class FixedBudget:
    """A constant node-wide budget: what a loader with a fixed download concurrency does. The
    same ``NodePermits`` and retry policy as the controller, without adapting."""

    def __init__(self, *, config: ControllerConfig, name: str, permits: int) -> None:
        self.permits = NodePermits(directory=Path(config.permits_dir) / name, default_budget=permits)
        self.clock = time.monotonic

    @contextmanager
    def permit(self):
        with self.permits.acquire() as slot:
            yield slot

    def budget(self) -> int:
        return self.permits.budget()

    def record_transfer(self, **_: Any) -> None:
        return None

    def record_failure(self, failure: Any) -> None:
        return None

    def history(self) -> list:
        return []


def reachable_budget(config: ControllerConfig, duration_s: float) -> int:
    """The most permits the controller can grant within ``duration_s``: each healthy window
    multiplies the budget by ``slow_start_factor`` (at least ``+increase_step``) until the first
    throttle, then adds ``increase_step``; this bounds both. A pool this big (plus spares)
    always has reads queued; a training node has a few fetch threads per worker process."""
    budget = max(config.initial_permits, config.floor_permits)
    for _ in range(math.ceil(duration_s / config.increase_interval_s) + 1):
        budget = max(budget + config.increase_step, round(budget * config.slow_start_factor))
    return min(config.cap_permits, budget)


def static_budget(sizes: list[int]) -> int:
    low, high = STATIC_RANGE
    return int(min(high, max(low, round(STATIC_BYTES_IN_FLIGHT / statistics.median(sizes)))))


# ---------------------------------------------------------------------------------------------
# One configuration on one link


@dataclass
class Result:
    scenario: str
    config: str
    permits: str  # "adaptive" or the fixed number
    duration_s: float
    warmup_s: float
    cap_mb_per_s: float | None
    goodput_mb_per_s: float
    goodput_after_warmup_mb_per_s: float
    wire_after_warmup_mb_per_s: float  # bytes the proxy sent after the warm-up, per second
    link_fraction: float | None
    link_fraction_after_warmup: float | None
    reads_ok: int
    reads_failed: int
    requests: int
    throttled_429: int
    requests_after_warmup: int
    throttled_429_after_warmup: int
    throttled_fraction_after_warmup: float
    injected_503: int
    resets: int
    peak_in_flight: int
    final_budget: int
    threads: int
    phases: dict = field(default_factory=dict)  # scenario d: per-phase goodput, time to follow down
    budget_series: list = field(default_factory=list)  # (s, budget)
    in_flight_series: list = field(default_factory=list)  # (s, most requests in flight at the proxy)
    errors: list = field(default_factory=list)


def run_config(server: Server, scenario: Scenario, name: str, permits: int | None, *, objects: list[tuple[str, int]],
               duration_s: float, warmup_s: float, work_dir: Path) -> Result:
    """Read ``objects`` round-robin for ``duration_s`` with a pool that always has work queued."""
    url = server.call("link", scenario.link)
    config = ControllerConfig.from_env(permits_dir=str(work_dir / f"permits-{scenario.key}-{name}"))
    if permits is None:
        fetch = DownloadFetch(config=config, name="bench")
        threads = reachable_budget(config, duration_s) + POOL_SPARE_THREADS
    else:
        fetch = DownloadFetch(config=config, name="bench",
                              controller_factory=functools.partial(FixedBudget, permits=permits))
        threads = permits + POOL_SPARE_THREADS
    resolved = resolve_source(REPO, revision=None, storage_options=None, hub_endpoint=url, token=False)
    listing = list_source(resolved)
    fs = resolved.filesystem()
    reader = ChunkedReader(fs, lambda path: listing[path[len(resolved.root) + 1:]].size, fetch=fetch)
    paths = [(resolved.path(relpath), size) for relpath, size in objects]

    lock = threading.Lock()
    order = itertools.count()
    stop = threading.Event()
    completions: list[tuple[float, int]] = []  # (seconds since start, bytes) of reads done in time
    failures: list[str] = []
    start_s = time.monotonic()
    deadline_s = start_s + duration_s

    headers_read: set[str] = set()

    def work() -> None:
        while not stop.is_set():
            with lock:
                path, size = paths[next(order) % len(paths)]
                first = path not in headers_read
                headers_read.add(path)
            try:
                if first:
                    # As RemoteVideos does once per mp4: its box headers, in 4 KiB blocks, before spans.
                    reader.read(path, 0, 8, block_bytes=HEADER_BLOCK_BYTES)
                data = reader.read(path, 0, size, exact=True)
            except Exception as error:
                if time.monotonic() < deadline_s:
                    with lock:
                        failures.append(f"{type(error).__name__}: {error}"[:300])
                continue
            now = time.monotonic()
            if now <= deadline_s:
                with lock:
                    completions.append((now - start_s, len(data)))

    pool = [threading.Thread(target=work, name=f"bench-{i}", daemon=True) for i in range(threads)]
    for thread in pool:
        thread.start()
    budget_series: list[tuple[float, int]] = []
    snapshots: dict[str, tuple[float, dict]] = {}  # name -> (seconds since start, proxy counters)
    marks = {"warm": warmup_s}
    if scenario.then is not None:
        marks.update(switch=duration_s / 2, settled=duration_s / 2 + SETTLE_S)
    while (now := time.monotonic()) < deadline_s:
        elapsed = now - start_s
        controller = fetch.controllers().get("bench")
        if controller is not None:
            budget_series.append((round(elapsed, 3), controller.budget()))
        for mark, at_s in marks.items():
            if mark not in snapshots and elapsed >= at_s:
                snapshots[mark] = (elapsed, server.call("counters"))
                if mark == "switch":
                    server.call("update", scenario.then)
        time.sleep(min(SAMPLE_EVERY_S, max(0.0, deadline_s - time.monotonic())))
    stop.set()
    counters = server.call("counters")
    snapshots["end"] = (time.monotonic() - start_s, counters)
    for mark in marks:
        snapshots.setdefault(mark, snapshots["end"])
    in_flight = server.call("in_flight", 0.1)
    controller = fetch.controllers().get("bench")
    final_budget = controller.budget() if controller is not None else 0
    budget_series.append((round(duration_s, 3), final_budget))
    server.call("update", {"rate_bytes_per_s": None, "per_connection_rate_bytes_per_s": None, "latency_s": 0.0,
                           "max_in_flight": None})  # let stragglers finish quickly; nothing counts now
    join_deadline = time.monotonic() + STRAGGLER_JOIN_S
    for thread in pool:
        thread.join(max(0.0, join_deadline - time.monotonic()))

    warm_s, warm_counters = snapshots["warm"]
    wire_after = _rate(snapshots["warm"], snapshots["end"], "bytes_sent")
    done = sum(size for _, size in completions)
    after = sum(size for t, size in completions if t >= warmup_s)
    cap = scenario.cap_bytes_per_s
    if scenario.then is not None:
        cap = None  # two caps; see phases
    requests_after = counters["requests"] - warm_counters["requests"]
    throttled_after = counters["throttled_429"] - warm_counters["throttled_429"]
    result = Result(
        scenario=scenario.key, config=name, permits="adaptive" if permits is None else str(permits),
        duration_s=duration_s, warmup_s=warmup_s, cap_mb_per_s=None if cap is None else cap / MB,
        goodput_mb_per_s=done / duration_s / MB, goodput_after_warmup_mb_per_s=after / (duration_s - warmup_s) / MB,
        link_fraction=None if cap is None else done / duration_s / cap,
        wire_after_warmup_mb_per_s=wire_after / MB,
        link_fraction_after_warmup=None if cap is None else wire_after / cap,
        reads_ok=len(completions), reads_failed=len(failures), requests=counters["requests"],
        throttled_429=counters["throttled_429"], requests_after_warmup=requests_after,
        throttled_429_after_warmup=throttled_after,
        throttled_fraction_after_warmup=throttled_after / max(1, requests_after),
        injected_503=counters["injected_503"], resets=counters["resets"], peak_in_flight=counters["peak_in_flight"],
        final_budget=final_budget, threads=threads, budget_series=budget_series, in_flight_series=in_flight,
        errors=sorted(set(failures))[:5])
    if scenario.then is not None:
        result.phases = _phases(scenario, result, completions, duration_s, snapshots)
    return result


def _rate(first: tuple[float, dict], last: tuple[float, dict], counter: str) -> float:
    """How fast ``counter`` grew between two snapshots, per second."""
    return (last[1][counter] - first[1][counter]) / max(1e-9, last[0] - first[0])


def _phases(scenario: Scenario, result: Result, completions: list[tuple[float, int]], duration_s: float,
            snapshots: dict[str, tuple[float, dict]]) -> dict:
    half = duration_s / 2
    fast = sum(size for t, size in completions if t < half) / half
    # Reads finishing just after the drop moved most of their bytes on the fast link: the slow
    # phase is measured on the wire (bytes the proxy sent), from SETTLE_S after the drop.
    slow = _rate(snapshots["settled"], snapshots["end"], "bytes_sent")
    at_switch, at_end = snapshots["switch"][1], snapshots["end"][1]
    limit = scenario.then_in_flight_limit
    at_or_below = [t for t, budget in result.budget_series if t >= half and budget <= limit]
    budget_at_switch = next((b for t, b in reversed(result.budget_series) if t < half), None)
    return {
        "switch_s": half, "fast_goodput_mb_per_s": fast / MB, "slow_wire_mb_per_s": slow / MB,
        "slow_link_fraction": slow / scenario.then_cap_bytes_per_s,
        "budget_at_switch": budget_at_switch,
        "seconds_to_follow_down": (at_or_below[0] - half) if at_or_below else None,
        "slow_requests": at_end["requests"] - at_switch["requests"],
        "slow_throttled_429": at_end["throttled_429"] - at_switch["throttled_429"],
    }


# ---------------------------------------------------------------------------------------------
# The run


def write_objects(root: Path, count: int, seed: int) -> list[tuple[str, int]]:
    """``count`` random files of 200 KB - 2 MB (log-uniform), like episodes' video spans."""
    rng = random.Random(seed)
    repo = root / "datasets" / REPO
    (repo / "spans").mkdir(parents=True, exist_ok=True)
    objects = []
    for i in range(count):
        size = int(200e3 * 10 ** rng.uniform(0, 1))
        relpath = f"spans/span-{i:03d}.bin"
        (repo / relpath).write_bytes(rng.randbytes(size))
        objects.append((relpath, size))
    rng.shuffle(objects)
    return objects


def goals(results: list[Result]) -> list[tuple[str, bool, str]]:
    by = {(r.scenario, r.config): r for r in results}
    checks = []
    failed = [f"{r.scenario}/{r.config}: {r.reads_failed}" for r in results if r.reads_failed]
    adaptive_failed = [r for r in results if r.config == "adaptive" and r.reads_failed]
    checks.append(("zero failed reads (adaptive, every link)", not adaptive_failed,
                   "failed: " + (", ".join(failed) if failed else "none in any configuration")))
    a = by.get(("a", "adaptive"))
    if a is not None:
        ok = a.link_fraction_after_warmup >= 0.9 and a.throttled_fraction_after_warmup < 0.01
        checks.append(("a: >= 90% of the link, < 1% throttled after warm-up", ok,
                       f"{a.link_fraction_after_warmup:.0%} of 10 MB/s used after {a.warmup_s:.0f} s warm-up "
                       f"(goodput {a.link_fraction:.0%} over the run); {a.throttled_429_after_warmup} of "
                       f"{a.requests_after_warmup} requests throttled ({a.throttled_fraction_after_warmup:.2%})"))
    for key in ("b", "c"):
        adaptive = by.get((key, "adaptive"))
        fixed = [r for r in results if r.scenario == key and r.config.startswith("fixed")]
        if adaptive is None or not fixed:
            continue
        best = max(fixed, key=lambda r: r.goodput_mb_per_s)
        ratio = adaptive.goodput_mb_per_s / best.goodput_mb_per_s
        checks.append((f"{key}: >= 85% of the best fixed concurrency", ratio >= 0.85,
                       f"adaptive {adaptive.goodput_mb_per_s:.1f} MB/s vs {best.config} "
                       f"{best.goodput_mb_per_s:.1f} MB/s: {ratio:.0%} (after warm-up: "
                       f"{adaptive.goodput_after_warmup_mb_per_s / max(1e-9, best.goodput_after_warmup_mb_per_s):.0%})"))
    d = by.get(("d", "adaptive"))
    if d is not None:
        seconds = d.phases.get("seconds_to_follow_down")
        checks.append(("d: the budget follows the link down within 10 s", seconds is not None and seconds <= 10,
                       f"budget {d.phases.get('budget_at_switch')} at the switch, <= 8 after "
                       + ("never" if seconds is None else f"{seconds:.1f} s")
                       + f"; slow phase {d.phases['slow_link_fraction']:.0%} of 10 MB/s, "
                         f"{d.phases['slow_throttled_429']} of {d.phases['slow_requests']} requests throttled"))
    return checks


def print_table(results: list[Result]) -> None:
    print(f"\n{'link':4} {'config':14} {'MB/s':>7} {'of cap':>7} {'MB/s warm':>9} {'link used warm':>14} "
          f"{'requests':>8} {'429s':>6} {'429s warm':>10} {'failed':>6} {'budget':>6} {'peak':>5}")
    for r in results:
        fraction = "" if r.link_fraction is None else f"{r.link_fraction:.0%}"
        used = "" if r.link_fraction_after_warmup is None else f"{r.link_fraction_after_warmup:.0%}"
        print(f"{r.scenario:4} {r.config:14} {r.goodput_mb_per_s:7.1f} {fraction:>7} "
              f"{r.goodput_after_warmup_mb_per_s:9.1f} {used:>14} {r.requests:8d} {r.throttled_429:6d} "
              f"{r.throttled_429_after_warmup:5d} ({r.throttled_fraction_after_warmup:.0%}) {r.reads_failed:6d} "
              f"{r.final_budget:6d} {r.peak_in_flight:5d}")
        if r.phases:
            p = r.phases
            follow = p["seconds_to_follow_down"]
            print(f"{'':4} {'':14} fast {p['fast_goodput_mb_per_s']:.1f} MB/s, slow {p['slow_wire_mb_per_s']:.1f} MB/s "
                  f"({p['slow_link_fraction']:.0%} of 10 MB/s), 429s in slow phase {p['slow_throttled_429']}/"
                  f"{p['slow_requests']}" + ("" if r.config != "adaptive" else
                                              f", budget {p['budget_at_switch']} at switch, <= 8 after "
                                              + ("never" if follow is None else f"{follow:.1f} s")))


def plot(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = [s for s in SCENARIOS if any(r.scenario == s.key for r in results)]
    figure, axes = plt.subplots(len(scenarios), 1, figsize=(9, 3 * len(scenarios)), squeeze=False)
    for axis, scenario in zip(axes[:, 0], scenarios):
        for r in results:
            if r.scenario != scenario.key or r.config not in ("adaptive",) and not r.config.startswith("static"):
                continue
            color = "tab:blue" if r.config == "adaptive" else "tab:red"
            if r.config == "adaptive":
                t, b = zip(*r.budget_series) if r.budget_series else ((), ())
                axis.step(t, b, where="post", color=color, label="adaptive budget")
            else:
                axis.axhline(int(r.permits), color=color, label=f"{r.config} budget")
            if r.in_flight_series:
                t, n = zip(*r.in_flight_series)
                axis.plot(t, n, color=color, alpha=0.35, linewidth=0.8, label=f"{r.config}: requests in flight at the server")
        if scenario.then is not None:
            axis.axvline(next(r.duration_s for r in results if r.scenario == scenario.key) / 2, color="gray",
                         linestyle="--", label="link drops")
        if scenario.link.get("max_in_flight") or (scenario.then or {}).get("max_in_flight"):
            axis.axhline(SHARED["max_in_flight"], color="gray", linestyle=":", label="429 beyond this")
        axis.set_yscale("symlog", base=2, linthresh=1, linscale=0.5)
        ticks = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256]
        axis.set_yticks(ticks, [str(t) for t in ticks])
        axis.set_ylim(0, 300)
        axis.set_title(scenario.title)
        axis.set_xlabel("seconds")
        axis.set_ylabel("permits / in flight")
        axis.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--quick", action="store_true", help="shorter runs, fixed budgets 2, 8, 32 (~2.5 min)")
    parser.add_argument("--duration-s", type=float, help="seconds per configuration (default 12; quick 5; link d runs twice as long)")
    parser.add_argument("--scenarios", default="abcd", help="which links, e.g. 'ad' (default: abcd)")
    parser.add_argument("--fixed", help="fixed budgets to sweep, e.g. '1,2,4,8,16,32' (the default; quick: 2,8,32)")
    parser.add_argument("--configs", default="adaptive,static,fixed",
                        help="which kinds of configuration to run (default: adaptive,static,fixed)")
    parser.add_argument("--objects", type=int, default=48, help="files of 200 KB - 2 MB to read round-robin")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    fixed = [int(v) for v in (args.fixed or ("2,8,32" if args.quick else "1,2,4,8,16,32")).split(",")]
    duration = args.duration_s or (5.0 if args.quick else 12.0)
    scenarios = [s for s in SCENARIOS if s.key in args.scenarios]
    args.output_dir.mkdir(parents=True, exist_ok=True)

    results: list[Result] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="episodestream-netbench-") as work:
        work_dir = Path(work)
        objects = write_objects(work_dir / "hub", args.objects, args.seed)
        sizes = [size for _, size in objects]
        static = static_budget(sizes)
        print(f"{len(objects)} objects, {min(sizes) / 1e3:.0f} KB - {max(sizes) / 1e6:.2f} MB, median "
              f"{statistics.median(sizes) / 1e3:.0f} KB; static budget {static}; fixed {fixed}; controller "
              f"{ControllerConfig.from_env()}", flush=True)
        kinds = set(args.configs.split(","))
        configs = ([("adaptive", None)] if "adaptive" in kinds else []) + \
            ([(f"static-{static}", static)] if "static" in kinds else []) + \
            ([(f"fixed-{n}", n) for n in fixed] if "fixed" in kinds else [])
        with Server(work_dir / "hub") as server:
            for scenario in scenarios:
                seconds = duration * (2 if scenario.then is not None else 1)
                warmup = min(5.0, seconds / 3)
                for name, permits in configs:
                    started = time.monotonic()
                    result = run_config(server, scenario, name, permits, objects=objects, duration_s=seconds,
                                        warmup_s=warmup, work_dir=work_dir)
                    results.append(result)
                    print(f"  {scenario.key} {name:12} {result.goodput_mb_per_s:7.1f} MB/s, "
                          f"{result.throttled_429:5d} 429s, {result.reads_failed} failed, budget at end "
                          f"{result.final_budget} ({time.monotonic() - started:.0f} s)", flush=True)
    load_after = os.getloadavg()
    print_table(results)
    print(f"\nMachine: {os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, {load_after[0]:.1f} "
          f"after (1 min; other processes share the CPUs with the client, proxy and server)")
    checks = goals(results)
    print("\nGoals:")
    for name, ok, detail in checks:
        print(f"  [{'met' if ok else 'NOT met'}] {name}: {detail}")
    (args.output_dir / "results.json").write_text(json.dumps(
        {"command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "static_budget": static,
         "cpus": os.cpu_count(), "load_average_before": load_before, "load_average_after": load_after,
         "goals": [{"goal": n, "met": ok, "detail": d} for n, ok, d in checks],
         "results": [asdict(r) for r in results]}, indent=1))
    with open(args.output_dir / "results.csv", "w", newline="") as out:
        columns = [f for f in Result.__dataclass_fields__ if f not in ("budget_series", "in_flight_series", "errors")]
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        for r in results:
            row = {k: v for k, v in asdict(r).items() if k in columns}
            row["phases"] = json.dumps(row["phases"]) if row["phases"] else ""
            writer.writerow(row)
    plot(results, args.output_dir / "permits.png")
    print(f"\nWrote {args.output_dir / 'results.json'}, results.csv and permits.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
