"""The acceptance alarm on scripted decode lines: it waits for a sustained low window, speaks once per episode
with the window's figures, clears when acceptance recovers, prefers the log over /metrics, and the Session
puts both in its event log (and drops the episode when the server leaves READY)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from app.core.advisor.acceptance_watch import WINDOW_S, AcceptanceWatch
from app.core.advisor.rules import LOW_ACCEPT_LEN
from app.core.data import DecodeStats, ServerState, SpecDecodeStats
from app.core.profiles.loading import parse_profile
from app.core.server.events import ServerLogEvent, StateChanged
from app.core.session import Session, launch_summary
from tests.fakes import InMemoryHost, ScriptedTelemetry, gpu_reading
from tests.log_helpers import feed, of_type

START = 1_780_000_000.0  # a wall-clock time (the Session stamps readings with time.time())


def sglang_decode(accept_len: float) -> DecodeStats:
    """The event of one real-format SGLang decode line with this acceptance length."""
    line = (f"[2026-06-03 09:15:25 TP0] Decode batch, #running-req: 4, #full token: 2560, full token usage: 0.01, "
            f"accept len: {accept_len:.2f}, accept rate: {(accept_len - 1) / 3:.2f}, cuda graph: True, "
            "gen throughput (token/s): 149.20, #queue-req: 0")
    [event] = of_type(feed(line, "sglang"), DecodeStats)
    assert event.accept_len == pytest.approx(accept_len)
    return event


def vllm_spec(mean: str) -> SpecDecodeStats:
    line = (f"INFO 11-30 12:01:11 [metrics.py:96] SpecDecoding metrics: Mean acceptance length: {mean}, Accepted "
            "throughput: 1.00 tokens/s, Drafted throughput: 19.00 tokens/s, Accepted: 10 tokens, Drafted: 190 tokens, "
            "Per-position acceptance rate: 0.050, Avg Draft acceptance rate: 5.3%")
    [event] = of_type(feed(line, "vllm"), SpecDecodeStats)
    return event


def run(watch: AcceptanceWatch, values: list[float], start: float = 0.0, every_s: float = 3.0,
        source: str = "log") -> list[tuple[float, str]]:
    """Feed one reading every `every_s` seconds; what the watch said, with when."""
    said = []
    for i, value in enumerate(values):
        at = start + i * every_s
        out = watch.add(at, value, source)  # type: ignore[arg-type]
        if out is not None:
            said.append((at, out.text()))
    return said


def test_a_sustained_low_acceptance_raises_one_alarm_with_the_window_figures() -> None:
    watch = AcceptanceWatch()
    lengths = [sglang_decode(v).accept_len or 0.0 for v in [1.05, 1.10, 1.08] * 6]  # 18 lines, 3 s apart
    said = run(watch, lengths)
    # low from the third line (t=6 s, the first full median); sustained for another 30 s: said at t=36 s, once
    assert said == [(36.0, "acceptance 1.08 over the last 36 s (13 lines); speculation is not paying (at or below "
                           f"{LOW_ACCEPT_LEN:g}): fewer speculative steps, another draft, or none; v advises, a A/Bs")]
    assert watch.alarm is not None and watch.alarm.header().startswith("ACCEPTANCE LOW 1.08 (")
    assert watch.alarm.count == 18  # the header follows the episode as it goes on


def test_a_short_dip_says_nothing_and_healthy_acceptance_never_alarms() -> None:
    watch = AcceptanceWatch()
    assert run(watch, [2.9, 1.0, 1.0, 1.0, 1.0, 1.0, 2.8, 3.0, 2.9, 3.1, 2.7, 2.9, 3.0] * 3) == []
    assert watch.alarm is None
    assert run(AcceptanceWatch(), [2.5] * 40) == []
    assert run(AcceptanceWatch(), [LOW_ACCEPT_LEN + 0.01] * 40) == []  # the advisor's threshold, not another one


def test_it_clears_on_recovery_once_and_a_new_episode_speaks_again() -> None:
    watch = AcceptanceWatch()
    said = run(watch, [1.02] * 15 + [2.8] * 10 + [1.01] * 25)
    kinds = [text.split(":")[0].split(" over")[0] for _, text in said]
    assert kinds == ["acceptance 1.02", "acceptance recovered", "acceptance 1.01"]
    recovered = said[1]
    assert recovered[0] > 15 * 3 and "acceptance recovered: 2.80 over the last" in recovered[1]
    assert watch.alarm is not None and watch.alarm.median == pytest.approx(1.01)


def test_metrics_windows_count_only_while_the_log_gives_no_acceptance() -> None:
    only_metrics = AcceptanceWatch()
    said = run(only_metrics, [1.1] * 20, every_s=2.0, source="metrics")
    assert len(said) == 1 and "(18 /metrics windows)" in said[0][1]
    both = AcceptanceWatch()
    for i in range(30):  # the log says 3.0 while /metrics says 1.1: the log's lines decide
        both.add(i * 2.0, 3.0, "log")
        assert both.add(i * 2.0 + 1, 1.1, "metrics") is None
    assert both.alarm is None


def test_a_reading_that_is_not_a_length_is_ignored() -> None:
    watch = AcceptanceWatch()
    assert run(watch, [float("nan"), float("inf"), 0.0, -1.0] * 20) == []
    nan_line = vllm_spec("nan")  # vLLM's idle window: no mean at all, never a 1.0
    assert nan_line.mean_accept_len is None


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Session:
    """A Session on an in-memory host whose wall clock the test moves (nothing runs)."""
    text = 'name = "acc"\nhost = "local"\nbackend = "sglang"\nmodel = "m"\nport = 1\ngpus = [0]\n'
    profile = parse_profile(text, tmp_path / "acc.toml")
    clock = types.SimpleNamespace(now=START)
    monkeypatch.setattr("app.core.session.time", types.SimpleNamespace(time=lambda: clock.now))
    made = Session(InMemoryHost(), profile, telemetry=ScriptedTelemetry(gpu_reading({0: 0})))
    made.clock = clock  # type: ignore[attr-defined]
    return made


def test_the_session_logs_the_episode_from_decode_lines_and_drops_it_when_the_server_stops(session: Session) -> None:
    clock = session.clock  # type: ignore[attr-defined]
    for _ in range(20):
        session._on_lifecycle(ServerLogEvent(sglang_decode(1.08)))
        clock.now += 3.0
    warnings = [e.text for e in session.events if e.level == "warning"]
    assert len(warnings) == 1 and warnings[0].startswith("acceptance 1.08 over the last 36 s (13 lines)")
    assert session.acceptance.alarm is not None
    session._on_lifecycle(ServerLogEvent(sglang_decode(1.0), replayed=True))  # a re-attach's replay: old news
    assert session.acceptance.alarm is not None and session.acceptance.alarm.count == 20
    session._on_lifecycle(StateChanged(ServerState.KILLING, ServerState.READY, clock.now))
    assert session.acceptance.alarm is None


def test_vllm_spec_decode_lines_feed_the_session_alarm(session: Session) -> None:
    clock = session.clock  # type: ignore[attr-defined]
    for _ in range(int(WINDOW_S / 10) + 4):  # vLLM logs its SpecDecoding line every 10 s
        session._on_lifecycle(ServerLogEvent(vllm_spec("1.05")))
        clock.now += 10.0
    assert [e.text.split(";")[0] for e in session.events if e.level == "warning"] == [
        "acceptance 1.05 over the last 50 s (6 lines)"]


def test_the_launch_summary_names_only_the_phases_that_happened() -> None:
    after_kill = {"kill": 2.1, "release": 0.4, "start": 0.3, "load": 3.9, "ready": 5.8}
    assert launch_summary("steps 1 -> 3", after_kill) == (
        "relaunched with steps 1 -> 3: kill 2.1s, release 0.4s, start 0.3s, load 3.9s, ready 5.8s")
    from app.core.server.states import phase_durations

    marks = {"RELEASING": 0.0, "FREE": 0.0, "LAUNCHING": 0.0, "LOADING": 0.4, "CAPTURING": 4.2, "WARMING": 5.5,
             "READY": 5.9}
    from_stopped = phase_durations(marks)  # a free check with nothing to release: no release phase
    assert "release" not in from_stopped and phase_durations({**marks, "KILLING": -0.3})["release"] == 0.0
    assert launch_summary("no change", from_stopped) == (
        "launched: start 0.4s, load 3.8s, capture 1.3s, warmup 0.4s, ready 5.9s")
    assert launch_summary("steps 1 -> 2", from_stopped).startswith("launched with steps 1 -> 2: start 0.4s")


def test_a_long_episode_keeps_bounded_readings_and_counts_them_all() -> None:
    from app.core.advisor.acceptance_watch import EPISODE_READINGS, AcceptanceWatch

    watch = AcceptanceWatch()
    for i in range(EPISODE_READINGS + 500):
        watch.add(float(i), 1.05, "log")
    assert watch.alarm is not None and watch.alarm.kind == "low"
    assert len(watch._low) == EPISODE_READINGS
    assert watch.alarm.count == EPISODE_READINGS + 500 and watch.alarm.span_s == EPISODE_READINGS + 499
