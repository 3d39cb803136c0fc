"""A launch you see coming (issue 20 item 3): progress and ETA from recorded phase times, the history's runs, the
headless output on a terminal and piped, and the line that says what the warm path saved."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from app.core.data import LogLine, Phase, PhaseEvent, ServerState
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import parse_profile
from app.core.profiles.types import Profile
from app.core.server.events import RunStarted, ServerLogEvent, StateChanged
from app.core.server.progress import (
    PhasePlan,
    PhaseTracker,
    PlainProgress,
    RunRecord,
    config_key,
    disk_reference,
    plan_from,
    progress_at,
    progress_line,
    run_offsets,
    saved_text,
    weights_key,
)


def make_test_profile() -> Profile:
    text = 'backend = "sglang"\nmodel = "m"\nwarm = true\n[flags]\ntp-size = 2\n'
    return parse_profile(text, Path("/nonexistent/progress.toml"))

# A warm relaunch as the seed-timing simulator plays it: kill 0.3, release 0.4, start 0.4, load 9.0, capture 12.4,
# warmup 2.6 (offsets from the relaunch's start).
WARM_OFFSETS = {"kill": 0.0, "release": 0.3, "start": 0.7, "load": 1.1, "capture": 10.1, "warmup": 22.5}
WARM_TOTAL = 25.1


def marks(offsets: dict[str, float], begin: float = 1000.0, ready: float | None = None) -> dict[str, float]:
    names = {"kill": "KILLING", "release": "RELEASING", "daemon": "DAEMON", "start": "LAUNCHING",
             "load": "LOADING", "capture": "CAPTURING", "warmup": "WARMING"}
    out = {"BEGIN": begin, **{names[p]: begin + off for p, off in offsets.items()}}
    if ready is not None:
        out["READY"] = begin + ready
    return out


def record(**over: object) -> RunRecord:
    base = RunRecord("cfg", "w", "warm", "p", "h", "relaunch", dict(WARM_OFFSETS), {}, WARM_TOTAL, 0.9, at=100.0)
    return replace(base, **over)  # type: ignore[arg-type]


PLAN = PhasePlan(dict(WARM_OFFSETS), WARM_TOTAL, "the last relaunch of this config (weights from the cache)")


def test_eta_in_the_middle_of_a_phase_is_the_plans_rest() -> None:
    seen = {k: v for k, v in WARM_OFFSETS.items() if k != "warmup"}  # capture began at 10.1 s
    now = 1000.0 + 10.1 + 5.0  # 5 s into a 12.4 s capture
    p = progress_at("relaunch", "warm", marks(seen), PLAN, now)
    assert p.phase == "capture"
    assert p.eta_s == pytest.approx((12.4 - 5.0) + 2.6)
    assert p.fraction == pytest.approx((10.1 + 5.0) / WARM_TOTAL)
    assert dict(p.phases) == {"kill": "done", "release": "done", "start": "done", "load": "done", "capture": "now",
                              "warmup": "next"}


def test_a_slower_run_holds_the_eta_at_the_rest_and_says_how_far_over() -> None:
    seen = {k: v for k, v in WARM_OFFSETS.items() if k != "warmup"}
    now = 1000.0 + 10.1 + 20.0  # capture has run 20 s, the plan gave it 12.4 s
    p = progress_at("relaunch", "warm", marks(seen), PLAN, now)
    assert p.eta_s == pytest.approx(2.6)
    assert p.over_s == pytest.approx(20.0 - 12.4)
    assert p.fraction is not None and p.fraction < 1.0


def test_a_faster_run_moves_the_eta_with_the_phase_it_reached() -> None:
    # the load took 2 s instead of 9 s: capture begins at 3.1 s, the ETA is the plan's capture + warmup
    seen = {**{k: v for k, v in WARM_OFFSETS.items() if k not in ("capture", "warmup")}, "capture": 3.1}
    p = progress_at("relaunch", "warm", marks(seen), PLAN, 1000.0 + 3.1)
    assert p.eta_s == pytest.approx(12.4 + 2.6)


def test_without_a_plan_only_the_elapsed_time_and_the_phase() -> None:
    p = progress_at("launch", "cold", marks({"start": 0.0, "load": 1.0}), None, 1000.0 + 4.0)
    assert p.fraction is None and p.eta_s is None and p.phase == "load" and p.elapsed_s == pytest.approx(4.0)
    assert "no ETA" in progress_line(p)


def test_a_phase_the_plan_lacks_adds_nothing_and_ready_is_done() -> None:
    # the daemon starts this time; the plan (a warm run) has no daemon phase: ETA = the plan from "start" on
    seen = {"kill": 0.0, "release": 0.3, "daemon": 0.7}
    p = progress_at("relaunch", "warm", marks(seen), PLAN, 1000.0 + 20.0)
    assert p.phase == "daemon" and p.eta_s == pytest.approx(WARM_TOTAL - 0.7)
    finished = progress_at("relaunch", "warm", marks(WARM_OFFSETS, ready=24.0), PLAN, 1000.0 + 99.0)
    assert finished.done and finished.fraction == 1.0 and finished.elapsed_s == pytest.approx(24.0)


def test_run_offsets_from_the_lifecycles_marks() -> None:
    assert run_offsets(marks(WARM_OFFSETS)) == WARM_OFFSETS
    assert run_offsets({"LOADING": 5.0}) == {}  # no BEGIN: no run
    assert "kill" not in run_offsets({"BEGIN": 10.0, "KILLING": 3.0})  # a mark from before the run


def test_plan_prefers_the_same_config_and_kind_then_says_when_it_falls_back() -> None:
    runs = [record(at=300.0, config_key="other", total_s=99.0), record(at=200.0, kind="launch", total_s=50.0),
            record(at=100.0, total_s=25.0)]
    plan = plan_from(runs, "cfg", "relaunch", now=400.0)
    assert plan is not None and plan.total_s == 25.0 and "relaunch of this config" in plan.basis
    plan = plan_from(runs, "cfg", "launch", now=400.0)
    assert plan is not None and plan.total_s == 50.0
    plan = plan_from(runs, "new", "relaunch", now=400.0)
    assert plan is not None and plan.total_s == 99.0 and "other flags" in plan.basis
    assert plan_from([], "cfg", "relaunch") is None


def test_config_key_follows_flags_and_weights_key_only_the_cache_keys_flags() -> None:
    profile = make_test_profile()
    graph = replace(profile, flags={**profile.flags, "cuda-graph-backend-prefill": "breakable"})
    tp = replace(profile, flags={**profile.flags, "tp-size": 1})
    assert config_key(profile) != config_key(graph) and config_key(profile) == config_key(replace(profile))
    assert weights_key(profile) == weights_key(graph)  # the prefill graph keeps the weights
    assert weights_key(profile) != weights_key(tp)  # tp_size is in CacheConfig


def test_saved_line_says_what_the_cache_saved() -> None:
    assert saved_text("relaunch", 19.6, "warm", 0.9, (31.1, "")) == \
        "relaunch 19.6 s; weights from the cache 0.9 s instead of 31.1 s"
    assert "instead of the daemon's start from disk 32.2 s" in saved_text(
        "relaunch", 19.6, "warm", 0.9, (32.2, "the daemon's start from disk "))
    assert "no disk load of these weights on record" in saved_text("relaunch", 19.6, "warm", 0.9, None)
    assert saved_text("launch", 58.0, "cold", 31.1, None) == "launch 58.0 s; weights from disk 31.1 s"
    assert "(a cold relaunch of this config took 59.4 s)" in saved_text("relaunch", 29.6, "warm", 0.9, (31.1, ""),
                                                                         59.4)


def test_disk_reference_is_the_last_cold_load_else_the_daemons_start() -> None:
    cold = record(cache="cold", weights_s=31.1, at=50.0, total_s=59.4, config_key="cold-cfg")
    other_flags = record(cache="cold", weights_s=31.0, at=40.0, total_s=55.2, config_key="cold-other")
    fill = record(cache="fill", weights_s=0.9, phase_times={"daemon": 32.2}, at=60.0)
    assert disk_reference([fill, cold, other_flags], "relaunch", "cold-cfg") == ((31.1, ""), 59.4)
    # the cold total is of the same flags only; the disk figure of any flags that load the same weights
    assert disk_reference([fill, other_flags], "relaunch", "cold-cfg") == ((31.0, ""), None)
    assert disk_reference([fill], "relaunch", "cold-cfg") == ((32.2, "the daemon's start from disk "), None)
    assert disk_reference([], "relaunch", "cold-cfg") == (None, None)


def test_the_store_keeps_runs_and_skips_a_hand_edited_row(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    with HistoryStore(path) as store:
        store.add_phase_run(record(at=1.0))
        store.add_phase_run(record(at=2.0, cache="cold", weights_s=31.1))
        store.add_phase_run(record(at=3.0, profile="q"))
        got = store.phase_runs(profile="p", host="h", cache="warm")
        assert [r.at for r in got] == [1.0] and got[0].offsets == WARM_OFFSETS
        assert [r.at for r in store.weights_runs("w")] == [3.0, 2.0, 1.0]
    db = sqlite3.connect(path)
    db.execute("UPDATE launch_phases SET offsets = ? WHERE at = 1.0", (json.dumps({"kill": "soon"}),))
    db.commit()
    db.close()
    with HistoryStore(path) as store:
        assert store.phase_runs(profile="p", host="h", cache="warm") == []
        assert store.skipped == 1 and "expected a number, got 'soon'" in store.skipped_why[0]


class FakeStore:
    def __init__(self, runs: list[RunRecord]) -> None:
        self.runs = runs
        self.added: list[RunRecord] = []

    def add_phase_run(self, run: RunRecord) -> None:
        self.added.append(run)

    def phase_runs(self, *, profile: str, host: str, cache: str, limit: int = 20) -> list[RunRecord]:
        return [r for r in self.runs if r.profile == profile and r.host == host and r.cache == cache]

    def weights_runs(self, weights_key: str, limit: int = 20) -> list[RunRecord]:
        return [r for r in self.runs if r.weights_key == weights_key]


def weights_end(seconds: float) -> ServerLogEvent:
    line = LogLine(1, f"Load weight end. elapsed={seconds:.2f} s")
    return ServerLogEvent(PhaseEvent(Phase.WEIGHTS, False, line, seconds))


def test_tracker_plans_records_and_says_what_was_saved() -> None:
    profile = make_test_profile()
    cold = RunRecord(config_key(replace(profile, warm=False)), weights_key(profile), "cold", profile.name,
                     profile.host, "relaunch",
                     {"kill": 0.0, "start": 1.0}, {}, 59.4, 31.1, at=1.0)
    earlier = replace(cold, config_key=config_key(profile), cache="warm", total_s=25.0, weights_s=0.9,
                      offsets=dict(WARM_OFFSETS), at=2.0)
    store = FakeStore([cold, earlier])
    said: list[str] = []
    now_marks: dict[str, float] = {}

    async def go() -> None:
        tracker = PhaseTracker(lambda: store, lambda text, level: said.append(text), lambda: dict(now_marks))
        now_marks.update(marks({"kill": 0.0}, begin=0.0))
        tracker.on_event(RunStarted("relaunch", profile, "warm", 0.0))
        await tracker.wait_idle()  # the plan loads in a thread
        assert tracker.plan is not None and tracker.plan.total_s == 25.0
        assert tracker.plan.basis.startswith("the last relaunch of this config (weights from the cache)")
        progress = tracker.progress(now=0.1)
        assert progress is not None and progress.eta_s == pytest.approx(25.0 - 0.1)
        tracker.on_event(weights_end(0.88))
        tracker.on_event(weights_end(0.91))  # the other rank: the longest counts
        now_marks.update(marks(WARM_OFFSETS, begin=0.0, ready=19.6))
        tracker.on_event(StateChanged(ServerState.READY, ServerState.WARMING, 0.0))
        assert tracker.progress() is None  # no run under way: no bar
        await tracker.close()

    asyncio.run(go())
    assert said == ["relaunch 19.6 s; weights from the cache 0.9 s instead of 31.1 s "
                    "(a cold relaunch of this config took 59.4 s)"]
    assert len(store.added) == 1 and store.added[0].weights_s == pytest.approx(0.91)
    assert store.added[0].offsets == WARM_OFFSETS and store.added[0].total_s == pytest.approx(19.6)
    assert store.added[0].phase_times["capture"] == pytest.approx(12.4)


def test_a_kill_before_ready_ends_the_run_without_a_record() -> None:
    profile = make_test_profile()
    store = FakeStore([])
    now_marks: dict[str, float] = {}

    async def go() -> None:
        tracker = PhaseTracker(lambda: store, lambda text, level: None, lambda: dict(now_marks))
        now_marks.update(marks({"start": 0.0}, begin=0.0))
        tracker.on_event(RunStarted("launch", profile, "cold", 0.0))
        tracker.on_event(StateChanged(ServerState.KILLING, ServerState.LOADING, 0.0))
        assert tracker.progress() is None
        await tracker.close()

    asyncio.run(go())
    assert store.added == []


def tracker_at(offsets: dict[str, float], plan: PhasePlan | None) -> tuple[PhaseTracker, dict[str, float]]:
    current = marks(offsets, begin=0.0)
    tracker = PhaseTracker(None, lambda text, level: None, lambda: dict(current))
    tracker.run = RunStarted("relaunch", make_test_profile(), "warm", 0.0)
    tracker.plan = plan
    return tracker, current


def test_piped_output_is_one_plain_line_per_phase() -> None:
    tracker, current = tracker_at({"kill": 0.0}, PLAN)
    out = io.StringIO()
    printer = PlainProgress(tracker, out, terminal=False)
    for t in (0.1, 0.2, 0.25):
        printer.tick(now=t)
    current["RELEASING"] = 0.3
    printer.tick(now=0.4)
    printer.tick(now=0.5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue()
    assert lines[0].startswith("relaunch [") and "kill" in lines[0] and "ETA 25 s" in lines[0]
    assert "release" in lines[1]


def test_terminal_output_rewrites_one_line_and_clears_it_for_other_lines() -> None:
    tracker, _ = tracker_at({"kill": 0.0}, PLAN)
    out = io.StringIO()
    printer = PlainProgress(tracker, out, terminal=True)
    printer.tick(now=0.1)
    printer.tick(now=0.2)
    text = out.getvalue()
    assert text.count("\r") == 2 and "\n" not in text
    printer.clear()
    assert out.getvalue().endswith("\r") and printer._width == 0
    tracker.finished = progress_at("relaunch", "warm", marks(WARM_OFFSETS, begin=0.0, ready=19.6), PLAN, 30.0)
    printer.finish()
    assert out.getvalue().endswith("relaunch [####################] 100%  ready after 19.6 s\n")
