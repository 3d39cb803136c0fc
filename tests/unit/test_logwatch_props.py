"""Property: the log parser and the summary never raise, whatever text they are fed, and every line fed is
accounted for (an event's line, a traceback's line, or a skipped line)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.data import LogEvent
from app.core.logs.parser import LogParser, read_log_lines, summarize, summary_to_json
from tests.helpers import DATA

LOGS = DATA / "logs"
REAL_LINES = sorted({line for path in LOGS.glob("*.log") for line in read_log_lines(path)})

# Real lines, cut anywhere and glued to arbitrary text, reach deeper into the patterns than random text.
fragments = st.one_of(
    st.text(),
    st.sampled_from(REAL_LINES),
    st.builds(lambda line, cut, noise: line[:cut] + noise, st.sampled_from(REAL_LINES), st.integers(0, 300), st.text()),
    st.builds(lambda a, b: a + "\r" + b, st.text(), st.sampled_from(REAL_LINES)),
)

# What a figure in a real line may turn into: not a number, out of range, signed, empty, another separator.
ODD_FIGURES = [
    "nan",
    "inf",
    "-inf",
    "1e309",
    "-1",
    "",
    "1,2",
    "1.2.3",
    "None",
    "True",
    "0x10",
    "٣",
    "99999999999999999999",
]


@st.composite
def mutated_real_line(draw: st.DrawFn) -> str:
    """A real line with a few edits: a span replaced by odd figures or text, a span deleted or doubled."""
    line = draw(st.sampled_from(REAL_LINES))
    for _ in range(draw(st.integers(1, 4))):
        start = draw(st.integers(0, len(line)))
        end = draw(st.integers(start, min(len(line), start + 12)))
        edit = draw(st.sampled_from(["figure", "text", "delete", "double"]))
        if edit == "figure":
            line = line[:start] + draw(st.sampled_from(ODD_FIGURES)) + line[end:]
        elif edit == "text":
            line = line[:start] + draw(st.text(max_size=8)) + line[end:]
        elif edit == "delete":
            line = line[:start] + line[end:]
        else:
            line = line[:end] + line[start:end] + line[end:]
    return line


def feed_all(lines: list[str], backend: str | None) -> tuple[LogParser, list[LogEvent]]:
    parser = LogParser(backend)
    events: list[LogEvent] = []
    for line in lines:
        events.extend(parser.feed(line))
    events.extend(parser.flush())
    return parser, events


def assert_accounted(parser: LogParser, events: list[LogEvent]) -> None:
    """Each line is an event's line, a line inside a traceback, or a skipped line: never two, never none."""
    event_lines = {event.line.number for event in events}
    assert len(event_lines) + parser.traceback_lines + parser.skipped == parser.lines
    assert parser.unreadable <= parser.skipped


@settings(max_examples=300, deadline=None)
@given(st.lists(fragments, max_size=40), st.sampled_from([None, "sglang", "vllm"]))
def test_feed_never_raises(lines: list[str], backend: str | None) -> None:
    parser, events = feed_all(lines, backend)
    assert parser.lines >= len(lines)
    assert all(event.line.number <= parser.lines for event in events)
    assert_accounted(parser, events)
    summarize(events, parser.backend, parser.first_timestamp)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(mutated_real_line(), st.sampled_from(REAL_LINES), st.text()), max_size=40),
    st.sampled_from([None, "sglang", "vllm", "custom"]),
)
def test_mutated_real_lines_never_raise_and_every_line_is_accounted_for(lines: list[str], backend: str | None) -> None:
    parser, events = feed_all(lines, backend)
    assert_accounted(parser, events)
    summary_to_json(summarize(events, parser.backend, parser.first_timestamp))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(REAL_LINES), min_size=1, max_size=30))
def test_a_chunk_of_lines_counts_like_the_lines_one_by_one(lines: list[str]) -> None:
    one_by_one, _ = feed_all(lines, None)
    chunked, _ = feed_all(["\n".join(line.rstrip("\n") for line in lines) + "\n"], None)
    assert (chunked.lines, chunked.skipped, chunked.traceback_lines) == (
        one_by_one.lines,
        one_by_one.skipped,
        one_by_one.traceback_lines,
    )
