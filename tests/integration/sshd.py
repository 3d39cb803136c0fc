"""A real OpenSSH sshd on loopback for the SSH tests (docs/architecture.md#tests), and helpers around it.

One sshd per test session: throwaway host and user keys, a free port, `-f /dev/null` with -o options,
UsePAM=no, StrictModes=no. As root it logs in a non-root user `tdtest` (created with useradd, password set to
'*' so sshd does not call it locked) and lets that user traverse to this venv's python; as another user it
logs in that same user. Skipped when /usr/sbin/sshd is absent. The fixtures (`sshd`, `sshd_fish`, `sshd_tcsh`,
`ssh_tmp`, `ssh_profile`) live in tests/conftest.py. `running_sshd()` starts another one (a jump
host, or a server a test may break), with its own keys and port; `sshd_fish` and `sshd_tcsh` log in users
`tdtest-fish` and `tdtest-tcsh` whose login shells are fish and tcsh (root only).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port

SSHD = Path("/usr/sbin/sshd")
TEST_USER = "tdtest"


@dataclass
class Sshd:
    """A running sshd: where it listens, who logs in, and the files a client needs."""

    port: int
    user: str
    pid: int
    folder: Path
    client_key: Path
    known_hosts: Path  # trusts this sshd's host key
    host_line: str  # the known_hosts line for it

    @property
    def log(self) -> str:
        """What sshd logged so far (each connection and login when started with log_level VERBOSE)."""
        return (self.folder / "sshd.log").read_text(errors="replace")

    @property
    def spec(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    def options(self, known_hosts: Path | None = None) -> dict[str, Any]:
        """asyncssh.connect options for tests: this key, these known_hosts, no ~/.ssh/config, no agent."""
        return {
            "known_hosts": str(known_hosts or self.known_hosts),
            "client_keys": [str(self.client_key)],
            "config": None,
            "agent_path": None,
        }

    def make_home(self, home: Path, *, trusted: bool = True) -> Path:
        """A $HOME whose ~/.ssh holds the client key (and, when trusted, the known_hosts line): for CLI runs."""
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copy(self.client_key, ssh_dir / "id_ed25519")
        (ssh_dir / "id_ed25519").chmod(0o600)
        if trusted:
            (ssh_dir / "known_hosts").write_text(self.host_line + "\n")
        return home

    def connection_pids(self) -> list[int]:
        """The per-connection sshd processes (children of the listener and their sshd children)."""
        found: list[int] = []
        parents = {self.pid}
        for _ in range(3):
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                name = stat[stat.find("(") + 1 : stat.rfind(")")]
                ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
                pid = int(entry.name)
                if ppid in parents and name.startswith("sshd") and pid not in found:
                    found.append(pid)
            parents |= set(found)
        return found

    def drop_connections(self) -> int:
        """SIGKILL every per-connection sshd: clients see their connection die; their commands get EOF."""
        pids = self.connection_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return (path.with_suffix(".pub")).read_text().strip()


def _prepare_user(login_shell: str | None = None) -> str:
    """The user sshd lets in: `tdtest` (login shell /bin/sh), or `tdtest-<shell>` whose login shell is
    `login_shell` (made when missing; root only, the caller skips otherwise)."""
    if os.geteuid() != 0:
        return getpass.getuser()
    user = TEST_USER if login_shell is None else f"{TEST_USER}-{Path(login_shell).name}"
    shell = login_shell or "/bin/sh"
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", shell, user], check=True, capture_output=True)
    subprocess.run(["usermod", "-p", "*", "-s", shell, user], check=True, capture_output=True)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    probe = [sys.executable, "-c", "import aiohttp, app.sim.sglang"]
    if subprocess.run(["runuser", "-u", user, "--", *probe], capture_output=True, cwd="/").returncode != 0:
        # Let the test user reach this venv's python (e.g. a pyenv under /root): traverse only, no listing.
        for folder in [*Path(os.path.realpath(sys.executable)).parents, *Path(sys.prefix).parents]:
            if folder.stat().st_mode & 0o001:
                continue
            if shutil.which("setfacl"):
                subprocess.run(["setfacl", "-m", f"u:{user}:x", str(folder)], check=True)
            else:
                folder.chmod(folder.stat().st_mode | 0o001)
    return user


def sshd_available() -> bool:
    return SSHD.exists() and shutil.which("ssh-keygen") is not None


@contextlib.contextmanager
def running_sshd(log_level: str = "ERROR", login_shell: str | None = None) -> Iterator[Sshd]:
    """Start sshd on a free loopback port (and the test user); stop it and remove its files afterwards.

    `log_level` VERBOSE makes sshd log each connection and login to `folder / "sshd.log"` (tests count them).
    `login_shell` (root only): log in a user whose login shell is that one (/usr/bin/fish), made when missing.
    """
    user = _prepare_user(login_shell)
    folder = Path(tempfile.mkdtemp(prefix="tunedash-sshd-"))
    folder.chmod(0o755)
    host_pub = _keygen(folder / "host_key")
    client_pub = _keygen(folder / "client_key")
    authorized = folder / "authorized_keys"
    authorized.write_text(client_pub + "\n")
    authorized.chmod(0o644)
    port = free_port()
    known_hosts = folder / "known_hosts"
    host_line = f"[127.0.0.1]:{port} {' '.join(host_pub.split()[:2])}"
    known_hosts.write_text(host_line + "\n")
    options = {
        "HostKey": folder / "host_key", "Port": port, "ListenAddress": "127.0.0.1", "AuthorizedKeysFile": authorized,
        "StrictModes": "no", "UsePAM": "no", "PasswordAuthentication": "no", "KbdInteractiveAuthentication": "no",
        "PidFile": folder / "sshd.pid", "MaxSessions": 30, "MaxStartups": "100", "LogLevel": log_level,
        "AllowUsers": user, "PermitUserEnvironment": "no",
    }
    argv = [str(SSHD), "-D", "-e", "-f", "/dev/null"] + [x for k, v in options.items() for x in ("-o", f"{k}={v}")]
    log = (folder / "sshd.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    server = Sshd(port, user, proc.pid, folder, folder / "client_key", known_hosts, host_line)
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(folder / 'sshd.log').read_text()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5) as sock:
                if sock.recv(4).startswith(b"SSH-"):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("sshd did not answer within 10 s")
            time.sleep(0.05)
        yield server
    finally:
        server.drop_connections()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def login_shell_sshd(shell: str) -> Iterator[Sshd]:
    """An sshd whose test user has `shell` as its login shell (skips without root or the shell)."""
    if not sshd_available():
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    if os.geteuid() != 0:
        pytest.skip(f"making a test user whose login shell is {shell} needs root")
    if not Path(shell).exists():
        pytest.skip(f"{shell} is not installed (apt-get install {Path(shell).name})")
    with running_sshd(login_shell=shell) as server:
        yield server


def open_to_all(folder: Path) -> None:
    """Make `folder` and everything in it readable and writable by the SSH test user too."""
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            Path(root, name).chmod(0o777)
    folder.chmod(0o777)
