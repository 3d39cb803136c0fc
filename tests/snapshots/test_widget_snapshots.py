"""Snapshot tests of the widgets with fixed data at 80x24 and 120x40."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.pilot import Pilot

from app.core.data import GpuProcess, GpuSample, Holder, RelaunchMarker, ServerState, ThroughputPoint
from widgets import (
    DiffScreen,
    EventEntry,
    EventLog,
    FlagsPanel,
    GpuPanel,
    ServerPanel,
    ServerView,
    ThroughputChart,
    ToggleRow,
)

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")

NOW = 1000.0  # monotonic clock of the GPU samples and server view
WALL = 1_700_000_000.0  # wall clock of throughput points and events

SAMPLES = [
    GpuSample(
        0,
        "GPU-0",
        "NVIDIA H200",
        81234,
        143771,
        97,
        64,
        612.4,
        (GpuProcess(48921, "python", 40000), GpuProcess(48930, "sglang::scheduler", 41000)),
        taken_at=NOW - 0.1,
    ),
    GpuSample(
        1,
        "GPU-1",
        "NVIDIA H200",
        None,
        143771,
        None,
        61,
        None,
        None,
        unavailable={"memory_used_mib": "[N/A]", "utilization_pct": "[N/A]", "power_w": "[GPU is lost]"},
        taken_at=NOW - 4.0,
    ),
]

TOGGLES = [
    ToggleRow("s", "speculative steps", "--speculative-num-steps", "1", "3"),
    ToggleRow("g", "piecewise CUDA graph", "--enable-piecewise-cuda-graph", None, "true"),
    ToggleRow("o", "overlap schedule", "--disable-overlap-schedule", None, None),
]

POINTS = [ThroughputPoint(WALL - 300 + 2 * i, 180.0 + (i % 7) * 3, "log", accept_len=2.6) for i in range(150)] + [
    ThroughputPoint(WALL - 300 + 5 * i, 150.0 + (i % 5) * 4, "probe") for i in range(60)
]


def fixed_time(at: float) -> str:
    """Seconds after WALL, so snapshots do not depend on the time zone."""
    return f"+{at - WALL:05.1f}s"


class Dashboard(App[None]):
    """All panels laid out the way the dashboard screen might."""

    CSS = """
    Screen { layout: vertical; }
    #middle { height: auto; }
    #middle > * { width: 1fr; }
    #bottom { height: 1fr; }
    #bottom > * { width: 1fr; }
    """

    def __init__(self, server: ServerView) -> None:
        super().__init__()
        self.server = server

    def compose(self) -> ComposeResult:
        yield GpuPanel()
        with Horizontal(id="middle"):
            yield ServerPanel()
            yield FlagsPanel()
        with Horizontal(id="bottom"):
            yield ThroughputChart(min_interval_s=3600)
            yield EventLog(format_time=fixed_time)

    def on_mount(self) -> None:
        self.query_one(GpuPanel).update(SAMPLES, NOW, period_s=0.25)
        self.query_one(ServerPanel).update(self.server, NOW)
        self.query_one(FlagsPanel).update(TOGGLES)
        self.query_one(ThroughputChart).update(POINTS, WALL, [RelaunchMarker(WALL - 120, "steps 1 -> 3")])
        self.query_one(EventLog).extend(
            [
                EventEntry(WALL + 1.0, "SIGTERM to group 48921", "action"),
                EventEntry(WALL + 3.2, "GPU0 0 MiB, GPU1 0 MiB after 1.2 s", "success"),
                EventEntry(WALL + 44.5, "ready after 41.3 s", "success"),
                EventEntry(WALL + 44.6, "piecewise CUDA graph disabled: speculative decoding", "warning"),
            ]
        )


READY = ServerView(
    ServerState.READY,
    since=NOW - 123.0,
    pid=48921,
    pgid=48921,
    port=30000,
    uptime_s=3700.0,
    backend="sglang",
    version="0.4.6",
    model="Qwen3-8B",
    phase_times={"weights": 12.1, "kv_cache": 3.0, "cuda_graph": 20.2},
    notices=("piecewise CUDA graph disabled: speculative decoding",),
)

STUCK = ServerView(
    ServerState.STUCK,
    since=NOW - 30.0,
    holders=(Holder(0, 48930, "sglang::scheduler", 41000), Holder(1, 48931, "sglang::scheduler", None)),
)


async def draw_chart(pilot: Pilot[Any]) -> None:
    await pilot.pause()
    pilot.app.query_one(ThroughputChart).replot()
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_dashboard_ready(snap_compare: Callable[..., bool], size: tuple[int, int]) -> None:
    assert snap_compare(Dashboard(READY), terminal_size=size, run_before=draw_chart)


def test_dashboard_stuck(snap_compare: Callable[..., bool]) -> None:
    assert snap_compare(Dashboard(STUCK), terminal_size=(120, 40), run_before=draw_chart)


def test_diff_screen(snap_compare: Callable[..., bool]) -> None:
    running = ["python", "-m", "sglang.launch_server", "--speculative-num-steps", "1", "--enable-piecewise-cuda-graph"]
    pending = ["python", "-m", "sglang.launch_server", "--speculative-num-steps", "3", "--disable-overlap-schedule"]

    async def open_diff(pilot: Pilot[Any]) -> None:
        await pilot.pause()
        pilot.app.push_screen(DiffScreen(running, pending))
        await pilot.pause()

    assert snap_compare(Dashboard(READY), terminal_size=(80, 24), run_before=open_diff)
