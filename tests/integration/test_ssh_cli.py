"""The headless commands against the simulated host behind a real sshd: launch, ready, status (a fresh CLI
re-attaches), relaunch, kill, confirm free; flag values reach the server verbatim; host-key refusal and trust."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.main import main as cli_main
from tests.helpers import REPO
from tests.integration.sshd import Sshd

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

EVIL = "x; rm -rf ~ $(touch {marker}) `touch {marker}`"


def cli(home: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """The real CLI as a user runs it, with HOME holding ~/.ssh (key, known_hosts) and no ssh-agent."""
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "SSH_AGENT_PID")}
    env["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env, stdin=subprocess.DEVNULL)


def server_pid(state_out: str) -> int:
    line = next(x for x in state_out.splitlines() if x.strip().startswith("pid:"))
    return int(line.split(":")[1])


def test_launch_ready_reattach_relaunch_kill_free_over_ssh(sshd: Sshd, ssh_tmp: Path, ssh_profile) -> None:
    home = sshd.make_home(ssh_tmp / "home")
    profile = str(ssh_profile())
    marker = ssh_tmp / "pwned"
    evil = EVIL.format(marker=marker)

    launched = cli(home, "launch", profile, "--wait", "--timeout", "60", "--set", f"served-model-name={evil}")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "ready" in launched.stdout

    status = cli(home, "status", profile)  # a fresh process re-attaches from the record on the host
    assert status.returncode == 0, status.stderr
    assert ": READY" in status.stdout or "ready" in status.stdout.lower()
    pid = server_pid(status.stdout)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert evil.encode() in argv  # the value reached the server as one argument, byte for byte
    assert not marker.exists()  # and no shell ran any part of it
    assert Path(f"/proc/{pid}").stat().st_uid != 0 or os.geteuid() != 0  # it runs as the SSH user

    relaunched = cli(home, "relaunch", profile, "--set", "speculative-num-steps=2", "--ready-timeout", "60")
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    for phase in ("kill", "release", "ready"):
        assert phase in relaunched.stdout
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]

    # bench: HTTP through the SSH port forward (ab is that plus two relaunches: test_ab_sim.py, by hand over SSH).
    bench = cli(home, "bench", profile, "--requests", "3", "--concurrency", "1", "--max-tokens", "16", "--warmup", "0")
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert "requests ok / sent       3/3" in bench.stdout and "history: run #1" in bench.stdout
    log_path = relaunched.stdout.rsplit(", log ", 1)[1].split()[0]  # on loopback the host's log is local too
    log = cli(home, "log", log_path, "--events")
    assert log.returncode == 0 and '"ready"' in log.stdout, log.stdout + log.stderr

    killed = cli(home, "kill", profile, "--confirm-free", "--grace", "5")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "0 MiB" in killed.stdout
    free = cli(home, "free", profile, "--timeout", "10")
    assert free.returncode == 0 and "FREE" in free.stdout, free.stdout + free.stderr
    gpus = cli(home, "gpus", profile, "--json")
    assert gpus.returncode == 0 and '"memory_used_mib": 0' in gpus.stdout


def test_remote_misuse_is_refused_in_words(sshd: Sshd, ssh_profile, capsys: pytest.CaptureFixture[str]) -> None:
    """No connection needed: libnvidia-ml reads this machine only; `ui ssh://...` names a host, not a profile."""
    assert cli_main(["gpus", str(ssh_profile()), "--source", "nvml"]) == 2
    assert "use --source smi" in capsys.readouterr().err
    assert cli_main(["ui", sshd.spec]) == 2
    assert "is a host, not a profile" in capsys.readouterr().err


def test_unknown_key_is_refused_until_trusted(sshd: Sshd, ssh_tmp: Path, ssh_profile) -> None:
    home = sshd.make_home(ssh_tmp / "home", trusted=False)
    profile = str(ssh_profile())
    refused = cli(home, "status", profile)
    assert refused.returncode == 2
    assert "SHA256:" in refused.stderr and f"tunedash trust {sshd.spec}" in refused.stderr
    assert not (home / ".ssh" / "known_hosts").exists()

    no_tty = cli(home, "trust", profile)  # no terminal and no --yes: nothing is written
    assert no_tty.returncode == 2 and not (home / ".ssh" / "known_hosts").exists()

    trusted = cli(home, "trust", profile, "--yes")
    assert trusted.returncode == 0, trusted.stderr
    assert "SHA256:" in trusted.stdout
    assert sshd.host_line.split()[2] in (home / ".ssh" / "known_hosts").read_text()
    assert cli(home, "status", profile).returncode == 0


def test_changed_key_is_refused_and_never_trusted(sshd: Sshd, ssh_tmp: Path, ssh_profile) -> None:
    home = sshd.make_home(ssh_tmp / "home", trusted=False)
    other = ssh_tmp / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = home / ".ssh" / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    before = known.read_text()
    profile = str(ssh_profile())

    refused = cli(home, "status", profile)
    assert refused.returncode == 2
    assert "CHANGED" in refused.stderr and "ssh-keygen" in refused.stderr
    trust = cli(home, "trust", profile, "--yes")
    assert trust.returncode == 2 and "CHANGED" in trust.stderr
    assert known.read_text() == before
