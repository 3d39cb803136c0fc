"""`tunedash adopt` on servers started by hand (never by tunedash): the simulated SGLang on the simulated host,
found, its profile written and loaded back to the same command line; the bad cases (not a server, a pid gone, a
server tunedash launched, two servers on one GPU set, another user's server, an environment we cannot read).
adopt never signals: every server a test started is still running when it ends."""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core.profiles.loading import load_profile
from app.core.profiles.render import launch_argv
from app.sim.host_env import sim_environment
from tests.helpers import REPO, GroupReaper, MakeProfile, free_port, sim_profile_text, tunedash

pytestmark = pytest.mark.slow


class HandStarted:
    """Servers started the way a user starts one in a tmux pane, each in its own session; killed at the end."""

    def __init__(self, sim_state: Path, folder: Path) -> None:
        self.sim_state = sim_state
        self.folder = folder
        self.reaper = GroupReaper()

    def sim(self, *flags: str, model: str = "sim/qwen3.6-27b",
            visible: str = "0,1") -> tuple[subprocess.Popen[str], list[str]]:
        port = free_port()
        argv = [sys.executable, "-m", "app.sim.sglang", "--model-path", model, "--port", str(port),
                "--tp-size", "2", *flags]
        env = {**os.environ, **sim_environment(self.sim_state), "TUNEDASH_SIM_STARTUP_S": "0.4",
               "CUDA_VISIBLE_DEVICES": visible, "SGLANG_ADOPT_TEST": "1", "HF_TOKEN": "hf_not_to_be_written"}
        env.pop("TUNEDASH_SIM_FAULT", None)
        log = self.folder / f"sim-{port}.log"
        proc = self.reaper.start(argv, env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "fired up" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        return proc, argv

    def kill_all(self) -> None:
        self.reaper.kill_all()


@pytest.fixture
def by_hand(sim_state: Path, tmp_path: Path) -> Iterator[HandStarted]:
    started = HandStarted(sim_state, tmp_path)
    yield started
    started.kill_all()


@pytest.fixture
def sim_host(tmp_path: Path, sim_state: Path) -> Path:
    """A profile naming the simulated host (`tunedash adopt PROFILE` looks at its host)."""
    path = tmp_path / "simhost.toml"
    path.write_text(sim_profile_text(name="simhost", port=free_port(), sim_state=sim_state))
    return path


def listing(host: Path | str | None) -> list[dict[str, Any]]:
    done = tunedash("adopt", *([str(host)] if host else []), "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def normalised(argv: list[str]) -> Counter[str]:
    return Counter(argv)


def test_server_started_by_hand_is_found_written_and_reloaded(by_hand: HandStarted, sim_host: Path,
                                                              sim_state: Path, tmp_path: Path) -> None:
    proc, argv = by_hand.sim("--enable-metrics", "--mem-fraction-static", "0.85", "--max-total-tokens", "8192")
    rows = [row for row in listing(sim_host) if row["pid"] == proc.pid]
    assert len(rows) == 1
    row = rows[0]
    assert (row["server"], row["backend"], row["simulated"]) == ("SGLang (simulated)", "sglang", True)
    assert row["user"] == getpass.getuser() and row["mine"] and row["not_adoptable"] is None
    assert row["python"] == sys.executable  # the venv's python, not the interpreter it links to
    assert row["exe"] == os.path.realpath(sys.executable)
    assert row["version"] == "0.5.10"
    assert (row["model"], row["port"], row["port_source"]) == ("sim/qwen3.6-27b", int(argv[6]), "argv")
    assert set(row["gpus_mib"]) == {"0", "1"} and all(mib > 1000 for mib in row["gpus_mib"].values())
    assert row["launched_by_tunedash"] is False
    assert row["argv"] == argv
    assert abs(row["started_at"] - time.time()) < 120
    # its scheduler children (python -m app.sim.rank ...) are not listed as servers
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children and not {int(c) for c in children} & {r["pid"] for r in listing(sim_host)}

    text_listing = tunedash("adopt", str(sim_host))
    assert f"{proc.pid:>7}  {getpass.getuser()}" in text_listing.stdout
    assert "SGLang (simulated)" in text_listing.stdout and "0:" in text_listing.stdout

    target = tmp_path / "mine.toml"
    wrote = tunedash("adopt", str(sim_host), "--pid", str(proc.pid), "--write", str(target))
    assert wrote.returncode == 0, wrote.stderr
    assert "--max-total-tokens" in wrote.stdout  # named as kept verbatim
    text = target.read_text()
    assert f"from pid {proc.pid}" in text and "hf_not_to_be_written" not in text and "HF_TOKEN" in text
    profile = load_profile(target)
    assert (profile.host, profile.sim_state, profile.gpus) == ("sim", sim_state, (0, 1))
    assert profile.env == {"SGLANG_ADOPT_TEST": "1"}
    assert normalised(launch_argv(profile)) == normalised(argv)

    again = tunedash("adopt", str(sim_host), "--pid", str(proc.pid), "--write", str(target))
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr
    assert target.read_text() == text
    forced = tunedash("adopt", str(sim_host), "--pid", str(proc.pid), "--write", str(target), "--force")
    assert forced.returncode == 0, forced.stderr
    assert proc.poll() is None  # nothing was signalled


def test_not_a_server_and_a_pid_gone(by_hand: HandStarted, sim_host: Path, tmp_path: Path) -> None:
    target = tmp_path / "x.toml"
    done = tunedash("adopt", str(sim_host), "--pid", str(os.getpid()), "--write", str(target))
    assert done.returncode == 2
    assert f"pid {os.getpid()} on sim is not an SGLang or vLLM server" in done.stderr and "pytest" in done.stderr
    gone = subprocess.Popen(["true"])
    gone.wait()
    done = tunedash("adopt", str(sim_host), "--pid", str(gone.pid), "--write", str(target))
    assert done.returncode == 2 and f"pid {gone.pid}: no such process on sim" in done.stderr
    assert not target.exists()


def test_server_launched_by_tunedash_is_named_with_its_profile(make_profile: MakeProfile, sim_host: Path,
                                                               tmp_path: Path) -> None:
    profile = make_profile(name="launched")
    assert tunedash("launch", str(profile), "--wait", "--timeout", "60").returncode == 0
    record = json.loads(next((tmp_path / "sim" / "host" / "jobs").glob("launched-*.json")).read_text())
    rows = [row for row in listing(sim_host) if row["pid"] == record["pid"]]
    assert len(rows) == 1 and rows[0]["launched_by_tunedash"] and rows[0]["profile"] == "launched"
    assert "launched by tunedash" in rows[0]["not_adoptable"]
    text = tunedash("adopt", str(sim_host)).stdout
    assert f"launched by tunedash: profile launched ({profile.resolve()})" in text
    assert f"`tunedash ui {profile.resolve()}` attaches to it" in text
    done = tunedash("adopt", str(sim_host), "--pid", str(record["pid"]), "--write", str(tmp_path / "y.toml"))
    assert done.returncode == 2 and "was launched by tunedash (profile launched" in done.stderr
    assert "tunedash ui" in done.stderr and not (tmp_path / "y.toml").exists()


def test_two_servers_on_one_gpu_set_are_said(by_hand: HandStarted, sim_host: Path) -> None:
    first, _ = by_hand.sim("--mem-fraction-static", "0.4", model="sim/llama-3.1-8b")
    second, _ = by_hand.sim("--mem-fraction-static", "0.4", model="sim/llama-3.1-8b")
    rows = {row["pid"]: row for row in listing(sim_host)}
    assert rows[first.pid]["shares_gpus_with"] == [second.pid]
    assert rows[second.pid]["shares_gpus_with"] == [first.pid]
    assert f"shares GPUs with pid {second.pid}: two servers on one GPU set" in tunedash("adopt", str(sim_host)).stdout


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a second Unix user needs root (useradd, runuser)")




@needs_root
def test_another_users_server_is_listed_with_its_user_and_never_signalled(their_server: int,
                                                                         shared_folder: Path) -> None:
    from tests.integration.sshd import TEST_USER

    pid = their_server
    rows = [row for row in listing(None) if row["pid"] == pid]
    assert len(rows) == 1
    assert (rows[0]["user"], rows[0]["mine"]) == (TEST_USER, False)
    assert f"belongs to user {TEST_USER}" in rows[0]["not_adoptable"]
    text = tunedash("adopt").stdout
    assert f"not adoptable: belongs to user {TEST_USER}: tunedash never signals another user's process" in text
    target = shared_folder / "theirs.toml"
    wrote = tunedash("adopt", "--pid", str(pid), "--write", str(target))
    assert wrote.returncode == 0, wrote.stderr
    assert f"user {TEST_USER}" in target.read_text()
    assert normalised(launch_argv(load_profile(target))) == normalised(rows[0]["argv"])
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state == "S"  # still sleeping: neither stopped nor killed


@needs_root
def test_unreadable_environ_read_by_another_user(by_hand: HandStarted, shared_folder: Path) -> None:
    """Run as the second user, adopt sees a root server: listed with its user, its environment unreadable, and
    a profile written all the same, saying so."""
    from tests.integration.sshd import TEST_USER, _prepare_user
    _prepare_user()
    proc, argv = by_hand.sim()

    def as_user(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", TEST_USER, "--", "env", "-i", "PATH=/usr/bin:/bin",
                               f"HOME=/home/{TEST_USER}", sys.executable, "-m", "app", *args],
                              capture_output=True, text=True, timeout=90, cwd=REPO)

    done = as_user("adopt", "--pid", str(proc.pid), "--json")
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert (row["user"], row["mine"], row["environ_readable"]) == ("root", False, False)
    assert "belongs to user root" in row["not_adoptable"]
    target = shared_folder / "root-server.toml"
    wrote = as_user("adopt", "--pid", str(proc.pid), "--write", str(target))
    assert wrote.returncode == 0, wrote.stderr
    text = target.read_text()
    assert f"/proc/{proc.pid}/environ could not be read" in text
    assert "hf_not_to_be_written" not in text
    assert normalised(launch_argv(load_profile(target))) == normalised(argv)
    assert proc.poll() is None


def test_a_pid_that_exits_after_the_listing_is_said_and_nothing_written(by_hand: HandStarted, tmp_path: Path) -> None:
    """The proof read at listing time no longer holds once the server is gone or its pid is another process."""
    import asyncio
    import dataclasses

    from app.core.adopt.details import find_servers
    from app.core.adopt.scan import still_same
    from app.core.hosts.local import LocalHost

    proc, _ = by_hand.sim()
    host = LocalHost("local")
    (server,) = asyncio.run(find_servers(host, [proc.pid]))
    assert asyncio.run(still_same(host, server.proof)) == ""
    reused = dataclasses.replace(server.proof, start_time=str(int(server.proof.start_time) - 1))
    assert "another process now" in asyncio.run(still_same(host, reused))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert asyncio.run(still_same(host, server.proof)) == f"pid {proc.pid} is gone from local (it exited)"
    done = tunedash("adopt", "--pid", str(proc.pid), "--write", str(tmp_path / "late.toml"))
    assert done.returncode == 2 and "no such process" in done.stderr and not (tmp_path / "late.toml").exists()
