"""SGLang /metrics into tok/s: the per-step decode counter, not the per-request one (which reads 0 mid-request)."""

from __future__ import annotations

import pytest

from app.core.measure.http_probes import parse_metrics
from app.core.measure.metrics import MetricsReading, rate_between

LABELS = 'engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"'


def sglang(decode: float, prefill: float, finished: float) -> dict[str, float]:
    return parse_metrics("\n".join([
        "# TYPE sglang:realtime_tokens_total counter",
        f'sglang:realtime_tokens_total{{{LABELS},mode="prefill_compute"}} {prefill}',
        f'sglang:realtime_tokens_total{{{LABELS},mode="decode"}} {decode}',
        f'sglang:generation_tokens_total{{model_name="m"}} {finished}',
    ]))


def test_decode_tokens_only_and_not_the_request_end_counter() -> None:
    before = MetricsReading(sglang(decode=1000, prefill=500, finished=960), 10.0, 1000.0)
    after = MetricsReading(sglang(decode=1074, prefill=585, finished=960), 12.0, 1002.0)  # mid-request
    rate = rate_between(before, after, "sglang")
    assert rate is not None
    assert rate.tokens_per_s == pytest.approx(37.0)


def test_older_sglang_without_the_realtime_counter_falls_back() -> None:
    before = MetricsReading(parse_metrics('sglang:generation_tokens_total{model_name="m"} 100'), 10.0, 1000.0)
    after = MetricsReading(parse_metrics('sglang:generation_tokens_total{model_name="m"} 196'), 12.0, 1002.0)
    rate = rate_between(before, after, "sglang")
    assert rate is not None
    assert rate.tokens_per_s == pytest.approx(48.0)
