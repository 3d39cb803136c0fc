"""Pilot tests of the dashboard's tune on parallel slots ("Tune on parallel slots…", ctrl+t) on a simulated 8-GPU host
like demo-8gpu's: asked for 2 slots, the race runs launches on both at once, on disjoint GPUs and ports, and ends with
slot 0 (the dashboard's own server) on the winner and slot 1's server killed, its GPUs confirmed free; a number of
slots that does not fit is refused with the CLI's own words and launches nothing; escape in the middle of the race
kills slot 1's server, confirms its GPUs free and gives its driver lock back; a slot another session drives is
refused, naming it, before anything is signalled."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, RichLog, Static

from app.connect import host_for
from app.core.data import ServerState
from app.core.measure.slots import Slot, slot_profile
from app.core.measure.store import DATA_DIR_ENV, HistoryStore
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.core.server.driver import DriverLock, keep_alive
from app.core.tune.run import TuneRunner
from app.tui.app import TunedashApp, create_app
from app.tui.tune import TuneScreen
from app.tui.value_prompt import ValuePrompt
from tests.helpers import kill_launched
from tests.helpers import pilot_until as until
from tests.slot_helpers import Watch, held_gpus, write_8gpu_profile

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
max_launches = 4
advisor_seeds = false
[tune.flags]
speculative-num-steps = [1, 3]
"""


@pytest.fixture
def host8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Profile, Path]]:
    """(profile, sim state): an 8-GPU simulated host with a tiny [tune] table; its history in tmp_path/data."""
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    path, state = write_8gpu_profile(tmp_path, TUNE)
    yield load_profile(path), state
    kill_launched(state)


def _log(screen: TuneScreen) -> str:
    return "\n".join(line.text for line in screen.query_one(RichLog).lines)


def _notes(app: TunedashApp) -> list[str]:
    return [str(n.message) for n in app._notifications]  # type: ignore[attr-defined]


def _running(pid: int) -> bool:
    """Whether process `pid` runs (a killed server this test process has not reaped yet is a zombie: not running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _live_records(state: Path) -> dict[str, dict[str, Any]]:
    """The sim host's job records whose server still runs: profile name -> record (a record outlives its kill)."""
    out = {}
    for f in (state / "host" / "jobs").glob("*.json"):
        rec = json.loads(f.read_text())
        if isinstance(rec.get("pid"), int) and _running(rec["pid"]):
            out[rec["profile"]] = rec
    return out


async def _ask_slots(pilot: Pilot[None], app: TunedashApp, answer: str) -> None:
    """ctrl+t, then `answer` typed over the number of slots offered, then enter."""
    await pilot.press("ctrl+t")
    await until(pilot, lambda: isinstance(app.screen, ValuePrompt), what="the slots prompt")
    offered = app.screen.query_one(Input).value
    assert offered == "4", offered  # 8 GPUs at TP 2, none busy: 4 slots fit
    await pilot.press(*["backspace"] * len(offered), *answer, "enter")


async def _ready(pilot: Pilot[None], app: TunedashApp) -> None:
    await until(pilot, lambda: app.session.lifecycle.state == ServerState.READY and app.session.busy is None,
                what="READY")


async def test_two_slots_race_side_by_side_and_end_with_slot_1_freed(host8: tuple[Profile, Path],
                                                                     tmp_path: Path) -> None:
    profile, state = host8
    app = create_app(profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=(150, 50)) as pilot:
        await _ready(pilot, app)
        with Watch(state) as watch:
            await _ask_slots(pilot, app, "2")
            await until(pilot, lambda: isinstance(app.screen, TuneScreen), what="the tune screen")
            screen = app.screen
            assert isinstance(screen, TuneScreen)
            await until(pilot, lambda: screen._run_task is not None and screen._run_task.done(), timeout=180,
                        what="tune done", detail=lambda: _log(screen))
        assert watch.samples > 10 and not watch.problems, watch.problems[:5]
        assert watch.most_servers == 2  # slot 0 and slot 1 ran at once, never on one GPU or one port
        assert screen.data is not None and screen.data.status == "done", _log(screen)
        base = profile.port
        slots_text = str(screen.query_one("#slots", Static).render())
        assert f"slot 0 (GPUs 0,1, port {base}): runs steps=" in slots_text, slots_text
        freed = f"slot 1 (GPUs 2,3, port {base + 1}): server killed, GPUs 2,3 confirmed free"
        assert screen.freed == [freed] and freed in slots_text
        assert "slots: " in slots_text  # the A/A across the slots
        assert "the server runs steps=" in str(screen.query_one("#summary", Static).render())
        assert app.session.lifecycle.state == ServerState.READY  # slot 0 is the dashboard's own server, kept
        assert set(_live_records(state)) == {profile.name} and held_gpus(state) <= {0, 1}
        assert app.session.command.current is None
        await pilot.press("escape")
        assert not isinstance(app.screen, TuneScreen)
    with HistoryStore(tmp_path / "data" / "history.sqlite3") as store:
        run = store.run(store.runs()[0].id)
    assert run is not None and run.status == "done"
    placed = {(ln.slot["index"], tuple(ln.slot["gpus"]), ln.slot["port"]) for ln in run.launches if ln.slot}
    assert placed == {(0, (0, 1), base), (1, (2, 3), base + 1)}, placed  # both slots, each on its own GPUs and port
    assert len(run.launches) == 4 and all(ln.outcome == "ready" for ln in run.launches)


async def test_slots_that_do_not_fit_are_refused_and_nothing_launches(host8: tuple[Profile, Path]) -> None:
    profile, state = host8
    app = create_app(profile, keymap_file=None)
    async with app.run_test(size=(150, 50), notifications=True) as pilot:
        await until(pilot, lambda: app.session.server_flags is not None, what="the session started")
        await _ask_slots(pilot, app, "9")
        await until(pilot, lambda: any("--slots 9" in n for n in _notes(app)), what="the refusal",
                    detail=lambda: str(_notes(app)))
        text = next(n for n in _notes(app) if "--slots 9" in n)
        assert text == (f"profile {profile.name}: --slots 9 needs 9 sets of 2 adjacent free GPUs; 4 fit on this host "
                        "(GPUs 0, 1, 2, 3, 4, 5, 6, 7). Ask for --slots 4 or run it on a host with more GPUs")
        await _ask_slots(pilot, app, "0")
        await until(pilot, lambda: any("got 0" in n for n in _notes(app)), what="the refusal of 0")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, (TuneScreen, ValuePrompt))
        assert app.session.command.current is None and not app.session.markers
    assert not _live_records(state) and not held_gpus(state)  # nothing was launched


async def test_escape_mid_race_kills_slot_1_and_frees_its_gpus(host8: tuple[Profile, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    profile, state = host8
    launch = TuneRunner._launch
    started: list[int] = []

    async def held_after_two(self: TuneRunner, candidate: int, slot_index: int = 0, k: int | None = None,
                             number: int | None = None) -> None:
        """The first two launches (one on each slot) as usual; later ones wait (as a slow relaunch would) until the
        tune is cancelled, so escape lands while both slots' servers run however loaded the machine is."""
        started.append(slot_index)
        if len(started) > 2:
            await asyncio.Event().wait()
        await launch(self, candidate, slot_index, k, number)

    monkeypatch.setattr(TuneRunner, "_launch", held_after_two)
    app = create_app(profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=(150, 50)) as pilot:
        await _ready(pilot, app)
        await _ask_slots(pilot, app, "2")
        await until(pilot, lambda: isinstance(app.screen, TuneScreen), what="the tune screen")
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        await until(pilot, lambda: screen.runner is not None and len(screen.runner.counted()) >= 2, timeout=120,
                    what="a launch on each slot", detail=lambda: _log(screen))
        slot1 = f"{profile.name}@slot1"
        assert slot1 in _live_records(state)  # slot 1's server runs
        lock = state / "host" / "drivers"
        assert any(lock.glob("*slot1*.json")), list(lock.iterdir())  # ... driven under its own lock
        await pilot.press("escape")
        await until(pilot, lambda: screen._run_task is not None and screen._run_task.done(), what="cancelled",
                    detail=lambda: _log(screen))
        assert isinstance(app.screen, TuneScreen)  # the first escape cancels, the screen stays with what it has
        log = _log(screen)
        assert "cancelled; every finished launch is kept" in log
        freed = f"slot 1 (GPUs 2,3, port {profile.port + 1}): server killed, GPUs 2,3 confirmed free"
        assert screen.freed == [freed] and freed in log
        slots_text = str(screen.query_one("#slots", Static).render())
        assert f"slot 0 (GPUs 0,1, port {profile.port}): tune cancelled; last launched " in slots_text, slots_text
        assert freed in slots_text
        assert slot1 not in _live_records(state) and not held_gpus(state) & {2, 3}
        assert not any(lock.glob("*slot1*.json"))  # its driver lock given back
        assert screen.servers is None and app.session.command.current is None
        await pilot.press("escape")
        assert not isinstance(app.screen, TuneScreen)
    with HistoryStore(tmp_path / "data" / "history.sqlite3") as store:
        run = store.runs()[0]
    assert run.status == "cancelled" and run.summary is not None and run.summary["resumable"] is True


async def test_a_slot_another_session_drives_is_refused_before_anything_is_signalled(
        host8: tuple[Profile, Path]) -> None:
    profile, state = host8
    host = host_for(profile)
    other = DriverLock(host, slot_profile(profile, Slot(1, (2, 3), profile.port + 1)), "cli")
    assert not (await other.acquire(take_over=False, command="tune")).readonly
    beating = asyncio.create_task(keep_alive(other))  # a live CLI drives s8@slot1
    try:
        app = create_app(profile, keymap_file=None)
        async with app.run_test(size=(150, 50), notifications=True) as pilot:
            await until(pilot, lambda: app.session.server_flags is not None, what="the session started")
            await _ask_slots(pilot, app, "2")
            await until(pilot, lambda: any("tune on slots refused" in n for n in _notes(app)), what="the refusal",
                        detail=lambda: str(_notes(app)))
            text = next(n for n in _notes(app) if "tune on slots refused" in n)
            assert f"drives {profile.name}@slot1" in text and f"tunedash tune {profile.name} --slots 2" in text, text
            screen = app.screen
            assert isinstance(screen, TuneScreen)
            await until(pilot, lambda: screen._run_task is not None and screen._run_task.done(), what="ended")
            assert screen.runner is None and not app.session.markers  # no launch on any slot
        assert not _live_records(state)
        assert (await other.holder()) is not None and other.held  # the other session still drives it
    finally:
        beating.cancel()
        await other.release()
        await host.close()
