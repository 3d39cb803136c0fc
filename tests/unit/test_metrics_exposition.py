"""/metrics read through prometheus_client's text parser: a label value may hold `}`, real expositions read as before,
and whatever the exposition's escaping allows in a label value comes back as the one series it is."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from app.core.measure.http_probes import METRIC_LINE_MAX, parse_metrics, read_metrics
from app.core.measure.metrics import MetricsReading, rate_between

DATA = Path(__file__).parent.parent / "data" / "metrics"

# The hand regex tunedash used before prometheus_client's parser (the reference for "reads as before").
OLD_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def old_reader(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = OLD_LINE.match(line)
        if not line or line.startswith("#") or not match:
            continue
        value = float(match["value"])
        if match["labels"]:
            values[f"{match['name']}{{{match['labels']}}}"] = value
        values[match["name"]] = values.get(match["name"], 0.0) + value
    return values


def test_a_label_value_with_a_brace_is_one_series_not_a_dropped_line() -> None:
    crafted = 'sglang:generation_tokens_total{model_name="/models/qwen}-27b"} 1234'
    values, skipped = read_metrics(crafted)
    assert skipped == 0
    assert values["sglang:generation_tokens_total"] == 1234  # before: the line was dropped, 1234 tokens lost
    assert values['sglang:generation_tokens_total{model_name="/models/qwen}-27b"}'] == 1234
    before = MetricsReading(parse_metrics(crafted.replace("1234", "1000")), 10.0, 1000.0)
    rate = rate_between(before, MetricsReading(values, 12.0, 1002.0), "sglang")
    assert rate is not None and rate.tokens_per_s == pytest.approx(117.0)


def test_the_decode_series_is_picked_when_a_model_path_holds_braces_and_commas() -> None:
    labels = 'model_name="/m/{a,b}",mode="decode"'
    other = 'sglang:realtime_tokens_total{model_name="/m/{a,b}",mode="prefill_compute",submode="decode"}'
    values = parse_metrics(f"sglang:realtime_tokens_total{{{labels}}} 500\n{other} 9000")
    later = parse_metrics(f"sglang:realtime_tokens_total{{{labels}}} 700\n{other} 9900")
    rate = rate_between(MetricsReading(values, 0.0, 0.0), MetricsReading(later, 2.0, 2.0), "sglang")
    assert rate is not None and rate.tokens_per_s == pytest.approx(100.0)  # decode only, not prefill


@pytest.mark.parametrize("fixture", ["sglang_0523.txt", "vllm_0320.txt", "vllm_0320_real.txt"])
def test_real_expositions_read_as_the_old_reader_read_them(fixture: str) -> None:
    text = (DATA / fixture).read_text()
    values, skipped = read_metrics(text)
    assert skipped == 0
    assert values == pytest.approx(old_reader(text))
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) > 20 and len([key for key in values if "{" in key]) == sum("{" in line for line in series)


def test_malformed_lines_are_counted_and_the_rest_kept() -> None:
    text = "\n".join([
        'vllm:generation_tokens_total{model_name="m"} 100',
        'vllm:generation_tokens_total{model_name="m} 5',  # unclosed quote
        'vllm:num_requests_running{model_name="m"} 1 2 3 junk',  # junk after the timestamp
        "vllm:spec_decode_num_drafts_total{a=b} 7",  # unquoted value
        "!name 1",
        "x{" + 'a="' + "y" * METRIC_LINE_MAX + '"} 1',  # over the line cap
        "   ",
        "  # an indented comment",
    ])
    values, skipped = read_metrics(text)
    assert skipped == 5
    assert values == {'vllm:generation_tokens_total{model_name="m"}': 100.0, "vllm:generation_tokens_total": 100.0}


label_name = st.from_regex(re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}"), fullmatch=True).filter(
    lambda n: not n.startswith("__"))
label_value = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24)  # `}` `,` `"` `\` newlines too


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.dictionaries(label_name, label_value, min_size=1, max_size=3),
                          st.integers(0, 10**9)), min_size=1, max_size=6, unique_by=lambda s: tuple(s[0].items())))
def test_any_escaped_label_value_reads_back_as_prometheus_client_reads_it(
        series: list[tuple[dict[str, str], int]]) -> None:
    lines = ["# TYPE demo_tokens_total counter"]
    for labels, value in series:
        rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"demo_tokens_total{{{rendered}}} {value}")
    text = "\n".join(lines)
    values, skipped = read_metrics(text)
    assert skipped == 0
    assert values["demo_tokens_total"] == sum(value for _, value in series)
    theirs = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert [(s.labels, s.value) for s in theirs] == [(labels, value) for labels, value in series]
    for (_labels, value), line in zip(series, lines[1:], strict=True):
        assert values[line.rsplit(" ", 1)[0]] == value  # the key is the series as the server wrote it


def _prometheus_reading(line: str) -> tuple[str, dict[str, str], float] | None:
    try:
        samples = [s for family in text_string_to_metric_families(line) for s in family.samples]
    except ValueError:
        return None
    return (samples[0].name, samples[0].labels, float(samples[0].value)) if len(samples) == 1 else None


plain_value = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='"\\\n'), max_size=16)
plain_line = st.builds(
    lambda name, labels, comma, gap, value: (
        name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + comma + "}" if labels is not None else "")
        + gap + value),
    st.from_regex(re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,10}"), fullmatch=True),
    st.one_of(st.none(), st.lists(st.tuples(st.one_of(
        st.from_regex(re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,6}"), fullmatch=True),
        st.sampled_from(["__x", "__name__", "le", "mode"])), plain_value), max_size=4)),
    st.sampled_from(["", ","]), st.sampled_from([" ", "\t", "  ", " \t"]),
    st.one_of(st.integers(-10, 10**20).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
              st.sampled_from(["NaN", "+Inf", "-Inf", "1e3", "1_0", "0x10", "١٢", "1.5E-3", "abc"])))
mutation = st.sampled_from(['"', "\\", "{", "}", ",", "=", " ", "\t", "_", "#", "__", "\u00a0", "\r"])


@settings(max_examples=2000, deadline=None)
@given(st.one_of(plain_line,
                 st.tuples(plain_line, st.integers(0, 60), mutation).map(lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:]),
                 st.text(max_size=60)))
def test_the_plain_fast_path_reads_a_line_as_prometheus_client_does(line: str) -> None:
    """`_plain_sample` answers only for lines prometheus_client reads, and then with its reading (the rest goes to
    the parser itself)."""
    from app.core.measure.http_probes import _plain_sample

    plain = _plain_sample(line)
    if plain is None:
        return
    theirs = _prometheus_reading(line)
    assert theirs is not None, line
    assert plain[:2] == theirs[:2], line
    assert plain[2] == theirs[2] or (math.isnan(plain[2]) and math.isnan(theirs[2])), line


def test_the_fast_path_takes_the_lines_real_servers_print() -> None:
    from app.core.measure.http_probes import _plain_sample

    for fixture in ("sglang_0523.txt", "vllm_0320_real.txt"):
        series = [line for line in (DATA / fixture).read_text().splitlines() if line and not line.startswith("#")]
        assert all(_plain_sample(line) is not None for line in series), fixture
    assert _plain_sample('x{a="b\\"c"} 1') is None  # an escape: the parser reads it
