"""Collapse per-run benchmark results into one comparison: summary.md, summary.csv, summary.png.

    python benchmarks/streaming/summarize_results.py RESULTS_DIR [--out OUT_DIR]

Reads every ``*.json`` under RESULTS_DIR (recursively: the SLURM matrix writes one folder per job).
A run result is an object with ``source``, ``mode`` and ``decode``; one whose ``status`` is "ok"
(the default) must also carry the metrics below. Failed and OOM runs (``status`` "failed"/"oom",
with ``error``) need no metrics and are listed with their error. Other JSON objects, such as the
benchmark's ``rss_by_pool_size.json``, are named and ignored; malformed files are named, skipped
and counted in a warning at the end. The chart needs matplotlib; without it the table and CSV are
still written.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

STATUSES = ("ok", "failed", "oom")
NUMBERS = ("samples_per_s", "frames_per_s", "first_batch_s", "peak_rss_mb")
PERCENTILES = ("p50", "p95", "p99")
CACHE_COUNTS = ("hits", "misses", "evictions")
# Reported when a run has them (the benchmark adds them; hand-written results may not).
OPTIONAL_NUMBERS = ("num_workers", "pool_size", "fraction_of_ceiling", "worker_peak_rss_mb")
OPTIONAL_HEADERS = {"num_workers": "workers", "pool_size": "pool", "fraction_of_ceiling": "of decoder ceiling",
                    "worker_peak_rss_mb": "worker peak RSS MB"}
CSV_FIELDS = ("source", "mode", "decode", "status", "samples_per_s", "frames_per_s",
              "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "first_batch_s", "cache_hit_rate",
              "decoder_cache_hits", "decoder_cache_misses", "decoder_cache_evictions", "peak_rss_mb",
              *OPTIONAL_NUMBERS, "error", "file")


class MalformedResult(ValueError):
    """A result file that cannot be summarised; the message says why."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_numbers(where: str, data: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        raise MalformedResult(f"{where} must be an object with {', '.join(keys)}, got {data!r}")
    for key in keys:
        if not _is_number(data.get(key)):
            raise MalformedResult(f"{where}{'.' if where else ''}{key} must be a number, got {data.get(key)!r}")


def _flatten(data: dict[str, Any], file: str) -> dict[str, Any]:
    """One CSV row from a result object, checked; raises MalformedResult naming the bad field."""
    status = data.get("status", "ok")
    if status not in STATUSES:
        raise MalformedResult(f"status ({status!r}) must be one of {', '.join(STATUSES)}")
    for key in ("source", "mode", "decode"):
        if not isinstance(data[key], str) or not data[key]:
            raise MalformedResult(f"{key} must be a non-empty string, got {data[key]!r}")
    row: dict[str, Any] = {field: None for field in CSV_FIELDS}
    row.update(source=data["source"], mode=data["mode"], decode=data["decode"], status=status,
               error=data.get("error"), file=file)
    if status != "ok" and "frames_per_s" not in data:
        return row  # a run that died before measuring anything
    _check_numbers("", data, NUMBERS)
    # An EpisodeLoader row has neither per-sample worker latency nor one decoder cache: null.
    for key, fields in (("latency_ms", PERCENTILES), ("decoder_cache", CACHE_COUNTS)):
        if data.get(key, "<missing>") is not None:
            _check_numbers(key, data.get(key), fields)
    hit_rate = data.get("cache_hit_rate", "<missing>")
    if not (hit_rate is None or _is_number(hit_rate)):
        raise MalformedResult(f"cache_hit_rate must be a number or null, got {hit_rate!r}")
    row.update({key: data[key] for key in NUMBERS}, cache_hit_rate=data["cache_hit_rate"])
    row.update({f"latency_{p}_ms": (data["latency_ms"] or {}).get(p) for p in PERCENTILES})
    row.update({f"decoder_cache_{c}": (data["decoder_cache"] or {}).get(c) for c in CACHE_COUNTS})
    row.update({key: data[key] for key in OPTIONAL_NUMBERS if _is_number(data.get(key))})
    return row


def load_results(results_dir: Path) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(rows sorted by source, mode, decode; malformed-file messages; ignored non-result files)."""
    rows, malformed, ignored = [], [], []
    for path in sorted(results_dir.rglob("*.json")):
        name = str(path.relative_to(results_dir))
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            malformed.append(f"{name}: not readable JSON ({error})")
            continue
        if not isinstance(data, dict) or not {"source", "mode", "decode"} <= data.keys():
            ignored.append(name)
            continue
        try:
            rows.append(_flatten(data, name))
        except MalformedResult as error:
            malformed.append(f"{name}: {error}")
    rows.sort(key=lambda row: (row["source"], row["mode"], row["decode"], row["file"]))
    return rows, malformed, ignored


# -- outputs -----------------------------------------------------------------------------------

def _fmt(value: Any, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _one_line(text: Any, limit: int = 400) -> str:
    flat = " ".join(str(text or "no error message recorded").split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def render_markdown(rows: list[dict[str, Any]]) -> str:
    optional = [key for key in OPTIONAL_NUMBERS if any(row[key] is not None for row in rows)]
    header = ["source", "mode", "decode", "status", "samples/s", "frames/s", "latency p50/p95/p99 ms",
              "first batch s", "cache hit rate", "decoder cache hits/misses/evictions", "peak RSS MB",
              *(OPTIONAL_HEADERS[key] for key in optional)]
    lines = ["# Streaming benchmark summary", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    for row in rows:
        measured = row["frames_per_s"] is not None
        latency = "/".join(_fmt(row[f"latency_{p}_ms"], ".2f") for p in PERCENTILES) if measured else "—"
        cache = "/".join(_fmt(row[f"decoder_cache_{c}"], "g") for c in CACHE_COUNTS) if measured else "—"
        cells = [row["source"], row["mode"], row["decode"], row["status"], _fmt(row["samples_per_s"], ".1f"),
                 _fmt(row["frames_per_s"], ".1f"), latency, _fmt(row["first_batch_s"], ".2f"),
                 _fmt(row["cache_hit_rate"], ".1%"), cache, _fmt(row["peak_rss_mb"], ".0f"),
                 *(_fmt(row[key], ".3g") for key in optional)]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    failed = [row for row in rows if row["status"] != "ok"]
    if failed:
        lines += ["", "## Failed runs", ""]
        lines += [f"- {row['source']}/{row['mode']}/{row['decode']} ({row['status']}, `{row['file']}`): "
                  f"{_one_line(row['error'])}" for row in failed]
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def write_chart(rows: list[dict[str, Any]], path: Path) -> bool:
    """Grouped bars of frames/s: one group per source, one bar per mode/decode. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a cluster node
        import matplotlib.pyplot as plt
    except ImportError as error:
        print(f"warning: matplotlib is not available ({error}); {path.name} not written", file=sys.stderr)
        return False
    sources = sorted({row["source"] for row in rows})
    variants = sorted({(row["mode"], row["decode"]) for row in rows})
    width = 0.8 / max(len(variants), 1)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.8 * len(sources) + 2), 4.5))
    for index, (mode, decode) in enumerate(variants):
        offsets = [s + (index - (len(variants) - 1) / 2) * width for s in range(len(sources))]
        heights, labels = [], []
        for source in sources:
            runs = [r for r in rows if (r["source"], r["mode"], r["decode"]) == (source, mode, decode)]
            measured = [r["frames_per_s"] for r in runs if r["status"] == "ok" and r["frames_per_s"] is not None]
            # Repeated runs of one configuration are averaged; a configuration that only failed
            # gets an empty bar labelled with how it failed, so it is not mistaken for "not run".
            heights.append(sum(measured) / len(measured) if measured else 0.0)
            labels.append("" if measured or not runs else runs[0]["status"].upper())
        bars = axes.bar(offsets, heights, width, label=f"{mode} / {decode}")
        axes.bar_label(bars, labels=labels, fontsize=7, color="tab:red")
    axes.set_xticks(range(len(sources)), sources)
    axes.set_ylabel("frames/s")
    axes.set_title("Streaming throughput by configuration")
    axes.legend(title="mode / decode", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=120)
    plt.close(figure)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path, help="folder searched recursively for *.json results")
    parser.add_argument("--out", type=Path, default=None, help="where to write summary.* (default RESULTS_DIR)")
    args = parser.parse_args(argv)
    if not args.results_dir.is_dir():
        parser.error(f"RESULTS_DIR {str(args.results_dir)!r} is not a directory")
    out_dir = args.out if args.out is not None else args.results_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    rows, malformed, ignored = load_results(args.results_dir)
    for message in malformed:
        print(f"warning: skipped {message}", file=sys.stderr)
    if ignored:
        print(f"ignored {len(ignored)} JSON file(s) that are not run results: {', '.join(ignored)}",
              file=sys.stderr)
    markdown = render_markdown(rows)
    (out_dir / "summary.md").write_text(markdown, encoding="utf-8")
    write_csv(rows, out_dir / "summary.csv")
    written = ["summary.md", "summary.csv"]
    if rows and write_chart(rows, out_dir / "summary.png"):
        written.append("summary.png")
    print(markdown)
    print(f"{len(rows)} run(s) summarised into {', '.join(str(out_dir / name) for name in written)}")
    if malformed:
        print(f"warning: {len(malformed)} malformed result file(s) skipped (listed above)", file=sys.stderr)
    if not rows:
        print(f"error: no run results found under {args.results_dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
