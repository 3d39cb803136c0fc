"""Taking over a server started by hand (issue 24 item 3): the dashboard on the written profile attaches to the
running simulated SGLang without restarting it (READY, probe tok/s, its log followed), `r` asks once naming
pid, user, start time and command line, and the kill goes only to the process adopt proved; then it relaunches
under tunedash's own record and tag. The refusals (the proof no longer holds, another user's server, the kill not
confirmed) signal nothing: every refused case ends with the hand-started server still running."""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import os
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.connect import host_for
from app.core.adopt.takeover import Adoption, TakeoverRefused, find_adoption
from app.core.data import ServerState
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.session import Session
from app.tui.app import create_app
from tests.helpers import free_port, sim_profile_text, tunedash
from tests.helpers import pilot_until as until
from tests.integration.test_adopt_sim import HandStarted
from tests.ui.ui_flows import SIZE, event_texts, screen_text, state_of
from widgets import ConfirmModal

pytestmark = pytest.mark.slow
os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")


@pytest.fixture
def by_hand(sim_state: Path, tmp_path: Path) -> Iterator[HandStarted]:
    started = HandStarted(sim_state, tmp_path)
    yield started
    started.kill_all()
    from tests.helpers import kill_launched

    kill_launched(sim_state)  # what the relaunch started under tunedash


def written(tmp_path: Path, sim_state: Path, pid: int, name: str = "byhand") -> Profile:
    """`tunedash adopt PROFILE --pid N --write FILE` on the simulated host, loaded."""
    host = tmp_path / "simhost.toml"
    host.write_text(sim_profile_text(name="simhost", port=free_port(), sim_state=sim_state))
    target = tmp_path / f"{name}.toml"
    done = tunedash("adopt", str(host), "--pid", str(pid), "--write", str(target))
    assert done.returncode == 0, done.stderr
    return load_profile(target)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_the_dashboard_adopts_a_hand_started_server_asks_once_and_relaunches_it_under_tunedash(
        by_hand: HandStarted, sim_state: Path, tmp_path: Path) -> None:
    proc, argv = by_hand.sim("--mem-fraction-static", "0.85", "--enable-metrics")
    profile = written(tmp_path, sim_state, proc.pid)
    app = create_app(profile, probe=True, keymap_file=None)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: state_of(app) == ServerState.READY, 60, "READY on the adopted server",
                    lambda: " | ".join(event_texts(app)))
        adopted = app.session.adopted
        assert adopted is not None and adopted.proof.pid == proc.pid and not adopted.confirmed
        assert app.session.lifecycle.record is not None and app.session.lifecycle.record.pid == proc.pid
        assert any(f"adopted pid {proc.pid}" in text for text in event_texts(app))
        await until(pilot, lambda: any(p.source == "probe" and p.tokens_per_s > 0 for p in app.session.throughput), 60,
                    "probe tok/s on the adopted server")
        await until(pilot, lambda: any(p.source == "metrics" and p.tokens_per_s > 0 for p in app.session.throughput),
                    60, "/metrics tok/s on the adopted server")
        await until(pilot, lambda: any("fired up" in line for line in app.session.log_lines), 10,
                    "its log (stdout to a file) followed")
        assert not await jobs.load_job(app.session.host, profile)  # watched, never recorded as ours

        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), 10, "the adopt question")
        text = " ".join(screen_text(app).split())
        assert f"pid {proc.pid}" in text and f"user {getpass.getuser()}" in text and "started" in text
        assert "--mem-fraction-static 0.85" in text and "did not launch" in text
        await pilot.press("n")  # no: nothing signalled, and the next r asks again
        await pilot.pause(0.5)
        assert alive(proc.pid) and state_of(app) == ServerState.READY and not adopted.confirmed
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), 10, "the question again")
        await pilot.press("y")
        await until(pilot, lambda: proc.poll() is not None, 30, "the hand-started server stopped")
        await until(pilot, lambda: state_of(app) == ServerState.READY and app.session.busy is None, 60,
                    "READY under tunedash", lambda: " | ".join(event_texts(app)))
        record = await jobs.load_job(app.session.host, profile)
        assert record is not None and record.tag and record.pid not in (None, proc.pid)
        assert app.session.adopted is None and app.session.lifecycle.record is not None
        assert app.session.lifecycle.record.pid == record.pid
        assert sorted(record.argv) == sorted(argv)
        assert any(f"SIGTERM to pid {proc.pid} (adopted" in t for t in event_texts(app))
        # from now on it is tunedash's like any other: k asks the ordinary question, no adopt one
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), 10, "the kill question")
        assert "did not launch" not in screen_text(app) and "process group" in screen_text(app)
        await pilot.press("n")


async def adoption_of(profile: Profile) -> Adoption:
    found = await find_adoption(host_for(profile), profile)
    assert found.adoption is not None, found.note
    return found.adoption


async def test_a_changed_proof_refuses_the_signal(by_hand: HandStarted, sim_state: Path, tmp_path: Path) -> None:
    """Between the ask and the signal the pid became another process (another start tick: PID reuse), its command
    line changed, or it is another user's: refused with the reason, nothing signalled."""
    proc, _ = by_hand.sim()
    profile = written(tmp_path, sim_state, proc.pid)
    adoption = await adoption_of(profile)
    said: list[str] = []
    cases = {
        "another process now (started at another time: the pid was reused)":
            dataclasses.replace(adoption.proof, start_time=str(int(adoption.proof.start_time) + 7)),
        "has another command line now": dataclasses.replace(adoption.proof, argv=(*adoption.proof.argv, "--x")),
        "belongs to another user now": dataclasses.replace(adoption.proof, uid=(adoption.proof.uid or 0) + 4242),
    }
    for expected, proof in cases.items():
        forged = dataclasses.replace(adoption, server=dataclasses.replace(adoption.server, proof=proof),
                                     confirmed=True)
        with pytest.raises(TakeoverRefused, match="nothing was signalled") as refused:
            await forged.terminate(1.0, lambda text, level: said.append(text))
        assert expected in str(refused.value) and f"pid {proc.pid}" in str(refused.value)
        assert forged.signalled == [] and alive(proc.pid)
    with pytest.raises(TakeoverRefused, match="confirm the kill first"):  # never asked: never signalled
        await adoption.terminate(1.0, lambda text, level: said.append(text))
    assert said == [] and alive(proc.pid)


async def test_the_proof_is_checked_again_by_the_signal_itself(by_hand: HandStarted, sim_state: Path,
                                                                tmp_path: Path) -> None:
    """The last check, in the same breath as the signal (a change after still_same read it): refused too."""
    proc, _ = by_hand.sim()
    profile = written(tmp_path, sim_state, proc.pid)
    adoption = await adoption_of(profile)
    reused = dataclasses.replace(adoption.proof, start_time=str(int(adoption.proof.start_time) + 3))
    forged = dataclasses.replace(adoption, server=dataclasses.replace(adoption.server, proof=reused))
    with pytest.raises(TakeoverRefused, match="the pid was reused; nothing was signalled"):
        await forged._signal(proc.pid, reused.start_time, 15, leader=True)
    changed = dataclasses.replace(adoption.proof, argv=("python", "-m", "sglang.launch_server"))
    forged = dataclasses.replace(adoption, server=dataclasses.replace(adoption.server, proof=changed))
    with pytest.raises(TakeoverRefused, match="another command line; nothing was signalled"):
        await forged._signal(proc.pid, changed.start_time, 15, leader=True)
    assert alive(proc.pid)


async def test_headless_kill_of_an_adopted_server_needs_adopted_ok(by_hand: HandStarted, sim_state: Path,
                                                                    tmp_path: Path) -> None:
    proc, _ = by_hand.sim()
    profile = written(tmp_path, sim_state, proc.pid)
    refused = tunedash("kill", str(profile.source))
    assert refused.returncode != 0 and alive(proc.pid)
    assert f"pid {proc.pid}" in refused.stderr and "--adopted-ok" in refused.stderr
    assert shlex.join(["--tp-size", "2"]) in refused.stderr  # its command line is named
    done = tunedash("kill", str(profile.source), "--adopted-ok", "--grace", "5")
    assert done.returncode == 0, done.stderr
    assert proc.wait(timeout=30) is not None and not alive(proc.pid)
    assert f"SIGTERM to pid {proc.pid} (adopted" in done.stdout


async def test_a_session_on_the_profile_of_a_server_tunedash_launched_elsewhere_is_not_adopted(
        by_hand: HandStarted, sim_state: Path, tmp_path: Path) -> None:
    """Another tunedash's server on the profile's port (its TUNEDASH_JOB tag) is never adopted: said, and
    `tunedash ui` on its own profile attaches to it."""
    theirs = tmp_path / "theirs.toml"
    port = free_port()
    theirs.write_text(sim_profile_text(name="theirs", port=port, sim_state=sim_state))
    assert tunedash("launch", str(theirs), "--wait", "--timeout", "60").returncode == 0
    mine = tmp_path / "mine.toml"
    mine.write_text(sim_profile_text(name="mine", port=port, sim_state=sim_state))
    profile = load_profile(mine)
    session = Session(host_for(profile), profile)
    await session.start()
    try:
        await asyncio.sleep(0.5)
        assert session.adopted is None and session.lifecycle.record is None
        assert any("launched by another tunedash" in e.text for e in session.events), list(session.events)
    finally:
        await session.stop()


async def test_adopt_pid_writes_the_profile_and_opens_the_dashboard_on_the_running_server(
        by_hand: HandStarted, sim_state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`tunedash adopt HOST --pid N`: the profile goes to adopted-N.toml in the user's profiles and the dashboard opens
    on it, attached to the server (the same pid, never restarted); a server tunedash launched is attached to
    through its own profile instead."""
    import argparse

    from app.cli.adopt import cmd_adopt
    from app.core.adopt.profile_text import AdoptError

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    proc, _ = by_hand.sim("--mem-fraction-static", "0.4", model="sim/llama-3.1-8b")
    other, _ = by_hand.sim("--mem-fraction-static", "0.4", model="sim/llama-3.1-8b")  # on the same two GPUs
    host = tmp_path / "simhost.toml"
    host.write_text(sim_profile_text(name="simhost", port=free_port(), sim_state=sim_state))
    args = argparse.Namespace(host=str(host), pid=proc.pid, write=None, force=False, json=False, probe=False,
                              open_ui=None)
    assert await cmd_adopt(args) == 0
    assert f"note: pid {other.pid} uses some of the same GPUs" in capsys.readouterr().out
    assert args.open_ui == str(tmp_path / "config" / "tunedash" / "profiles" / f"adopted-{proc.pid}.toml")
    profile = load_profile(Path(args.open_ui))
    assert profile.name == f"adopted-{proc.pid}"
    app = create_app(profile, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: state_of(app) == ServerState.READY, 60, "READY",
                    lambda: " | ".join(event_texts(app)))
        assert app.session.adopted is not None and app.session.adopted.proof.pid == proc.pid
    assert alive(proc.pid)  # closing the dashboard leaves it running
    by_hand.kill_all()  # its GPUs free for the launch below
    with pytest.raises(AdoptError, match=f"pid {proc.pid}: no such process on sim"):  # exited since the listing
        await cmd_adopt(argparse.Namespace(host=str(host), pid=proc.pid, write=None, force=False, json=False,
                                           probe=False, open_ui=None))

    launched = tmp_path / "launched.toml"
    launched.write_text(sim_profile_text(name="launched", port=free_port(), sim_state=sim_state))
    assert tunedash("free", str(launched), "--timeout", "30").returncode == 0
    assert tunedash("launch", str(launched), "--wait", "--timeout", "60").returncode == 0
    record = await jobs.load_job(host_for(load_profile(launched)), load_profile(launched))
    assert record is not None and record.pid is not None
    args = argparse.Namespace(host=str(host), pid=record.pid, write=None, force=False, json=False, probe=False,
                              open_ui=None)
    assert await cmd_adopt(args) == 0
    assert args.open_ui == str(launched.resolve())  # its own profile: `ui` attaches through its record


def started_to_a_terminal(by_hand: HandStarted) -> tuple[int, list[str]]:
    """The simulated SGLang with its stdout where no file is (here /dev/null, as a tty would be): READY by /health."""
    import subprocess
    import sys
    import time
    import urllib.request

    from app.sim.host_env import sim_environment

    port = free_port()
    argv = [sys.executable, "-m", "app.sim.sglang", "--model-path", "sim/qwen3.6-27b", "--port", str(port),
            "--tp-size", "2"]
    env = {**os.environ, **sim_environment(by_hand.sim_state), "TUNEDASH_SIM_STARTUP_S": "0.4",
           "CUDA_VISIBLE_DEVICES": "0,1"}
    proc = by_hand.reaper.start(argv, env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return proc.pid, argv
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the simulated server did not start"
        time.sleep(0.2)


async def test_a_server_whose_log_is_not_a_file_says_so_in_the_server_panel(by_hand: HandStarted, sim_state: Path,
                                                                            tmp_path: Path) -> None:
    pid, _ = started_to_a_terminal(by_hand)
    profile = written(tmp_path, sim_state, pid)
    app = create_app(profile, keymap_file=None)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: state_of(app) == ServerState.READY, 60, "READY by its health URL",
                    lambda: " | ".join(event_texts(app)))
        note = f"the log of pid {pid} is not visible (its stdout goes to /dev/null); a relaunch under tunedash"
        assert any(n.text.startswith(note) for n in app.session.lifecycle.notices)
        assert any(line.startswith(f"({note}") for line in app.session.log_lines)
        await until(pilot, lambda: f"! the log of pid {pid} is not visible" in screen_text(app), 10,
                    "the Server panel's notice")
    assert alive(pid)
