"""Dashboard benchmarks: CPU time of the dashboard process per minute, and key press to screen change.

Run: .venv/bin/python bench/bench_dashboard.py [--seconds 60] [--presses 50]

Both run the real app headless (App.run_test) against the simulated host on a private state folder and
a free port, with 8 simulated GPUs sampled at 4 Hz (the fake nvidia-smi), the server READY and the probe
streaming into the visible chart.

(a) CPU: the dashboard process's own user+sys time (resource.getrusage RUSAGE_SELF: not the detached
    server, not the nvidia-smi children, which are printed apart) over the window, scaled to one minute.
    Baseline measured in the same run: the same app with GPU sampling and the probe off. Target <= 3 s/min.
(b) Latency: `s` pressed -> the Flags panel shows the new pending value and the screen has refreshed,
    over N presses; p50/p95. Baseline: an unbound key, same round trip. Target p95 <= 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.connect import host_for
from app.core.model import GpuSnapshot, ServerState
from app.core.profile import Profile, load_profile
from app.core.session import Session
from app.sim.host_env import reset_state
from app.tui.app import TunedashApp
from widgets import FlagsPanel

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_profile(folder: Path) -> Profile:
    state = folder / "sim"
    reset_state(state, gpu_count=8)
    path = folder / "bench.toml"
    path.write_text(
        f'name = "bench"\nhost = "sim"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\nport = {free_port()}\n'
        f'gpus = [0, 1, 2, 3, 4, 5, 6, 7]\nsim_state = "{state}"\nenv = {{ TUNEDASH_SIM_STARTUP_S = "0.5" }}\n'
        "[flags]\ntp-size = 8\nspeculative-algorithm = \"NEXTN\"\nspeculative-num-steps = 1\n"
        "speculative-eagle-topk = 1\nspeculative-num-draft-tokens = 2\ndecode-log-interval = 40\n"
    )
    return load_profile(path)


class NoSampling:
    """Telemetry that never samples (the baseline's GPU source)."""

    async def sample(self) -> GpuSnapshot:
        return GpuSnapshot((), time.monotonic())

    async def stream(self, period_ms: int = 1000) -> AsyncIterator[GpuSnapshot]:
        await asyncio.Event().wait()
        yield GpuSnapshot((), time.monotonic())

    async def close(self) -> None:
        return None


def cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


async def measure_cpu(profile: Profile, seconds: float, sampling: bool) -> tuple[float, float, int]:
    """(dashboard CPU s/min, children CPU s/min, chart replots) with the server READY."""
    host = host_for(profile)
    session = Session(host, profile, probe=sampling, autolaunch=False,
                      telemetry=None if sampling else NoSampling())  # type: ignore[arg-type]
    app = TunedashApp(session, keymap_file=None)
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 60
        while session.lifecycle.state != ServerState.READY and time.monotonic() < deadline:
            await pilot.pause(0.1)
        assert session.lifecycle.state == ServerState.READY, "the simulated server did not become ready"
        await pilot.pause(2.0)  # the probe's first points, the chart's first replot
        chart = app.query_one("#chart")
        replots0 = chart.replot_count  # type: ignore[attr-defined]
        self0, kids0 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN)
        await asyncio.sleep(seconds)
        self1, kids1 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN)
        replots = chart.replot_count - replots0  # type: ignore[attr-defined]
        await app.session.stop()
    scale = 60.0 / seconds
    return (self1 - self0) * scale, (kids1 - kids0) * scale, replots


async def measure_keys(profile: Profile, presses: int) -> tuple[list[float], list[float]]:
    """Milliseconds from pressing `s` to the new pending value on the refreshed screen; and an unbound key."""
    session = Session(host_for(profile), profile, telemetry=NoSampling())  # type: ignore[arg-type]
    app = TunedashApp(session, keymap_file=None)
    toggle_ms: list[float] = []
    idle_ms: list[float] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)
        panel = app.query_one(FlagsPanel)
        for _ in range(presses):
            before = next(r.pending for r in panel.rows if r.key == "s")
            started = time.perf_counter()
            await pilot.press("s")
            while next(r.pending for r in panel.rows if r.key == "s") == before:
                await pilot.pause(0)
            await pilot.pause()  # the screen refresh that draws it
            toggle_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await pilot.press("z")
            await pilot.pause()
            idle_ms.append((time.perf_counter() - started) * 1000)
        await app.session.stop()
    return toggle_ms, idle_ms


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 2 else values[0]


def kill_launched(state: Path) -> None:
    for record_file in (state / "host" / "jobs").glob("*.json"):
        try:
            os.killpg(json.loads(record_file.read_text())["pgid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError, KeyError, ValueError):
            pass


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=60.0, help="CPU measurement window per variant")
    parser.add_argument("--presses", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tunedash-bench-") as tmp:
        folder = Path(tmp)
        profile = make_profile(folder)
        try:
            from app.core.lifecycle import ServerLifecycle
            from app.core.telemetry import telemetry_for

            host = host_for(profile)
            lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))
            await lifecycle.launch()
            await lifecycle.wait_ready(60)
            await lifecycle.close()

            full, full_kids, replots = await measure_cpu(profile, args.seconds, sampling=True)
            base, base_kids, base_replots = await measure_cpu(profile, args.seconds, sampling=False)
            print(f"(a) dashboard CPU, 8 GPUs at 4 Hz + probe + chart: {full:.2f} s/min "
                  f"(nvidia-smi children {full_kids:.2f} s/min, {replots} chart replots in {args.seconds:.0f} s)")
            print(f"    baseline, same app, no sampling, no probe:      {base:.2f} s/min "
                  f"(children {base_kids:.2f} s/min, {base_replots} replots)")
            print(f"    ratio full/baseline: {full / base if base else float('inf'):.2f}x; target <= 3 s/min: "
                  f"{'met' if full <= 3.0 else 'MISSED'}")

            toggle_ms, idle_ms = await measure_keys(profile, args.presses)
            print(f"(b) `s` -> pending value on screen, {len(toggle_ms)} presses: median "
                  f"{statistics.median(toggle_ms):.1f} ms, p95 {p95(toggle_ms):.1f} ms")
            print(f"    baseline, unbound key round trip:      median {statistics.median(idle_ms):.1f} ms, "
                  f"p95 {p95(idle_ms):.1f} ms")
            print(f"    ratio p95 toggle/baseline: {p95(toggle_ms) / p95(idle_ms):.2f}x; target p95 <= 100 ms: "
                  f"{'met' if p95(toggle_ms) <= 100 else 'MISSED'}")
        finally:
            kill_launched(folder / "sim")


if __name__ == "__main__":
    asyncio.run(main())
