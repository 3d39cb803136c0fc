"""Pilot tests of the modal and full screens: confirm, error, help, diff, log view."""

from __future__ import annotations

from textual.app import App
from textual.screen import Screen
from textual.widgets import Button, DataTable, Input, Static

from app.core.data import FlagChange
from widgets import ConfirmModal, DiffScreen, ErrorModal, HelpScreen, LogViewScreen, argv_to_flags, diff_flags
from widgets.diff_screen import COMMAND_KEY


class Host(App[None]):
    """An empty app that records what pushed screens dismiss with."""

    def __init__(self) -> None:
        super().__init__()
        self.results: list[object] = []

    def open(self, screen: Screen[object]) -> None:
        self.push_screen(screen, callback=self.results.append)


async def confirm_result(*keys: str) -> tuple[list[object], bool]:
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        app.open(ConfirmModal("Kill the server?", "SIGTERM to group 48921"))  # type: ignore[arg-type]
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        focused_no = app.focused is app.screen.query_one("#no", Button)
        await pilot.press(*keys)
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmModal)
        return app.results, focused_no


async def test_confirm_y_is_true() -> None:
    results, focused_no = await confirm_result("y")
    assert results == [True]
    assert focused_no


async def test_confirm_n_and_escape_are_false() -> None:
    assert (await confirm_result("n"))[0] == [False]
    assert (await confirm_result("escape"))[0] == [False]


async def test_confirm_enter_picks_the_safe_choice() -> None:
    assert (await confirm_result("enter"))[0] == [False]


async def test_error_modal_shows_message_and_closes() -> None:
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        app.open(ErrorModal("Launch failed", "port 30000 is in use by pid 4242", "pick another port"))  # type: ignore[arg-type]
        await pilot.pause()
        texts = [str(s.content) for s in app.screen.query(Static)]
        assert "port 30000 is in use by pid 4242" in texts
        assert "pick another port" in texts
        await pilot.press("escape")
        await pilot.pause()
        assert app.results == [None]


async def test_help_lists_bindings() -> None:
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        app.open(HelpScreen([("k", "kill the server"), ("r", "relaunch")]))  # type: ignore[arg-type]
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        assert table.row_count == 2
        assert table.get_row_at(0) == ["k", "kill the server"]
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


RUNNING = [
    "python",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "Qwen/Qwen3-8B",
    "--speculative-num-steps",
    "1",
    "--enable-piecewise-cuda-graph",
    "--cuda-graph-bs",
    "1",
    "2",
    "4",
]
PENDING = [
    "python",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "Qwen/Qwen3-8B",
    "--speculative-num-steps=3",
    "--cuda-graph-bs",
    "1",
    "2",
    "4",
    "--disable-overlap-schedule",
]


def test_argv_to_flags() -> None:
    flags = argv_to_flags(RUNNING)
    assert flags[COMMAND_KEY] == "python -m sglang.launch_server"
    assert flags["--speculative-num-steps"] == "1"
    assert flags["--enable-piecewise-cuda-graph"] == ""
    assert flags["--cuda-graph-bs"] == "1 2 4"


def test_diff_flags_argv_and_dicts() -> None:
    assert diff_flags(RUNNING, PENDING) == [
        FlagChange("--speculative-num-steps", "1", "3"),
        FlagChange("--enable-piecewise-cuda-graph", "", None),
        FlagChange("--disable-overlap-schedule", None, ""),
    ]
    assert [c.kind for c in diff_flags(RUNNING, PENDING)] == ["changed", "removed", "added"]
    assert diff_flags({"--a": "1", "--b": True, "--c": None}, {"--a": "1", "--b": False, "--c": "x"}) == [
        FlagChange("--b", "", None),
        FlagChange("--c", None, "x"),
    ]
    assert diff_flags(RUNNING, list(RUNNING)) == []


async def test_diff_screen_shows_each_change() -> None:
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        app.open(DiffScreen(RUNNING, PENDING))  # type: ignore[arg-type]
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, DiffScreen)
        changed = [str(s.content) for s in screen.query(".diff-changed").results(Static)]
        removed = [str(s.content) for s in screen.query(".diff-removed").results(Static)]
        added = [str(s.content) for s in screen.query(".diff-added").results(Static)]
        assert changed == ["~ --speculative-num-steps 1 -> 3"]
        assert removed == ["- --enable-piecewise-cuda-graph"]
        assert added == ["+ --disable-overlap-schedule"]
        await pilot.press("escape")
        await pilot.pause()
        assert app.results == [None]


async def test_diff_screen_without_changes_says_so() -> None:
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        app.open(DiffScreen({"--tp": "2"}, {"--tp": "2"}))  # type: ignore[arg-type]
        await pilot.pause()
        assert "no changes" in str(app.screen.query_one(".diff-none", Static).content)


LOG = [
    f"[2026-01-01 00:00:{i:02d}] Decode batch. #running-req: 1, gen throughput (token/s): {100 + i}" for i in range(60)
]
LOG[10] = "[2026-01-01 00:00:10] WARNING piecewise CUDA graph disabled"
LOG[40] = "[2026-01-01 00:00:40] warning: deprecated flag --enable-foo"


async def test_log_view_follows_and_searches() -> None:
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = LogViewScreen(LOG[:30])
        app.open(screen)  # type: ignore[arg-type]
        await pilot.pause()
        view = screen.view
        assert screen.follow
        assert view.scroll_offset.y == view.max_scroll_y > 0
        screen.add_lines(LOG[30:])
        await pilot.pause()
        assert len(view.lines) == 60
        assert view.scroll_offset.y == view.max_scroll_y  # still at the end

        await pilot.press("slash")
        await pilot.pause()
        search = screen.query_one("#log-search", Input)
        assert search.has_focus
        await pilot.press(*"WARNING", "enter")
        await pilot.pause()
        assert screen.matches == [10, 40]
        assert screen.current_match == 0
        assert view.current_line == 10
        assert not screen.follow  # searching stops following
        status = str(screen.query_one(".log-status", Static).content)
        assert "1/2 (line 11)" in status
        await pilot.press("n")
        await pilot.pause()
        assert view.current_line == 40
        await pilot.press("n")  # wraps
        await pilot.pause()
        assert view.current_line == 10
        await pilot.press("N")  # wraps backwards
        await pilot.pause()
        assert view.current_line == 40

        # New lines do not move the view while follow is off; f jumps back to the end.
        y = view.scroll_offset.y
        screen.add_lines([f"extra {i}" for i in range(20)])
        await pilot.pause()
        assert view.scroll_offset.y == y
        await pilot.press("f")
        await pilot.pause()
        assert screen.follow
        assert view.scroll_offset.y == view.max_scroll_y

        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, LogViewScreen)


async def test_log_view_search_not_found() -> None:
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = LogViewScreen(LOG)
        app.open(screen)  # type: ignore[arg-type]
        await pilot.pause()
        screen.search("no such text")
        await pilot.pause()
        assert screen.matches == []
        assert "not found" in str(screen.query_one(".log-status", Static).content)


async def test_log_view_keyboard_up_stops_following() -> None:
    app = Host()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = LogViewScreen(LOG)
        app.open(screen)  # type: ignore[arg-type]
        await pilot.pause()
        assert screen.follow
        await pilot.press("pageup")
        await pilot.pause()
        assert not screen.follow
        y = screen.view.scroll_offset.y
        assert y < screen.view.max_scroll_y
        screen.add_lines(["one more"])
        await pilot.pause()
        assert screen.view.scroll_offset.y == y
