"""WARM vs STUCK vs FREE from a free check's verdict, and the profile's `warm` key with its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.data import Holder
from app.core.profiles.loading import load_profile
from app.core.profiles.types import ProfileError
from app.core.server.warm_state import WarmTracker, warm_share
from app.core.telemetry.freecheck import FreeVerdict

DAEMON = {4101, 4102}


def limit(gpu: int) -> int:
    return 64


def verdict(holders: tuple[Holder, ...], used: dict[int, int | None]) -> FreeVerdict:
    return FreeVerdict(not holders, False, used, holders)


def test_only_the_daemons_pids_holding_memory_is_warm() -> None:
    held = verdict((Holder(0, 4101, "python3", 26266), Holder(1, 4102, "python3", 26266)), {0: 26270, 1: 26266})
    share = warm_share(held, DAEMON, limit)
    assert share is not None and share.mib == {0: 26266, 1: 26266} and share.pids == (4101, 4102)
    assert share.describe() == "engine gone; 25.7 GiB per GPU held by the weight cache, pids 4101, 4102"


@pytest.mark.parametrize(("holders", "used"), [
    ((Holder(0, 4101, "python3", 26266), Holder(0, 999, "sglang::scheduler_TP0", 18000)), {0: 44266}),  # engine
    ((Holder(0, 4101, "python3", 26266),), {0: 30000}),  # memory beside the daemon with no visible process
    ((Holder(0, None, "", 26266),), {0: 26266}),  # memory with no process at all
    ((), {0: 0}),  # nothing held: that is FREE, not WARM
])
def test_anything_else_is_not_warm(holders: tuple[Holder, ...], used: dict[int, int | None]) -> None:
    assert warm_share(verdict(holders, used), DAEMON, limit) is None


def test_warm_needs_two_consecutive_samples() -> None:
    tracker = WarmTracker(DAEMON, limit)
    warm = verdict((Holder(0, 4101, "python3", 26266),), {0: 26266})
    engine = verdict((Holder(0, 4101, "python3", 26266), Holder(0, 7, "x", 10)), {0: 26276})
    assert tracker.feed(warm) is None
    assert tracker.feed(engine) is None
    assert tracker.feed(warm) is None
    assert tracker.feed(warm) is not None


def test_the_warm_key(tmp_path: Path) -> None:
    good = tmp_path / "w.toml"
    good.write_text('backend = "sglang"\nmodel = "m"\nwarm = true\n')
    assert load_profile(good).warm is True
    bad = tmp_path / "b.toml"
    bad.write_text('backend = "sglang"\nmodel = "m"\nwarm = "yes"\n')
    with pytest.raises(ProfileError, match=r"b\.toml: warm: expected true or false, got string"):
        load_profile(bad)
    custom = tmp_path / "c.toml"
    custom.write_text('backend = "custom"\ncommand = ["x"]\nready_regex = "up"\nwarm = true\n')
    with pytest.raises(ProfileError, match=r"c\.toml: warm: a custom profile names its daemon: replace warm = true"):
        load_profile(custom)


def test_a_warm_release_is_timed_to_warm() -> None:
    from app.core.server.states import phase_durations

    times = phase_durations({"KILLING": 10.0, "RELEASING": 10.5, "WARM": 11.25})
    assert times == {"kill": 0.5, "release": 0.75}
