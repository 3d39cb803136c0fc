"""The GPU panel and the chart take the data the Session announced: nobody outside them diffs what changed.

The panel takes each new sample as its `snapshot` reactive and shows it at its next tick (its own timer, or its
owner's); at the dashboard's tick (stopped here and called by hand) its chart follows the series when a
ThroughputAdded said it grew (never polling the Session), and its GPU panel shows the sample a GpuSampled announced
(a one-slot mailbox: the newest sample told of, never the Session's own field)."""

from __future__ import annotations

import time

from textual.app import App, ComposeResult
from textual.screen import Screen

from app.core.data import GpuSample, GpuSnapshot, ThroughputPoint
from app.core.profiles.types import Profile
from app.core.server.events import GpuSampled, ThroughputAdded
from app.tui.app import create_app
from tests.helpers import pilot_until
from widgets import GpuPanel, ThroughputChart


def snapshot(used: int) -> GpuSnapshot:
    now = time.monotonic()
    return GpuSnapshot((GpuSample(0, "GPU-a", "H200", used, 143771, taken_at=now),), taken_at=now)


class PanelApp(App[None]):
    def compose(self) -> ComposeResult:
        yield GpuPanel(min_interval_s=0.5, period_s=0.25)


async def test_the_panel_shows_its_snapshot_at_most_every_interval_and_not_while_hidden() -> None:
    app = PanelApp()
    async with app.run_test() as pilot:
        panel = app.query_one(GpuPanel)
        panel.snapshot = first = snapshot(100)
        assert not panel.rows  # not at once: at the panel's next tick
        await pilot_until(pilot, lambda: bool(panel.rows), timeout=5, what="the first sample at the panel's tick")
        assert list(panel.rows) == ["GPU-a"] and panel.rows["GPU-a"]._sample is first.gpus[0]
        panel.snapshot = second = snapshot(200)  # waits for the panel's next tick
        assert panel.rows["GPU-a"]._sample is first.gpus[0]
        await pilot_until(pilot, lambda: panel.rows["GPU-a"]._sample is second.gpus[0], timeout=5,
                          what="the second sample at the panel's next tick")
        app.push_screen(Screen())  # a screen over the panel's
        await pilot.pause()
        panel.snapshot = snapshot(300)
        await pilot.pause(1.2)  # two of the panel's ticks while hidden: nothing drawn
        assert panel.rows["GPU-a"]._sample is second.gpus[0]
        app.pop_screen()
        await pilot_until(pilot, lambda: panel.rows["GPU-a"]._sample.memory_used_mib == 300, timeout=5,
                          what="the newest sample once the panel is in front again")


async def test_the_dashboard_follows_session_events(profile: Profile) -> None:
    app = create_app(profile)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        await pilot_until(pilot, lambda: bool(screen.query(GpuPanel)), what="the dashboard")
        for timer in list(screen._timers):  # the dashboard's own tick (refresh_view) and page-cache reads
            timer.stop()
        session = app.session
        await pilot_until(pilot, lambda: session._telemetry_task is not None, what="the GPU sampler")
        assert session._telemetry_task is not None
        session._telemetry_task.cancel()  # only the samples this test announces
        panel, chart = screen.query_one(GpuPanel), screen.query_one(ThroughputChart)
        sample, unannounced = snapshot(4242), snapshot(1)
        session.snapshot = sample
        session._on_lifecycle(GpuSampled(sample))
        session.snapshot = unannounced  # a sample nobody announced: the tick shows the one it was told of
        await pilot.pause(0.3)
        assert panel.snapshot is not sample  # nothing until the dashboard's tick
        screen._tick()
        assert panel.snapshot is sample and panel.rows["GPU-a"]._sample is sample.gpus[0]
        screen._tick()  # the mailbox was emptied: the panel keeps the sample it was told of
        assert panel.snapshot is sample
        point = ThroughputPoint(time.time(), 123.0, "probe")
        session.throughput.append(point)
        session._on_lifecycle(ThroughputAdded(point))
        await pilot.pause(0.3)
        assert chart._points[-1:] != (point,)  # nothing until the dashboard's tick
        screen.refresh_view(whole=True)  # the tick that starts a second
        assert chart._points[-1:] == (point,)
        session.throughput.append(ThroughputPoint(time.time(), 1.0, "probe"))  # a point nobody announced
        screen.refresh_view(whole=True)
        assert chart._points[-1] == point  # the chart takes what it was told of, it does not poll the Session
