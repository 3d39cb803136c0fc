"""app.tui.plots: typed experiment reports and stored request rows -> the plot widgets' views, degraded inputs
included."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from app.core.measure.client import RequestResult
from app.core.measure.results import ArmData, experiment_report
from app.core.measure.store import HistoryStore, RequestRow
from app.tui.plots import (
    RunCache,
    compare_plots_view,
    distribution_views,
    launch_plot_view,
    trend_view,
)


def _arm(label: str, launches: list[list[float]]) -> ArmData:
    values = [v for vals in launches for v in vals]
    return ArmData(label, "", values, [], 0, len(values), 10 * len(values), launches)


def test_launch_values_are_the_dots_and_the_interval_is_kept() -> None:
    report = experiment_report("done", [_arm("A", [[10.0, 11.0], [12.0, 13.0]]), _arm("B", [[20.0, 21.0]])])
    view = launch_plot_view(report)
    assert view.unit == "launch"
    a, b = view.arms
    assert (a.label, a.values, a.mean) == ("A", (10.5, 12.5), 11.5)
    assert a.interval == report.arms[0].ci95 and a.interval is not None and a.interval[0] < 10.5
    assert (b.label, b.values, b.interval, b.mean) == ("B", (20.5,), None, 20.5)  # one launch: no interval


def test_bad_numbers_never_reach_the_widget() -> None:
    arm = experiment_report("done", [_arm("A", [[1.0], [2.0]])]).arms[0]
    bad = dataclasses.replace(arm, launch_values=(1.0, math.nan, 2.0, math.inf), mean=math.nan,
                              ci95=(math.nan, 2.0))
    view = launch_plot_view(dataclasses.replace(experiment_report("done", []), arms=(bad,)))
    assert view.arms[0].values == (1.0, 2.0) and view.arms[0].interval is None and view.arms[0].mean is None
    assert launch_plot_view(experiment_report("done", [])).arms == ()
    empty = experiment_report("failed", [_arm("A", [[]]), _arm("B", [])]).arms  # no successful trial
    assert [(a.values, a.mean, a.interval) for a in launch_plot_view(
        experiment_report("failed", [_arm("A", [[]]), _arm("B", [])])).arms] == [((), None, None)] * 2
    assert all(a.mean is None for a in empty)


def _row(arm: int, ok: bool, ttft: float | None, tpot: float | None) -> RequestRow:
    return RequestRow(arm, 0, 0, 0, ok, 8, ttft, 1.0, tpot, 0.0, False, None if ok else "HTTP 500")


def test_distributions_take_finished_requests_of_known_arms_in_ms() -> None:
    rows = [
        _row(0, True, 0.05, 0.01),
        _row(0, False, 9.0, 9.0),  # failed: left out
        _row(1, True, 0.08, None),  # one token: no ITL
        _row(7, True, 0.08, 0.02),  # no such arm
        _row(-1, True, 0.08, 0.02),  # not an index
        _row(1, True, -1.0, math.nan),
    ]
    ttft, itl = distribution_views(["A", "B"], rows)
    assert ttft.arms == (("A", (50.0,)), ("B", (80.0,)))
    assert itl.arms == (("A", (10.0,)), ("B", ()))


def test_zero_requests_give_empty_distributions_for_every_arm() -> None:
    view = compare_plots_view(experiment_report("done", [_arm("A", [[1.0]]), _arm("B", [[2.0]])]), [])
    assert view.ttft.arms == (("A", ()), ("B", ())) and view.itl.arms == (("A", ()), ("B", ()))


def _store_with_runs(path: Path) -> tuple[HistoryStore, list[int]]:
    store = HistoryStore(path)
    ids = []
    req = RequestResult(ok=True, output_tokens=8, ttft_s=0.1, latency_s=0.8)
    for value, flags in ((100.0, {"s": 1}), (90.0, {"s": 3}), (104.0, {"s": 1})):
        rid = store.start_run("bench", profile="demo", host="sim", backend="sglang", model="m", params={},
                              arms=[("running", "", flags)])
        store.add_trial(rid, 0, 0, value=value, summary={}, accept_len=None, accept_source="", requests=[req])
        store.finish_run(rid, "done")
        ids.append(rid)
    other = store.start_run("bench", profile="other", host="sim", backend="sglang", model="m", params={},
                            arms=[("running", "", {"s": 1})])
    store.add_trial(other, 0, 0, value=1.0, summary={}, accept_len=None, accept_source="", requests=[])
    ab = store.start_run("ab", profile="demo", host="sim", backend="sglang", model="m", params={},
                         arms=[("A", "", {"s": 1}), ("B", "s=3", {"s": 3})])
    for arm, values in ((0, [110.0, 112.0]), (1, [95.0])):
        for i, v in enumerate(values):
            store.add_trial(ab, arm, i, value=v, summary={}, accept_len=None, accept_source="", requests=[req])
    store.add_trial(ab, 1, 1, value=None, summary={}, accept_len=None, accept_source="", requests=[])
    store.finish_run(ab, "done")
    ids.append(ab)
    return store, ids


def test_trend_follows_each_config_of_the_run_across_the_profile(tmp_path: Path) -> None:
    store, (b1, b2, b3, ab) = _store_with_runs(tmp_path / "h.sqlite3")
    with store:
        cache = RunCache(store)
        run = cache.get(ab)
        assert run is not None
        view = trend_view(run, cache.profile_runs("demo", store.runs()))
        a_series, b_series = view.series
        assert [(p.run_id, p.value) for p in a_series.points] == [(b1, 100.0), (b3, 104.0), (ab, 111.0)]
        assert [(p.run_id, p.value) for p in b_series.points] == [(b2, 90.0), (ab, 95.0)]
        assert view.current == ab and a_series.label == "A: the profile" and b_series.label == "B: s=3"
        bench = cache.get(b2)
        assert bench is not None
        only = trend_view(bench, [])  # nothing else loaded: the run alone
        assert [(p.run_id, p.value) for p in only.series[0].points] == [(b2, 90.0)]


def test_trend_of_a_run_without_values_is_empty(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        rid = store.start_run("bench", profile="demo", host="sim", backend="sglang", model="m", params={},
                              arms=[("running", "", {})])
        run = RunCache(store).get(rid)
        assert run is not None
        assert all(not s.points for s in trend_view(run, [run]).series)


def test_cache_reads_a_running_run_again(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        rid = store.start_run("bench", profile="demo", host="sim", backend="sglang", model="m", params={},
                              arms=[("running", "", {})])
        cache = RunCache(store)
        first = cache.get(rid)
        assert first is not None and not first.trials
        store.add_trial(rid, 0, 0, value=5.0, summary={}, accept_len=None, accept_source="", requests=[])
        store.finish_run(rid, "done")
        again = cache.get(rid)
        assert again is not None and again.values(0) == [5.0]
        assert cache.get(rid) is again  # finished: kept
        assert cache.get(rid + 99) is None
