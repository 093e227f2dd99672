"""Chrome trace events: format, nesting, levels, and several processes appending to one file."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time

import pytest

from episodestream._base import tracing
from episodestream._base.tracing import (
    TRACE_ENV,
    TRACE_LEVEL_ENV,
    disable_tracer,
    enable_tracer,
    load_trace,
    set_process_name,
    trace_counter,
    trace_instant,
    trace_span,
    tracer_enabled,
)

EVENTS_PER_PROCESS = 500
NUM_PROCESSES = 4


@pytest.fixture(autouse=True)
def tracer_off():
    """Every test starts and ends with tracing off in this process and in the environment."""
    disable_tracer()
    yield
    disable_tracer()


def _payload_events(trace):
    return [event for event in trace if event["ph"] != "M"]


def test_events_are_written_and_the_file_is_a_json_array(tmp_path):
    path = tmp_path / "trace.json"
    enable_tracer(path)
    with trace_span("decode", cat="video", file=tmp_path / "a.mp4", frames=4):
        trace_instant("admit", cat="pool", episode=3)
    trace_counter("pool", cat="pool", episodes=2)
    disable_tracer()

    text = path.read_text()
    assert text.startswith("[\n")
    # What Perfetto reads: the array with its optional "]" and no trailing comma.
    strict = json.loads(text.rstrip().rstrip(",") + "]")
    assert strict == load_trace(path)

    by_name = {event["name"]: event for event in strict}
    assert by_name["process_name"]["ph"] == "M"
    assert by_name["decode"]["ph"] == "X" and by_name["decode"]["cat"] == "video"
    assert by_name["decode"]["args"] == {"file": str(tmp_path / "a.mp4"), "frames": 4}
    assert by_name["admit"]["ph"] == "i" and by_name["admit"]["args"] == {"episode": 3}
    assert by_name["pool"]["ph"] == "C" and by_name["pool"]["args"] == {"episodes": 2}
    for event in strict:
        assert event["pid"] == os.getpid()
        assert event["tid"] == threading.get_native_id()
    # Microseconds since the epoch, so that processes line up.
    assert abs(by_name["decode"]["ts"] - time.time_ns() / 1000) < 60e6


def test_spans_nest_with_consistent_timestamps(tmp_path):
    enable_tracer(tmp_path / "trace.json")
    with trace_span("batch"):
        time.sleep(0.002)
        with trace_span("decode"):
            time.sleep(0.005)
        time.sleep(0.002)
    spans = {event["name"]: event for event in _payload_events(load_trace(tmp_path / "trace.json"))}
    outer, inner = spans["batch"], spans["decode"]
    assert inner["dur"] >= 5000 and outer["dur"] >= inner["dur"] + 4000
    assert outer["ts"] <= inner["ts"]
    assert inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def test_a_span_left_by_an_exception_is_recorded_with_the_error(tmp_path):
    enable_tracer(tmp_path / "trace.json")
    with pytest.raises(KeyError):
        with trace_span("read", episode=1):
            raise KeyError("missing")
    (span,) = _payload_events(load_trace(tmp_path / "trace.json"))
    assert span["args"] == {"episode": 1, "error": "KeyError"}


@pytest.mark.parametrize("level, expected", [("basic", {"decode", "admit"}),
                                             ("detailed", {"decode", "admit", "sample", "read"})])
def test_level_filters_detailed_events(tmp_path, level, expected):
    enable_tracer(tmp_path / "trace.json", level=level)
    with trace_span("decode"):
        with trace_span("sample", level="detailed"):
            trace_instant("read", level="detailed")
    trace_instant("admit")
    names = {event["name"] for event in _payload_events(load_trace(tmp_path / "trace.json"))}
    assert names == expected
    assert tracer_enabled("basic")
    assert tracer_enabled("detailed") == (level == "detailed")


def test_invalid_level_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"Invalid level \('verbose'\). Supported values are 'basic', 'detailed'"):
        enable_tracer(tmp_path / "trace.json", level="verbose")
    assert not (tmp_path / "trace.json").exists()
    enable_tracer(tmp_path / "trace.json")
    with pytest.raises(ValueError, match=r"Invalid level \('all'\)"):
        trace_span("decode", level="all")


def test_environment_enables_a_fresh_process_and_bad_level_is_named(tmp_path, monkeypatch):
    # A fresh _Tracer is what a spawned worker has: it decides from the environment on first use.
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "env.json"))
    monkeypatch.setenv(TRACE_LEVEL_ENV, "detailed")
    fresh = tracing._Tracer()
    assert fresh.active("detailed")
    fresh.close()
    assert (tmp_path / "env.json").read_text().startswith("[\n")

    monkeypatch.setenv(TRACE_LEVEL_ENV, "loud")
    expected = r"EPISODESTREAM_TRACE_LEVEL='loud' is invalid. Supported values are 'basic', 'detailed'"
    with pytest.raises(ValueError, match=expected):
        tracing._Tracer().active("basic")


def test_environment_naming_a_missing_folder_turns_tracing_off_with_one_line(tmp_path, monkeypatch, capsys):
    # What a spawned worker meets when the variable names a folder that does not exist: the first
    # trace call used to raise FileNotFoundError out of the loader.
    missing = tmp_path / "no-such-folder" / "trace.json"
    monkeypatch.setenv(TRACE_ENV, str(missing))
    monkeypatch.setattr(tracing, "_TRACER", tracing._Tracer())
    with trace_span("decode"):
        trace_instant("admit")
    trace_counter("pool", episodes=1)
    assert not tracer_enabled()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert f"{TRACE_ENV}={str(missing)!r} cannot be opened" in lines[0]
    assert "create its folder or unset" in lines[0]
    assert not missing.parent.exists()


def test_enable_exports_and_disable_clears_the_environment(tmp_path):
    enable_tracer(tmp_path / "sub" / "trace.json", level="detailed")
    assert os.environ[TRACE_ENV] == str(tmp_path / "sub" / "trace.json")
    assert os.environ[TRACE_LEVEL_ENV] == "detailed"
    disable_tracer()
    assert TRACE_ENV not in os.environ and TRACE_LEVEL_ENV not in os.environ
    assert not tracer_enabled()


def test_disabled_tracer_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path would land here if anything were written
    path = tmp_path / "trace.json"
    with trace_span("decode", file=path):
        trace_instant("admit", episode=1)
    trace_counter("pool", episodes=1)
    set_process_name("idle")
    assert list(tmp_path.iterdir()) == []

    enable_tracer(path)
    disable_tracer()
    before = path.read_text()
    with trace_span("decode"):
        trace_instant("admit")
    assert path.read_text() == before


def test_process_name_is_recorded(tmp_path):
    enable_tracer(tmp_path / "trace.json")
    set_process_name("episodestream worker 1 rank 0")
    names = [event["args"]["name"] for event in load_trace(tmp_path / "trace.json")
             if event["name"] == "process_name"]
    assert names[-1] == "episodestream worker 1 rank 0"


def test_load_trace_accepts_a_closed_array_and_names_a_torn_line(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text('[\n{"name":"a","ph":"i","ts":1,"pid":1,"tid":1},\n]\n')
    assert [event["name"] for event in load_trace(path)] == ["a"]
    path.write_text('[\n{"name":"a","ph":"i","ts":1,"pid":1,"tid":1},\n{"name":"b","ph\n')
    with pytest.raises(ValueError, match="line 3"):
        load_trace(path)


# -- several processes -------------------------------------------------------------------------

def _write_events(worker: int) -> None:
    """Runs in a child that did not call enable_tracer: tracing comes from fork or the environment."""
    set_process_name(f"episodestream worker {worker} rank 0")

    def emit(thread: int) -> None:
        for i in range(EVENTS_PER_PROCESS // 2):
            # Some events far larger than PIPE_BUF, so interleaving would show as broken lines.
            blob = "x" * (5000 if i % 50 == 0 else i % 7)
            if i % 2:
                with trace_span("decode", cat="video", worker=worker, thread=thread, i=i, blob=blob):
                    pass
            else:
                trace_instant("admit", cat="pool", worker=worker, thread=thread, i=i, blob=blob)

    threads = [threading.Thread(target=emit, args=(thread,)) for thread in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_concurrent_processes_write_one_valid_file(tmp_path, start_method):
    path = tmp_path / "trace.json"
    enable_tracer(path)
    context = multiprocessing.get_context(start_method)
    # Spawned children import torch afresh (seconds each): two show that they find the trace file.
    num_processes = NUM_PROCESSES if start_method == "fork" else 2
    processes = [context.Process(target=_write_events, args=(worker,)) for worker in range(num_processes)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0] * num_processes

    text = path.read_text()
    assert text.startswith("[\n") and text.count("[\n") == 1
    trace = json.loads(text.rstrip().rstrip(",") + "]")  # any torn write fails here
    child_pids = {process.pid for process in processes}
    events = _payload_events(trace)
    assert {event["pid"] for event in events} == child_pids
    for pid in child_pids:
        mine = [event for event in events if event["pid"] == pid]
        assert len(mine) == EVENTS_PER_PROCESS
        assert len({event["tid"] for event in mine}) == 2
        worker = mine[0]["args"]["worker"]
        assert sorted((e["args"]["thread"], e["args"]["i"]) for e in mine) == \
            [(t, i) for t in range(2) for i in range(EVENTS_PER_PROCESS // 2)]
        assert all(e["args"]["worker"] == worker for e in mine)
        names = [e["args"]["name"] for e in trace if e["ph"] == "M" and e["pid"] == pid]
        assert names[-1] == f"episodestream worker {worker} rank 0"


def test_a_write_error_stops_tracing_instead_of_raising(tmp_path, capsys):
    enable_tracer(tmp_path / "trace.json")
    os.close(tracing._TRACER.fd)  # what a vanished file system looks like to os.write
    trace_instant("admit")
    assert "tracing stopped in process" in capsys.readouterr().err
    assert not tracer_enabled()
    tracing._TRACER.fd = None  # already closed above; keep disable_tracer from closing it again
