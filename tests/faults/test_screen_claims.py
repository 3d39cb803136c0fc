"""What the screen claims is what was measured: when the Session's state turns FREE (or STUCK), the GPU sample it
holds for the GPU panel is the one that proved it, not an older one from the dashboard's own sampler."""

from __future__ import annotations

import pytest

from app.connect import host_for
from app.core.data import GpuSnapshot, ServerState
from app.core.profiles.loading import load_profile
from app.core.server.events import LifecycleEvent, StateChanged
from app.core.session import Session
from tests.helpers import MakeProfile, until

pytestmark = pytest.mark.slow


async def test_free_shows_with_the_sample_that_proved_it(make_profile: MakeProfile) -> None:
    profile = load_profile(make_profile(startup_s=0.3))
    session = Session(host_for(profile), profile, sample_period_ms=250)
    seen: list[tuple[ServerState, GpuSnapshot | None]] = []

    def on_event(event: LifecycleEvent) -> None:
        if isinstance(event, StateChanged) and event.state in (ServerState.FREE, ServerState.STUCK):
            seen.append((event.state, session.snapshot))

    session.subscribe(on_event)
    await session.start()
    try:
        session.run_command("launch", session.launch)
        await until(lambda: session.view().state == ServerState.READY and session.busy is None, 30, "READY")
        await until(lambda: session.snapshot is not None and all(
            (g.memory_used_mib or 0) > 1000 for g in session.snapshot.gpus), 10, "loaded GPUs on the panel")
        for _ in range(3):
            session.pending_flags = {**session.pending_flags, "speculative-num-steps": 2}
            assert await session.relaunch() == ServerState.READY
    finally:
        await session.lifecycle.kill(confirm_free=True)
        await session.stop()
    assert len(seen) >= 3
    for state, snapshot in seen:
        assert state == ServerState.FREE
        assert snapshot is not None
        for gpu in snapshot.gpus:
            assert gpu.memory_used_mib is not None and gpu.memory_used_mib <= 64, (gpu.index, gpu.memory_used_mib)
            assert not gpu.processes, (gpu.index, gpu.processes)
