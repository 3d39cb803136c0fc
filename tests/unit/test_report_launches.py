"""The A/B report at launch level: launches x trials, launch values, both spreads, J/token per arm, the verdict."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.measure.report import experiment_text
from app.core.measure.results import ArmData, TrialEnergy, arm_energy, energy_of, experiment_report, result_json


def _energy(joules: float, tokens: int, method: str = "sim-power") -> dict[str, Any]:
    return {"method": method, "joules": joules, "gpus": 2, "mean_w_per_gpu": [200.0, 210.0],
            "output_tokens": tokens, "j_per_token": joules / tokens, "tokens_per_j": tokens / joules}


def _arm(label: str, launches: list[list[float]], joules: list[list[float]] | None, **kw: Any) -> ArmData:
    energy = None
    if joules is not None:
        energy = [TrialEnergy(k, _energy(j, 100, **kw) if j >= 0 else None) for k, js in enumerate(joules) for j in js]
    values = [v for vals in launches for v in vals]
    return ArmData(label, "" if label == "A" else "speculative-num-steps=3", values, [], 0, 4 * len(values),
                   100 * len(values), launches, energy)


A = [[100.0, 102.0, 101.0], [96.0, 98.0, 97.0]]
B = [[130.0, 132.0, 131.0], [124.0, 126.0, 125.0]]


def test_json_and_text_show_launches_trials_spreads_energy_and_both_verdicts():
    a = _arm("A", A, [[50.0, 50.0, 50.0], [52.0, 52.0, 52.0]])  # J/token 0.50, 0.52 per launch
    b = _arm("B", B, [[41.0, 41.0, 41.0], [42.0, 42.0, 42.0]])  # 0.41, 0.42
    data = result_json("done", [a, b])
    arm_a = data["arms"][0]
    assert arm_a["launches"] == 2 and arm_a["trials_per_launch"] == [3, 3] and arm_a["n"] == 6
    assert arm_a["launch_values"] == [101.0, 97.0] and arm_a["mean"] == 99.0
    assert arm_a["energy"]["j_per_token"] == pytest.approx(306 / 600)  # sum of joules / sum of tokens
    assert arm_a["energy"]["launch_j_per_token"] == [0.5, 0.52] and arm_a["energy"]["mean_w_per_gpu"] == [200, 210]
    assert arm_a["energy"]["tokens_per_j"] == pytest.approx(600 / 306, abs=1e-6)
    comp = data["comparisons"][0]
    assert comp["ratio_ci"] is not None and comp["energy_ratio"] == pytest.approx(0.8138, abs=1e-4)
    assert data["verdict"] == ("B is 29% faster than A (95% CI 13-48%), and uses 19% less energy per token "
                               "(95% CI 10-26%)")
    text = experiment_text(experiment_report("done", [a, b]))
    header, row_a, row_b = text.splitlines()[:3]
    assert "launches x trials" in header and "launch CV" in header and "trial CV" in header and "J/token" in header
    assert "2x3" in row_a and "2.9%" in row_a and "0.510" in row_a  # launch CV of 101, 97; J/token
    assert "1.293 (1.132-1.477)" in row_b
    assert "A launch means (tok/s): 101.0, 97.0; J/token per launch: 0.500, 0.520 (sim-power)" in text
    assert text.endswith(f"verdict: {data['verdict']}")


def test_energy_missing_in_one_trial_is_not_measured_never_zero():
    a = _arm("A", A, [[50.0, -1.0, 50.0], [52.0, 52.0, 52.0]], method="nvml")  # one trial without energy
    b = _arm("B", B, [[41.0, 41.0, 41.0], [42.0, 42.0, 42.0]], method="nvml")
    data = result_json("done", [a, b])
    energy = data["arms"][0]["energy"]
    assert energy["measured"] is False and "j_per_token" not in energy and "1 of 6 trials" in energy["missing"]
    assert data["comparisons"][0]["energy_ratio"] is None
    assert data["verdict"].endswith("; energy not measured (method nvml)")
    text = experiment_text(experiment_report("done", [a, b]))
    assert "not measured" in text.splitlines()[1] and "0.000" not in text


def test_runs_without_energy_fields_and_bad_energy_values():
    data = result_json("done", [_arm("A", A, None), _arm("B", B, None)])  # stored before energy existed
    assert data["arms"][0]["energy"] is None and data["verdict"].endswith("; energy not measured")
    assert energy_of({"energy": {"method": "nvml", "joules": -3.0, "output_tokens": 10}}) is None
    assert energy_of({"energy": {"method": "nvml", "joules": float("nan"), "output_tokens": 10}}) is None
    assert energy_of({"energy": {"method": "nvml", "joules": 3.0, "output_tokens": "10"}}) is None
    assert energy_of({"energy": None}) is None and energy_of({}) is None
    good = {"method": "nvml", "joules": 3.0, "output_tokens": 10}
    assert energy_of({"energy": good}) == good
    bad_watts = ArmData("A", "", [1.0], [], 0, 1, 10, [[1.0]], [TrialEnergy(0, {**good, "mean_w_per_gpu": ["x"]})])
    energy = arm_energy(bad_watts)
    assert energy is not None and energy.mean_w_per_gpu is None


def test_a_partial_launch_shows_in_the_design_column():
    report = experiment_report("cancelled", [_arm("A", [[100.0, 101.0], [99.0]], None), _arm("B", [[120.0]], None)])
    rows = experiment_text(report).splitlines()
    assert "2+1" in rows[1] and "1x1" in rows[2]


def test_the_bench_note_says_why_energy_is_missing():
    from app.core.measure.results import energy_note_of

    why = "nvidia-smi power.draw: GPU 1 gave no power samples"
    assert energy_note_of({"energy": None, "energy_note": why}) == why
    assert energy_note_of({"energy": None, "energy_note": "not measured (no energy meter)"}) == "no energy meter"
    assert energy_note_of({"energy": {"method": "m", "joules": 1.0, "output_tokens": 1}, "energy_note": ""}) == ""
    arms = [ArmData(label, "", [100.0, 101.0], [], 0, 2, 20, [[100.0], [101.0]],
                    [TrialEnergy(0, None, why), TrialEnergy(1, None, why)])
            for label in "AB"]
    data = result_json("done", arms)
    assert data["verdict"].endswith(f"; energy not measured ({why})")
    assert data["arms"][0]["energy"]["missing"] == f"no trial measured energy: {why}"
