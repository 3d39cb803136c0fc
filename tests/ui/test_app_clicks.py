"""Pilot tests of the dashboard's mouse: a click on a flag row does what its key does, a click on a GPU row
selects that GPU (the row is highlighted). Against the simulated host; nothing is launched."""

from __future__ import annotations

from app.core.profiles.types import Profile
from app.tui.app import create_app
from tests.ui.ui_flows import SIZE, pending_of, until
from widgets import FlagsPanel, GpuPanel
from widgets.flags_panel import FlagRow


async def test_clicking_a_flag_row_does_what_its_key_does(profile: Profile) -> None:
    app = create_app(profile, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: any(r.region.height for r in app.query(FlagRow)), what="the flag rows on screen")
        running, _ = pending_of(app, "s")
        await pilot.press("s")
        by_key = pending_of(app, "s")
        assert by_key[1] != running
        await pilot.press("u")
        assert pending_of(app, "s") == (running, running)

        row = next(r for r in app.query(FlagRow) if r.row.key == "s")
        await pilot.click(row, offset=(2, 0))
        await pilot.pause()
        assert pending_of(app, "s") == by_key
        assert app.query_one(FlagsPanel).pending_count == 1
        assert row.has_class("-pending")


async def test_clicking_a_gpu_row_selects_it(profile: Profile) -> None:
    app = create_app(profile, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(GpuPanel)
        await until(pilot, lambda: len(panel.rows) == 2 and all(r.region.height for r in panel.rows.values()),
                    what="two GPU rows on screen")
        rows = panel.rows
        first, second = (rows[uuid] for uuid in sorted(rows, key=lambda u: rows[u].index))
        assert not first.has_class("-selected") and not second.has_class("-selected")

        await pilot.click(second, offset=(1, 0))
        await pilot.pause()
        assert panel.selected == second.uuid
        assert second.has_class("-selected") and not first.has_class("-selected")

        await pilot.click(first, offset=(1, 0))
        await pilot.pause()
        assert panel.selected == first.uuid
        assert first.has_class("-selected") and not second.has_class("-selected")

        await pilot.pause(1.2)  # new samples keep the selection
        assert first.has_class("-selected") and panel.selected == first.uuid
