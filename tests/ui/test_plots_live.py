"""The dashboard's A/B screen plots the arms as the trials land, on the simulated host (B, s s, a)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.core.data import ServerState
from app.core.measure.report import run_report
from app.core.measure.store import DATA_DIR_ENV, HistoryStore
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.tui.app import create_app
from app.tui.bench import RunScreen
from tests.helpers import MakeProfile
from tests.helpers import pilot_until as until
from widgets.arm_plot import ComparePlots, LaunchPlot

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")
pytestmark = pytest.mark.slow


@pytest.fixture
def profile(make_profile: MakeProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Profile:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    bench = "[bench]\nrequests = 3\nconcurrency = 3\ninput_len = 16\noutput_len = 24\nwarmup = 1\ntrials = 2\n"
    return load_profile(make_profile(startup_s=0.3, decode_log_interval=10, extra=bench))


async def test_ab_screen_plots_each_arm_and_its_requests(profile: Profile) -> None:
    app = create_app(profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.session.lifecycle.state == ServerState.READY and app.session.busy is None,
                    what="READY")
        await pilot.press("B", "s", "s", "a")
        screen = app.screen
        assert isinstance(screen, RunScreen)
        plots = screen.query_one(ComparePlots)
        assert not plots.display  # nothing measured yet: no empty axes on the progress screen
        await until(pilot, lambda: screen.worker is not None and screen.worker.is_finished, what="A/B done")
        await pilot.pause(0.2)
        assert plots.display and plots.region.height > 0
        view = plots.view
        assert [a.label for a in view.launches.arms] == ["A", "B"]
        assert all(a.values and a.mean is not None for a in view.launches.arms)
        with HistoryStore() as store:
            run = store.run(store.runs()[0].id)
            assert run is not None
            stored = run_report(run).experiment
            finished = [sum(1 for r in store.request_rows(run.id) if r.arm_idx == arm and r.ok) for arm in (0, 1)]
        assert [a.values for a in view.launches.arms] == [a.launch_values for a in stored.arms]
        assert min(len(a.values) for a in view.launches.arms) >= 2  # the default design: two launches per arm
        # every finished request of each arm is in its distributions (3 per trial here)
        assert finished[0] >= 6 and [len(v) for _, v in view.ttft.arms] == finished
        assert [len(v) for _, v in view.itl.arms] == finished
        assert "A" in str(screen.query_one(LaunchPlot).render())
