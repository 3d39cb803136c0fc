"""Pilot test of the tune screen on the simulated host: `t` races the profile's [tune] table through the Session
(the leaderboard per shape fills as launches land, the summary says what the server runs at the end), and escape
cancels a running tune cleanly: the finished launches stay in the history as a cancelled, resumable run and the
command slot is free again."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from textual.widgets import DataTable, RichLog, Static

from app.core.data import ServerState
from app.core.measure.store import DATA_DIR_ENV, HistoryStore
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.core.tune.run import TuneRunner
from app.tui.app import create_app
from app.tui.tune import TuneScreen
from tests.helpers import MakeProfile
from tests.helpers import pilot_until as until
from widgets.pareto_plot import ParetoPlot

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")
pytestmark = pytest.mark.slow

TUNE = """
[bench]
concurrency = 2
requests = 2
input_len = 16
output_len = 16
warmup = 0
[tune]
shapes = [{ concurrency = 1, requests = 1 }, { concurrency = 2, requests = 2 }]
max_launches = 3
advisor_seeds = false
[tune.flags]
speculative-num-steps = [1, 3]
"""


@pytest.fixture
def profile(make_profile: MakeProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Profile:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    return load_profile(make_profile(startup_s=0.3, extra=TUNE))


def _log(screen: TuneScreen) -> str:
    return "\n".join(line.text for line in screen.query_one(RichLog).lines)


async def test_t_races_the_tune_table_and_ends_on_the_winner(profile: Profile, tmp_path: Path) -> None:
    app = create_app(profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=(140, 44)) as pilot:
        await until(pilot, lambda: app.session.lifecycle.state == ServerState.READY and app.session.busy is None,
                    what="READY")
        await pilot.press("t")
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        await until(pilot, lambda: screen._run_task is not None and screen._run_task.done(), timeout=120,
                    what="tune done", detail=lambda: _log(screen))
        await pilot.pause(0.2)
        assert screen.data is not None and screen.data.status == "done", _log(screen)
        assert screen.data.launches.spent == 3
        table = screen.query_one(DataTable)
        shapes = [table.get_row_at(i)[0] for i in range(table.row_count)]
        assert [s for s in shapes if s] == ["c1 16/16", "c2 16/16"] and table.row_count == 6  # 2 x (header + 2)
        summary = str(screen.query_one("#summary", Static).render())
        assert "launches: 3 spent" in summary and "the server runs steps=" in summary
        pareto = screen.query_one("#pareto-total", ParetoPlot).view
        assert len(pareto.points) == 4 and pareto.front and set(pareto.front) <= set(pareto.points)
        assert [m.text.split(":")[0] for m in app.session.markers][:3] == [
            "tune launch 1/3", "tune launch 2/3", "tune launch 3/3"]  # the Session relaunched every time
        await pilot.press("escape")
        assert not isinstance(app.screen, TuneScreen)
    with HistoryStore(tmp_path / "data" / "history.sqlite3") as store:
        run = store.runs()[0]
    assert run.kind == "tune" and run.status == "done" and run.trial_count == 6


async def test_escape_cancels_a_running_tune_and_keeps_its_launches(make_profile: MakeProfile, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    profile = load_profile(make_profile(startup_s=0.3, extra=TUNE))
    launch = TuneRunner._launch

    async def held_after_the_first(self: TuneRunner, candidate: int) -> None:
        """The first launch as usual; the second waits (as a slow relaunch would) until the tune is cancelled, so
        escape lands while the race runs however loaded the machine is."""
        if self.state.spent() >= 1:
            await asyncio.Event().wait()
        await launch(self, candidate)

    monkeypatch.setattr(TuneRunner, "_launch", held_after_the_first)
    app = create_app(profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=(140, 44)) as pilot:
        await until(pilot, lambda: app.session.lifecycle.state == ServerState.READY and app.session.busy is None,
                    what="READY")
        await pilot.press("t")
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        await until(pilot, lambda: screen.runner is not None and len(screen.runner.counted()) >= 1, timeout=60,
                    what="a first launch", detail=lambda: _log(screen))
        await pilot.press("escape")
        await until(pilot, lambda: screen._run_task is not None and screen._run_task.done(), what="cancelled")
        assert isinstance(app.screen, TuneScreen)  # the first escape cancels, the screen stays with what it has
        assert "cancelled; every finished launch is kept" in _log(screen)
        assert app.session.command.current is None  # the slot is free
        await pilot.press("escape")
        assert not isinstance(app.screen, TuneScreen)
    with HistoryStore(tmp_path / "data" / "history.sqlite3") as store:
        run = store.runs()[0]
        detail = store.run(run.id)
    assert run.status == "cancelled" and detail is not None and len(detail.trials) == 2  # the first launch's shapes
    assert run.summary is not None and run.summary["resumable"] is True
