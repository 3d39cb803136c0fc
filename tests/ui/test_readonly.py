"""Read-only is read-only: a dashboard that only watches (`ui --readonly`, or `--watch` until T: each `tunedash serve`
tab) neither loads the server nor writes the owner's files; `--tuning-flags-only` changes only tuning flags; flag
values with control characters are shown written out and refused when typed. Through Pilot, on the simulated host.

HOME, the XDG folders and the history folder are the test's own, so "nothing written" is read from them.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from textual.widgets import Input

from app.cli.main import main
from app.connect import host_for
from app.core.data import ServerState
from app.core.flags.catalog import SGLANG_FLAGS, TUNING_FLAGS, VLLM_FLAGS
from app.core.flags.toggles import default_toggles
from app.core.measure.store import DATA_DIR_ENV
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.core.session import Session
from app.tui.app import TunedashApp, create_app
from app.tui.bench import RunScreen
from app.tui.value_prompt import ValuePrompt
from tests.helpers import MakeProfile
from tests.ui.ui_flows import SIZE, screen_text, shows, until
from widgets import DiffScreen, FlagsPanel

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

PWNED = "\x1b]0;pwned\x07"
"""An OSC sequence that retitles the terminal: what a value must never send to it."""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME with its own XDG folders and history folder (all absent until something writes them)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv(DATA_DIR_ENV, str(home / "history"))
    return home


def written(home: Path) -> list[str]:
    """Every file under HOME (the dashboard under test must add none)."""
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())


def said(app: TunedashApp) -> list[str]:
    return [str(n.message) for n in app._notifications]  # type: ignore[attr-defined]


@pytest.fixture
def profile(make_profile: MakeProfile) -> Profile:
    bench = "[bench]\nrequests = 2\nconcurrency = 2\ninput_len = 16\noutput_len = 8\nwarmup = 0\ntrials = 1\n"
    return load_profile(make_profile(startup_s=0.3, extra=bench))


async def ready_server(profile: Profile) -> Session:
    """A server of `profile`, launched and driven by another dashboard's Session (READY when this returns)."""
    driver = Session(host_for(profile), profile)
    driver.lifecycle.phases.store_factory = None  # the driver's launch history: only the read-only side is checked
    await driver.start()
    driver.run_command("launch", driver.launch)
    end = time.monotonic() + 30.0
    while not (driver.view().state == ServerState.READY and driver.busy is None):
        assert time.monotonic() < end, f"no READY server: {[e.text for e in driver.events]}"
        await asyncio.sleep(0.05)
    return driver


@pytest.mark.parametrize("watching", [False, True], ids=["readonly", "serve-readonly-tab"])
async def test_a_readonly_dashboard_refuses_bench_probe_export_theme_and_writes_nothing(
        profile: Profile, home: Path, watching: bool) -> None:
    driver = await ready_server(profile)
    theme_file = home / "xdg_config_home" / "tunedash" / "theme.toml"
    try:
        app = create_app(profile, readonly=True, watching=watching, keymap_file=None, theme_file=theme_file)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await until(pilot, lambda: app.session.view().state == ServerState.READY, what="attached, READY")
            await pilot.press("b")
            await pilot.pause(1.0)  # time enough for the 2-request benchmark to run and be saved, were it run
            assert not isinstance(app.screen, RunScreen), "b ran a benchmark"
            await pilot.press("p", "x", "s")
            await pilot.pause(0.3)
            assert written(home) == [], "a read-only dashboard wrote the owner's files"
            assert not app.session.probe_wanted and app.session.probe_status is None, "p started the probe"
            assert app.session.pending_flags == app.session.profile.flags, "s changed a flag"
            for key in ("b", "p", "x", "a", "s", "r", "k"):
                assert app.screen.active_bindings[key].enabled is False, f"{key} offered in the footer"
            for key, what in (("b", "benchmark (b)"), ("p", "probe (p)"), ("x", "export (x)"), ("s", "flag changes")):
                app.clear_notifications()  # a toast lasts seconds: each refusal is read right after its key
                await pilot.press(key)
                await until(pilot, lambda w=what: any(w in t for t in said(app)), timeout=10, what=f"{key} refused")
                refusal = next(t for t in said(app) if what in t)
                assert "read-only" in refusal and "--readonly" in refusal, refusal  # why, and how to drive
            app.theme = "nord" if app.theme != "nord" else "gruvbox"  # the palette's Theme command does this
            await until(pilot, lambda: any("does not write" in t for t in said(app)), what="theme not kept")

            await pilot.press("ctrl+p")  # the palette: no measuring command, no flag, no screenshot
            await pilot.press(*"bench")
            await pilot.pause(0.5)
            assert "Bench · key b" not in screen_text(app)
            await pilot.press(*(["backspace"] * 5), *"--chunked")
            await pilot.pause(0.5)
            assert "--chunked-prefill-size" not in screen_text(app)
            await pilot.press("escape")
            await pilot.press("q")
        assert written(home) == [], "a read-only dashboard wrote the owner's files"
        assert not (home / "history").exists()
    finally:
        await driver.stop()


async def test_a_watching_tab_refuses_until_t_then_measures_and_exports(profile: Profile, home: Path) -> None:
    app = create_app(profile, watching=True, keymap_file=None, theme_file=None)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: "nobody drives" in app.sub_title, what="the watching header")
        for key in ("p", "x"):
            app.clear_notifications()
            await pilot.press(key)
            await until(pilot, lambda: any("T takes over" in t and "read-only" in t for t in said(app)), timeout=10,
                        what=f"{key} refused, naming T")
        assert not app.session.probe_wanted and written(home) == []

        await pilot.press("T")
        await until(pilot, lambda: not app.session.readonly, what="driving after T")
        await pilot.pause(0.6)  # a UI tick: the footer asks check_action again
        assert app.screen.active_bindings["p"].enabled
        await pilot.press("p", "x")
        await until(pilot, lambda: any("event log saved" in t for t in said(app)), what="x saves now")
        assert app.session.probe_wanted
        assert any(path.endswith(".log") and "events-" in path for path in written(home))
        await pilot.press("p", "q")


def tuning_profile(make_profile: MakeProfile, tmp_path: Path, flags: str = "") -> Path:
    """A profile with a toggle `m` on a flag outside the tuning flags (served-model-name), its value holding an
    OSC sequence, and `flags` appended to its [flags]."""
    toggle = ('[toggles.m]\nlabel = "name"\ncycle = "served-model-name"\n'
              'values = ["plain", "\\u001b]0;pwned\\u0007"]\n')
    path = make_profile(startup_s=0.3, extra=toggle)
    path.write_text(path.read_text() + flags)
    return path


async def test_tuning_flags_only_offers_and_takes_only_tuning_flags(make_profile: MakeProfile, tmp_path: Path,
                                                                     home: Path) -> None:
    profile = load_profile(tuning_profile(make_profile, tmp_path))
    app = create_app(profile, keymap_file=None, theme_file=None, tuning_flags_only=True)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause(0.3)
        for flag, offered in (("--trust-remote-code", False), ("--tokenizer-path", False),
                              ("--speculative-num-draft-tokens", True), ("--mem-fraction-static", True)):
            await pilot.press("ctrl+p", *flag[:-2])  # the palette's input shows the query: the hit has the rest
            await pilot.pause(0.5)
            assert (flag in screen_text(app)) is offered, f"{flag}: offered should be {offered}"
            await pilot.press("escape")
        pending = dict(app.session.pending_flags)
        await pilot.press("m")  # a toggle of the profile on a flag outside the tuning flags
        await until(pilot, lambda: any("--served-model-name is not a tuning flag" in t for t in said(app)),
                    what="the toggle refused, naming its flag")
        assert app.session.pending_flags == pending
        assert "--allow-all-flags" in next(t for t in said(app) if "not a tuning flag" in t)
        await pilot.press("s")  # speculative steps: a tuning flag
        await pilot.pause(0.2)
        assert app.session.pending_flags["speculative-num-steps"] == 2
        await pilot.press("q")


def test_ui_tuning_flags_only_refuses_set_outside_the_tuning_flags(
        make_profile: MakeProfile, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(make_profile(startup_s=0.3))
    for item in ("trust-remote-code=true", "tokenizer-path=some/repo", "--model-path=evil/repo"):
        assert main(["ui", path, "--tuning-flags-only", f"--set={item}"]) == 2
        err = capsys.readouterr().err
        name = item.lstrip("-").partition("=")[0]
        assert f"--{name} is not a tuning flag" in err and "--allow-all-flags" in err, err
    assert main(["ui", path, "--tuning-flags-only", "--unset", "trust-remote-code"]) == 2


def test_the_tuning_allowlist_holds_only_catalog_flags_and_none_that_fetch_or_run_code() -> None:
    catalogs = {"sglang": {s.name: s for s in SGLANG_FLAGS}, "vllm": {s.name: s for s in VLLM_FLAGS}}
    for backend, names in TUNING_FLAGS.items():
        assert names, backend
        for name in names:
            head, dot, key = name.partition(".")
            spec = catalogs[backend].get(head)
            assert spec is not None, f"{backend}: --{head} is not in the catalog"
            assert not dot or (spec.kind == "json" and key), f"{backend}: {name} is not a key of a JSON flag"
            assert spec.kind != "json" or dot, f"{backend}: a whole JSON table (--{name}) may name a module"
    never = {"trust-remote-code", "tokenizer-path", "model-path", "model", "speculative-draft-model-path",
             "spec-model", "speculative-config.model", "load-format", "config", "speculative-config",
             "compilation-config", "host", "port", "base-gpu-id", "tp-size", "tensor-parallel-size"}
    for backend, names in TUNING_FLAGS.items():
        assert not names & never, f"{backend}: {sorted(names & never)}"
    # every built-in toggle works in a tuning-only dashboard
    for backend in ("sglang", "vllm"):
        for version in (None, "0.5.10", "0.5.23", "0.33.0"):
            for toggle in default_toggles(backend, version):
                assert set(toggle.flags) <= TUNING_FLAGS[backend], (backend, version, toggle.key, toggle.flags)


def terminal_sees(app: TunedashApp) -> str:
    """The screen as the app would write it (its SVG export keeps every character a widget drew)."""
    return app.export_screenshot()


async def test_control_characters_in_values_are_written_out_on_screen_and_refused_when_typed(
        make_profile: MakeProfile, tmp_path: Path, home: Path) -> None:
    path = tuning_profile(make_profile, tmp_path, flags='served-model-name = "\\u001b]0;pwned\\u0007"\n')
    profile = load_profile(path)
    assert profile.flags["served-model-name"] == PWNED  # the value itself is kept as written
    app = create_app(profile, keymap_file=None, theme_file=None)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        # the Flags panel: the toggle's running value (its rows come with the first UI refresh)
        await until(pilot, lambda: any(r.key == "m" for r in app.query_one(FlagsPanel).rows), what="the Flags panel")
        row = next(r for r in app.query_one(FlagsPanel).rows if r.key == "m")
        assert row.running == "\\x1b]0;pwned\\x07"
        await shows(pilot, app, "\\x1b]0;")  # the panel's column cuts the rest
        assert "\x1b" not in terminal_sees(app)
        # the event log: a line naming the value
        app.session.note(f"launch refused: --served-model-name {PWNED} is not served")
        await shows(pilot, app, "served-model-name \\x1b]0;pwned")
        assert "\x1b" not in terminal_sees(app)
        # the diff: running against pending
        app.session.set_pending_flag("served-model-name", "plain")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DiffScreen), what="the diff")
        await shows(pilot, app, "\\x1b]0;pwned\\x07")
        assert "\x1b" not in terminal_sees(app)
        await pilot.press("escape")
        # the server log (`l`): a line echoing the value
        app.session.log_lines.append(f"server_args tokenizer={PWNED}")
        await pilot.press("l")
        await shows(pilot, app, "tokenizer=\\x1b]0;pwned\\x07")
        assert "\x1b" not in terminal_sees(app)
        await pilot.press("escape")

        # typed in the palette: refused, saying why; the pending value stays
        await pilot.press("ctrl+p", *"--served-model")
        await shows(pilot, app, "--served-model-name")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ValuePrompt), what="the value prompt")
        app.screen.query_one(Input).value = f"x{PWNED}"
        await pilot.press("enter")
        await until(pilot, lambda: any("control character" in t for t in said(app)), what="the refusal")
        refusal = next(t for t in said(app) if "control character" in t)
        assert "--served-model-name" in refusal and "\\x1b" in refusal and "\x1b" not in refusal, refusal
        assert app.session.pending_flags["served-model-name"] == "plain"
        await pilot.press("q")
