"""`w`: warm mode on/off for the session (issue 20 item 1), and what a relaunch then shows (item 3): the Server
panel's progress bar while it runs, the event log's line saying what the weight cache saved. Where discovery finds
no weight cache (the simulated 0.5.10), `w` says why and changes nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.core.data import ServerState
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.tui.app import create_app
from tests.helpers import MakeProfile
from tests.helpers import pilot_until as until
from tests.ui.ui_flows import SIZE, event_texts, ready, shows, state_of

pytestmark = pytest.mark.slow


def cold_0523(make_profile: MakeProfile, version: str = "0.5.23") -> Profile:
    path: Path = make_profile(extra=f'sim_version = "{version}"\n', startup_s=1.5)
    text = path.read_text()
    for line in ('speculative-algorithm = "NEXTN"\n', "speculative-num-steps = 1\n", "speculative-eagle-topk = 1\n",
                 "speculative-num-draft-tokens = 2\n"):
        text = text.replace(line, "")
    path.write_text(text)
    return load_profile(path)


async def test_w_switches_warm_on_and_the_relaunches_show_progress_and_savings(make_profile: MakeProfile,
                                                                               tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A history of its own: another test's runs of profile "t" would give this relaunch a plan (and another
    # "instead of"), and the panel would not show the no-plan block this test reads.
    monkeypatch.setenv("TUNEDASH_DATA_DIR", str(tmp_path / "history"))
    app = create_app(cold_0523(make_profile), autolaunch=True, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await until(pilot, lambda: app.session.server_flags is not None, what="discovery", timeout=30)
        await pilot.press("w")
        assert app.session.pending_profile.warm and not app.session.profile.warm
        assert any(t.startswith("warm mode on: the next relaunch") for t in event_texts(app))
        assert app.session.describe_pending() == "warm off -> on"

        await pilot.press("r")  # starts the daemon, then the server as its client
        await until(pilot, lambda: app.session.busy is not None, what="the relaunch begins")
        await shows(pilot, app, "relaunch:", timeout=10)  # the progress block (no plan yet: elapsed only)
        await until(pilot, lambda: app.session.busy is None and state_of(app) == ServerState.READY,
                    what="warm READY", timeout=60)
        assert app.session.profile.warm and app.session.pending_warm is None
        assert any("weight cache daemon ready" in t for t in event_texts(app))

        await pilot.press("g", "r")  # keeps the cache key: the weights come from the cache
        def saved() -> list[str]:
            return [t for t in event_texts(app) if t.startswith("relaunch ") and "; weights from the cache" in t]

        await until(pilot, lambda: app.session.busy is None and state_of(app) == ServerState.READY and saved(),
                    what="warm relaunch", timeout=60)
        # "instead of": the first (cold) launch's own weights figure, from disk (the same weights: weights_key)
        assert re.search(r"; weights from the cache \d+\.\d s instead of \d+\.\d s", saved()[0]), saved()

        await pilot.press("w")  # off again: the next relaunch stops the daemon and loads from disk
        assert not app.session.pending_profile.warm
        await pilot.press("r")
        await until(pilot, lambda: app.session.busy is None and state_of(app) == ServerState.READY
                    and not app.session.profile.warm, what="cold READY", timeout=60)
        assert any("warm mode is off: stopping the weight cache daemon" in t for t in event_texts(app))


async def test_w_says_why_not_where_discovery_finds_no_weight_cache(make_profile: MakeProfile) -> None:
    app = create_app(cold_0523(make_profile, "0.5.10"), autolaunch=True, keymap_file=None)
    notes: list[str] = []
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot, app)
        await until(pilot, lambda: app.session.server_flags is not None, what="discovery", timeout=30)
        original = app.notify

        def notify(message: str, **kw: object) -> None:
            notes.append(message)
            original(message, **kw)  # type: ignore[arg-type]

        app.notify = notify  # type: ignore[method-assign]
        app.screen.notify = notify  # type: ignore[method-assign]
        await pilot.press("w")
        await pilot.pause(0.2)
        assert not app.session.pending_profile.warm
        assert any("warm mode unavailable" in n and "--weight-cache-mode arrived in SGLang 0.5.23" in n
                   for n in notes), notes
