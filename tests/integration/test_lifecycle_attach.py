"""Re-attaching to a running job: the log is replayed for state, but its old figures are marked as replayed."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from pathlib import Path

from app.core.data import DecodeStats, ServerState
from app.core.hosts.local import LocalHost
from app.core.profiles.loading import resolve_profile
from app.core.server import jobs
from app.core.server.events import LifecycleEvent, ServerLogEvent
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.smi import SmiTelemetry

OLD = (
    "[2026-11-30 06:00:00] The server is fired up and ready to roll!\n"
    "[2026-11-30 06:00:05 TP0] Decode batch, #running-req: 1, #token: 90, token usage: 0.00, accept len: 1.85, "
    "cuda graph: True, gen throughput (token/s): 37.50, #queue-req: 0\n"
)
NEW = (
    "[2026-11-30 06:10:00 TP0] Decode batch, #running-req: 1, #token: 90, token usage: 0.00, accept len: 3.20, "
    "cuda graph: True, gen throughput (token/s): 54.00, #queue-req: 0\n"
)


async def test_reattach_replays_state_but_marks_old_figures(tmp_path: Path) -> None:
    host = LocalHost("local", state_dir=str(tmp_path / "state"))
    profile = dataclasses.replace(resolve_profile("demo"), name="attach-test", gpus=())
    log = tmp_path / "state" / "logs" / "server.log"  # a record's log lies in the host's state folder
    log.parent.mkdir(parents=True)
    log.write_text(OLD)
    tag = jobs.new_tag()
    spawned = await host.spawn_detached(["sleep", "30"], log_path=str(tmp_path / "sleep.log"), env={jobs.TAG_ENV: tag})
    identity = await host.boot_identity()
    try:
        record = jobs.JobRecord(
            profile=profile.name, host="local", backend="sglang", model=profile.model, port=profile.port,
            argv=["sleep", "30"], flags={}, pid=spawned.pid, pgid=spawned.pgid, start_time=spawned.start_time,
            log_path=str(log), launched_by="someone@else", launched_at=time.time(), gpus=[],
            phase_times={"ready": 41.3}, outcome="ready", profile_file=jobs.profile_file_of(profile), tag=tag,
            boot_id=identity.boot_id, hostname=identity.hostname,
        )
        await jobs.save_job(host, record)
        lifecycle = ServerLifecycle(host, profile, SmiTelemetry(host, ()))
        seen: list[LifecycleEvent] = []
        lifecycle.subscribe(seen.append)
        assert await lifecycle.attach()
        assert await lifecycle.wait_ready(5) == ServerState.READY
        assert lifecycle.phase_times == {"ready": 41.3}  # the recorded times, not the replay's
        with log.open("a") as handle:
            handle.write(NEW)
        for _ in range(60):
            decodes = [e for e in seen if isinstance(e, ServerLogEvent) and isinstance(e.event, DecodeStats)]
            if len(decodes) == 2:
                break
            await asyncio.sleep(0.05)
        assert [(d.event.gen_tps, d.replayed) for d in decodes] == [(37.5, True), (54.0, False)]
        await lifecycle.close()
    finally:
        await host.signal_group(spawned.pgid, signal.SIGKILL)
