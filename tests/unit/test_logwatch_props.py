"""Property: the log parser and the summary never raise, whatever text they are fed."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.data import LogEvent
from app.core.logs.parser import LogParser, read_log_lines, summarize

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
REAL_LINES = sorted({line for path in LOGS.glob("*.log") for line in read_log_lines(path)})

# Real lines, cut anywhere and glued to arbitrary text, reach deeper into the patterns than random text.
fragments = st.one_of(
    st.text(),
    st.sampled_from(REAL_LINES),
    st.builds(lambda line, cut, noise: line[:cut] + noise, st.sampled_from(REAL_LINES), st.integers(0, 300), st.text()),
    st.builds(lambda a, b: a + "\r" + b, st.text(), st.sampled_from(REAL_LINES)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(fragments, max_size=40), st.sampled_from([None, "sglang", "vllm"]))
def test_feed_never_raises(lines: list[str], backend: str | None) -> None:
    parser = LogParser(backend)
    events: list[LogEvent] = []
    for line in lines:
        events.extend(parser.feed(line))
    events.extend(parser.flush())
    assert parser.lines >= len(lines)
    assert all(event.line.number <= parser.lines for event in events)
    summarize(events, parser.backend, parser.first_timestamp)
