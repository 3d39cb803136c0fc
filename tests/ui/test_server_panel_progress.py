"""The Server panel's progress block (issue 20 item 3): the bar, the phase, the ETA and where it comes from while a
launch runs; nothing once none does. The core computes it (app.core.server.progress); the panel only draws."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Static

from app.core.data import ServerState
from app.core.server.progress import PhasePlan, progress_at
from app.tui.progress_view import progress_view
from widgets.server_panel import ProgressView, ServerPanel, ServerView, progress_bar, progress_text


class Host(App[None]):
    def __init__(self, panel: ServerPanel) -> None:
        super().__init__()
        self.panel = panel

    def compose(self) -> ComposeResult:
        yield self.panel


def test_progress_text_with_and_without_a_plan() -> None:
    view = ProgressView("relaunch", "capture", 15, 0.6, 10, 0, "the last relaunch of this config (weights from the "
                        "cache), 2 min ago", (("kill", "done"), ("capture", "now"), ("warmup", "next")))
    text = progress_text(view)
    assert text.splitlines()[0] == f"{progress_bar(0.6)}  60%  capture  ETA 10s"
    assert "✓kill ▸capture ·warmup" in text and "ETA from the last relaunch of this config" in text
    bare = progress_text(ProgressView("launch", "load", 4, basis="no earlier launch of this config on record"))
    assert bare.startswith("launch: load, 4s (no ETA yet)")
    assert progress_text(None) == ""
    assert progress_bar(0.0) == "░" * 24 and progress_bar(1.5) == "█" * 24


def test_the_core_progress_becomes_the_panels_view_in_whole_seconds() -> None:
    plan = PhasePlan({"kill": 0.0, "start": 1.0, "capture": 10.0}, 25.0, "the last relaunch of this config")
    marks = {"BEGIN": 0.0, "KILLING": 0.0, "LAUNCHING": 1.0, "CAPTURING": 10.0}
    view = progress_view(progress_at("relaunch", "warm", marks, plan, now=12.4))
    assert view is not None and view.elapsed_s == 12 and view.eta_s == 13 and view.phase == "capture"
    done = progress_at("relaunch", "warm", {**marks, "READY": 24.0}, plan, now=30.0)
    assert progress_view(done) is None and progress_view(None) is None


async def test_panel_shows_the_bar_while_a_launch_runs_and_hides_it_after() -> None:
    panel = ServerPanel()
    async with Host(panel).run_test(size=(90, 30)) as pilot:
        progress = ProgressView("relaunch", "load", 3, 0.2, 20, 0, "the last relaunch of this config",
                                (("kill", "done"), ("load", "now")))
        panel.update(ServerView(ServerState.LOADING, since=1000.0, progress=progress), now=1003.0)
        await pilot.pause()
        block = panel.query_one(".server-progress", Static)
        assert not block.has_class("-empty") and "ETA 20s" in str(block.render())
        panel.update(ServerView(ServerState.READY, since=1020.0), now=1021.0)
        await pilot.pause()
        assert panel.query_one(".server-progress", Static).has_class("-empty")
