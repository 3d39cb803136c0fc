"""The user's ~/.ssh/config against a real OpenSSH sshd on loopback: one reading of it for the host-key check
and the connection, and nothing in it that turns checking off or lets the host reach back.

Each test writes a real `~/.ssh/config` in a temporary HOME (never the real ~/.ssh) and runs the real CLI (or
an SshHost in this process with HOME pointed there): an alias with HostName and a non-default Port is shown,
trusted under the name OpenSSH itself looks up (checked with OpenSSH's own client) and used;
`UserKnownHostsFile none` and `StrictHostKeyChecking no` still refuse an unknown key; a changed key in a
configured known_hosts file is refused naming that file and line; `ForwardAgent yes` and `RequestTTY force`
give the session neither an agent nor a tty; ProxyJump through a second sshd works for trust and connect; a
login refused on reconnect stops the retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.core.hosts.base import ConnectionChanged, HostError
from app.core.hosts.ssh import SshHost
from tests.integration.sshd import Sshd, running_sshd
from tests.integration.test_ssh_cli import cli

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

ALIAS = "gpubox"


def host_block(alias: str, server: Sshd, identity: Path, known_hosts: str, *extra: str) -> str:
    """One `Host` block of an ssh config that reaches `server` through `alias` (absolute paths, so OpenSSH's
    own client, which expands ~ from the password file rather than $HOME, reads it the same way)."""
    lines = [f"Host {alias}", "  HostName 127.0.0.1", f"  Port {server.port}", f"  User {server.user}",
             f"  IdentityFile {identity}", "  IdentitiesOnly yes", f"  UserKnownHostsFile {known_hosts}",
             *(f"  {line}" for line in extra)]
    return "\n".join(lines) + "\n"


def write_config(home: Path, *blocks: str) -> Path:
    path = home / ".ssh" / "config"
    path.write_text("".join(blocks))
    path.chmod(0o600)
    return path


def other_key_line(folder: Path, pattern: str) -> str:
    """A known_hosts line for `pattern` holding a freshly made key that no sshd here presents."""
    key = folder / f"other_{abs(hash(pattern))}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return f"{pattern} {' '.join(key.with_suffix('.pub').read_text().split()[:2])}"


def openssh_accepts(config: Path, alias: str) -> subprocess.CompletedProcess[str]:
    """OpenSSH's own client, strict host-key checking, through `config`: does it accept the known_hosts lines?"""
    return subprocess.run(
        ["ssh", "-F", str(config), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", alias, "true"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


def fingerprint(server: Sshd) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(server.folder / "host_key.pub")], capture_output=True,
                         text=True, check=True).stdout
    return out.split()[1]


@pytest.fixture
def home(sshd: Sshd, ssh_tmp: Path) -> Path:
    """A HOME with the client key in ~/.ssh and no known_hosts."""
    return sshd.make_home(ssh_tmp / "home", trusted=False)


def test_alias_with_hostname_and_port_is_shown_trusted_and_used(
    sshd: Sshd, home: Path, ssh_profile: Callable[..., Path]
) -> None:
    known = home / "team" / "known_hosts"
    known.parent.mkdir()
    config = write_config(home, host_block(ALIAS, sshd, home / ".ssh" / "id_ed25519", str(known)))
    profile = str(ssh_profile(name=f"{ALIAS}-profile", host=ALIAS))

    refused = cli(home, "status", profile)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert fingerprint(sshd) in refused.stderr and f"tunedash trust {ALIAS}" in refused.stderr
    assert f"[127.0.0.1]:{sshd.port}" in refused.stderr and str(known) in refused.stderr
    assert not known.exists()

    trusted = cli(home, "trust", ALIAS, "--yes")
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    assert fingerprint(sshd) in trusted.stdout
    assert known.read_text() == sshd.host_line + "\n"  # "[127.0.0.1]:PORT ssh-ed25519 ...", into the config's file
    assert not (home / ".ssh" / "known_hosts").exists()
    accepted = openssh_accepts(config, ALIAS)  # the very name and file OpenSSH looks up
    assert accepted.returncode == 0, accepted.stderr

    gpus = cli(home, "gpus", profile, "--json")
    assert gpus.returncode == 0, gpus.stdout + gpus.stderr
    assert '"memory_used_mib"' in gpus.stdout


def test_user_known_hosts_file_none_still_refuses_an_unknown_key(
    sshd: Sshd, home: Path, ssh_profile: Callable[..., Path]
) -> None:
    write_config(home, host_block(ALIAS, sshd, home / ".ssh" / "id_ed25519", "none",
                                  "GlobalKnownHostsFile none", "StrictHostKeyChecking no"))
    profile = str(ssh_profile(name=f"{ALIAS}-none", host=ALIAS))

    for command, code in (("gpus", 1), ("status", 2)):  # gpus: the GPUs could not be read; status: bad input
        refused = cli(home, command, profile)
        said = refused.stdout + refused.stderr
        assert refused.returncode == code, said
        assert "refusing to connect" in said and fingerprint(sshd) in said
    assert not (home / ".ssh" / "known_hosts").exists()

    # Checking stays on: trusting writes to OpenSSH's default file, and then the host is used.
    assert cli(home, "trust", ALIAS, "--yes").returncode == 0
    assert (home / ".ssh" / "known_hosts").read_text() == sshd.host_line + "\n"
    gpus = cli(home, "gpus", profile)
    assert gpus.returncode == 0, gpus.stdout + gpus.stderr


def test_changed_key_in_a_configured_file_is_refused_naming_file_and_line(
    sshd: Sshd, home: Path, ssh_tmp: Path, ssh_profile: Callable[..., Path]
) -> None:
    known = home / "team" / "known_hosts"
    known.parent.mkdir()
    known.write_text("# the team's hosts\n" + other_key_line(ssh_tmp, "elsewhere.example") + "\n"
                     + other_key_line(ssh_tmp, f"[127.0.0.1]:{sshd.port}") + "\n")
    before = known.read_text()
    write_config(home, host_block(ALIAS, sshd, home / ".ssh" / "id_ed25519", str(known)))
    profile = str(ssh_profile(name=f"{ALIAS}-changed", host=ALIAS))

    refused = cli(home, "status", profile)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "CHANGED" in refused.stderr and f"{known}:3" in refused.stderr, refused.stderr
    assert f"ssh-keygen -f {known}" in refused.stderr
    trust = cli(home, "trust", ALIAS, "--yes")
    assert trust.returncode == 2 and "CHANGED" in trust.stderr and f"{known}:3" in trust.stderr
    assert known.read_text() == before
    assert not (home / ".ssh" / "known_hosts").exists()


@contextlib.contextmanager
def ssh_agent(folder: Path) -> Iterator[str]:
    """A real ssh-agent on a socket in `folder` (so ForwardAgent has something to forward)."""
    sock = folder / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.02)
        yield str(sock)
    finally:
        agent.kill()
        agent.wait()


async def test_forward_agent_and_request_tty_in_the_config_are_not_honoured(
    sshd: Sshd, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = home / ".ssh" / "known_hosts"
    known.write_text(sshd.host_line + "\n")
    write_config(home, host_block(ALIAS, sshd, home / ".ssh" / "id_ed25519", str(known),
                                  "ForwardAgent yes", "RequestTTY force"))
    monkeypatch.setenv("HOME", str(home))
    with ssh_agent(home) as agent_sock:
        monkeypatch.setenv("SSH_AUTH_SOCK", agent_sock)
        host = SshHost(ALIAS)
        try:
            result = await host.run(["sh", "-c", 'echo "agent=${SSH_AUTH_SOCK:-none}"; tty; exit 0'])
        finally:
            await host.close()
    assert "agent=none" in result.stdout, result.stdout
    assert "not a tty" in result.stdout, result.stdout


def test_proxy_jump_through_a_second_sshd_for_trust_and_connect(
    sshd: Sshd, home: Path, ssh_profile: Callable[..., Path]
) -> None:
    known = home / ".ssh" / "known_hosts"
    with running_sshd(log_level="VERBOSE") as jump:
        config = write_config(
            home,
            host_block("jumpbox", jump, jump.client_key, str(known)),
            host_block(ALIAS, sshd, home / ".ssh" / "id_ed25519", str(known), "ProxyJump jumpbox"),
        )
        profile = str(ssh_profile(name=f"{ALIAS}-jump", host=ALIAS))

        unknown_jump = cli(home, "trust", ALIAS, "--yes")  # the jump host is checked first, and said so
        assert unknown_jump.returncode == 2, unknown_jump.stdout + unknown_jump.stderr
        assert fingerprint(jump) in unknown_jump.stderr and "tunedash trust jumpbox" in unknown_jump.stderr
        assert not known.exists()

        assert cli(home, "trust", "jumpbox", "--yes").returncode == 0
        assert "Accepted publickey" not in jump.log  # reading a host key is no login
        trusted = cli(home, "trust", ALIAS, "--yes")
        assert trusted.returncode == 0, trusted.stdout + trusted.stderr
        assert fingerprint(sshd) in trusted.stdout
        assert known.read_text() == jump.host_line + "\n" + sshd.host_line + "\n"
        accepted = openssh_accepts(config, ALIAS)
        assert accepted.returncode == 0, accepted.stderr

        logins_before = jump.log.count("Accepted publickey")
        gpus = cli(home, "gpus", profile, "--json")
        assert gpus.returncode == 0, gpus.stdout + gpus.stderr
        assert jump.log.count("Accepted publickey") > logins_before  # it went through the jump host


async def test_a_refused_login_on_reconnect_stops_retrying(ssh_tmp: Path) -> None:
    with running_sshd(log_level="VERBOSE") as server:
        host = SshHost(server.spec, options=server.options(), backoff_s=(0.2, 0.5))
        seen: list[ConnectionChanged] = []
        host.subscribe_connection(seen.append)
        try:
            assert (await host.run(["true"])).returncode == 0
            # The key stops being accepted (revoked on the host), then the connection drops.
            (server.folder / "authorized_keys").write_text(other_key_line(ssh_tmp, "x").split(" ", 1)[1] + "\n")
            assert server.drop_connections() >= 1
            deadline = time.monotonic() + 15
            while not any(event.state == "failed" for event in seen):
                assert time.monotonic() < deadline, [event.detail for event in seen]
                await asyncio.sleep(0.05)
            failed = next(event for event in seen if event.state == "failed")
            assert "login refused" in failed.detail
            events, attempts = len(seen), server.log.count("Connection from")
            await asyncio.sleep(3.0)  # the backoff would have tried several times by now
            assert len(seen) == events and server.log.count("Connection from") == attempts
            with pytest.raises(HostError, match="login refused"):
                await host.run(["true"])
            assert server.log.count("Connection from") == attempts
        finally:
            await host.close()
