"""The release watch reads the GPUs at their source's own pace while a kill is pending (issue 20 item 5).

On the simulated host it reads through the host's NVML-like reader (no process per sample); a local NVML that
cannot start falls back to nvidia-smi; nvidia-smi's process lists come from a kept-open loop whose empty runs say
"no process" (docs/decisions.md#release-watch-at-the-sources-pace).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from app.connect import host_for
from app.core.data import GpuSnapshot, ServerState
from app.core.hosts.local import LocalHost
from app.core.profiles.loading import load_profile
from app.core.server import release
from app.core.server.events import LifecycleEvent
from app.core.server.lifecycle import ServerLifecycle
from app.core.server.release import FreeProgress
from app.core.telemetry.freecheck import FreeCheck, FreeVerdict
from app.core.telemetry.smi import SmiTelemetry, telemetry_for
from app.sim.host_env import sim_environment
from app.sim.sim_nvml import SimNvml


def samples_of(lifecycle: ServerLifecycle) -> list[GpuSnapshot]:
    seen: list[GpuSnapshot] = []

    def listener(event: LifecycleEvent) -> None:
        if isinstance(event, FreeProgress) and event.snapshot is not None:
            seen.append(event.snapshot)

    lifecycle.subscribe(listener)
    return seen


async def launch_and_kill(lifecycle: ServerLifecycle) -> FreeVerdict | None:
    await lifecycle.launch()
    assert await lifecycle.wait_ready(30) == ServerState.READY
    return await lifecycle.kill(confirm_free=True)


async def test_a_kill_on_the_simulated_host_is_watched_through_its_nvml_reader(
    make_profile: Callable[..., Path],
) -> None:
    profile = load_profile(make_profile(startup_s=0.3))
    host = host_for(profile)
    assert isinstance(host, LocalHost) and isinstance(host.nvml, SimNvml)
    lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))
    seen = samples_of(lifecycle)
    verdict = await launch_and_kill(lifecycle)
    await lifecycle.close()
    assert verdict is not None and verdict.confirmed
    assert lifecycle.state == ServerState.FREE
    # What the GPU panel shows when FREE shows came from the in-process reader, with nvidia-smi's memory semantics.
    assert seen and all(g.source == "nvml" and g.memory_api == "nvml_v2" for g in seen[-1].gpus)
    assert [g.memory_used_mib for g in seen[-1].gpus] == [0, 0]
    assert host.nvml.reads > len(seen)  # it read the state folder more often than it told the listeners


class NoLibrary:
    """An NVML whose library is missing (no driver on this machine)."""

    class NVMLError_LibraryNotFound(Exception):
        pass

    def nvmlInit(self) -> None:
        raise self.NVMLError_LibraryNotFound("NVML Shared Library Not Found")


async def test_nvml_that_cannot_start_falls_back_to_nvidia_smi(
    make_profile: Callable[..., Path], sim_state: Path
) -> None:
    profile = load_profile(make_profile(startup_s=0.3))
    sim = host_for(profile)
    host = LocalHost("sim", extra_env=sim_environment(sim_state), state_dir=sim.state_dir, nvml=NoLibrary())
    lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))
    seen = samples_of(lifecycle)
    verdict = await launch_and_kill(lifecycle)
    await lifecycle.close()
    assert verdict is not None and verdict.confirmed
    assert lifecycle.state == ServerState.FREE
    assert seen and all(g.source == "smi" for g in seen[-1].gpus)


class V1Only(SimNvml):
    """A binding with no v2 memory call (drivers before ~R510): its `used` counts the driver's reserve."""

    nvmlMemory_v2 = None  # type: ignore[assignment]


async def test_nvml_with_only_v1_memory_gives_way_to_nvidia_smi(
    make_profile: Callable[..., Path], sim_state: Path
) -> None:
    profile = load_profile(make_profile(startup_s=0.3))
    sim = host_for(profile)
    host = LocalHost("sim", extra_env=sim_environment(sim_state), state_dir=sim.state_dir,
                     nvml=V1Only(str(sim_state)))
    lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))
    seen = samples_of(lifecycle)
    verdict = await launch_and_kill(lifecycle)
    await lifecycle.close()
    assert verdict is not None and verdict.confirmed  # v1's reserve (471 MiB here) would never read as free
    assert seen and all(g.source == "smi" for g in seen[-1].gpus)


def holder(sim_state: Path) -> subprocess.Popen[bytes]:
    """A process holding 2048 MiB on simulated GPU 0 until it is killed."""
    code = (
        "import sys, time; from app.sim import gpu_state; "
        f"gpu_state.allocate({str(sim_state)!r}, 0, 2048, 'python holder', 'weights'); "
        "print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": "."})
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    return proc


async def test_the_process_list_loop_sees_a_process_go(sim_state: Path, tmp_path: Path) -> None:
    host = LocalHost(extra_env=sim_environment(sim_state), state_dir=str(tmp_path / "td"))
    proc = holder(sim_state)
    telemetry = SmiTelemetry(host, [0], apps_loops=1)
    seen: list[tuple[int | None, tuple[int, ...] | None, float | None]] = []
    killed_at = 0.0
    try:
        async with asyncio.timeout(30), contextlib.aclosing(telemetry.stream(10)) as snapshots:
            async for snapshot in snapshots:
                gpu = snapshot.gpus[0] if snapshot.gpus else None
                if gpu is None:
                    continue
                pids = None if gpu.processes is None else tuple(p.pid for p in gpu.processes)
                seen.append((gpu.memory_used_mib, pids, gpu.processes_taken_at))
                if pids == (proc.pid,) and not killed_at:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    killed_at = asyncio.get_running_loop().time()
                after_kill = killed_at and gpu.processes_taken_at and gpu.processes_taken_at > killed_at
                if after_kill and pids == () and gpu.memory_used_mib == 0:
                    break  # a new list re-reads the last memory tick: memory shows until the next tick
    finally:
        await telemetry.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    used, pids, _ = seen[-1]
    assert used == 0 and pids == ()  # an empty run of the loop is "no process", not "not printed yet"
    assert any(p == (proc.pid,) for _, p, _ in seen)


def test_a_failing_run_of_the_process_list_loop_is_unread_not_empty(tmp_path: Path) -> None:
    telemetry = SmiTelemetry(LocalHost(state_dir=str(tmp_path)), [0], apps_loops=1)
    text = ["Failed to initialize NVML: Driver/library version mismatch", "NVML library version: 580.159"]
    failed = telemetry._apps_reading(1.0, "tunedash-apps-end 18", text, [])
    assert failed.processes is None
    assert "version mismatch" in failed.reason
    empty = telemetry._apps_reading(2.0, "tunedash-apps-end 0", [], [])
    assert empty.processes == () and empty.started_at == 2.0


class Repeating:
    """A telemetry source that yields the same not-yet-free snapshot `count` times, as fast as asked."""

    source = "test"

    def __init__(self, snapshot: GpuSnapshot, count: int) -> None:
        self.snapshot = snapshot
        self.count = count

    async def sample(self) -> GpuSnapshot:
        return self.snapshot

    async def stream(self, period_ms: int = 1000):  # type: ignore[no-untyped-def]
        for _ in range(self.count):
            yield self.snapshot
            await asyncio.sleep(0)

    async def close(self) -> None:
        pass


async def test_progress_reaches_the_listener_on_change_not_per_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "PROGRESS_EVERY_S", 3600.0)
    held = GpuSnapshot(gpus=(), taken_at=0.0)
    told: list[FreeVerdict] = []
    source = release.ReleaseSampler(Repeating(held, 50), 1, "test", owned=False)
    watch = release.FreeWatch(source, FreeCheck((0,)), lambda verdict, _snapshot: told.append(verdict))
    await asyncio.wait_for(watch._task, 10)
    assert watch.samples == 50
    assert len(told) == 1  # the same verdict fifty times is told once
