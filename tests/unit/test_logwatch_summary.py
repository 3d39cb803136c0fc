"""Log summary (ready time, phase durations, tok/s series, acceptance) and the JSON forms of events."""

from __future__ import annotations

import json

import pytest

from app.core.data import Phase
from app.core.logs.parser import event_to_json, parse_lines, read_log_lines, summarize, summary_to_json
from app.core.logs.summary import LogSummary, TimestampClock
from tests.helpers import DATA

LOGS = DATA / "logs"


def summary_of(name: str) -> LogSummary:
    return parse_lines(read_log_lines(LOGS / name)).summary()


def test_sglang_summary() -> None:
    summary = summary_of("sglang_0510_startup.log")
    assert summary.backend == "sglang"
    assert summary.ready is True
    assert summary.ready_seconds == 39.0  # 12:50:08 -> 12:50:47
    timings = {timing.phase: (timing.seconds, timing.source) for timing in summary.phases}
    assert timings[Phase.WEIGHTS] == (12.0, "timestamps")  # 0.5.10 prints no elapsed
    assert timings[Phase.CUDA_GRAPH] == (pytest.approx(4.92 + 2.61 + 1.80), "backend")  # decode + draft graphs
    assert timings[Phase.WARMUP] == (5.0, "timestamps")  # uvicorn up -> ready
    assert [(s.gen_tps, s.accept_len) for s in summary.tps_series] == [
        (1203.55, 3.42),
        (1187.10, 3.38),
        (2001.90, 3.10),
    ]
    assert summary.tps_series[0].timestamp == "2025-11-30 12:51:02"
    assert summary.max_gen_tps == 2001.90
    assert summary.mean_gen_tps == pytest.approx((1203.55 + 1187.10 + 2001.90) / 3)
    assert summary.mean_accept_len == pytest.approx((3.42 + 3.38 + 3.10) / 3)
    assert [notice.kind for notice in summary.notices].count("deprecation") == 1
    assert summary.fatal == ()


def test_crash_summary_is_not_ready_and_names_the_oom() -> None:
    summary = summary_of("sglang_crash_loading.log")
    assert (summary.ready, summary.ready_seconds) == (False, None)
    assert [fatal.kind for fatal in summary.fatal] == ["oom", "child_failed"]
    assert {timing.phase: timing.seconds for timing in summary.phases}[Phase.WEIGHTS] == 31.4  # elapsed= printed


def test_vllm_summary_pairs_spec_decoding_with_throughput_and_ignores_idle_lines() -> None:
    summary = summary_of("vllm_011.log")
    assert summary.ready_seconds == 50.0  # 12:00:01 -> 12:00:51, no year in vLLM timestamps
    assert [(s.gen_tps, s.accept_len) for s in summary.tps_series] == [(1843.7, 2.84), (2010.4, None), (0.0, None)]
    assert summary.mean_gen_tps == pytest.approx((1843.7 + 2010.4) / 2)  # the 0.0 line after the burst is left out
    assert summary.mean_accept_len == 2.84  # the "nan" interval is left out
    timings = {timing.phase: timing.seconds for timing in summary.phases}
    assert timings[Phase.WEIGHTS] == 4.38  # "Model loading took" includes "Loading weights took"
    assert timings[Phase.CUDA_GRAPH] == 7.0


def test_vllm_ready_time_across_new_year() -> None:
    assert summary_of("vllm_033.log").ready_seconds == 25.0  # 12-31 23:59:40 -> 01-01 00:00:05


def test_vllm_cpu_ready_time_uses_the_last_timestamp_before_uvicorn() -> None:
    summary = summary_of("vllm_cpu.log")
    assert summary.ready is True
    assert summary.ready_seconds == 30.0  # 10:02:11 -> 10:02:41 (the uvicorn line has no timestamp)


def test_timestamp_clock_time_only_crosses_midnight() -> None:
    clock = TimestampClock()
    assert clock.seconds("23:59:50") == 0.0
    assert clock.seconds("00:00:10") == 20.0
    assert clock.seconds("garbage") is None
    assert clock.seconds(None) is None


def test_timestamp_clock_full_dates_and_milliseconds() -> None:
    clock = TimestampClock()
    assert clock.seconds("2025-11-30 23:59:59.500") == 0.0  # milliseconds are dropped
    assert clock.seconds("2025-12-01 00:00:09") == 10.0


def test_summary_without_timestamps() -> None:
    events = parse_lines(["INFO:     Application startup complete."], backend="vllm").events
    summary = summarize(events, "vllm")
    assert (summary.ready, summary.ready_seconds) == (True, None)


def test_events_and_summary_are_json() -> None:
    parsed = parse_lines(read_log_lines(LOGS / "vllm_011.log"))
    rows = [event_to_json(event) for event in parsed.events]
    assert {row["type"] for row in rows} == {"phase", "ready", "decode", "spec_decode"}
    decode = next(row for row in rows if row["type"] == "decode")
    assert decode["gen_tps"] == 1843.7
    assert decode["line"] == 22
    assert decode["timestamp"] == "11-30 12:01:11"
    phase = rows[0]
    assert (phase["phase"], phase["begin"]) == ("init", True)
    json.dumps(rows)
    document = summary_to_json(parsed.summary())
    assert json.loads(json.dumps(document))["ready_seconds"] == 50.0
    assert document["phases"][0] == {"phase": "init", "seconds": None, "source": "timestamps"}


def test_fatal_and_notice_json() -> None:
    parsed = parse_lines(read_log_lines(LOGS / "sglang_crash_loading.log"))
    rows = [event_to_json(event) for event in parsed.events]
    fatal = next(row for row in rows if row["type"] == "fatal")
    assert fatal["kind"] == "oom"
    assert fatal["message"].startswith("RuntimeError: Not enough memory")
    assert isinstance(fatal["context"], list)
    notice = next(row for row in rows if row["type"] == "notice")
    assert notice["kind"] == "auto_adjusted"
    json.dumps(rows)
