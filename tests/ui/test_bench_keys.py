"""Pilot test of the measuring keys on the simulated host: B marks the baseline, a runs the A/B with progress
through every relaunch (two launches per arm, A B B A) and shows the arms with a verdict, b benchmarks, h browses
the history."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.widgets import DataTable, RichLog, Static

from app.core.data import ServerState
from app.core.measure.store import DATA_DIR_ENV, HistoryStore
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.tui.app import create_app
from app.tui.bench import HistoryScreen, RunScreen
from tests.helpers import MakeProfile
from tests.helpers import pilot_until as until

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")
pytestmark = pytest.mark.slow


@pytest.fixture
def profile(make_profile: MakeProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Profile:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    bench = "[bench]\nrequests = 3\nconcurrency = 3\ninput_len = 16\noutput_len = 24\nwarmup = 1\ntrials = 2\n"
    return load_profile(make_profile(startup_s=0.3, decode_log_interval=10, extra=bench))


def _log_text(screen: RunScreen) -> str:
    return "\n".join(line.text for line in screen.query_one(RichLog).lines)


async def test_baseline_ab_bench_and_history(profile: Profile, tmp_path: Path) -> None:
    app = create_app(profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.session.lifecycle.state == ServerState.READY and app.session.busy is None,
                    what="READY")
        await pilot.press("a")  # no baseline yet: refused with a hint
        assert not isinstance(app.screen, RunScreen)
        await pilot.press("B", "s", "s")  # baseline = steps 1; pending steps 3
        await pilot.press("a")
        screen = app.screen
        assert isinstance(screen, RunScreen)
        await until(pilot, lambda: screen.worker is not None and screen.worker.is_finished, what="A/B done")
        assert screen.worker is not None and screen.worker.error is None, screen.worker.error
        await pilot.pause(0.2)
        log = _log_text(screen)
        assert log.count("relaunch with") == 4 and "SIGTERM" in log and "FREE" not in log.split("relaunch")[0]
        table = screen.query_one(DataTable)
        assert table.row_count == 2
        assert [table.get_row_at(i)[0] for i in range(2)] == ["A", "B"]
        verdict = str(screen.query_one("#verdict", Static).render())
        assert verdict.startswith(("B is", "no difference"))
        assert app.session.profile.flags["speculative-num-steps"] == 1  # the last launch (A B B A) keeps running
        # The A/B went through the Session: the log view follows the last launch, the chart marks every relaunch.
        record = app.session.view().record
        assert record is not None and app.session.log_path == record.log_path
        assert record.flags["speculative-num-steps"] == 1
        b_change = "steps 1 -> 3, --speculative-num-draft-tokens 2 -> 4"
        assert [m.text for m in app.session.markers] == [
            "arm A launch 1/2: baseline", f"arm B launch 1/2: {b_change}", f"arm B launch 2/2: {b_change}",
            "arm A launch 2/2: baseline"]
        await pilot.press("escape")

        await pilot.press("b")
        bench = app.screen
        assert isinstance(bench, RunScreen)
        await until(pilot, lambda: bench.worker is not None and bench.worker.is_finished, what="bench done")
        assert bench.query_one(DataTable).get_row_at(0)[0] == "output tok/s"
        await pilot.press("escape")

        await pilot.press("h")
        assert isinstance(app.screen, HistoryScreen)
        runs = app.screen.query_one("#runs", DataTable)
        assert runs.row_count == 2 and runs.get_row_at(1)[1] == "ab"
        await pilot.press("escape")
    with HistoryStore() as store:
        bench_run, ab = store.runs()[0], store.runs()[1]
        assert ab.kind == "ab" and ab.status == "done" and ab.trial_count == 8  # 2 launches x 2 trials per arm
        # one recorded-bench runner: the host as the Host names itself, the flags of the server that ran
        full = store.run(bench_run.id)
        assert full is not None and full.host == "sim" and full.arms[0].flags["speculative-num-steps"] == 1
