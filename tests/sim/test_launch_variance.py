"""Launch-to-launch speed variance of the simulated server (app/sim/speed.py: launch_sigma, launch factor)."""

from __future__ import annotations

import math
import statistics

import pytest

from app.sim.speed import LAUNCH_SEED_ENV, SpeedConfig, SpeedModel, launch_factor, load_params

CFG = SpeedConfig(weights_gib=50.0, tp_size=2, spec_algorithm="NEXTN", spec_steps=1, spec_draft_tokens=2)


def test_launch_factors_are_log_normal_with_the_configured_sigma() -> None:
    logs = [math.log(launch_factor(0.03, seed)) for seed in range(4000)]
    assert statistics.fmean(logs) == pytest.approx(0.0, abs=0.003)
    assert statistics.stdev(logs) == pytest.approx(0.03, rel=0.06)
    assert launch_factor(0.0, 7) == 1.0
    with pytest.raises(ValueError, match="launch_sigma"):
        launch_factor(-0.1, 1)


def test_two_launches_of_one_config_differ_and_one_seed_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LAUNCH_SEED_ENV, raising=False)
    p = load_params()
    assert p["launch_sigma"] == 0.03  # the documented default
    fresh = {SpeedModel(CFG, p).launch_factor for _ in range(5)}  # unseeded: a new draw per launch
    assert len(fresh) == 5
    assert SpeedModel(CFG, p, launch_seed=11).launch_factor == SpeedModel(CFG, p, launch_seed=11).launch_factor
    monkeypatch.setenv(LAUNCH_SEED_ENV, "11")
    assert SpeedModel(CFG, p).launch_factor == SpeedModel(CFG, p, launch_seed=11).launch_factor
    monkeypatch.setenv(LAUNCH_SEED_ENV, "eleven")
    with pytest.raises(ValueError, match=LAUNCH_SEED_ENV):
        SpeedModel(CFG, p)


def test_the_factor_scales_what_a_stream_measures() -> None:
    """The step times (what the load generator's tok/s per stream comes from) carry the launch's factor."""
    p = {**load_params(), "noise_sigma": 0.0}
    fast = next(m for m in (SpeedModel(CFG, p, launch_seed=s) for s in range(100)) if m.launch_factor > 1.03)
    slow = next(m for m in (SpeedModel(CFG, p, launch_seed=s) for s in range(100)) if m.launch_factor < 0.97)
    assert fast.sample_step_ms(4) == pytest.approx(fast.mean_step_ms(4) / fast.launch_factor)
    ratio = slow.sample_step_ms(4) / fast.sample_step_ms(4)
    assert ratio == pytest.approx(fast.launch_factor / slow.launch_factor)
    assert ratio > 1.06
    off = SpeedModel(CFG, {**p, "launch_sigma": 0.0}, launch_seed=3)
    assert off.launch_factor == 1.0 and off.sample_step_ms(1) == pytest.approx(off.mean_step_ms(1))
