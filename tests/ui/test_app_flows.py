"""Pilot tests of the whole dashboard against the simulated host: every key flow a user drives.

Each test uses a private sim state folder and a free port (never the demo's), a short simulated startup,
and kills whatever the test launched in teardown (process groups from the job records).
"""

from __future__ import annotations

import os
from pathlib import Path

from textual.widgets import Input

from app.core.data import ServerState
from app.core.profiles.types import Profile
from app.core.server.events import LifecycleEvent, StateChanged
from app.tui.app import create_app
from app.tui.value_prompt import ValuePrompt
from tests.ui.ui_flows import SIZE, event_texts, pending_of, ready, shows, state_of, until
from widgets import ConfirmModal, DiffScreen, FlagsPanel, HelpScreen, LogViewScreen

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

async def test_toggles_undo_relaunch_and_screens(profile: Profile) -> None:
    app = create_app(profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await shows(pilot, app, "READY")

        await pilot.press("s", "s", "g", "o")
        assert pending_of(app, "s") == ("1", "3")
        assert app.query_one(FlagsPanel).pending_count == 3
        await pilot.press("u")
        assert app.query_one(FlagsPanel).pending_count == 0
        assert pending_of(app, "s") == ("1", "1")

        states: list[ServerState] = []

        def on_event(event: LifecycleEvent) -> None:
            if isinstance(event, StateChanged):
                states.append(event.state)

        app.session.subscribe(on_event)
        await pilot.press("s", "s", "r")
        await until(pilot, lambda: bool(states) and states[-1] == ServerState.READY, what="relaunch to READY")
        await ready(pilot, app)
        for phase in (ServerState.KILLING, ServerState.RELEASING, ServerState.FREE, ServerState.LAUNCHING,
                      ServerState.LOADING, ServerState.READY):
            assert phase in states, f"{phase} not passed through: {states}"
        assert app.session.profile.flags["speculative-num-steps"] == 3
        await pilot.pause(0.3)
        assert pending_of(app, "s") == ("3", "3")
        assert any(t.startswith("relaunched with steps 1 -> 3") for t in event_texts(app))
        assert [m.text for m in app.session.markers] == ["steps 1 -> 3"]
        assert "--speculative-num-steps 3" in " ".join(app.session.running_argv())

        # d: the diff screen, l: the server log, ?: help
        await pilot.press("s", "d")  # a pending change to show
        assert isinstance(app.screen, DiffScreen)
        await shows(pilot, app, "speculative-num-steps")
        await pilot.press("escape")
        assert not isinstance(app.screen, DiffScreen)

        await pilot.press("l")
        assert isinstance(app.screen, LogViewScreen)
        await shows(pilot, app, "The server is fired up and ready to roll")
        await pilot.press("escape")
        assert not isinstance(app.screen, LogViewScreen)

        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await shows(pilot, app, "Relaunch", "Kill", "Toggle steps", "command palette")
        await pilot.press("escape")


async def test_probe_kill_confirmation_and_confirm_free(profile: Profile) -> None:
    app = create_app(profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await pilot.press("p")
        assert app.session.probe_wanted
        await until(pilot, lambda: any(p.source == "probe" for p in app.session.throughput), what="probe points")
        await shows(pilot, app, "probe on")
        await pilot.press("p")
        assert not app.session.probe_wanted

        await pilot.press("k")
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("n")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ConfirmModal)
        assert state_of(app) == ServerState.READY

        await pilot.press("k")
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("y")
        await until(pilot, lambda: state_of(app) == ServerState.FREE and app.session.busy is None, what="FREE")
        await shows(pilot, app, "FREE", "no process", " 0/49140 MiB", "no processes")
        assert any("SIGTERM to group" in t for t in event_texts(app))

        await pilot.press("f")
        await until(pilot, lambda: app.session.busy is None, what="confirm free to finish")
        assert state_of(app) == ServerState.FREE
        assert sum("GPU0 0 MiB" in t for t in event_texts(app)) >= 2


async def test_quit_leaves_the_server_running_and_readonly_reattaches(profile: Profile) -> None:
    app = create_app(profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        pid = app.session.lifecycle.record.pid if app.session.lifecycle.record else None
        await pilot.press("q")
    assert pid is not None
    os.kill(pid, 0)  # still alive after quitting

    watcher = create_app(profile, readonly=True, keymap_file=None)
    async with watcher.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: state_of(watcher) == ServerState.READY, what="re-attach")
        assert watcher.session.lifecycle.record is not None
        assert watcher.session.lifecycle.record.pid == pid
        await shows(pilot, watcher, "READ-ONLY")
        await pilot.press("k")
        assert not isinstance(watcher.screen, ConfirmModal)
        await pilot.press("s", "r", "f")
        await pilot.pause(0.5)
        assert watcher.session.busy is None
        assert state_of(watcher) == ServerState.READY
        await shows(pilot, watcher, "read-only session")
    os.kill(pid, 0)


async def test_palette_sets_any_flag_and_lists_dashboard_commands(profile: Profile) -> None:
    app = create_app(profile, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+p")
        await pilot.press(*"chunked-prefill")
        await shows(pilot, app, "--chunked-prefill-size")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ValuePrompt), timeout=5, what="value prompt")
        app.screen.query_one(Input).value = ""
        await pilot.press(*"8192", "enter")
        await pilot.pause()
        assert app.session.pending_flags["chunked-prefill-size"] == 8192
        assert "--chunked-prefill-size 8192" in " ".join(app.session.pending_argv())

        await pilot.press("ctrl+p")
        await pilot.press(*"relaunch")
        await shows(pilot, app, "Relaunch · key r")
        await pilot.press("escape")


async def test_keys_remapped_from_the_config_file(profile: Profile, tmp_path: Path) -> None:
    keymap = tmp_path / "keys.toml"
    keymap.write_text('[keys]\nkill = "K"\nhelp = "f1"\n')
    app = create_app(profile, keymap_file=keymap)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("k")
        assert not isinstance(app.screen, ConfirmModal)
        await pilot.press("K")
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("n", "f1")
        assert isinstance(app.screen, HelpScreen)
        assert "K" in [c.key for c in app.dashboard_commands() if c.action == "kill"]
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("ctrl+p", *"kill")
        await shows(pilot, app, "Kill · key K")
        await pilot.press("escape")


async def test_resize_to_80x24_keeps_every_panel_on_screen(profile: Profile) -> None:
    app = create_app(profile, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await shows(pilot, app, "STOPPED")
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.3)
        assert app.screen.has_class("-compact")
        for selector in ("#gpus", "#server", "#flags", "#chart", "#events"):
            region = app.query_one(selector).region
            assert region.height > 0 and region.bottom <= 24 and region.right <= 80, (selector, region)
        await shows(pilot, app, "GPUs", "Server", "Flags", "tokens/s", "Relaunch")
