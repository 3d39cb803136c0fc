"""Pilot tests of the dashboard panels: GPU, server, flags, event log and throughput chart."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from app.core.data import (
    GpuProcess,
    GpuSample,
    GpuSnapshot,
    Holder,
    RelaunchMarker,
    ServerState,
    TelemetryError,
    ThroughputPoint,
)
from widgets import (
    EventEntry,
    EventLog,
    FlagsPanel,
    GpuPanel,
    ServerPanel,
    ServerView,
    ThroughputChart,
    ToggleRow,
)
from widgets.gpu_panel import GpuRow, MemoryBar
from widgets.throughput_chart import downsample


class Host(App[None]):
    """A tiny app holding one widget."""

    def __init__(self, widget: Widget) -> None:
        super().__init__()
        self.widget = widget
        self.seen: list[Message] = []

    def compose(self) -> ComposeResult:
        yield self.widget


def unique(messages: list[Message], kind: type[Message]) -> list[Message]:
    """Messages of one kind, each once (the hook sees a message at every step it bubbles)."""
    out: list[Message] = []
    for message in messages:
        if isinstance(message, kind) and all(message is not m for m in out):
            out.append(message)
    return out


def text_of(static: Static) -> str:
    return str(static.content)


def gpu(index: int, **kw: object) -> GpuSample:
    values: dict[str, object] = {
        "index": index,
        "uuid": f"GPU-{index}",
        "name": "NVIDIA H200",
        "memory_used_mib": 81234,
        "memory_total_mib": 143771,
        "utilization_pct": 97,
        "temperature_c": 64,
        "power_w": 612.4,
        "processes": (GpuProcess(48921, "python", 81000),),
        "taken_at": 100.0,
    }
    values.update(kw)
    return GpuSample(**values)  # type: ignore[arg-type]


async def test_gpu_panel_shows_values_and_processes() -> None:
    panel = GpuPanel()
    app = Host(panel)
    async with app.run_test(size=(120, 40)) as pilot:
        panel.update([gpu(0), gpu(1, memory_used_mib=0, processes=())], now=100.1, period_s=0.25)
        await pilot.pause()
        rows = panel.rows
        assert list(rows) == ["GPU-0", "GPU-1"]
        row0 = rows["GPU-0"]
        assert text_of(row0.query_one(".gpu-memory", Static)) == "81234/143771 MiB"
        assert text_of(row0.query_one(".gpu-util", Static)) == "97%"
        assert text_of(row0.query_one(".gpu-temp", Static)) == "64°C"
        assert text_of(row0.query_one(".gpu-power", Static)) == "612W"
        assert text_of(row0.query_one(".gpu-procs", Static)) == "48921 python 81000 MiB"
        assert text_of(rows["GPU-1"].query_one(".gpu-procs", Static)) == "no processes"
        # A real 0 MiB is shown as 0, with an empty bar.
        assert text_of(rows["GPU-1"].query_one(".gpu-memory", Static)) == "0/143771 MiB"
        assert rows["GPU-1"].query_one(MemoryBar).fraction == 0.0


async def test_unavailable_values_show_na_with_reason_never_zero() -> None:
    panel = GpuPanel()
    app = Host(panel)
    sample = gpu(
        0,
        memory_used_mib=None,
        utilization_pct=None,
        power_w=None,
        processes=None,
        unavailable={
            "memory_used_mib": "[N/A]",
            "utilization_pct": "NVMLError_NotSupported",
            "power_w": "[GPU is lost]",
            "processes": "permission denied",
        },
    )
    async with app.run_test(size=(80, 24)) as pilot:
        panel.update([sample], now=100.0)
        await pilot.pause()
        row = panel.rows["GPU-0"]
        util = row.query_one(".gpu-util", Static)
        power = row.query_one(".gpu-power", Static)
        memory = row.query_one(".gpu-memory", Static)
        procs = row.query_one(".gpu-procs", Static)
        assert text_of(util) == "n/a"
        assert util.tooltip == "utilization_pct: NVMLError_NotSupported"
        assert text_of(power) == "n/a"
        assert "[GPU is lost]" in str(power.tooltip)
        assert text_of(memory) == "n/a/143771 MiB"
        assert "[N/A]" in str(memory.tooltip)
        assert text_of(procs) == "processes: n/a"
        assert procs.tooltip == "processes: permission denied"
        for cell in (util, power, memory):
            assert "0" not in text_of(cell).split("/")[0]
        assert row.query_one(MemoryBar).fraction is None
        assert "n/a" in str(row.query_one(MemoryBar).render())


async def test_stale_rows_are_marked_with_their_age() -> None:
    panel = GpuPanel()
    app = Host(panel)
    async with app.run_test(size=(80, 24)) as pilot:
        panel.update([gpu(0, taken_at=100.0), gpu(1, taken_at=96.0)], now=100.2, period_s=1.0)
        await pilot.pause()
        fresh, stale = panel.rows["GPU-0"], panel.rows["GPU-1"]
        assert not fresh.has_class("-stale")
        assert text_of(fresh.query_one(".gpu-age", Static)) == ""
        assert stale.has_class("-stale")
        assert text_of(stale.query_one(".gpu-age", Static)) == "stale 4.2s"
        # Time passes without new samples: both go stale.
        panel.update([], now=103.0, period_s=1.0)
        await pilot.pause()
        assert fresh.has_class("-stale")
        assert text_of(fresh.query_one(".gpu-age", Static)) == "stale 3.0s"


async def test_gpu_updates_touch_only_changed_cells_and_keep_rows() -> None:
    panel = GpuPanel()
    app = Host(panel)
    async with app.run_test(size=(120, 40)) as pilot:
        samples = [gpu(i, uuid=f"GPU-{i}") for i in range(8)]
        panel.update(samples, now=100.0, period_s=0.25)
        await pilot.pause()
        rows_before = {uuid: id(row) for uuid, row in panel.rows.items()}
        updated: list[str] = []
        for row in panel.rows.values():
            for static in row.query(Static):
                original = static.update

                def spy(
                    content: object = "", *, _orig: object = original, _row: GpuRow = row, layout: bool = True
                ) -> None:
                    updated.append(_row.uuid)
                    _orig(content, layout=layout)  # type: ignore[operator]

                static.update = spy  # type: ignore[method-assign]
        changed = list(samples)
        changed[3] = gpu(3, utilization_pct=12)
        panel.update(changed, now=100.1, period_s=0.25)
        await pilot.pause()
        assert {uuid: id(row) for uuid, row in panel.rows.items()} == rows_before
        assert updated == ["GPU-3"]
        assert text_of(panel.rows["GPU-3"].query_one(".gpu-util", Static)) == "12%"


async def test_telemetry_error_is_shown_and_rows_kept() -> None:
    panel = GpuPanel()
    app = Host(panel)
    async with app.run_test(size=(80, 24)) as pilot:
        panel.update(GpuSnapshot((gpu(0),), taken_at=100.0), now=100.0)
        await pilot.pause()
        error = TelemetryError("not_found", "nvidia-smi: command not found", 127, "install the NVIDIA driver")
        panel.update(GpuSnapshot((), taken_at=105.0, error=error), now=105.0)
        await pilot.pause()
        assert panel.has_class("-error")
        message = text_of(panel.query_one(".gpu-error", Static))
        assert "nvidia-smi: command not found" in message
        assert "install the NVIDIA driver" in message
        assert panel.rows["GPU-0"].has_class("-stale")


async def test_clicking_a_gpu_row_posts_selected() -> None:
    panel = GpuPanel()
    app = Host(panel)
    async with app.run_test(size=(80, 24), message_hook=app.seen.append) as pilot:
        panel.update([gpu(0), gpu(1)], now=100.0)
        await pilot.pause()
        await pilot.click(panel.rows["GPU-1"].query_one(".gpu-name"))
        await pilot.pause()
        selected = unique(app.seen, GpuPanel.Selected)
        assert [(m.index, m.uuid) for m in selected] == [(1, "GPU-1")]  # type: ignore[attr-defined]


async def test_selected_gpu_row_is_highlighted_until_its_gpu_goes() -> None:
    panel = GpuPanel()
    async with Host(panel).run_test(size=(80, 24)) as pilot:
        panel.update([gpu(0), gpu(1)], now=100.0)
        await pilot.pause()
        panel.select("GPU-1")
        assert panel.selected == "GPU-1"
        assert [r.has_class("-selected") for r in panel.rows.values()] == [False, True]
        panel.update([gpu(0), gpu(1), gpu(2)], now=101.0)  # a GPU appears: rows remount, the selection stays
        await pilot.pause()
        assert [r.has_class("-selected") for r in panel.rows.values()] == [False, True, False]
        panel.update([gpu(0)], now=102.0)  # the selected GPU is gone: nothing is selected
        await pilot.pause()
        assert panel.selected is None and not panel.rows["GPU-0"].has_class("-selected")
        panel.select("GPU-9")  # not shown: nothing is selected
        assert panel.selected is None


async def test_server_panel_states() -> None:
    panel = ServerPanel()
    app = Host(panel)
    async with app.run_test(size=(80, 24)) as pilot:
        view = ServerView(
            ServerState.READY,
            since=1000.0,
            pid=48921,
            pgid=48921,
            port=30000,
            uptime_s=62.0,
            backend="sglang",
            version="0.4.6",
            phase_times={"weights": 12.1, "cuda_graph": 20.2},
            notices=("n1", "n2", "n3", "piecewise CUDA graph disabled: speculative decoding"),
        )
        panel.update(view, now=1123.0)
        await pilot.pause()
        state = panel.query_one(".server-state", Static)
        assert text_of(state) == "READY for 2m03s"
        assert state.has_class("-good")
        identity = text_of(panel.query_one(".server-identity", Static))
        assert "pid 48921/48921" in identity
        assert "port 30000" in identity
        assert "sglang 0.4.6" in identity
        assert "up 1m02s" in identity
        assert "weights 12.1s" in text_of(panel.query_one(".server-phases", Static))
        notices = text_of(panel.query_one(".server-notices", Static))
        assert "n1" not in notices
        assert "piecewise CUDA graph disabled" in notices
        assert panel.query_one(".server-fatal").has_class("-empty")
        panel.tick(1124.0)
        assert text_of(state) == "READY for 2m04s"

        crashed = ServerView(
            ServerState.CRASHED,
            since=2000.0,
            fatal="torch.OutOfMemoryError: CUDA out of memory",
            last_lines=("line a", "line b"),
        )
        panel.update(crashed, now=2001.0)
        await pilot.pause()
        assert state.has_class("-bad")
        assert "OutOfMemoryError" in text_of(panel.query_one(".server-fatal", Static))
        assert text_of(panel.query_one(".server-lines", Static)) == "line a\nline b"
        assert "no process" in text_of(panel.query_one(".server-identity", Static))  # not "pid n/a/n/a"

        stuck = ServerView(ServerState.STUCK, since=3000.0, holders=(Holder(0, 777, "python", 512),))
        panel.update(stuck, now=3010.0)
        await pilot.pause()
        assert "GPU0  777 python  512 MiB" in text_of(panel.query_one(".server-holders", Static))
        assert panel.query_one(".server-fatal").has_class("-empty")


async def test_server_panel_shows_the_page_cache_line() -> None:
    panel = ServerPanel()
    app = Host(panel)
    async with app.run_test(size=(80, 24)) as pilot:
        line = "weights: 5.4 GiB of 54.0 GiB in the page cache (10%, 11 files)"
        panel.update(ServerView(ServerState.STOPPED, since=1000.0, page_cache=line), now=1001.0)
        await pilot.pause()
        assert text_of(panel.query_one(".server-pagecache", Static)) == line
        panel.update(ServerView(ServerState.STOPPED, since=1000.0), now=1002.0)  # a hub model: no line
        await pilot.pause()
        assert panel.query_one(".server-pagecache").has_class("-empty")


def toggles(steps_pending: str = "3") -> list[ToggleRow]:
    return [
        ToggleRow("s", "spec steps", "--speculative-num-steps", "1", steps_pending),
        ToggleRow("g", "piecewise graph", "--enable-piecewise-cuda-graph", None, None),
    ]


async def test_flags_panel_highlights_pending() -> None:
    panel = FlagsPanel()
    app = Host(panel)
    async with app.run_test(size=(80, 24), message_hook=app.seen.append) as pilot:
        panel.update(toggles())
        await pilot.pause()
        rows = list(panel.query("FlagRow"))
        assert rows[0].has_class("-pending")
        assert not rows[1].has_class("-pending")
        assert text_of(rows[0].query_one(".flag-pending", Static)) == " → 3"
        assert text_of(rows[0].query_one(".flag-key", Static)) == "[s]"
        assert text_of(rows[1].query_one(".flag-running", Static)) == "off"
        assert panel.pending_count == 1
        assert "1 pending" in str(panel.border_subtitle)
        # Same flags: rows are updated in place, not re-mounted.
        panel.update(toggles(steps_pending="1"))
        await pilot.pause()
        assert list(panel.query("FlagRow")) == rows
        assert not rows[0].has_class("-pending")
        assert panel.pending_count == 0
        await pilot.click(rows[1])
        await pilot.pause()
        requested = unique(app.seen, FlagsPanel.ToggleRequested)
        assert [(m.key, m.flag) for m in requested] == [  # type: ignore[attr-defined]
            ("g", "--enable-piecewise-cuda-graph")
        ]


async def test_event_log_keeps_entries_and_exports() -> None:
    log = EventLog(format_time=lambda at: f"t{at:.0f}", export_format_time=lambda at: f"T{at:.0f}")
    log.add(EventEntry(1.0, "SIGTERM to group 48921", "action"))
    app = Host(log)
    async with app.run_test(size=(80, 24)) as pilot:
        log.extend(
            [
                EventEntry(2.0, "GPU0 0 MiB, GPU1 0 MiB after 1.2 s", "success"),
                EventEntry(3.0, "ready after 41.3 s", "success"),
                EventEntry(4.0, "piecewise CUDA graph disabled: speculative decoding", "warning"),
            ]
        )
        await pilot.pause()
        assert len(log.entries) == 4
        shown = "\n".join(line.text for line in log.lines)
        assert "t1 SIGTERM to group 48921" in shown
        assert "t4 ! piecewise CUDA graph disabled" in shown  # a warning says so without colour too
        exported = log.export_text()
        assert exported.splitlines()[0] == "T1  action   SIGTERM to group 48921"
        assert exported.count("\n") == 4
        assert "ready after 41.3 s" in exported


async def test_event_log_caps_entries() -> None:
    log = EventLog(max_entries=3)
    app = Host(log)
    async with app.run_test() as pilot:
        log.extend(EventEntry(float(i), f"event {i}") for i in range(5))
        await pilot.pause()
        assert [e.text for e in log.entries] == ["event 2", "event 3", "event 4"]


def test_downsample_averages_into_buckets() -> None:
    points = [(float(x), float(x)) for x in range(100)]
    out = downsample(points, 0.0, 100.0, 10)
    assert len(out) == 10
    assert out[0] == (4.5, 4.5)
    assert downsample(points, 0.0, 100.0, 0) == []
    assert downsample([(200.0, 1.0)], 0.0, 100.0, 10) == []


async def test_chart_replots_only_on_new_data_and_throttled() -> None:
    chart = ThroughputChart(window_s=300.0, min_interval_s=0.2)
    app = Host(chart)
    points = [ThroughputPoint(1000.0 + i, 100.0 + i, "log", accept_len=2.5) for i in range(100)]
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        assert chart.replot_count == 0  # nothing arrived: nothing drawn
        for _ in range(5):  # a burst of updates inside one interval
            chart.update(points, now=1100.0, markers=[RelaunchMarker(1050.0, "steps 1 -> 3")])
        assert chart.dirty
        await pilot.pause(0.5)
        assert chart.replot_count == 1
        assert not chart.dirty
        chart.update(points, now=1100.0)  # same data: no redraw
        await pilot.pause(0.5)
        assert chart.replot_count == 1
        chart.update([*points, ThroughputPoint(1100.0, 300.0, "probe")], now=1100.0)
        await pilot.pause(0.5)
        assert chart.replot_count == 2
        rendered = chart.text()
        assert "steps 1 -> 3" in rendered
        assert "probe tok/s" in rendered
        assert "accept len" in rendered


async def test_chart_driven_by_its_owner_replots_only_on_flush_and_throttled() -> None:
    chart = ThroughputChart(window_s=300.0, min_interval_s=2.0, own_timer=False)
    app = Host(chart)
    async with app.run_test(size=(80, 24)) as pilot:
        chart.update([ThroughputPoint(1000.0, 100.0, "probe")], now=1000.0)
        await pilot.pause(0.1)
        assert chart.replot_count == 0 and chart.dirty  # no timer of its own
        assert chart.flush(now=50.0) and chart.replot_count == 1
        assert not chart.flush(now=50.1)  # nothing new
        chart.update([ThroughputPoint(1000.0, 100.0, "probe"), ThroughputPoint(1001.0, 90.0, "probe")], now=1001.0)
        assert not chart.flush(now=chart._last_replot + 1.0)  # too soon: stays dirty
        assert chart.dirty
        assert chart.flush(now=chart._last_replot + 2.0) and chart.replot_count == 2
        assert "probe tok/s" in chart.text()


async def test_chart_waits_while_a_modal_covers_it() -> None:
    from widgets import ErrorModal

    chart = ThroughputChart(min_interval_s=0.1)
    app = Host(chart)
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(ErrorModal("x", "y"))
        await pilot.pause()
        chart.update([ThroughputPoint(1000.0, 100.0, "log")], now=1000.0)
        await pilot.pause(0.3)
        assert chart.replot_count == 0
        app.pop_screen()
        await pilot.pause(0.3)
        assert chart.replot_count == 1
