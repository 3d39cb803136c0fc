"""The real `tunedash fleet` in a real tmux over three servers: one READY behind the loopback sshd, one stopped on
the simulated host, one on a host that refuses connections. Rows and states come back through `capture-pane`;
Enter opens the remote row's dashboard over the fleet's own SSH connection, Escape brings the fleet back."""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, MakeProfile, free_port
from tests.integration.sshd import Sshd
from tests.integration.test_ssh_cli import cli
from tests.integration.test_tmux_demo import Tmux

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ssh,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (CI installs it via .ci/run)"),
]


def row_of(screen: str, server: str) -> str:
    """The fleet table's line for one server (its name stands alone between columns)."""
    return next((line for line in screen.splitlines() if f" {server} " in line and "·" not in line.split()[0]), "")


@pytest.fixture
def fleet(sshd: Sshd, ssh_tmp: Path, ssh_profile, make_profile: MakeProfile,
          tmp_path: Path) -> Iterator[tuple[Tmux, Path]]:
    home = sshd.make_home(ssh_tmp / "home")
    remote = ssh_profile(name="remote")
    launched = cli(home, "launch", str(remote), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    idle = make_profile(name="idle")
    gone = tmp_path / "gone.toml"  # nothing listens on this port: the connection is refused at once
    gone.write_text(f'name = "gone"\nhost = "ssh://{sshd.user}@127.0.0.1:{free_port()}"\nbackend = "sglang"\n'
                    'model = "m"\nport = 30000\ngpus = [0]\n')
    stdout = tmp_path / "stdout.txt"
    env = {"HOME": str(home), "TEXTUAL_ANIMATIONS": "none", "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    prefix = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
    unset = "env -u SSH_AUTH_SOCK -u SSH_AGENT_PID "
    argv = [sys.executable, "-m", "app", "fleet", str(remote), str(idle), str(gone)]
    tmux = Tmux(f"{unset}{prefix} {shlex.join(argv)} >{shlex.quote(str(stdout))}", REPO)
    try:
        yield tmux, stdout
    finally:
        tmux.kill()  # the fleet goes with the tmux server; the fixtures kill what the profiles launched


def test_fleet_rows_enter_opens_dashboard_escape_returns(fleet: tuple[Tmux, Path]) -> None:
    tmux, stdout = fleet

    def rows_known(screen: str) -> bool:
        return ("READY" in row_of(screen, "remote") and "STOPPED" in row_of(screen, "idle")
                and "unreachable" in row_of(screen, "gone"))

    screen = tmux.wait_for(rows_known, 60, "the three rows with their states")
    assert "3 servers on 3 hosts" in screen
    remote, idle, gone = (row_of(screen, name) for name in ("remote", "idle", "gone"))
    assert "127.0.0.1:" in remote, remote
    assert "connected" in remote and "local" in idle, screen
    assert "n/a" in gone  # its state is not known, and says so
    assert "Connect call failed" in screen or "cannot connect" in screen, screen  # the refused host's error
    lines = [line for line in screen.splitlines() if row_of(line + "\n", "idle") or row_of(line + "\n", "remote")
             or row_of(line + "\n", "gone")]
    print("\n--- fleet screen ---\n" + screen)

    order = [next(name for name in ("remote", "idle", "gone") if f" {name} " in line) for line in lines]
    assert order[0] == "idle" and sorted(order) == ["gone", "idle", "remote"], order  # by host: sim, then ssh://
    for _ in range(order.index("remote")):
        tmux.send("Down")
    tmux.send("Enter")
    dashboard = tmux.wait_for(lambda s: "tunedash · remote on" in s and "READY for" in s, 60, "the remote dashboard")
    assert "tunedash fleet" not in dashboard

    tmux.send("Escape")
    back = tmux.wait_for(lambda s: "tunedash fleet" in s and rows_known(s), 30, "the fleet again")
    assert "tunedash · remote" not in back

    tmux.send("q")
    tmux.wait_for(lambda s: "tunedash fleet" not in s, 15, "the fleet to quit")
    assert stdout.read_text() == "", f"the fleet wrote to stdout:\n{stdout.read_text()}"
