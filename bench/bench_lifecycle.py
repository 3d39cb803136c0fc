"""Benchmarks of the kill -> free -> relaunch loop on the simulated host (issue 3).

1. Confirm-free latency: time from the simulated driver's actual release of the last allocation
   (released.jsonl `released_at`) to tunedash declaring FREE, median of N kill cycles, against the
   manual habit `kill PID; sleep 3; nvidia-smi` measured in the same run (its "free" moment is the kill
   plus 3 s plus one nvidia-smi call, and only if the memory was already released by then).
2. Relaunch overhead: relaunch wall time minus what the server and the driver take themselves
   (SIGTERM -> group gone, group gone -> driver release, spawned -> ready line), median of N. What is
   left is tunedash's own: signalling, noticing the release, spawning, noticing the ready line.

Run: .venv/bin/python bench/bench_lifecycle.py [--cycles 10]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from app.connect import host_for
from app.core.data import ServerState
from app.core.profiles.loading import resolve_profile
from app.core.server.events import ActionLogged, LifecycleEvent, StateChanged
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.smi import telemetry_for
from app.sim.gpu_state import released_log
from app.sim.host_env import reset_state, sim_environment

READY_STAMP = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3})\] The server is fired up")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ready_line_epoch(log_path: str) -> float:
    for line in Path(log_path).read_text().splitlines():
        match = READY_STAMP.match(line)
        if match:
            return time.mktime(time.strptime(match[1][:19], "%Y-%m-%d %H:%M:%S")) + float("0" + match[1][19:])
    raise RuntimeError(f"no ready line in {log_path}")


@dataclasses.dataclass
class Marks:
    sigterm: float = 0.0
    releasing: float = 0.0
    free: float = 0.0
    ready: float = 0.0
    launched: float = 0.0

    def listener(self, event: LifecycleEvent) -> None:
        if isinstance(event, ActionLogged) and event.text.startswith("SIGTERM"):
            self.sigterm = event.at
        elif isinstance(event, ActionLogged) and event.text.startswith("launched pid"):
            self.launched = event.at  # right after the detached spawn returned
        elif isinstance(event, StateChanged):
            if event.state == ServerState.RELEASING:
                self.releasing = event.at
            elif event.state == ServerState.FREE:
                self.free = event.at
            elif event.state == ServerState.READY:
                self.ready = event.at


def last_release(state: Path, pids: set[int]) -> float:
    times = [r["released_at"] for r in released_log(state) if r["pid"] in pids]
    if not times:
        raise RuntimeError("the driver released nothing for this job")
    return max(times)


def smi_call_seconds(env: dict[str, str]) -> float:
    full = {**os.environ, **env}
    started = time.monotonic()
    subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                   env=full, capture_output=True, check=True)
    return time.monotonic() - started


async def main(cycles: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "sim"
        reset_state(state)
        base = resolve_profile("demo")
        profile = dataclasses.replace(
            base, port=free_port(), sim_state=state,
            env={"TUNEDASH_SIM_STARTUP_S": "1.0", "SGLANG_LOG_MS": "1"},
        )
        host = host_for(profile)
        env = sim_environment(state)
        lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))
        marks = Marks()
        lifecycle.subscribe(marks.listener)
        await lifecycle.launch()
        assert await lifecycle.wait_ready(60) == ServerState.READY

        free_latency, habit_latency, overhead, walls = [], [], [], []
        for cycle in range(cycles):
            record = lifecycle.record
            assert record is not None
            pids = {p.pid for p in await host.processes() if p.pgid == record.pgid}
            started = time.time()
            state_now = await lifecycle.relaunch(profile, ready_timeout_s=60)
            wall = time.time() - started
            assert state_now == ServerState.READY, state_now
            released = last_release(state, pids)
            free_latency.append(marks.free - released)
            habit_free_at = marks.sigterm + 3.0 + smi_call_seconds(env)
            habit_latency.append(habit_free_at - released if habit_free_at >= released else float("nan"))
            new = lifecycle.record
            assert new is not None
            server_own = (
                (marks.releasing - marks.sigterm)  # server shutdown after SIGTERM (includes our group polling)
                + (released - marks.releasing)  # the driver's release delay
                + (ready_line_epoch(new.log_path) - marks.launched)  # server start to its ready line
            )
            overhead.append(wall - server_own)
            walls.append(wall)
            print(f"cycle {cycle + 1}: release->FREE {free_latency[-1] * 1000:6.1f} ms, "
                  f"relaunch {wall:5.2f} s, overhead {overhead[-1] * 1000:6.1f} ms")
        await lifecycle.kill(confirm_free=True)
        await lifecycle.close()

    med_free = statistics.median(free_latency)
    med_habit = statistics.median(habit_latency)
    print()
    print(f"confirm-free latency (driver release -> FREE), median of {cycles}: {med_free * 1000:.1f} ms "
          f"(min {min(free_latency) * 1000:.1f}, max {max(free_latency) * 1000:.1f}); target <= 150 ms")
    print(f"manual habit `kill; sleep 3; nvidia-smi`, same cycles: {med_habit * 1000:.1f} ms after release; "
          f"tunedash is {med_habit / med_free:.0f}x sooner")
    print(f"relaunch overhead (wall - server and driver time), median of {cycles}: "
          f"{statistics.median(overhead) * 1000:.0f} ms (wall median {statistics.median(walls):.2f} s); "
          "target < 500 ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=10)
    asyncio.run(main(parser.parse_args().cycles))
