"""Pilot tests of the dashboard on a remote host's connection changes (a toast each, the header says the state
until it is back) and on a profile without GPUs (nothing sampled, the GPU panel says so)."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from app.core.data import ConnectionState, GpuSnapshot
from app.core.hosts.base import ConnectionChanged
from app.core.hosts.local import LocalHost
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.core.session import Session
from app.core.tasks import Listeners, Unsubscribe
from app.sim.host_env import reset_state, sim_environment
from app.tui.app import create_app
from app.tui.views import NO_GPUS
from tests.helpers import free_port
from tests.ui.ui_flows import SIZE, screen_text, shows, until


class FlakyHost(LocalHost):
    """The simulated host under a remote host's name, whose connection events the test sends: they take the
    path a real SshHost's take (host -> lifecycle -> session -> its listeners)."""

    def __init__(self, sim_profile: Profile) -> None:
        env = sim_environment(Path(sim_profile.sim_state) if sim_profile.sim_state else None)
        super().__init__("gpu-box", extra_env=env, state_dir=str(Path(env["TUNEDASH_SIM_STATE"]) / "host"))
        self.listeners: Listeners[ConnectionChanged] = Listeners("gpu-box")

    def subscribe_connection(self, listener: Callable[[ConnectionChanged], None]) -> Unsubscribe:
        return self.listeners.subscribe(listener)

    def emit(self, state: ConnectionState, detail: str, since: float | None = None) -> None:
        self.listeners.emit(ConnectionChanged(self.name, state, detail, time.time(), since))


def toast_titles(app: object) -> list[str]:
    return [str(n.title) for n in app._notifications]  # type: ignore[attr-defined]


async def test_connection_changes_toast_and_show_in_the_header(profile: Profile) -> None:
    host = FlakyHost(profile)
    app = create_app(profile, host=host, keymap_file=None)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app.session.snapshot is not None, 30, "the first GPU sample")
        host.emit("connected", "connected to gpu-box")
        await pilot.pause()
        assert app.session.connection is not None and app.session.connection.state == "connected"
        assert toast_titles(app) == []  # the first connection is no news
        assert "connection" not in app.sub_title

        lost_at = time.time() - 12
        host.emit("lost", "connection to gpu-box lost: keepalive timeout; values are stale", since=lost_at)
        await pilot.pause()
        assert app.session.connection.state == "lost"
        assert toast_titles(app) == ["gpu-box: connection lost"]
        assert re.search(r"connection lost \d+ s", app.sub_title), app.sub_title
        await shows(pilot, app, "connection lost", "keepalive timeout")  # the header and the toast

        host.emit("reconnecting", "reconnecting to gpu-box in 2 s", since=lost_at)
        host.emit("reconnecting", "reconnecting to gpu-box in 4 s", since=lost_at)  # same state: no new toast
        await pilot.pause()
        assert toast_titles(app) == ["gpu-box: connection lost", "gpu-box: connection reconnecting"]
        assert re.search(r"connection reconnecting \d+ s", app.sub_title), app.sub_title

        host.emit("connected", "connection to gpu-box is back", since=lost_at)
        await pilot.pause()
        assert toast_titles(app)[-1] == "gpu-box: connection connected"
        assert "connection" not in app.sub_title
        assert any("keepalive timeout" in e.text for e in app.session.events)  # the event log has the details
        await app.session.stop()


class CountingTelemetry:
    """Telemetry that counts what is asked of it and never answers a stream."""

    def __init__(self) -> None:
        self.streams = 0
        self.samples = 0

    async def sample(self) -> GpuSnapshot:
        self.samples += 1
        return GpuSnapshot((), time.monotonic())

    async def stream(self, period_ms: int = 1000) -> AsyncIterator[GpuSnapshot]:
        self.streams += 1
        yield GpuSnapshot((), time.monotonic())

    async def close(self) -> None:
        return None


async def test_a_profile_without_gpus_samples_none_and_says_so(tmp_path: Path) -> None:
    state = tmp_path / "sim"
    reset_state(state)
    path = tmp_path / "cpu.toml"
    path.write_text(f'name = "cpu"\nhost = "sim"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\n'
                    f'port = {free_port()}\ngpus = []\nsim_state = "{state}"\n')
    no_gpus = load_profile(path)
    telemetry = CountingTelemetry()
    session = Session(FlakyHost(no_gpus), no_gpus, telemetry=telemetry)  # type: ignore[arg-type]
    app = create_app(no_gpus, session=session, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: not any(w.name == "session start" and w.is_running for w in app.workers),
                    30, "the session to start")
        await pilot.pause(0.6)  # a UI tick
        text = screen_text(app)
        assert NO_GPUS in text
        assert "telemetry failed" not in text and "waiting for the first sample" not in text
        assert telemetry.streams == 0 and session.snapshot is None
        await app.session.stop()
