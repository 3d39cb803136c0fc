"""Commands that must never hang or lie (issue: safe on a shared GPU host): `k` cancels a relaunch that waits for a
server that never gets ready; the dashboard's relaunch has a ready timeout; a connection lost between SIGTERM
and SIGKILL resumes the kill after the reconnect instead of staying KILLING."""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import replace

import pytest

from app.connect import host_for
from app.core.data import ServerState
from app.core.hosts.base import ConnectionChanged, HostError
from app.core.profiles.loading import load_profile
from app.core.server.lifecycle import ServerLifecycle
from app.core.session import Session
from app.core.tasks import Unsubscribe
from tests.fakes import InMemoryHost, ScriptedTelemetry, gpu_reading
from tests.helpers import REPO, MakeProfile, until


def _texts(session: Session) -> str:
    return "\n".join(e.text for e in session.events)


@pytest.mark.slow
async def test_k_cancels_a_relaunch_waiting_for_ready_and_kills(make_profile: MakeProfile) -> None:
    profile = load_profile(make_profile(startup_s=0.3))
    session = Session(host_for(profile), profile)
    await session.start()
    try:
        session.run_command("launch", session.launch)
        await until(lambda: session.view().state == ServerState.READY and session.busy is None, 30, "READY")
        # the next launch never gets ready: the simulated server takes 300 s to start
        session.profile = replace(session.profile, env={**session.profile.env, "TUNEDASH_SIM_STARTUP_S": "300"})
        session.pending_flags = {**session.pending_flags, "speculative-num-steps": 2}
        assert session.run_command("relaunch", session.relaunch)
        await until(lambda: session.view().state in (ServerState.LOADING, ServerState.LAUNCHING)
                     and session.busy == "relaunch", 30, "the relaunch to wait for ready")
        assert not session.run_command("confirm free", session.confirm_free)  # one command at a time ...
        assert session.run_command("kill", session.kill)  # ... but a kill cancels it
        await until(lambda: session.view().state == ServerState.FREE and session.busy is None, 30, "FREE")
        assert "kill: cancelling the relaunch in progress" in _texts(session)
    finally:
        await session.stop()


@pytest.mark.slow
async def test_the_dashboards_relaunch_gives_up_waiting_after_the_ready_timeout(make_profile: MakeProfile) -> None:
    profile = load_profile(make_profile(startup_s=0.3, extra="ready_timeout = 2"))
    assert profile.ready_timeout_s == 2.0
    session = Session(host_for(profile), profile)
    await session.start()
    try:
        session.run_command("launch", session.launch)
        await until(lambda: session.view().state == ServerState.READY and session.busy is None, 30, "READY")
        session.profile = replace(session.profile, env={**session.profile.env, "TUNEDASH_SIM_STARTUP_S": "300"})
        state = await asyncio.wait_for(session.relaunch(), 120)  # returns at its ready timeout, not at 300 s
        assert state in (ServerState.LAUNCHING, ServerState.LOADING)
        assert "not ready after 2 s" in _texts(session)
    finally:
        await session.lifecycle.kill(confirm_free=False)
        await session.stop()


class FlakyHost(InMemoryHost):
    """An SSH-like host whose connection drops right after the SIGTERM, then comes back."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: list[object] = []
        self.drop_after_sigterm = True
        self.down = False

    def subscribe_connection(self, listener: object) -> Unsubscribe:  # type: ignore[override]
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener) if listener in self.listeners else None

    async def signal_group(self, pgid: int, signal_number: int) -> bool:
        if self.down:
            raise HostError("gpu-box: connection lost")
        sent = await super().signal_group(pgid, signal_number)
        if signal_number == signal.SIGTERM and self.drop_after_sigterm:
            self.drop_after_sigterm, self.down = False, True
        return sent

    async def processes(self):  # type: ignore[no-untyped-def]
        if self.down:
            raise HostError("gpu-box: connection lost")
        return await super().processes()

    def reconnect(self) -> None:
        self.down = False
        for listener in self.listeners:
            listener(ConnectionChanged(self.name, "connected", "gpu-box: reconnected", time.time(),  # type: ignore[operator]
                                       since=time.time() - 5))


async def test_a_connection_lost_between_sigterm_and_sigkill_resumes_the_kill() -> None:
    host = FlakyHost()
    host.ignored_signals = {signal.SIGTERM}  # the server hangs on shutdown: only SIGKILL ends it
    profile = replace(load_profile(REPO / "profiles" / "demo.toml"), gpus=())
    life = ServerLifecycle(host, profile, ScriptedTelemetry(gpu_reading({})), grace_s=0.3, liveness_period_s=0.05)
    record = await life.launch()
    with pytest.raises(HostError):
        await life.kill()
    assert life.state == ServerState.KILLING
    assert [s for _, s in host.signals] == [signal.SIGTERM]
    await asyncio.sleep(0.4)  # the grace passes while the host is away
    host.reconnect()
    await until(lambda: life.state == ServerState.FREE, 5, "the resumed kill to end FREE")
    assert (record.pgid, signal.SIGKILL) in host.signals
    assert not host.groups[record.pgid].alive
