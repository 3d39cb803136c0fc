"""The driver lock cannot be wedged or stolen by clocks (issue 19): real files on the simulated host, the real CLI,
a real tmux for the dashboard, and two clients of the real loopback sshd for the skewed clock.

Before the change: an empty or unparseable claim (a crash or a full disk between create and write) made `kill`
and even `relaunch --take-over` exit 2 forever; a heartbeat holding 9999999999, inf or 1e400 never went stale;
liveness used each client's clock, so a client 6 s ahead took a live driver's lock without --take-over; SIGTERM
of a holder left its lock held; refused racers left .beat files behind; `since: 1e308` in a claim was a
traceback in `kill`; control characters in a claim's `who` reached the terminal raw.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.connect import host_for
from app.core.hosts.base import Host
from app.core.profiles.loading import load_profile, parse_profile
from app.core.profiles.types import Profile
from app.core.server.driver import STALE_S, DriverLock
from tests.helpers import REPO, MakeProfile, tunedash, wait_until
from tests.integration.sshd import Sshd
from tests.integration.test_tmux_demo import Tmux

pytestmark = pytest.mark.slow


def _drivers(profile: Profile) -> Path:
    assert profile.sim_state is not None
    return profile.sim_state / "host" / "drivers"


def _backdate(path: str | Path, seconds: float) -> None:
    """What `seconds` of waiting would do to the file's mtime (the host's clock is not changed)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


async def _plant_claim(host: Host, profile: Profile, **values: object) -> DriverLock:
    """A claim of another session with `values` over a valid one, and a fresh heartbeat: it looks alive."""
    other = DriverLock(host, profile, "dashboard")
    claim = {**json.loads(other._claim_text()), **values}
    await host.create_exclusive(other.claim_path, json.dumps(claim) + "\n")
    await host.write_text(other._beat_path(other.token), f"{time.time():.3f}\n")
    return other


# ---- wedged claims -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", ["", '{"token": "5f3a', "\x00" * 64], ids=["empty", "cut", "zeros"])
def test_an_unreadable_claim_left_by_a_crash_is_broken_once_stale(make_profile: MakeProfile, content: str) -> None:
    path = make_profile()
    profile = load_profile(path)
    claim = Path(DriverLock(host_for(profile), profile, "cli").claim_path)
    claim.parent.mkdir(parents=True, exist_ok=True)
    claim.write_text(content)
    _backdate(claim, STALE_S + 5)  # the crash happened 10 s ago
    done = tunedash("kill", str(path))
    assert done.returncode == 0, done.stderr
    assert "broke an unreadable driver claim" in done.stdout and str(claim) in done.stdout
    assert not claim.exists()  # given back when `kill` ended, like any lock it took


def test_a_fresh_unreadable_claim_is_refused_with_a_reason_and_take_over_replaces_it(
        make_profile: MakeProfile) -> None:
    path = make_profile(startup_s=0.2)
    profile = load_profile(path)
    claim = Path(DriverLock(host_for(profile), profile, "cli").claim_path)
    claim.parent.mkdir(parents=True, exist_ok=True)
    claim.write_text("")  # just now: it may be an older tunedash between its create and its write
    refused = tunedash("kill", str(path))
    assert refused.returncode == 2
    assert "unreadable driver claim" in refused.stderr and "an empty file" in refused.stderr
    assert "--take-over" in refused.stderr and "Traceback" not in refused.stderr
    claim.write_text("")  # fresh again
    taken = tunedash("relaunch", str(path), "--take-over")
    assert taken.returncode == 0, taken.stderr
    # taken over at once; or broken, when the relaunch reached the lock more than 5 s after that write
    assert "took over from an unreadable driver claim" in taken.stdout or "broke an unreadable" in taken.stdout
    assert not claim.exists()


# ---- heartbeats judged on the host's clock -----------------------------------------------------------------
@pytest.mark.parametrize("content", ["9999999999", "inf", "1e400"])
async def test_a_heartbeat_holding_a_huge_number_still_goes_stale(make_profile: MakeProfile, content: str) -> None:
    profile = load_profile(make_profile())
    host = host_for(profile)
    dead = DriverLock(host, profile, "dashboard")
    assert not (await dead.acquire(take_over=False)).readonly
    beat = dead._beat_path(dead.token)
    await host.write_text(beat, content + "\n")
    _backdate(beat, 60)  # its holder died a minute ago
    alive = DriverLock(host, profile, "dashboard")
    verdict = await alive.acquire(take_over=False)
    assert not verdict.readonly and alive.held, verdict.message


async def test_a_heartbeat_dated_in_the_hosts_future_is_stale(make_profile: MakeProfile) -> None:
    profile = load_profile(make_profile())
    host = host_for(profile)
    dead = DriverLock(host, profile, "dashboard")
    assert not (await dead.acquire(take_over=False)).readonly
    beat = dead._beat_path(dead.token)
    _backdate(beat, -3600)  # touched an hour ahead: "fresh" for an hour if the future counted
    alive = DriverLock(host, profile, "dashboard")
    verdict = await alive.acquire(take_over=False)
    assert not verdict.readonly and alive.held, verdict.message


@pytest.fixture
def ssh_state() -> Iterator[Path]:
    """A state folder the SSH test user can write to."""
    folder = Path(tempfile.mkdtemp(prefix="tunedash-lock-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.ssh
async def test_a_client_whose_clock_runs_6_s_ahead_does_not_take_a_live_lock(
        sshd: Sshd, ssh_state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two clients of one SSH host; the second one's clock is 6 s ahead (the host's clock is not touched). On one
    machine every client shares the host's clock, so this is a remote host's problem: tested over sshd."""
    from app.core.hosts.ssh import SshHost

    text = 'name = "skew"\nhost = "local"\nbackend = "custom"\ngpus = []\ncommand = ["true"]\nready_regex = "x"\n'
    (tmp_path / "skew.toml").write_text(text)
    profile = parse_profile(text, tmp_path / "skew.toml")
    first = SshHost(sshd.spec, state_dir=str(ssh_state / "state"), options=sshd.options())
    second = SshHost(sshd.spec, state_dir=str(ssh_state / "state"), options=sshd.options())
    try:
        holder = DriverLock(first, profile, "dashboard")
        assert not (await holder.acquire(take_over=False)).readonly
        assert await holder.heartbeat() is None  # it beats, as a live dashboard does every second
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 6.0)  # this client's clock only: the host keeps its own
        skewed = DriverLock(second, profile, "cli")
        verdict = await skewed.acquire(take_over=False)
        assert verdict.readonly and not skewed.held, verdict.message
        assert "drives skew" in verdict.message
        monkeypatch.undo()
        assert await holder.heartbeat() is None  # still the driver
    finally:
        await first.close()
        await second.close()


# ---- losers and SIGTERM give the lock back -----------------------------------------------------------------
async def test_losers_of_a_race_and_a_taken_over_holder_leave_no_beat_file(make_profile: MakeProfile) -> None:
    profile = load_profile(make_profile())
    host = host_for(profile)
    drivers = _drivers(profile)
    for round_ in range(4):
        locks = [DriverLock(host, profile, "cli") for _ in range(6)]
        dead_beats: set[str] = set()
        if round_ % 2:  # a dead holder's claim is there: every racer tries to break it at once
            dead = DriverLock(host, profile, "dashboard")
            await host.write_text(dead.claim_path, dead._claim_text())
            await host.write_text(dead._beat_path(dead.token), "0\n")
            _backdate(dead._beat_path(dead.token), 60)
            dead_beats.add(Path(dead._beat_path(dead.token)).name)
        verdicts = await asyncio.gather(*(lock.acquire(take_over=False) for lock in locks))
        winners = [lock for lock, verdict in zip(locks, verdicts, strict=True) if not verdict.readonly]
        assert len(winners) == 1, [v.message for v in verdicts]
        beats = {p.name for p in drivers.glob("*.beat")} - dead_beats
        assert beats == {Path(winners[0]._beat_path(winners[0].token)).name}, beats
        for lock in locks:
            await lock.release()
        for stale in drivers.glob("*.beat"):
            stale.unlink()  # the dead holder's, which nobody removes
    holder, taker = DriverLock(host, profile, "dashboard"), DriverLock(host, profile, "cli")
    assert not (await holder.acquire(take_over=False)).readonly
    assert (await taker.acquire(take_over=False)).readonly  # refused: it never beat, so nothing to clean
    assert not (await taker.acquire(take_over=True)).readonly
    assert await holder.heartbeat() is not None  # it learns it was taken over ...
    assert {p.name for p in drivers.glob("*.beat")} == {Path(taker._beat_path(taker.token)).name}  # ... and cleans


def _claim_of(profile: Profile) -> dict[str, object] | None:
    files = list(_drivers(profile).glob("*.json")) if _drivers(profile).exists() else []
    try:
        return json.loads(files[0].read_text()) if files else None
    except (OSError, ValueError):
        return None


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["TERM", "HUP"])
def test_sigterm_of_a_holding_cli_command_gives_the_lock_back(make_profile: MakeProfile, signum: int,
                                                             code: int) -> None:
    path = make_profile(startup_s=60)  # `launch --wait` holds the lock for a minute
    profile = load_profile(path)
    proc = subprocess.Popen([sys.executable, "-m", "app", "launch", str(path), "--wait"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (_claim_of(profile) or {}).get("pid") == proc.pid, 30, "the launch to hold the lock")
        assert list(_drivers(profile).glob("*.beat"))
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert f"stopped by {signal.Signals(signum).name}" in err and "Traceback" not in err
    assert _claim_of(profile) is None and not list(_drivers(profile).glob("*"))  # claim and beat given back


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (CI installs it via .ci/run)")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_sigterm_of_a_dashboard_gives_the_lock_back(make_profile: MakeProfile, signum: int) -> None:
    path = make_profile(name="term")
    profile = load_profile(path)
    dashboard = Tmux("TEXTUAL_ANIMATIONS=none " + shlex.join([sys.executable, "-m", "app", "ui", str(path)]), REPO)
    try:
        dashboard.wait_for(lambda s: "term" in s and "READ-ONLY" not in s, 30, "the dashboard")
        wait_until(lambda: (_claim_of(profile) or {}).get("kind") == "dashboard", 30, "the dashboard to hold the lock")
        pid = int((_claim_of(profile) or {})["pid"])  # type: ignore[call-overload]
        assert str(path) in Path(f"/proc/{pid}/cmdline").read_text()  # the dashboard this test started
        os.kill(pid, signum)
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 15, "the dashboard to quit")
        assert _claim_of(profile) is None and not list(_drivers(profile).glob("*.beat"))  # given back before it quit
    finally:
        dashboard.kill()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (CI installs it via .ci/run)")
def test_a_dashboard_whose_terminal_goes_away_ends_and_gives_the_lock_back(make_profile: MakeProfile) -> None:
    """The tmux server killed under a dashboard (a dropped SSH session does the same): SIGHUP, SIGCONT, a dead
    terminal. Textual's shutdown then hung about 1 run in 3 (sigterm.py says why), leaving an idle dashboard
    process for good; the watchdog ends it within its grace (5 s here). Five rounds, so a hang before the watchdog
    would have shown with a chance of about 87%."""
    path = make_profile(name="hup", startup_s=0.4)
    profile = load_profile(path)
    # the demo (its server, the probe, the chart): a dashboard that writes to its terminal all the time, as the
    # hang needs (an idle `ui` never showed it in 10 rounds)
    command = shlex.join([sys.executable, "-m", "app", "demo", str(path)])
    for round_ in range(5):
        dashboard = Tmux("TUNEDASH_EXIT_GRACE_S=5 TEXTUAL_ANIMATIONS=none " + command, REPO)
        pid = 0
        try:
            dashboard.wait_for(lambda s: "READY" in s and "probe on" in s, 60, "the demo READY, its probe on")
            wait_until(lambda: (_claim_of(profile) or {}).get("kind") == "dashboard", 30, "the dashboard's lock")
            pid = int((_claim_of(profile) or {})["pid"])  # type: ignore[call-overload]
            assert str(path) in Path(f"/proc/{pid}/cmdline").read_text()  # the dashboard this test started
        finally:
            dashboard.kill()  # the terminal goes away
        try:
            wait_until(lambda p=pid: not _running(p), 20, f"the dashboard to end when its terminal went ({round_})")
        finally:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        assert _claim_of(profile) is None  # given back before it ended


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


# ---- what a claim says -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("values", "said"), [({"since": 1e308}, "since: expected a time between 2000 and 2100"),
                                              ({"since": float("nan")}, "since: expected a time"),
                                              ({"pid": 10**30}, "pid: expected a process id")],
                         ids=["since-1e308", "since-nan", "pid-huge"])
async def test_a_claim_with_values_out_of_range_is_described_not_a_traceback(
        make_profile: MakeProfile, values: dict[str, object], said: str) -> None:
    path = make_profile()
    profile = load_profile(path)
    await _plant_claim(host_for(profile), profile, **values)
    done = await asyncio.to_thread(tunedash, "kill", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "kill refused" in done.stderr and said in done.stderr


async def test_control_characters_in_a_claims_who_never_reach_the_terminal(make_profile: MakeProfile) -> None:
    path = make_profile()
    profile = load_profile(path)
    await _plant_claim(host_for(profile), profile, who="mallory\x1b]0;owned\x07\x1b[2J\u202e@box")
    done = await asyncio.to_thread(tunedash, "kill", str(path))
    assert done.returncode == 2 and "kill refused" in done.stderr
    assert not any(char in done.stderr for char in "\x1b\x07\u202e"), repr(done.stderr)
    assert "mallory\\x1b]0;owned\\x07\\x1b[2J\\u202e@box" in done.stderr
