"""What a new user sees at 120x40 and 80x24: the footer keeps help, quit, relaunch, kill and the toggles and leaves
whole keys out (each one in help), GPU names use the row's room, the chart's legend covers no data, the acceptance
alarm is in the header in words, a chosen theme is kept for the next start, and NO_COLOR leaves levels readable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable

from app.core.data import GpuSample, RelaunchMarker, ThroughputPoint
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.tui.app import create_app
from tests.helpers import MakeProfile
from tests.ui.ui_flows import screen_text, shows, until
from widgets import EventEntry, EventLog, GpuPanel, HelpScreen, KeyFooter, ThroughputChart
from widgets.gpu_panel import BAR_MIN_W, MemoryBar
from widgets.key_footer import PALETTE_W, key_width

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")


@pytest.fixture
def profile(make_profile: MakeProfile) -> Profile:
    return load_profile(make_profile(startup_s=0.3))


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_footer_keeps_the_keys_a_user_needs_and_help_lists_the_rest(profile: Profile,
                                                                              size: tuple[int, int]) -> None:
    app = create_app(profile, keymap_file=None, theme_file=None)
    async with app.run_test(size=size) as pilot:
        await shows(pilot, app, "STOPPED")
        # the footer is laid out after the first frames: wait for it on the last line, then read that line
        await until(pilot, lambda: "q Quit" in screen_text(app).splitlines()[-1], what="the footer on the last line")
        footer = app.query_one(KeyFooter)
        last_line = screen_text(app).splitlines()[-1]
        for word in ("s steps", "g pcg", "o overlap", "r Relaunch", "k Kill", "q Quit", "^p palette"):
            assert word in last_line, (word, last_line)
        assert footer.left_out, "all keys fit: the help key would not say more are there"
        assert "? All keys" in last_line
        shown = [k for k in footer.query("FooterKey") if not k.has_class("-command-palette")]
        used = sum(key_width(k.key_display, k.description) for k in shown)  # type: ignore[attr-defined]
        assert used <= size[0] - PALETTE_W  # whole keys only: none runs under the palette key
        if size[0] >= 120:
            for word in ("b Bench", "B Baseline", "a A/B", "l Log"):
                assert word in last_line, (word, last_line)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        table = app.screen.query_one(DataTable)
        rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]
        marked = {key.removesuffix(" ·") for key, _ in rows if key.endswith(" ·")}
        keys = {c.action: app.get_key_display(Binding(c.key, c.action)) for c in app.dashboard_commands()}
        assert marked == {keys[action] for action in footer.left_out}  # each key left out is in help, marked
        assert ("?", "Help: Keys") in [tuple(row) for row in rows]  # as the footer writes it, not "question_mark"
        assert "keys marked · have no room in the footer" in screen_text(app)  # the close line says what · means
        bench_row = next(i for i, row in enumerate(rows) if "the profile's" in row[-1] and "bench]" in row[-1])
        table.move_cursor(row=bench_row)  # scrolled into view: at 80x24 the list is longer than the screen
        await until(pilot, lambda: "(the profile's [bench])" in screen_text(app),  # help text is text, not markup
                    what="the bench key's help, its [bench] drawn as text")


async def test_the_footer_lays_out_again_when_the_terminal_narrows(profile: Profile) -> None:
    app = create_app(profile, keymap_file=None, theme_file=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await shows(pilot, app, "B Baseline")
        wide_left_out = list(app.query_one(KeyFooter).left_out)
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: "B Baseline" not in screen_text(app).splitlines()[-1], timeout=5, what="relayout")
        assert "? All keys" in screen_text(app).splitlines()[-1]
        assert len(app.query_one(KeyFooter).left_out) > len(wide_left_out)


class One(App[None]):
    def __init__(self, widget: GpuPanel | ThroughputChart | EventLog) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        yield self.widget


def sample(index: int, name: str) -> GpuSample:
    return GpuSample(index, f"GPU-{index}", name, 44240, 49140, 96, 71, 281.0, (), taken_at=1.0)


@pytest.mark.parametrize("width", [120, 80])
async def test_gpu_names_use_the_room_of_the_row(width: int) -> None:
    panel = GpuPanel()  # outside the dashboard its age cell is 12 cells wide: a stale row's room
    names = ["NVIDIA RTX A6000", "NVIDIA H100 80GB HBM3"] if width >= 120 else ["NVIDIA RTX A6000"] * 2
    async with One(panel).run_test(size=(width, 8)) as pilot:
        panel.update([sample(i, name) for i, name in enumerate(names)], 1.0)
        await pilot.pause()
        await pilot.pause()
        cells = list(panel.query(".gpu-name"))
        # whole, where "0 NVIDIA RTX A6…" was, and as wide as the longest: the bars line up
        assert [str(cell.content) for cell in cells] == [f"{i} {name}" for i, name in enumerate(names)]
        assert cells[0].size.width == cells[1].size.width == max(len(f"1 {name}") for name in names) + 1
        assert [cell.render_line(0).text.rstrip() for cell in cells] == [f"{i} {n}" for i, n in enumerate(names)]
        assert all(bar.size.width >= BAR_MIN_W for bar in panel.query(MemoryBar))


async def test_a_name_longer_than_the_room_is_cut_and_the_bar_keeps_its_cells() -> None:
    panel = GpuPanel()
    async with One(panel).run_test(size=(80, 6)) as pilot:
        panel.update([sample(0, "NVIDIA Some Very Long Future Accelerator Name 141GB HBM3e")], 1.0)
        await pilot.pause()
        await pilot.pause()
        [bar] = panel.query(MemoryBar)
        assert bar.size.width == BAR_MIN_W
        [name] = panel.query(".gpu-name")
        assert name.size.width < len("0 NVIDIA Some Very Long Future Accelerator Name 141GB HBM3e")


async def test_the_chart_legend_sits_on_the_frame_not_over_the_data() -> None:
    chart = ThroughputChart(window_s=60)
    async with One(chart).run_test(size=(72, 16)) as pilot:
        now = 1000.0
        # a fresh chart: data only in the first seconds, high: the top left the legend used to cover
        points = [ThroughputPoint(now - 60 + i, 50.0, "log", 3.0) for i in range(10)]
        points += [ThroughputPoint(now - 60 + i, 49.0, "probe") for i in range(10)]
        chart.update(points, now, [RelaunchMarker(now - 30, "steps 1 -> 3")])
        chart.replot()
        await pilot.pause()
        rows = chart.text().splitlines()
        frame_top = next(i for i, row in enumerate(rows) if "┌" in row)
        assert "⣿ log tok/s ─ ⣿ probe tok/s ─ ⣿ accept len (right)" in rows[frame_top]
        plot_rows = rows[frame_top + 1:]
        assert not any("tok/s" in row or "accept len" in row for row in plot_rows)
        assert any("steps 1 -> 3" in row for row in plot_rows)  # the marker's label is still drawn


async def test_the_legend_shortens_on_a_narrow_chart() -> None:
    chart = ThroughputChart(window_s=60)
    async with One(chart).run_test(size=(38, 10)) as pilot:
        now = 1000.0
        chart.update([ThroughputPoint(now - 5, 40.0, src, 2.0) for src in ("log", "metrics", "probe")], now)
        chart.replot()
        await pilot.pause()
        top = next(row for row in chart.text().splitlines() if "┌" in row)
        assert "⣿ log ─ ⣿ metrics" in top and "tok/s" not in top and top.rstrip().endswith("┐")


async def test_the_acceptance_alarm_is_in_the_header_and_the_event_log_and_clears(profile: Profile) -> None:
    app = create_app(profile, keymap_file=None, theme_file=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await shows(pilot, app, "STOPPED")
        session = app.session
        for i in range(16):  # a decode line every 3 s at accept len 1.08: low for 45 s
            session.observe_acceptance(1000.0 + 3 * i, 1.08, "log")
        await shows(pilot, app, "ACCEPTANCE LOW 1.08 (45 s, 16 lines)", "! acceptance 1.08 over the last 36 s")
        assert any(e.text.startswith("acceptance 1.08 over the last 36 s (13 lines); speculation is not paying")
                   and e.level == "warning" for e in session.events)
        for i in range(16, 30):
            session.observe_acceptance(1000.0 + 3 * i, 2.9, "log")
        await until(pilot, lambda: "ACCEPTANCE LOW" not in app.sub_title, timeout=5, what="the alarm to clear")
        await shows(pilot, app, "acceptance recovered: 2.90")
        said = [e.text for e in session.events if e.text.startswith("acceptance ")]
        assert len(said) == 2  # once per episode, and its end


async def test_a_theme_chosen_is_kept_for_the_next_start(profile: Profile, tmp_path: Path) -> None:
    theme_file = tmp_path / "config" / "theme.toml"
    app = create_app(profile, keymap_file=None, theme_file=theme_file)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.theme == "textual-dark"
        await pilot.press("ctrl+p", *"theme")  # Textual's own Theme command, in the dashboard's palette
        await shows(pilot, app, "Change the current theme")
        await pilot.press("enter")
        await shows(pilot, app, "Search for themes")
        await pilot.press(*"nord", "enter")
        await until(pilot, theme_file.exists, timeout=5, what="the theme file")
        assert app.theme == "nord"
    assert 'theme = "nord"' in theme_file.read_text()
    again = create_app(profile, keymap_file=None, theme_file=theme_file)
    async with again.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert again.theme == "nord"


async def test_a_bad_theme_file_is_named_and_ignored(profile: Profile, tmp_path: Path) -> None:
    theme_file = tmp_path / "theme.toml"
    theme_file.write_text('theme = "no-such-theme"\n')
    app = create_app(profile, keymap_file=None, theme_file=theme_file)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        said = [(n.title, n.message) for n in app._notifications]  # type: ignore[attr-defined]
        assert said == [("theme ignored", f"{theme_file}: unknown theme 'no-such-theme'; ctrl+p, Theme lists them "
                         "(choosing one rewrites this file)")]
        assert app.theme == "textual-dark"


async def test_no_color_leaves_levels_readable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    log = EventLog()
    app = One(log)
    async with app.run_test(size=(80, 8)) as pilot:
        assert app.no_color  # Textual's own NO_COLOR: a monochrome filter over every line
        log.extend([EventEntry(1.0, "ready after 5.8 s"), EventEntry(2.0, "GPUs still held", "warning"),
                    EventEntry(3.0, "launch failed", "error")])
        await pilot.pause()
        lines = [line.text for line in log.lines]
        assert lines[0].endswith(" ready after 5.8 s")
        assert lines[1].endswith(" ! GPUs still held") and lines[2].endswith(" ✗ launch failed")


async def test_no_color_tells_the_chart_lines_apart_by_their_dashes(monkeypatch: pytest.MonkeyPatch) -> None:
    points = [ThroughputPoint(1000.0 - 60 + i, v, src) for i in range(60) for src, v in (("log", 40.0),
                                                                                        ("metrics", 20.0))]
    rows_by_mode = {}
    for no_color in (False, True):
        if no_color:
            monkeypatch.setenv("NO_COLOR", "1")
        chart = ThroughputChart(window_s=60)
        async with One(chart).run_test(size=(72, 12)) as pilot:
            chart.update(points, 1000.0)
            chart.replot()
            await pilot.pause()
            rows_by_mode[no_color] = chart.text().splitlines()
    colour, grey = rows_by_mode[False], rows_by_mode[True]
    assert "⣿ log tok/s ─ ⣿ metrics tok/s" in next(r for r in colour if "┌" in r)
    assert "━ log tok/s ─ ╍ metrics tok/s" in next(r for r in grey if "┌" in r)

    def dots(rows: list[str], value_row: int) -> int:  # braille cells on the row where a line runs
        return sum(1 for ch in rows[value_row] if "\u2801" <= ch <= "\u28ff")

    line_rows = [i for i in range(len(colour)) if dots(colour, i) > 30]  # 40 tok/s above, 20 below
    log_row, metrics_row = line_rows[0], line_rows[-1]
    assert log_row < metrics_row
    assert dots(grey, log_row) == dots(colour, log_row)  # the log's line stays solid
    assert 0 < dots(grey, metrics_row) < 0.7 * dots(colour, metrics_row)  # the metrics line is dashed


async def test_escape_back_to_the_fleet_is_in_help_only_when_opened_from_it(profile: Profile) -> None:
    for fleet in (False, True):
        app = create_app(profile, keymap_file=None, theme_file=None, fleet=fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("question_mark")
            await until(pilot, lambda app=app: isinstance(app.screen, HelpScreen), what="help")
            table = app.screen.query_one(DataTable)
            rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]
            fleet_rows = [row for row in rows if row[1] == "Fleet: back to the fleet (the server keeps running)"]
            assert [row[0].removesuffix(" ·") for row in fleet_rows] == (["esc"] if fleet else []), rows
