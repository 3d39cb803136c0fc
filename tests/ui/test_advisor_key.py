"""Pilot test of the advisor key on the simulated host: `v` opens the advice (the graph auto-disabled, single-batch
overlap off, with their evidence), `a` sets the fixes as pending flags (the Flags panel shows them, nothing
launches), the event log records what was found and applied, and `b` goes on to the A/B screen."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.widgets import Static

from app.core.data import ServerState
from app.core.measure.bench import BenchSpec
from app.core.measure.store import DATA_DIR_ENV, HistoryStore
from app.core.profiles.loading import load_profile
from app.tui.app import create_app
from app.tui.bench import RunScreen
from tests.helpers import MakeProfile, until
from widgets.advisor_screen import AdvisorScreen

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")
pytestmark = pytest.mark.slow


async def test_v_shows_the_advice_a_applies_it_b_ab_tests_it(make_profile: MakeProfile, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    profile = load_profile(make_profile(startup_s=0.3))
    shape = BenchSpec.from_settings(profile.bench).to_json()
    with HistoryStore() as store:  # one run, at 4x the profile's concurrency: no reference, a note
        run = store.start_run("bench", profile=profile.name, host=profile.host, backend=profile.backend,
                              model=profile.model, params={"bench": {**shape, "concurrency": shape["concurrency"] * 4}},
                              arms=[("running", "", dict(profile.flags))])
        store.finish_run(run, "done", summary={"output_tok_s": 123.0})
    app = create_app(profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(lambda: app.session.view().state == ServerState.READY and app.session.busy is None, 60, "READY")
        await pilot.press("v")
        await until(lambda: isinstance(app.screen, AdvisorScreen), 30, "the advisor screen")
        text = str(app.screen.query_one("#advice", Static).render())
        assert "Single-batch overlap off with TP > 1" in text and "enable_single_batch_overlap=False" in text
        assert "Prefill (piecewise) CUDA graph" in text and "--enforce-piecewise-cuda-graph" in text
        assert "nothing to do on this hardware" in text  # FlashInfer fusion / NVLS on the simulated SM 8.6
        assert f"recorded at other shapes: concurrency {shape['concurrency'] * 4} x" in text
        assert "note, another shape (not like for like): the nearest" in text and f"run #{run} (bench)" in text
        await pilot.press("a")
        await until(lambda: not isinstance(app.screen, AdvisorScreen), 5, "the screen to close")
        assert app.session.pending_flags.get("enable-single-batch-overlap") is True
        assert app.session.pending_flags.get("enforce-piecewise-cuda-graph") is True
        assert app.session.profile.flags.get("enable-single-batch-overlap") is None  # nothing launched
        events = [e.text for e in app.session.events]
        assert any(t.startswith("advisor: 2 fix(es) found") for t in events), events
        assert any(t.startswith("advisor: applied as pending: ") for t in events), events
        await pilot.press("v")
        await until(lambda: isinstance(app.screen, AdvisorScreen), 30, "the advisor screen again")
        await pilot.press("b")
        await until(lambda: isinstance(app.screen, RunScreen), 10, "the A/B screen")
        # A = what runs (no fixes), B = the pending flags with the fixes
        assert app.baseline is not None and app.baseline.flags.get("enable-single-batch-overlap") is None
        assert app.session.pending_profile.flags.get("enable-single-batch-overlap") is True
        assert "B = " in str(app.screen.query_one("#title", Static).render())
