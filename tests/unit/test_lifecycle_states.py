"""The server state machine on an in-memory host: the log moves a launch to READY, a death while starting is
CRASHED with the telling fatal event, a kill escalates SIGTERM -> SIGKILL and ends FREE or STUCK, and launch
refuses a taken port, held GPUs and a server that already runs. No process is started."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from app.core.data import GpuProcess, GpuSnapshot, Holder, ServerState, TelemetryError
from app.core.errors import Reason
from app.core.profiles.loading import parse_profile
from app.core.profiles.types import Profile
from app.core.server.events import ActionLogged, StateChanged
from app.core.server.jobs import job_path
from app.core.server.lifecycle import ServerLifecycle
from app.core.server.preflight import LaunchRefused
from app.core.server.release import FreeProgress
from tests.fakes import InMemoryHost, ScriptedTelemetry, gpu_reading
from tests.helpers import DATA, free_port, until

LOGS = DATA / "logs"
STARTUP = (LOGS / "sglang_0510_startup.log").read_text().splitlines()  # a real SGLang 0.5.10 startup
CRASH = (LOGS / "sglang_crash_loading.log").read_text().splitlines()  # OOM while loading, then its echo
IDLE = gpu_reading({0: 0, 1: 0})
HOLDER = GpuProcess(4242, "python", 30000)
HELD = gpu_reading({0: 30500, 1: 0}, {0: [HOLDER]})


@pytest.fixture
def profile(tmp_path: Path) -> Profile:
    # A closed port: the /health check after READY is refused at once (nothing listens, nothing is started).
    text = f'name = "lc"\nhost = "local"\nbackend = "sglang"\nmodel = "m"\nport = {free_port()}\ngpus = [0, 1]\n'
    return parse_profile(text, tmp_path / "lc.toml")


@pytest.fixture
def host() -> InMemoryHost:
    return InMemoryHost()


Seen = list[object]
MakeLifecycle = Callable[..., tuple[ServerLifecycle, Seen]]


@pytest.fixture
async def make_lifecycle(host: InMemoryHost, profile: Profile) -> AsyncIterator[MakeLifecycle]:
    """A ServerLifecycle on the in-memory host with short grace and timeouts, and the events it sends."""
    made: list[ServerLifecycle] = []

    def make(telemetry: ScriptedTelemetry | None = None, **options: float) -> tuple[ServerLifecycle, Seen]:
        settings = {"grace_s": 0.2, "free_timeout_s": 1.0, "liveness_period_s": 0.02, **options}
        lifecycle = ServerLifecycle(host, profile, telemetry or ScriptedTelemetry(IDLE), **settings)
        seen: Seen = []
        lifecycle.subscribe(seen.append)
        made.append(lifecycle)
        return lifecycle, seen

    yield make
    for lifecycle in made:
        await lifecycle.close()
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:  # the lifecycle's own saves and /health check: let them finish, not leak into the next test
        await asyncio.wait(others, timeout=2.0)


def in_state(lifecycle: ServerLifecycle, state: ServerState) -> Callable[[], bool]:
    return lambda: lifecycle.state == state


def states(seen: Seen) -> list[ServerState]:
    return [e.state for e in seen if isinstance(e, StateChanged)]


def said(seen: Seen) -> list[tuple[str, str]]:
    return [(e.level, e.text) for e in seen if isinstance(e, ActionLogged)]


def first_line(lines: list[str], fragment: str) -> int:
    return next(i for i, line in enumerate(lines) if fragment in line)


# ---- launch -> ready ------------------------------------------------------------------------------
async def test_the_log_moves_a_launch_through_loading_capturing_warming_to_ready(
    make_lifecycle: MakeLifecycle, host: InMemoryHost
) -> None:
    lifecycle, seen = make_lifecycle()
    record = await lifecycle.launch()
    assert lifecycle.state == ServerState.LAUNCHING
    assert host.groups[record.pgid].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    steps = [
        ("Load weight begin", ServerState.LOADING),
        ("Capture cuda graph begin", ServerState.CAPTURING),
        ("Application startup complete", ServerState.WARMING),
        ("The server is fired up and ready to roll!", ServerState.READY),
    ]
    written = 0
    for fragment, state in steps:
        upto = first_line(STARTUP, fragment) + 1
        host.append_log(record.log_path, *STARTUP[written:upto])
        written = upto
        await until(in_state(lifecycle, state), 2.0, str(state), interval=0.005)
    assert states(seen) == [ServerState.LAUNCHING, ServerState.LOADING, ServerState.CAPTURING,
                            ServerState.WARMING, ServerState.READY]
    assert set(lifecycle.phase_times) >= {"start", "load", "capture", "warmup", "ready"}
    assert [n.kind for n in lifecycle.notices][:2] == ["auto_disabled", "auto_adjusted"]
    assert await lifecycle.wait_ready(0.1) == ServerState.READY


# ---- crash ----------------------------------------------------------------------------------------
async def test_a_group_that_dies_while_loading_is_crashed_with_the_highest_ranked_fatal(
    make_lifecycle: MakeLifecycle, host: InMemoryHost
) -> None:
    lifecycle, seen = make_lifecycle()
    record = await lifecycle.launch()
    host.append_log(record.log_path, *CRASH)
    await until(lambda: lifecycle.state == ServerState.LOADING, 2.0, "LOADING", interval=0.005)
    host.exit_group(record.pgid)
    assert await lifecycle.wait_ready(2.0) == ServerState.CRASHED
    assert lifecycle.fatal is not None
    assert lifecycle.fatal.kind == "oom"  # the cause, not the later "child failed" echo
    assert states(seen)[-2:] == [ServerState.LOADING, ServerState.CRASHED]
    level, text = said(seen)[-1]
    assert level == "error" and text.startswith("server crashed while starting: ")
    assert lifecycle.view().crash_detail() == lifecycle.fatal.text
    await until(lambda: '"outcome": "crashed"' in host.files.get(job_path(host, lifecycle.profile), ""),
                2.0, "the crash in the job record", interval=0.005)


# ---- kill -> free / stuck -------------------------------------------------------------------------
async def test_kill_sigterms_the_group_and_is_free_after_two_free_readings(
    make_lifecycle: MakeLifecycle, host: InMemoryHost
) -> None:
    telemetry = ScriptedTelemetry(IDLE, [HELD, HELD, IDLE, HELD, IDLE, IDLE])
    lifecycle, seen = make_lifecycle(telemetry)
    record = await lifecycle.launch()
    verdict = await lifecycle.kill()
    assert host.signals == [(record.pgid, signal.SIGTERM)]
    assert verdict is not None and verdict.confirmed
    assert lifecycle.state == ServerState.FREE and lifecycle.holders == ()
    assert states(seen)[-3:] == [ServerState.KILLING, ServerState.RELEASING, ServerState.FREE]
    progress = [e.verdict for e in seen if isinstance(e, FreeProgress)]
    # Progress is told when the verdict changes (the second HELD repeats the first), and the confirming one.
    assert [v.all_free for v in progress] == [False, True, False, True, True]
    assert [v.confirmed for v in progress] == [False] * 4 + [True]  # two free readings in a row, not one
    assert ("info", f"SIGTERM to group {record.pgid} (1 processes)") in said(seen)


async def test_a_group_that_ignores_sigterm_gets_sigkill_after_the_grace(
    make_lifecycle: MakeLifecycle, host: InMemoryHost
) -> None:
    host.ignored_signals.add(signal.SIGTERM)
    lifecycle, seen = make_lifecycle(grace_s=0.3)
    record = await lifecycle.launch()
    started = time.monotonic()
    await lifecycle.kill()
    assert time.monotonic() - started >= 0.3
    assert host.signals == [(record.pgid, signal.SIGTERM), (record.pgid, signal.SIGKILL)]
    assert not host.groups[record.pgid].alive
    assert any(level == "warning" and text.startswith(f"SIGKILL to group {record.pgid} after")
               for level, text in said(seen))
    assert lifecycle.state == ServerState.FREE


async def test_memory_that_is_never_released_is_stuck_naming_the_holder(
    make_lifecycle: MakeLifecycle, host: InMemoryHost
) -> None:
    lifecycle, seen = make_lifecycle(ScriptedTelemetry(IDLE, [HELD]), free_timeout_s=0.3)
    await lifecycle.launch()
    verdict = await lifecycle.kill()
    assert verdict is not None and not verdict.confirmed
    assert lifecycle.state == ServerState.STUCK
    assert lifecycle.holders == (Holder(0, 4242, "python", 30000),)
    level, text = said(seen)[-1]
    assert level == "error" and text.startswith("GPUs still held after ")
    assert text.endswith("GPU0: pid 4242 python 30000 MiB (owner unknown: its environment cannot be read)")


# ---- preflight refusals ---------------------------------------------------------------------------
async def test_a_taken_port_is_refused_before_anything_starts(
    make_lifecycle: MakeLifecycle, host: InMemoryHost, profile: Profile
) -> None:
    host.taken_ports.add(profile.port)
    lifecycle, seen = make_lifecycle()
    with pytest.raises(LaunchRefused) as refused:
        await lifecycle.launch()
    assert refused.value.reason == Reason.PORT_IN_USE
    assert f"port {profile.port}" in str(refused.value) and str(profile.source) in str(refused.value)
    assert host.groups == {} and lifecycle.state == ServerState.STOPPED and states(seen) == []


async def test_held_gpus_are_refused_naming_who_holds_them(
    make_lifecycle: MakeLifecycle, host: InMemoryHost
) -> None:
    lifecycle, _ = make_lifecycle(ScriptedTelemetry(HELD))
    with pytest.raises(LaunchRefused) as refused:
        await lifecycle.launch()
    assert refused.value.reason == Reason.GPUS_HELD
    assert refused.value.holders == (Holder(0, 4242, "python", 30000),)
    assert "GPU0: pid 4242 python 30000 MiB" in str(refused.value)
    assert host.groups == {}


async def test_unreadable_gpus_are_refused_with_the_tools_message(
    make_lifecycle: MakeLifecycle, host: InMemoryHost
) -> None:
    error = TelemetryError("driver", "Failed to initialize NVML: Driver/library version mismatch", 18, "Reboot.")
    lifecycle, _ = make_lifecycle(ScriptedTelemetry(GpuSnapshot(gpus=(), taken_at=0.0, error=error)))
    with pytest.raises(LaunchRefused) as refused:
        await lifecycle.launch()
    assert refused.value.reason == Reason.GPUS_UNREADABLE
    assert "Driver/library version mismatch (Reboot.)" in str(refused.value)
    assert host.groups == {}


async def test_a_second_launch_of_a_running_profile_is_refused(
    make_lifecycle: MakeLifecycle, host: InMemoryHost
) -> None:
    first, _ = make_lifecycle()
    record = await first.launch()
    second, _ = make_lifecycle()  # another tunedash process: it knows the server from the job record
    with pytest.raises(LaunchRefused) as refused:
        await second.launch()
    assert refused.value.reason == Reason.ALREADY_RUNNING
    assert f"pid {record.pid}" in str(refused.value)
    assert list(host.groups) == [record.pgid]
