"""--set/--unset overrides, [toggles] tables, flag diffs and how changes read."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.data import FlagChange
from app.core.flags.toggles import apply_toggle, default_toggles
from app.core.profiles.loading import apply_overrides, load_profile, parse_profile
from app.core.profiles.render import describe_change, flag_diff, launch_argv, profile_diff
from app.core.profiles.types import Profile, ProfileError
from tests.helpers import REPO

SHIPPED = REPO / "profiles"


@pytest.fixture
def demo() -> Profile:
    return load_profile(SHIPPED / "demo.toml")


@pytest.fixture
def vllm() -> Profile:
    return load_profile(SHIPPED / "local-vllm.toml")


def test_set_typed_values(demo: Profile) -> None:
    new = apply_overrides(demo, ["--mem-fraction-static=0.8", "enforce-piecewise-cuda-graph=true",
                                 "enable-metrics=false", "tp=1"], [])
    assert new.flags["mem-fraction-static"] == 0.8
    assert new.flags["enforce-piecewise-cuda-graph"] is True
    assert "enable-metrics" not in new.flags
    assert new.flags["tp-size"] == 1
    assert demo.flags["tp-size"] == 2  # the original is untouched
    assert "--enforce-piecewise-cuda-graph" in launch_argv(new)
    assert "--enable-metrics" not in launch_argv(new)


def test_setting_steps_keeps_draft_tokens_consistent(demo: Profile) -> None:
    new = apply_overrides(demo, ["speculative-num-steps=3"], [])
    assert new.flags["speculative-num-draft-tokens"] == 4
    explicit = apply_overrides(demo, ["speculative-num-steps=3", "speculative-num-draft-tokens=2"], [])
    assert explicit.flags["speculative-num-draft-tokens"] == 2


def test_unset(demo: Profile) -> None:
    new = apply_overrides(demo, [], ["--decode-log-interval", "enable-single-batch-overlap"])
    assert "decode-log-interval" not in new.flags
    with pytest.raises(ProfileError, match="also given to --set"):
        apply_overrides(demo, ["tp-size=1"], ["tp-size"])


@pytest.mark.parametrize(("sets", "message"), [
    (["speculative-num-step=3"], "--set speculative-num-step: unknown SGLang flag --speculative-num-step; "
                                 "did you mean --speculative-num-steps?"),
    (["tp-size=two"], "--set tp-size: expected an integer, got 'two'"),
    (["enable-metrics=yes"], "--set enable-metrics: expected true or false"),
    (["speculative-algorithm=MEDUSA"], "--set speculative-algorithm: expected one of"),
    (["enable-metrics"], "expected FLAG=VALUE"),
    (["port=0"], "--set port: expected a port"),
    (["tp-size.x=1"], "not a JSON flag"),
])
def test_bad_overrides_name_the_flag(demo: Profile, sets: list[str], message: str) -> None:
    with pytest.raises(ProfileError) as caught:
        apply_overrides(demo, sets, [])
    assert message in str(caught.value)


def test_port_and_model_are_profile_keys(demo: Profile) -> None:
    new = apply_overrides(demo, ["port=31000", "model-path=other/model"], [])
    assert (new.port, new.model) == (31000, "other/model")
    assert "port" not in new.flags
    assert [describe_change(c) for c in profile_diff(demo, new)] == [
        "--model-path sim/qwen3.6-27b -> other/model", "--port 30000 -> 31000"]


def test_json_flag_whole_and_by_key(vllm: Profile) -> None:
    whole = apply_overrides(vllm, ['speculative-config={"method":"eagle3","num_speculative_tokens":2}'], [])
    assert whole.flags["speculative-config"] == {"method": "eagle3", "num_speculative_tokens": 2}
    by_key = apply_overrides(vllm, ["speculative-config.num_speculative_tokens=5",
                                    "compilation-config.cudagraph_mode=PIECEWISE"], [])
    assert by_key.flags["speculative-config"]["num_speculative_tokens"] == 5  # type: ignore[index]
    assert by_key.flags["compilation-config"] == {"cudagraph_mode": "PIECEWISE"}
    removed = apply_overrides(vllm, [], ["speculative-config.prompt_lookup_min"])
    assert "prompt_lookup_min" not in removed.flags["speculative-config"]  # type: ignore[operator]
    assert apply_overrides(vllm, ["enable-prefix-caching=false"], []).flags["enable-prefix-caching"] is False


def test_diff_and_describe_with_toggle_labels(demo: Profile, vllm: Profile) -> None:
    steps = demo.toggle("s")
    assert steps is not None
    pending = apply_toggle(apply_toggle(demo.flags, steps), steps)
    changes = flag_diff(demo.flags, pending)
    assert changes == [FlagChange("speculative-num-steps", 1, 3), FlagChange("speculative-num-draft-tokens", 2, 4)]
    assert [describe_change(c, demo.toggles) for c in changes] == [
        "steps 1 -> 3", "--speculative-num-draft-tokens 2 -> 4"]

    pcg = demo.toggle("g")
    assert pcg is not None
    (change,) = flag_diff(demo.flags, apply_toggle(demo.flags, pcg))
    assert change.kind == "added"
    assert describe_change(change, demo.toggles) == "pcg off -> on"

    graphs = vllm.toggle("g")
    assert graphs is not None
    (change,) = flag_diff(vllm.flags, apply_toggle(vllm.flags, graphs))
    assert describe_change(change, vllm.toggles) == "graphs FULL_AND_PIECEWISE -> NONE"

    spec = vllm.toggle("s")
    assert spec is not None
    (change,) = flag_diff(vllm.flags, apply_toggle(vllm.flags, spec))
    assert describe_change(change, vllm.toggles) == "spec 3 -> 4"

    new_json = apply_overrides(load_profile(SHIPPED / "local-vllm.toml"), [], ["speculative-config"])
    assert [c.kind for c in flag_diff(vllm.flags, new_json.flags)] == ["removed"]


def test_toggles_table_overrides_adds_and_removes(tmp_path: Path) -> None:
    text = """
backend = "sglang"
model = "m"
[toggles]
g = false
[toggles.s]
label = "steps"
cycle = "speculative-num-steps"
values = [2, 4]
[toggles.m]
label = "mem"
set = "mem-fraction-static"
value = 0.8
[toggles.b]
label = "sbo"
flip = "enable-single-batch-overlap"
[toggles.c]
cycle = ["disable-overlap-schedule", "enable-two-batch-overlap"]
values = [[false, false], [true, true]]
names = ["plain", "tbo"]
"""
    profile = parse_profile(text, tmp_path / "t.toml")
    assert [t.key for t in profile.toggles] == ["s", "o", "m", "b", "c"]
    steps = profile.toggle("s")
    mem = profile.toggle("m")
    combo = profile.toggle("c")
    assert steps is not None and mem is not None and combo is not None
    assert apply_toggle({}, steps) == {"speculative-num-steps": 2}
    assert apply_toggle({}, mem) == {"mem-fraction-static": 0.8}
    assert apply_toggle({}, combo) == {"disable-overlap-schedule": True, "enable-two-batch-overlap": True}
    assert combo.label == "disable-overlap-schedule"


def test_profile_without_toggles_gets_the_defaults(tmp_path: Path) -> None:
    profile = parse_profile('backend="vllm"\nmodel="m"\n', tmp_path / "v.toml")
    assert profile.toggles == default_toggles("vllm")


@pytest.mark.parametrize(("toggles", "message"), [
    ('[toggles.xy]\nflip = "enable-metrics"', "toggles.xy: a toggle's key is one character"),
    ('[toggles.x]\nlabel = "x"', "toggles.x: needs exactly one of"),
    ('[toggles.x]\ncycle = "tp-size"\nvalues = ["a"]', "toggles.x.values[0]: --tp-size: expected an integer"),
    ('[toggles.x]\ncycle = "tp-szie"\nvalues = [1]', "did you mean --tp-size?"),
    ('[toggles.x]\nset = "tp-size"', "a set toggle needs value"),
    ('[toggles.x]\ncycle = "tp-size"\nvalues = [1, 2]\nnames = ["one"]', "toggles.x.names"),
    ('[toggles.x]\nflip = "enable-metrics"\ncolour = "red"', "toggles.x.colour: unknown key"),
])
def test_bad_toggle_tables(tmp_path: Path, toggles: str, message: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profile(f'backend="sglang"\nmodel="m"\n{toggles}\n', tmp_path / "t.toml")
    assert message in str(caught.value)
    assert "t.toml" in str(caught.value)
