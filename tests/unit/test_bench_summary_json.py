"""A bench's summary is a BenchSummary from the store to the screen: a stored run's report carries the dataclass
(its export writes the stored JSON back unchanged), and a summary stored before energy and SLOs existed reads with
their defaults instead of a KeyError in a table."""

from __future__ import annotations

import json
from pathlib import Path

from app.core.measure.bench import NOT_MEASURED, BenchSummary, summarize, summary_lines
from app.core.measure.client import RequestResult
from app.core.measure.report import bench_rows, export_run, run_report
from app.core.measure.store import HistoryStore


def _summary() -> BenchSummary:
    results = [RequestResult(ok=True, output_tokens=11, ttft_s=0.1, latency_s=0.3) for _ in range(4)]
    return summarize(results, 2.0, slo_ttft_ms=150)


def test_a_stored_bench_reads_back_as_its_summary(tmp_path: Path) -> None:
    summary = _summary()
    stored = summary.to_json() | {"accept_len": 2.5, "accept_source": "log"}
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        run = store.start_run("bench", profile="p", host="sim", backend="sglang", model="m",
                              params={"bench": {}, "trials": 1}, arms=[("running", "", {})])
        store.add_trial(run, 0, 0, value=summary.output_tok_s, summary=stored, accept_len=2.5, accept_source="log",
                        requests=[])
        store.finish_run(run, "done", summary=stored)
        row = store.run(run)
    assert row is not None
    report = run_report(row)
    assert isinstance(report.summary, BenchSummary) and report.summary.accept_len == 2.5
    assert report.summary.goodput_rps == summary.goodput_rps and report.summary.slo == {"ttft_ms": 150,
                                                                                        "tpot_ms": None}
    assert json.loads(export_run(row, "json"))["summary"] == stored  # the export writes the stored JSON back
    assert bench_rows(report.summary)[-2] == ["accept len", "2.50 (log)"]


def test_a_summary_from_before_energy_and_slos_reads_with_defaults() -> None:
    old = {"requests": 8, "completed": 8, "errors": 0, "output_tokens": 800, "wall_s": 4.0, "output_tok_s": 200.0,
           "ttft_ms": {"p50": 10.0, "p90": 12.0, "p99": 13.0, "mean": 10.5}}
    summary = BenchSummary.from_json(old)
    assert (summary.energy, summary.energy_note, summary.slo, summary.goodput_rps) == (None, NOT_MEASURED, None,
                                                                                       None)
    assert summary.tpot_ms["p50"] is None and summary.error_kinds == {}
    assert summary_lines(summary) == [f"energy: unavailable ({NOT_MEASURED})"]
    rows = dict((r[0], r[1]) for r in bench_rows(summary))
    assert rows["output tok/s"] == "200.0" and rows["TPOT"] == "n/a / n/a / n/a ms (p50/p90/p99)"


def test_a_damaged_stored_summary_reads_as_not_measured_instead_of_breaking_a_screen() -> None:
    """Values read from the history file are checked where they enter: a half-written energy, a latency that is
    text, an SLO limit as a string or a count below 0 reads as not measured, and every line still renders."""
    good = _summary().to_json()
    damaged = good | {
        "energy": {"method": "smi", "joules": 1.0},  # no gpus, no watts: summary_lines would KeyError
        "ttft_ms": {"p50": "x", "p90": float("nan"), "p99": True, "mean": 12.0},
        "slo": {"ttft_ms": "500", "tpot_ms": 40},
        "errors": -3, "error_kinds": {"timeout": "many"}, "wall_s": "long", "output_tok_s": float("inf"),
    }
    summary = BenchSummary.from_json(damaged)
    assert summary.energy is None and summary.errors == 0 and summary.error_kinds == {"timeout": 0}
    assert summary.ttft_ms == {"p50": None, "p90": None, "p99": None, "mean": 12.0}
    assert summary.slo == {"ttft_ms": None, "tpot_ms": 40} and summary.wall_s == 0.0 and summary.output_tok_s is None
    lines = summary_lines(summary)
    assert lines[0].startswith("energy: unavailable") and "TPOT <= 40 ms" in lines[1]
    assert any("n/a" in " ".join(row) for row in bench_rows(summary))
