"""benchmarks/streaming/summarize_results.py on synthetic result files."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .scripts import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "streaming" / "summarize_results.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def summarize():
    return load_script(SCRIPT)


def _result(source, mode, decode, frames_per_s, **extra):
    return {"source": source, "mode": mode, "decode": decode, "samples_per_s": frames_per_s / 2,
            "frames_per_s": frames_per_s, "latency_ms": {"p50": 1.5, "p95": 4.25, "p99": 9.0},
            "first_batch_s": 0.75, "cache_hit_rate": 0.5, "peak_rss_mb": 812.4,
            "decoder_cache": {"hits": 10, "misses": 2, "evictions": 1}, "status": "ok", **extra}


@pytest.fixture
def results_dir(tmp_path):
    root = tmp_path / "results"
    runs = {
        "local-single-cpu/local-single-cpu.json": _result("local", "single", "cpu", 900.0, num_workers=8),
        "hub-single-cpu/hub-single-cpu.json": _result("hub", "single", "cpu", 300.0, cache_hit_rate=None),
        "hub-sarm-cpu/hub-sarm-cpu.json": _result("hub", "sarm", "cpu", 1200.0),
        "hub-sarm-cuda/failed.json": {"source": "hub", "mode": "sarm", "decode": "cuda", "status": "oom",
                                      "exit_code": 137, "error": "exit 137: CUDA out of memory.\nTried | 2 GiB"},
        "local-single-cpu/rss_by_pool_size.json": {"2": 500.0, "32": 900.0},
        "bucket-single-cpu/bucket-single-cpu.json": {**_result("bucket", "single", "cpu", 1.0), "frames_per_s": "fast"},
    }
    for name, data in runs.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(json.dumps(data))
    (root / "torn.json").write_text('{"source": "hub", "mode": ')
    return root


def test_table_csv_and_chart(summarize, results_dir, tmp_path, capsys):
    out = tmp_path / "summary"
    assert summarize.main([str(results_dir), "--out", str(out)]) == 0
    captured = capsys.readouterr()

    table = [line for line in (out / "summary.md").read_text().splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[:4] for line in table[1:]] == [
        ["| hub", "sarm", "cpu", "ok"], ["| hub", "sarm", "cuda", "oom"], ["| hub", "single", "cpu", "ok"],
        ["| local", "single", "cpu", "ok"]]
    assert "| 600.0 | 1200.0 | 1.50/4.25/9.00 | 0.75 | 50.0% | 10/2/1 | 812 |" in table[1]
    assert "| — | — | — |" in table[2]  # the OOM run has no measurements
    assert "| — |" in table[3]  # cache_hit_rate null
    markdown = (out / "summary.md").read_text()
    assert "## Failed runs" in markdown
    assert "- hub/sarm/cuda (oom, `hub-sarm-cuda/failed.json`): exit 137: CUDA out of memory. Tried | 2 GiB" in markdown

    with open(out / "summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["source"], r["mode"], r["decode"], r["status"]) for r in rows] == [
        ("hub", "sarm", "cpu", "ok"), ("hub", "sarm", "cuda", "oom"), ("hub", "single", "cpu", "ok"),
        ("local", "single", "cpu", "ok")]
    assert rows[0]["frames_per_s"] == "1200.0" and rows[0]["latency_p95_ms"] == "4.25"
    assert rows[0]["decoder_cache_evictions"] == "1" and rows[2]["cache_hit_rate"] == ""
    assert rows[3]["num_workers"] == "8" and rows[1]["frames_per_s"] == ""

    assert (out / "summary.png").read_bytes()[:8] == PNG_SIGNATURE

    # Malformed files are named and counted; the non-result JSON is named as ignored.
    assert "torn.json: not readable JSON" in captured.err
    assert "bucket-single-cpu/bucket-single-cpu.json: frames_per_s must be a number, got 'fast'" in captured.err
    assert "2 malformed result file(s) skipped" in captured.err
    assert "local-single-cpu/rss_by_pool_size.json" in captured.err


def test_without_matplotlib_tables_are_still_written(summarize, results_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    assert summarize.main([str(results_dir), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "summary.md").exists() and (tmp_path / "out" / "summary.csv").exists()
    assert not (tmp_path / "out" / "summary.png").exists()
    assert "matplotlib is not available" in capsys.readouterr().err


def test_no_results_is_an_error(summarize, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert summarize.main([str(tmp_path / "empty")]) == 1
    assert "no run results found" in capsys.readouterr().err


def test_command_line_writes_next_to_the_results(results_dir):
    result = subprocess.run([sys.executable, str(SCRIPT), str(results_dir)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "4 run(s) summarised" in result.stdout
    assert {"summary.md", "summary.csv", "summary.png"} <= {p.name for p in results_dir.iterdir()}
