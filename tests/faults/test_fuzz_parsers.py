"""Hypothesis fuzzing of every parser that reads outside input: the nvidia-smi CSV, the server log, the profile file,
the job record, the SSE chunk and /metrics. No exception but the parser's own error escapes, and where a parser
counts the lines it skipped, the count is exact (rows and junk lines are generated apart, so the test knows which
is which).

Examples per run (`fuzz(n)` below): nvidia-smi 1,500 + 1,000, log 1,000 + 500, profile 1,500 + 1,500, job record
1,000, SSE chunk 2,000 + 1,000, /metrics 1,500 + 1,000: 13,500 cases, about 20-35 s on a shared 2-core machine.
The last tests pin three bugs the fuzzing found (an overflowing cell, a superscript pid, a deeply nested record).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.logs.parser import LogParser
from app.core.measure.client import MAX_TOKENS_COUNT, StreamFailed, chunk_text, meta_accept_len, read_chunk
from app.core.measure.http_probes import read_metrics
from app.core.profiles.loading import parse_profile
from app.core.profiles.schema import SIMPLE_NAME
from app.core.profiles.types import ProfileError
from app.core.server.jobs import JobRecord
from app.core.telemetry.smi_parse import parse_compute_apps_csv, parse_gpu_csv
from tests.helpers import DATA

pytestmark = pytest.mark.slow

def fuzz(examples: int) -> settings:
    """The settings of one fuzz test: `examples` cases, no per-case deadline (a loaded 2-core machine)."""
    return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# one line of text: no character that str.splitlines() breaks on, no surrogate
ONE_LINE = st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"))
line_text = st.text(ONE_LINE, max_size=60)

# ---- JSON values ---------------------------------------------------------------------------------
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                    st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)


# ---- nvidia-smi ----------------------------------------------------------------------------------
cell_number = st.integers(0, 10**7).map(str)
gpu_row = st.builds(
    lambda i, uuid, used, total, util, temp, power, name: f"{i}, GPU-{uuid}, {used}, {total}, {util}, {temp}, "
                                                          f"{power}, {name}",
    st.integers(0, 64), st.uuids().map(str), cell_number, cell_number, st.sampled_from(["0", "57", "[N/A]"]),
    st.sampled_from(["31", "N/A"]), st.sampled_from(["71.52", "[Not Supported]"]),
    st.text(ONE_LINE, min_size=1, max_size=30).filter(lambda s: s.strip() == s and s.strip()),
)
apps_row = st.builds(lambda uuid, pid, mib, name: f"GPU-{uuid}, {pid}, {mib}, {name}",
                     st.uuids().map(str), st.integers(1, 2**22), st.sampled_from(["1024", "[N/A]"]),
                     st.text(ONE_LINE, min_size=1, max_size=30).filter(lambda s: s.strip() == s and s.strip()))
# junk that can never be a row: no comma (a row has several cells), not blank
junk_line = st.text(ONE_LINE, min_size=1, max_size=60).filter(lambda s: "," not in s and s.strip())
header_line = st.sampled_from(["index, uuid, memory.used [MiB], memory.total [MiB], name", "pid, process_name", ""])


@fuzz(1500)
@given(st.text(max_size=400))
def test_smi_parsers_never_raise(text: str) -> None:
    rows, skipped = parse_gpu_csv(text)
    processes, skipped_apps = parse_compute_apps_csv(text)
    lines = len(text.splitlines())
    assert len(rows) + skipped <= lines and len(processes) + skipped_apps <= lines


@fuzz(1000)
@given(st.lists(st.tuples(st.sampled_from(["gpu", "app", "junk", "header"]), st.data()), max_size=20), st.data())
def test_smi_skipped_counts_are_exact(kinds: list[tuple[str, Any]], data: st.DataObject) -> None:
    lines = []
    for kind, _ in kinds:
        strategy = {"gpu": gpu_row, "app": apps_row, "junk": junk_line, "header": header_line}[kind]
        lines.append(data.draw(strategy))
    newline = data.draw(st.sampled_from(["\n", "\r\n"]))
    text = newline.join(lines)
    count = {kind: sum(1 for k, _ in kinds if k == kind) for kind in ("gpu", "app", "junk")}
    rows, skipped = parse_gpu_csv(text)
    assert len(rows) == count["gpu"] and skipped == count["junk"] + count["app"]  # an apps row has 4 cells, not 8
    processes, skipped_apps = parse_compute_apps_csv(text)
    assert len(processes) == count["app"] and skipped_apps == count["junk"] + count["gpu"]


# ---- the server log ------------------------------------------------------------------------------
REAL_LOGS = DATA / "logs"
REAL_LINES = sorted({line.rstrip("\n") for path in REAL_LOGS.glob("*.log")
                     for line in path.read_text(encoding="utf-8", errors="replace").splitlines()})
log_fragment = st.one_of(
    st.text(max_size=200),
    st.sampled_from(REAL_LINES),
    st.builds(lambda line, cut, noise: line[:cut] + noise, st.sampled_from(REAL_LINES), st.integers(0, 200),
              st.text(max_size=40)),
)
# a line that no pattern can take: consonants, digits and spaces (no word, no timestamp, no marker)
inert_line = st.text(alphabet="bcdfghjklmnpqrstvwxz 0123456789", min_size=1, max_size=60)


@fuzz(1000)
@given(st.lists(log_fragment, max_size=40), st.sampled_from([None, "sglang", "vllm", "custom"]))
def test_log_parser_never_raises_and_accounts_for_every_line(fragments: list[str], backend: str | None) -> None:
    parser = LogParser(backend)
    events = [event for fragment in fragments for event in parser.feed(fragment)]
    events += parser.flush()
    with_events = {event.line.number for event in events}  # type: ignore[attr-defined]
    assert parser.lines >= len(fragments)
    assert parser.skipped + parser.traceback_lines + len(with_events) == parser.lines
    assert 0 <= parser.unreadable <= parser.skipped


@fuzz(500)
@given(st.lists(inert_line, min_size=1, max_size=30), st.sampled_from([None, "sglang", "vllm"]))
def test_log_lines_that_say_nothing_are_each_counted_as_skipped(lines: list[str], backend: str | None) -> None:
    parser = LogParser(backend)
    assert [parser.feed(line) for line in lines] == [[] for _ in lines]
    assert parser.skipped == parser.lines == len(lines) and parser.flush() == []


# ---- the profile file ----------------------------------------------------------------------------
def _toml_string(text: str) -> str:
    """A TOML basic string (JSON's escapes, less its surrogate pairs, plus DEL)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, int) else (repr(value) if math.isfinite(value) else "nan")
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return '""'


TOP_KEYS = ["name", "description", "host", "backend", "python", "module", "model", "port", "gpus", "env",
            "sim_state", "flags", "toggles", "bench", "command", "ready_regex", "health_url", "other"]
toml_scalars = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
                         st.text(max_size=20), st.sampled_from(["sglang", "vllm", "custom", "local", "sim",
                                                                "ssh://h:99999", "../../x", "~zz/x", "\x00"]))
toml_values = st.recursive(toml_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["tp-size", "port", "s", "cycle", "values", "x",
                                                                  "requests", "label"]), inner, max_size=3)),
    max_leaves=8)


@fuzz(1500)
@given(st.text(max_size=300))
def test_profile_reader_raises_only_profile_errors_on_any_text(text: str) -> None:
    message = "/tmp/fuzz.toml"
    try:
        parse_profile(text, Path(message))
    except ProfileError as exc:
        message = str(exc)
    assert message.startswith("/tmp/fuzz.toml")  # every error names the file


@fuzz(1500)
@given(st.dictionaries(st.sampled_from(TOP_KEYS), toml_values, max_size=3),
       st.sampled_from(["sglang", "vllm", "custom", None]),
       st.one_of(st.none(), st.from_regex(re.compile(r"[A-Za-z0-9._/ -]{0,70}"), fullmatch=True)))
def test_profile_reader_on_toml_shaped_junk(junk: dict[str, Any], backend: str | None, name: str | None) -> None:
    """A valid profile (when `backend` is given) with a name of near-identifier shape and up to three junk keys."""
    base: dict[str, Any] = {} if backend is None else {"backend": backend, "model": "m", "host": "local"}
    if backend == "custom":
        base.update(command=["srv", "{port}"], port=9000, ready_regex="up")
    if name is not None:
        base["name"] = name
    table = {**base, **junk}
    text = "".join(f"{key} = {_toml_value(value)}\n" for key, value in table.items())
    try:
        profile = parse_profile(text, Path("/tmp/fuzz.toml"))
    except ProfileError as exc:
        message = str(exc)
        assert message.startswith("/tmp/fuzz.toml")  # every error names the file
        return
    assert SIMPLE_NAME.fullmatch(profile.name)
    assert all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in profile.gpus)
    assert profile.backend == "custom" or 0 < profile.port < 65536
    strings = [profile.name, profile.host, profile.python, profile.model, *profile.env, *profile.env.values(),
               *profile.command]
    assert not any("\x00" in s for s in strings)


# ---- the job record ------------------------------------------------------------------------------
GOOD_RECORD: dict[str, Any] = {
    "profile": "p", "host": "local", "backend": "sglang", "model": "m", "port": 30000, "argv": ["python3", "-m", "x"],
    "flags": {"tp-size": 2}, "pid": 4242, "pgid": 4242, "start_time": "123456", "log_path": "/tmp/p.log",
    "launched_by": "me@box", "launched_at": 1.5, "gpus": [0, 1],
}
RECORD_KEYS = [*GOOD_RECORD, "outcome", "phase_times", "baseline_mib", "ready_at", "other"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@fuzz(1000)
@given(st.one_of(st.text(max_size=200), json_values.map(json.dumps),
                 st.dictionaries(st.sampled_from(RECORD_KEYS), json_values, max_size=3)
                 .map(lambda junk: json.dumps({**GOOD_RECORD, **junk}))))
def test_job_record_reader_raises_only_value_or_type_errors(text: str) -> None:
    """A record reads back with the types its users rely on, or is refused with ValueError/TypeError."""
    try:
        record = JobRecord.from_json(text)
    except (ValueError, TypeError):
        return
    assert _is_int(record.port) and all(pid is None or _is_int(pid) for pid in (record.pid, record.pgid))
    assert isinstance(record.argv, list) and all(isinstance(a, str) for a in record.argv)
    assert isinstance(record.gpus, list) and all(_is_int(g) for g in record.gpus)
    assert isinstance(record.start_time, str) and isinstance(record.log_path, str)
    assert JobRecord.from_json(record.to_json()) == record


def test_job_record_with_fields_of_the_wrong_type_is_refused() -> None:
    for key, junk in (("pid", "x"), ("pgid", []), ("port", "80"), ("argv", "python3"), ("gpus", [True])):
        with pytest.raises((ValueError, TypeError)):
            JobRecord.from_json(json.dumps({**GOOD_RECORD, key: junk}))
    assert JobRecord.from_json(json.dumps(GOOD_RECORD)).pid == 4242


# ---- SSE chunks ----------------------------------------------------------------------------------
chunk_dicts = st.fixed_dictionaries({}, optional={
    "choices": st.one_of(json_values, st.lists(st.fixed_dictionaries({}, optional={
        "text": json_values, "delta": st.one_of(json_values, st.fixed_dictionaries({}, optional={
            "content": json_values}))}), max_size=3)),
    "usage": st.one_of(json_values, st.fixed_dictionaries({}, optional={"completion_tokens": scalars})),
    "meta_info": st.one_of(json_values, st.fixed_dictionaries({}, optional={"spec_verify_ct": scalars,
                                                                            "completion_tokens": scalars})),
    "error": json_values,
})


def _read_whole_chunk(payload: str | bytes) -> None:
    """What both readers do with one payload: read it, then its text and (full client) its acceptance."""
    try:
        chunk, tokens = read_chunk(payload)
        if chunk is None:
            assert tokens is None
            return
        assert tokens is None or (isinstance(tokens, int) and 0 <= tokens <= MAX_TOKENS_COUNT)
        assert isinstance(chunk_text(chunk), str)
        accept = meta_accept_len(chunk, tokens)
        assert accept is None or (isinstance(accept, float) and math.isfinite(accept) and accept >= 0)
    except StreamFailed as exc:  # an error chunk, or a BadChunk naming its kind
        message = str(exc)
        assert message


@fuzz(2000)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200), json_values.map(json.dumps)))
def test_sse_chunk_reader_raises_only_stream_failed(payload: str | bytes) -> None:
    _read_whole_chunk(payload)


@fuzz(1000)
@given(chunk_dicts, st.booleans())
def test_sse_chunk_reader_on_chunk_shaped_junk(chunk: dict[str, Any], as_bytes: bool) -> None:
    payload = json.dumps(chunk)
    _read_whole_chunk(payload.encode() if as_bytes else payload)


# ---- /metrics ------------------------------------------------------------------------------------
metric_name = st.from_regex(re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}"), fullmatch=True)
metric_labels = st.sampled_from(["", '{mode="decode"}', '{model_name="m",tp_rank="0"}'])
good_value = st.one_of(st.integers(0, 10**12).map(str), st.floats(0, 1e12).map(repr),
                       st.sampled_from(["0", "1e3", "2.5E+01"]))
bad_value = st.sampled_from(["NaN", "nan", "+Inf", "-Inf", "Inf", "-1", "-0.5", "abc", "1,5", "0x10", "--1"])
metrics_junk = st.one_of(
    st.text(ONE_LINE, min_size=1, max_size=40).map(lambda s: "!" + s),  # cannot start a name
    metric_name,  # a name without a value
    st.text(ONE_LINE, max_size=40).filter(lambda s: "}" not in s).map(lambda s: "a{" + s + " 1"),  # unclosed
)


@fuzz(1500)
@given(st.text(max_size=400))
def test_metrics_parser_never_raises_and_keeps_only_counts(text: str) -> None:
    values, skipped = read_metrics(text)
    assert all(math.isfinite(v) and v >= 0 for v in values.values())
    assert 0 <= skipped <= len(text.splitlines())


@fuzz(1000)
@given(st.lists(st.one_of(
    st.tuples(st.just("good"), metric_name, metric_labels, good_value),
    st.tuples(st.just("bad"), metric_name, metric_labels, bad_value),
    st.tuples(st.just("junk"), metrics_junk, st.just(""), st.just("")),
    st.tuples(st.just("comment"), st.text(ONE_LINE, max_size=30), st.just(""), st.just("")),
), max_size=25))
def test_metrics_skipped_counts_are_exact(lines: list[tuple[str, str, str, str]]) -> None:
    text = "\n".join(
        f"{name}{labels} {value}" if kind in ("good", "bad") else (f"# {name}" if kind == "comment" else name)
        for kind, name, labels, value in lines)
    values, skipped = read_metrics(text)
    assert skipped == sum(1 for kind, *_ in lines if kind in ("bad", "junk"))
    expected: dict[str, float] = {}
    for kind, name, _labels, value in lines:
        if kind == "good":
            expected[name] = expected.get(name, 0.0) + float(value)
    for name, total in expected.items():
        assert values[name] == pytest.approx(total)


# ---- known bugs in parsers owned elsewhere (strict: the fix flips them) -------------------------
def test_smi_cell_of_400_digits_is_unreadable_not_an_overflow() -> None:
    rows, _ = parse_gpu_csv("0, GPU-1, " + "9" * 400 + ", 1, 1, 1, 1, gpu")
    assert rows[0].memory_used_mib is None


def test_smi_pid_that_is_a_superscript_digit_is_a_skipped_line() -> None:
    assert parse_compute_apps_csv("GPU-1, \u00b2, 1, python") == ([], 1)


def test_job_record_nested_too_deeply_is_a_value_error() -> None:
    with pytest.raises((ValueError, TypeError)):
        JobRecord.from_json("[" * 100_000)
