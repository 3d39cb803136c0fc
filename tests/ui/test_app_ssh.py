"""Pilot tests of the whole dashboard over SSH: the simulated host behind a real OpenSSH sshd on loopback.

The profile's host is ssh://tdtest@127.0.0.1:PORT with sim_state (app.connect runs the simulated host behind
sshd), HOME holds only the client key and known_hosts (no ssh-agent), and the dashboard is built exactly as
`tunedash ui PROFILE` builds it (create_app without a host). One flow drives it: launch (r), READY with GPU
rows from the remote nvidia-smi, the probe through the SSH port forward (p), a toggle and r relaunch with the
new flag, q, a second dashboard re-attaches to the same server, k y kill to FREE; afterwards nothing it
streamed is left running on the host. Then the unknown-host-key prompt (yes: trusted and connected; no: not
asked again), and a connection loss shown as stale rows with their age.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from app.core.data import ServerState
from app.core.profiles.loading import resolve_profile
from app.core.profiles.types import Profile
from app.tui.app import TunedashApp, create_app
from tests.helpers import until as until_true
from tests.integration.sshd import Sshd
from tests.integration.test_ssh_session import cmdlines_with
from tests.ui.ui_flows import SIZE, event_texts, pending_of, shows, state_of, until
from widgets import ConfirmModal, GpuPanel

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")
pytestmark = pytest.mark.ssh  # not slow: each test under 20 s (the flow about 12 s, the file about 25 s)


@pytest.fixture
def remote(
    sshd: Sshd,
    ssh_tmp: Path,
    ssh_profile: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> Profile:
    """The SSH profile, with HOME holding the client key and a known_hosts that trusts this sshd."""
    monkeypatch.setenv("HOME", str(sshd.make_home(ssh_tmp / "home")))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return resolve_profile(str(ssh_profile(name="remote-ui")))


def streams_on_host(profile: Profile) -> list[int]:
    """The remote nvidia-smi loops of this profile's sim host (what the dashboard's telemetry streams)."""
    return cmdlines_with("-lms", f"TUNEDASH_SIM_STATE={profile.sim_state}")


async def closed(app: TunedashApp) -> None:
    """What `tunedash ui` gets by exiting: the SSH connection closed (quitting the app leaves it open)."""
    await app.session.host.close()


def server_argv(pid: int) -> list[str]:
    return [part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part]


def gone(pid: int) -> bool:
    """No such process, or a zombie (an empty command line)."""
    try:
        return not Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


async def until_gone(found: Callable[[], list[int]], timeout: float = 10.0) -> None:
    """Until `found()` lists nothing (the host's streams end when their channel closes)."""
    await until_true(lambda: not found(), timeout, "the host's streams to end",
                     lambda: f"still running on the host: {found()}", interval=0.1)


async def remote_ready(pilot: Pilot[None], app: TunedashApp) -> None:
    await until(pilot, lambda: state_of(app) == ServerState.READY and app.session.busy is None, 60, "READY",
                lambda: f"state {state_of(app)}, busy {app.session.busy}; events: {' | '.join(event_texts(app))}")


async def test_dashboard_over_ssh_launch_probe_relaunch_reattach_kill(remote: Profile) -> None:
    app = create_app(remote, keymap_file=None)
    assert app.session.host.name == remote.host and not app.session.host.is_local
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session.connection is not None
                    and app.session.connection.state == "connected", 15, "connected")
        await shows(pilot, app, "STOPPED", f"on {remote.host}", f"connected to {remote.host}", timeout=15)

        await pilot.press("r")  # nothing runs yet: r launches
        await remote_ready(pilot, app)
        record = app.session.lifecycle.record
        assert record is not None
        first_pid = record.pid
        assert "--speculative-num-steps 1" in " ".join(server_argv(first_pid))

        # GPU rows from the remote nvidia-smi, holding the model's memory.
        await until(pilot, lambda: app.session.snapshot is not None and app.session.snapshot.error is None
                    and all((g.memory_used_mib or 0) > 0 for g in app.session.snapshot.gpus), 15, "GPU memory in use")
        snapshot = app.session.snapshot
        assert snapshot is not None and [g.index for g in snapshot.gpus] == [0, 1]
        await shows(pilot, app, "READY", "GPU", "MiB", f"pid {first_pid}", timeout=10)
        assert app.query_one(GpuPanel).region.height > 0

        # The probe's requests go through the SSH port forward (a local port, not the server's).
        await pilot.press("p")
        await until(pilot, lambda: any(p.source == "probe" for p in app.session.throughput), 30, "probe points")
        await shows(pilot, app, "probe on")
        base = await app.session.host.http_base(remote.port)
        assert base.startswith("http://127.0.0.1:") and not base.endswith(f":{remote.port}")
        await pilot.press("p")
        assert not app.session.probe_wanted

        # A toggle, then r: the server on the host restarts with the new flag.
        await pilot.press("s")
        assert pending_of(app, "s") == ("1", "2")
        await pilot.press("r")
        await until(pilot, lambda: app.session.lifecycle.record is not None
                    and app.session.lifecycle.record.pid != first_pid, 60, "a new server")
        await remote_ready(pilot, app)
        assert app.session.profile.flags["speculative-num-steps"] == 2
        record = app.session.lifecycle.record
        assert record is not None
        pid = record.pid
        assert "--speculative-num-steps 2" in " ".join(server_argv(pid))
        assert gone(first_pid)
        await until(pilot, lambda: pending_of(app, "s") == ("2", "2"), 5, "the flags panel to follow")
        assert any(t.startswith("relaunched with steps 1 -> 2") for t in event_texts(app))

        await pilot.press("q")  # quitting never touches the server
    await closed(app)
    os.kill(pid, 0)
    await until_gone(lambda: streams_on_host(remote))

    # A second dashboard re-attaches to the same server over a new connection, then kills it.
    second = create_app(remote, keymap_file=None)
    async with second.run_test(size=SIZE) as pilot:
        await remote_ready(pilot, second)
        record = second.session.lifecycle.record
        assert record is not None and record.pid == pid
        assert any(f"re-attached to pid {pid}" in t for t in event_texts(second))
        assert second.session.profile.flags["speculative-num-steps"] == 2
        await shows(pilot, second, "READY", f"pid {pid}", timeout=10)
        assert not second.session.readonly  # the first dashboard quit and gave the driver lock back

        await pilot.press("k")
        assert isinstance(second.screen, ConfirmModal)
        await pilot.press("y")
        await until(pilot, lambda: state_of(second) == ServerState.FREE and second.session.busy is None, 60, "FREE")
        await shows(pilot, second, "FREE", "0/49140 MiB", timeout=10)
        assert any("SIGTERM to group" in t for t in event_texts(second))
        await pilot.press("q")
    await closed(second)
    assert gone(pid)
    await until_gone(lambda: streams_on_host(remote))


async def test_dashboard_asks_about_an_unknown_host_key(
    sshd: Sshd,
    ssh_tmp: Path,
    ssh_profile: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = sshd.make_home(ssh_tmp / "home", trusted=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    profile = resolve_profile(str(ssh_profile(name="remote-trust")))
    known = home / ".ssh" / "known_hosts"
    app = create_app(profile, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), 15, "the trust prompt")
        text = await shows(pilot, app, "Unknown SSH host key", "SHA256:", "Trust")
        assert f"[127.0.0.1]:{sshd.port}" in text
        assert not known.exists()
        await pilot.press("y")
        await until(pilot, lambda: app.session.connection is not None
                    and app.session.connection.state == "connected", 15, "connected")
        await until(pilot, lambda: app.session.snapshot is not None and app.session.snapshot.error is None
                    and len(app.session.snapshot.gpus) == 2, 15, "GPU rows")
        assert not isinstance(app.screen, ConfirmModal)
        await shows(pilot, app, "STOPPED")
        await pilot.press("q")
    await closed(app)
    assert sshd.host_line.split()[2] in known.read_text()


async def test_a_declined_host_key_is_not_asked_again(
    sshd: Sshd,
    ssh_tmp: Path,
    ssh_profile: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = sshd.make_home(ssh_tmp / "home", trusted=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    app = create_app(resolve_profile(str(ssh_profile(name="remote-decline"))), keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ConfirmModal), 15, "the trust prompt")
        await pilot.press("n")
        await shows(pilot, app, "refusing", "telemetry failed", timeout=10)  # words: lines wrap anywhere else
        snapshot = app.session.snapshot
        assert snapshot is not None and snapshot.error is not None
        assert f"tunedash trust {sshd.spec}" in snapshot.error.message
        # Telemetry, the job record and flag discovery all keep calling the host: none of them asks again.
        for _ in range(30):
            await pilot.pause(0.1)
            assert not isinstance(app.screen, ConfirmModal), "the declined key was asked about again"
        assert app.session.connection is not None and app.session.connection.state == "failed"
        assert sum("refusing to connect" in t for t in event_texts(app)) == 1
        await pilot.press("q")
    await closed(app)
    assert not (home / ".ssh" / "known_hosts").exists()


@pytest.mark.parametrize("readonly", [True, False], ids=["readonly", "watch"])
async def test_a_watching_dashboard_never_answers_an_unknown_host_key(
    sshd: Sshd,
    ssh_tmp: Path,
    ssh_profile: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    readonly: bool,
) -> None:
    """`ui --readonly`, and a `serve` tab (--watch) before T: no trust prompt, nothing written to known_hosts; the
    connection fails saying the key is unknown and to run `tunedash trust HOST`."""
    home = sshd.make_home(ssh_tmp / "home", trusted=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    profile = resolve_profile(str(ssh_profile(name="remote-watch")))
    app = create_app(profile, readonly=readonly, watching=True, keymap_file=None, theme_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session.connection is not None or isinstance(app.screen, ConfirmModal), 15,
                    "a connection state")
        for _ in range(30):  # telemetry, the job record and flag discovery keep calling the host: none asks
            await pilot.pause(0.1)
            assert not isinstance(app.screen, ConfirmModal), "a watching dashboard asked to trust a host key"
        assert app.session.connection is not None and app.session.connection.state == "failed"
        assert f"tunedash trust {sshd.spec}" in app.session.connection.detail
        assert "read-only dashboard never adds a host key" in app.session.connection.detail
        await pilot.press("q")
    await closed(app)
    assert not (home / ".ssh" / "known_hosts").exists()


async def test_connection_loss_shows_each_gpu_row_stale_with_its_age(remote: Profile, sshd: Sshd) -> None:
    app = create_app(remote, keymap_file=None)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.session.snapshot is not None and len(app.session.snapshot.gpus) == 2,
                        15, "GPU rows")
            os.kill(sshd.pid, signal.SIGSTOP)  # no reconnect succeeds until SIGCONT
            try:
                assert sshd.drop_connections() >= 1
                await until(pilot, lambda: app.session.connection is not None
                            and app.session.connection.state != "connected", 15, "connection lost")
                rows = app.query_one(GpuPanel).rows.values()
                await until(pilot, lambda: all(r.has_class("-stale") for r in rows), 15, "stale rows")
                await shows(pilot, app, "connection", "lost", "stale ", timeout=5)
            finally:
                os.kill(sshd.pid, signal.SIGCONT)
            await until(pilot, lambda: not any(r.has_class("-stale") for r in app.query_one(GpuPanel).rows.values()),
                        30, "live rows again")
            await pilot.press("q")
    finally:
        await closed(app)
