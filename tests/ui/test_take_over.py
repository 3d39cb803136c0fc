"""The take-over key `T` and the watching dashboard (`ui --watch`, each `tunedash serve` tab), through Pilot.

The driver lock is the real one on the simulated host's state folder; no server is launched (the lock does not
need one). The browser end to end is tests/integration/test_serve_chromium.py.
"""

from __future__ import annotations

import os

import pytest

from app.connect import host_for
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.core.server.driver import DriverLock
from app.core.session import Session
from app.tui.app import create_app
from tests.helpers import MakeProfile
from tests.ui.ui_flows import SIZE, screen_text, until
from widgets import ConfirmModal

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")


@pytest.fixture
def profile(make_profile: MakeProfile) -> Profile:
    return load_profile(make_profile(startup_s=0.3))


async def holder_token(profile: Profile) -> str | None:
    claim = await DriverLock(host_for(profile), profile, "cli").holder()
    return claim.token if claim is not None else None


async def test_a_watching_dashboard_takes_the_free_lock_on_t_and_gives_it_back_however_it_ends(
        profile: Profile) -> None:
    app = create_app(profile, watching=True, keymap_file=None)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: "nobody drives" in app.sub_title, what="the watching header")
        assert app.sub_title.startswith("READ-ONLY") and "T takes over" in app.sub_title
        await pilot.pause(1.5)  # a heartbeat or more: a watching dashboard never takes the free lock by itself
        assert await holder_token(profile) is None and app.session.readonly
        await pilot.press("k")
        await until(pilot, lambda: "kill is disabled; T takes over" in screen_text(app), what="the refusal")
        assert not isinstance(app.screen, ConfirmModal)

        await pilot.press("T")  # nobody drives: no question
        await until(pilot, lambda: not app.session.readonly, what="driving")
        assert await holder_token(profile) == app.session.driver.token
        await until(pilot, lambda: "READ-ONLY" not in app.sub_title, what="the header without READ-ONLY")
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the kill question, now it drives")
        await pilot.press("n")
        app.exit()  # not `q`: how a closed browser tab ends it (textual-serve's quit message)
    assert await holder_token(profile) is None  # on_unmount gave the lock back


async def test_t_asks_before_taking_over_from_a_live_driver_which_turns_read_only(profile: Profile) -> None:
    driver = Session(host_for(profile), profile)
    await driver.start()
    try:
        assert not driver.readonly
        app = create_app(profile, watching=True, keymap_file=None)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await until(pilot, lambda: " drives" in app.sub_title and "nobody" not in app.sub_title,
                        what="the header naming the driver")
            assert f"{driver.driver.who} drives" in app.sub_title
            await pilot.press("T")
            await until(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the take-over question")
            assert "Take over" in screen_text(app) and "their dashboard turns read-only" in screen_text(app)
            await pilot.press("n")
            await pilot.pause(0.3)
            assert app.session.readonly and not driver.readonly  # No keeps things as they were

            await pilot.press("T")
            await until(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the question again")
            await pilot.press("y")
            await until(pilot, lambda: not app.session.readonly, what="the watching dashboard driving")
            await until(pilot, lambda: driver.readonly, timeout=5, what="the old driver turning read-only")
            assert any("took over" in event.text for event in driver.events)
            await pilot.press("q")
    finally:
        await driver.stop()


async def test_a_readonly_dashboard_never_takes_over(profile: Profile) -> None:
    app = create_app(profile, readonly=True, watching=True, keymap_file=None)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app.sub_title.startswith("READ-ONLY"), what="read-only")
        assert "takes over" not in app.sub_title
        await pilot.press("T")
        await until(pilot, lambda: "take-over is disabled" in screen_text(app), what="the refusal")
        assert app.session.readonly and await holder_token(profile) is None
        with pytest.raises(Exception, match="take-over is disabled"):
            await app.session.take_over_now()
        await pilot.press("q")
