"""One driver per server (issue: safe on a shared GPU host): a per-session token in a lock on the host.

Real scenarios on the simulated host: two dashboards of one account, a dashboard opened before the launch, CLI
commands beside a driving dashboard (refused, or --take-over), a lock whose holder died, a race for a free lock;
and two dashboards of one account in a real tmux."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from app.connect import host_for
from app.core.data import ServerState
from app.core.profiles.loading import load_profile
from app.core.server import driver
from app.core.server.driver import STALE_S, DriverLock
from app.core.session import ReadOnlyError, Session
from tests.helpers import REPO, MakeProfile, tunedash, until
from tests.integration.test_tmux_demo import Tmux

pytestmark = pytest.mark.slow


def _texts(session: Session) -> str:
    return "\n".join(e.text for e in session.events)


async def test_second_dashboard_of_one_account_is_read_only_and_says_who(make_profile: MakeProfile) -> None:
    profile = load_profile(make_profile(startup_s=0.3))
    first = Session(host_for(profile), profile)
    second = Session(host_for(profile), profile)
    await first.start()
    await second.start()
    try:
        assert not first.readonly and second.readonly
        assert "read-only:" in _texts(second) and "dashboard" in _texts(second)
        with pytest.raises(ReadOnlyError, match="read-only"):
            second.run_command("kill", second.kill)
    finally:
        await second.stop()
        await first.stop()


async def test_dashboard_opened_before_the_launch_drives_and_the_cli_respects_it(make_profile: MakeProfile) -> None:
    path = make_profile(startup_s=0.3)
    profile = load_profile(path)
    dash = Session(host_for(profile), profile)
    await dash.start()  # nothing runs yet: it still takes the lock
    try:
        assert not dash.readonly
        refused = await asyncio.to_thread(tunedash, "launch", str(path), "--wait")
        assert refused.returncode == 2 and "launch refused" in refused.stderr and "dashboard" in refused.stderr
        assert dash.view().state == ServerState.STOPPED
        taken = await asyncio.to_thread(tunedash, "launch", str(path), "--wait", "--take-over")
        assert taken.returncode == 0, taken.stderr
        # (read-only lasts only until the CLI gives the lock back, so the event log is what to wait for)
        await until(lambda: "took over; this dashboard is now read-only" in _texts(dash), 3,
                    "the dashboard to learn of the take-over")
        # the CLI gave the lock back when it ended: the dashboard drives again by itself
        await until(lambda: not dash.readonly, 5, "the dashboard to drive again")
        killed = await asyncio.to_thread(tunedash, "kill", str(path), "--confirm-free")
        assert killed.returncode == 2 and "kill refused" in killed.stderr
        record = json.loads(next((profile.sim_state / "host" / "jobs").glob("*.json")).read_text())  # type: ignore[operator]
        os.kill(record["pid"], 0)  # the refused kill signalled nothing: the server lives
        killed = await asyncio.to_thread(tunedash, "kill", str(path), "--confirm-free", "--take-over")
        assert killed.returncode == 0, killed.stderr
    finally:
        await dash.stop()


async def test_a_lock_whose_holder_died_is_free_after_the_stale_time(make_profile: MakeProfile) -> None:
    profile = load_profile(make_profile())
    host = host_for(profile)
    dead = DriverLock(host, profile, "dashboard")
    assert not (await dead.acquire(take_over=False)).readonly  # then it "crashes": no heartbeat, no release
    alive = DriverLock(host, profile, "dashboard")
    assert (await alive.acquire(take_over=False)).readonly
    await asyncio.sleep(STALE_S + 0.5)
    verdict = await alive.acquire(take_over=False)
    assert not verdict.readonly and alive.held


async def test_a_race_for_a_free_lock_has_one_winner(make_profile: MakeProfile) -> None:
    profile = load_profile(make_profile())
    host = host_for(profile)
    for round_ in range(6):
        locks = [DriverLock(host, profile, "cli") for _ in range(6)]
        if round_ % 2:  # a dead holder's claim is there: every racer tries to break it at once
            dead = DriverLock(host, profile, "dashboard")
            await host.write_text(dead.claim_path, dead._claim_text())
            await host.write_text(dead._beat_path(dead.token), f"{time.time() - 60}\n")
            os.utime(dead._beat_path(dead.token), (time.time() - 60, time.time() - 60))  # its last beat, 60 s ago
        verdicts = await asyncio.gather(*(lock.acquire(take_over=False) for lock in locks))
        assert sum(not v.readonly for v in verdicts) == 1, [v.message for v in verdicts]
        for lock in locks:
            await lock.release()


async def test_a_release_while_the_lock_is_being_taken_leaves_nothing_behind(make_profile: MakeProfile,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A dashboard stopped (SIGTERM, q) in its first second, while acquire sleeps its SETTLE_S with the claim on
    disk and `held` not yet set: release did nothing then, and a heartbeat file stayed (1 run in 8 of the SIGTERM
    tmux test). Now what is on disk is given back at once and acquire gives back what it took."""
    monkeypatch.setattr(driver, "SETTLE_S", 2.0)  # a window this test cannot miss on a loaded machine
    profile = load_profile(make_profile())
    host = host_for(profile)
    lock = DriverLock(host, profile, "dashboard")
    drivers = Path(str(host.state_dir)) / "drivers"
    taking = asyncio.create_task(lock.acquire(take_over=False))
    await until(lambda: any(drivers.glob("*.json")), 10, "the claim on disk", interval=0.01)
    assert not lock.held  # in SETTLE_S: taken on disk, not yet held
    await lock.release()
    assert not list(drivers.glob("*")), list(drivers.glob("*"))  # given back at once
    verdict = await taking
    assert verdict.readonly and "stopped while taking" in verdict.message
    assert not lock.held and not list(drivers.glob("*")), list(drivers.glob("*"))


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (CI installs it via .ci/run)")
def test_two_dashboards_of_one_account_in_a_real_tmux(make_profile: MakeProfile, tmp_path: Path) -> None:
    path = make_profile(name="pair", startup_s=0.4)
    command = shlex.join([sys.executable, "-m", "app", "demo", str(path)])
    first = Tmux("TEXTUAL_ANIMATIONS=none " + command, REPO)
    second = None
    try:
        first.wait_for(lambda s: "READY" in s, 60, "READY in the first dashboard")
        second = Tmux("TEXTUAL_ANIMATIONS=none " + shlex.join([sys.executable, "-m", "app", "ui", str(path)]), REPO)
        second.wait_for(lambda s: "READ-ONLY" in s and "@" in s.splitlines()[0] and " drives" in s, 30,
                                 "READ-ONLY and who drives in the second dashboard's header")
        second.send("k")
        time.sleep(1.0)
        assert "Kill the server?" not in second.screen()  # a read-only dashboard does not even ask
        assert "READY" in first.screen()
    finally:
        if second is not None:
            second.kill()
        first.kill()


async def test_a_cli_relaunch_while_a_dashboard_watches_is_followed_not_reverted(make_profile: MakeProfile) -> None:
    """The record names the new server and the dashboard follows it (before: the dashboard marked the old
    server crashed over the new record, and the new one ran untracked)."""
    path = make_profile(startup_s=0.3)
    profile = load_profile(path)
    dash = Session(host_for(profile), profile)
    await dash.start()
    try:
        dash.run_command("launch", dash.launch)
        await until(lambda: dash.view().state == ServerState.READY and dash.busy is None, 30, "READY")
        first = dash.view().record
        assert first is not None
        done = await asyncio.to_thread(tunedash, "relaunch", str(path), "--take-over", "--set",
                                       "speculative-num-steps=3")
        assert done.returncode == 0, done.stderr
        try:
            await until(lambda: (r := dash.view().record) is not None and r.pid != first.pid
                         and dash.view().state == ServerState.READY, 30, "the dashboard to follow the new server")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; state {dash.view().state}; events:\n{_texts(dash)}") from None
        states = [e.text for e in dash.events]
        assert not any("crashed" in text for text in states), states
        assert dash.profile.flags["speculative-num-steps"] == 3 and dash.log_path == dash.view().record.log_path  # type: ignore[union-attr]
        record = json.loads(next((profile.sim_state / "host" / "jobs").glob("*.json")).read_text())  # type: ignore[operator]
        assert record["pid"] != first.pid and record["outcome"] in ("running", "ready")  # never "crashed"
    finally:
        await dash.lifecycle.kill(confirm_free=False) if not dash.readonly else None
        await dash.stop()


async def test_a_launch_asked_while_the_lock_is_being_taken_waits_for_it(make_profile: MakeProfile) -> None:
    """A key pressed in the first second (the lock's claim already on disk, its SETTLE_S wait not over; over SSH
    that is longer) launched nothing: "launch refused: <this very session> drives ...; this session is read-only"."""
    profile = load_profile(make_profile(startup_s=0.3))
    dash = Session(host_for(profile), profile)
    taking = asyncio.Event()
    acquire = dash.driver.acquire

    async def slow_acquire(*, take_over: bool, command: str = "ui") -> object:
        taking.set()
        await asyncio.sleep(0.5)  # the claim exists by now or soon: what SETTLE_S and a slow host leave open
        return await acquire(take_over=take_over, command=command)

    dash.driver.acquire = slow_acquire  # type: ignore[method-assign]
    starting = asyncio.create_task(dash.start())
    try:
        await asyncio.wait_for(taking.wait(), 10)
        assert dash.run_command("launch", dash.launch)
        await starting
        await until(lambda: dash.view().state == ServerState.READY, 30,
                    "the launch asked for during the lock's acquisition", lambda: _texts(dash))
        assert "refused" not in _texts(dash)
        await dash.kill()
    finally:
        await dash.stop()
