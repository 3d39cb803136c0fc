"""The dashboard's one command slot, as a user meets it on the simulated host (issue 25): `B`, `s`, `a` starts an
A/B (arm A relaunches first); a relaunch key then is refused naming the A/B and leaves it alone; a kill then cancels
the A/B first and kills after."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import RichLog

from app.core.data import ServerState
from app.core.measure.store import DATA_DIR_ENV, HistoryStore
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.tui.app import TunedashApp, create_app
from app.tui.bench import RunScreen
from tests.helpers import MakeProfile
from tests.helpers import pilot_until as until

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")
pytestmark = pytest.mark.slow


@pytest.fixture
def profile(make_profile: MakeProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Profile:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    bench = ("[bench]\nrequests = 2\nconcurrency = 2\ninput_len = 16\noutput_len = 8\nwarmup = 0\ntrials = 1\n"
             "launches = 1\n")
    return load_profile(make_profile(startup_s=1.5, decode_log_interval=10, extra=bench))


def events(app: TunedashApp) -> list[str]:
    return [e.text for e in app.session.events]


def toasts(app: TunedashApp) -> list[str]:
    return [str(n.message) for n in app._notifications]  # type: ignore[attr-defined]


def run_log(screen: RunScreen) -> str:
    return "\n".join(line.text for line in screen.query_one(RichLog).lines)


async def start_ab(pilot: Pilot[None], app: TunedashApp) -> RunScreen:
    """READY, then B s a: the A/B screen, with arm A's relaunch under way (its server starting)."""
    await until(pilot, lambda: app.session.view().state == ServerState.READY and app.session.busy is None,
                what="READY")
    await pilot.press("B", "s", "a")
    screen = app.screen
    assert isinstance(screen, RunScreen)
    # arm A's server is starting (the one running before was killed): a live group for a kill to signal
    await until(pilot, lambda: sum(t.startswith("launched pid") for t in events(app)) == 2
                and app.session.view().state in (ServerState.LAUNCHING, ServerState.LOADING),
                what="arm A's server starting")
    assert app.session.busy == "A/B"
    return screen


async def test_relaunch_under_an_ab_is_refused_naming_it(profile: Profile) -> None:
    app = create_app(profile, autolaunch=True, keymap_file=None, theme_file=None)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await start_ab(pilot, app)
        await pilot.press("r")
        await until(pilot, lambda: any("relaunch refused" in t for t in toasts(app)), what="the refusal")
        refusal = next(t for t in toasts(app) if "relaunch refused" in t)
        assert "A/B" in refusal and "arm A" in refusal, refusal  # names what runs, and how far it is
        await until(pilot, lambda: screen.worker is not None and screen.worker.is_finished, timeout=60,
                    what="the A/B to finish")
        log = run_log(screen)
        assert "did not become ready" not in log and "stopped:" not in log, log
        # no second relaunch beside the A/B's own: only the arms' relaunches are in the event log
        relaunches = [t for t in events(app) if t.startswith("relaunch: ")]
        assert relaunches == ["relaunch: arm A launch 1/1: baseline",
                              "relaunch: arm B launch 1/1: steps 1 -> 2, --speculative-num-draft-tokens 2 -> 3"]
    with HistoryStore() as store:
        assert store.runs()[0].status == "done"


async def test_kill_under_an_ab_cancels_it_then_kills(profile: Profile) -> None:
    app = create_app(profile, autolaunch=True, keymap_file=None, theme_file=None)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await start_ab(pilot, app)
        await pilot.press("k")
        await until(pilot, lambda: not isinstance(app.screen, RunScreen), what="the kill's confirmation")
        await pilot.press("y")
        await until(pilot, lambda: app.session.view().state == ServerState.FREE and app.session.busy is None,
                    timeout=60, what="FREE after the kill")
        texts = events(app)
        cancel = next(i for i, t in enumerate(texts) if t.startswith("kill: cancelling the A/B"))
        kills = [i for i, t in enumerate(texts) if t.startswith("SIGTERM to group")]
        assert kills and kills[-1] > cancel, texts  # the A/B was cancelled first, then the kill signalled
        assert app.screen is screen
        log = run_log(screen)
        assert "cancelled; the finished trials are kept" in log and "did not become ready" not in log, log
    with HistoryStore() as store:
        assert store.runs()[0].status == "cancelled"
