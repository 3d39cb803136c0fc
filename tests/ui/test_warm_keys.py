"""The dashboard on a warm profile: `k` ends WARM with the weight cache daemon's MiB on the GPUs (never FREE or
STUCK), `K` (kill all, asks first) stops the daemon too and shows FREE at 0 MiB."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.data import ServerState
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.tui.app import create_app
from tests.helpers import MakeProfile
from tests.helpers import pilot_until as until
from tests.ui.ui_flows import SIZE, event_texts, ready, shows, state_of
from widgets import ConfirmModal

pytestmark = pytest.mark.slow


@pytest.fixture
def warm_profile(make_profile: MakeProfile) -> Profile:
    path: Path = make_profile(extra='sim_version = "0.5.23"\nwarm = true\n')
    text = path.read_text()
    for line in ('speculative-algorithm = "NEXTN"\n', "speculative-num-steps = 1\n", "speculative-eagle-topk = 1\n",
                 "speculative-num-draft-tokens = 2\n"):
        text = text.replace(line, "")
    path.write_text(text)
    return load_profile(path)


async def test_k_is_warm_and_capital_k_is_free(warm_profile: Profile) -> None:
    app = create_app(warm_profile, autolaunch=True, keymap_file=None)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        # discovery ran while the daemon loaded: the running profile keeps 0.5.23's toggle flags (`g` renders
        # --cuda-graph-backend-prefill, not 0.5.10's --enforce-piecewise-cuda-graph)
        await until(pilot, lambda: app.session.server_flags is not None, what="discovery", timeout=30)
        g = next(t for t in app.session.profile.toggles if t.key == "g")
        assert g.flags == ("cuda-graph-backend-prefill",)
        await pilot.press("k")
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("y")
        await until(pilot, lambda: state_of(app) == ServerState.WARM and app.session.busy is None, what="WARM",
                    timeout=30)
        await shows(pilot, app, "WARM")
        assert any("GiB per GPU held by the weight cache" in t for t in event_texts(app))

        await pilot.press("K")
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("y")
        await until(pilot, lambda: state_of(app) == ServerState.FREE and app.session.busy is None, what="FREE",
                    timeout=30)
        await shows(pilot, app, "FREE", " 0/49140 MiB")
        assert any("SIGTERM to the weight cache daemon's group" in t for t in event_texts(app))
