"""Toggles: what each default key does to a profile's flags, and how it reads on screen."""

from __future__ import annotations

import pytest

from app.core.data import FlagValue
from app.core.flags.toggles import Toggle, apply_toggle, default_toggles, toggle_value
from app.core.flags.values import FlagError


def toggle(backend: str, key: str) -> Toggle:
    return next(t for t in default_toggles(backend) if t.key == key)


SPEC: dict[str, FlagValue] = {
    "speculative-algorithm": "NEXTN",
    "speculative-num-steps": 1,
    "speculative-eagle-topk": 1,
    "speculative-num-draft-tokens": 2,
}


def test_default_keys() -> None:
    assert [(t.key, t.label) for t in default_toggles("sglang")] == [
        ("s", "steps"), ("g", "pcg"), ("o", "overlap")]
    assert [(t.key, t.label) for t in default_toggles("vllm")] == [("s", "spec"), ("e", "eager"), ("g", "graphs")]


def test_steps_cycle_one_to_five_with_draft_tokens_following() -> None:
    steps = toggle("sglang", "s")
    flags = dict(SPEC)
    seen = []
    for _ in range(5):
        flags = apply_toggle(flags, steps)
        seen.append((flags["speculative-num-steps"], flags["speculative-num-draft-tokens"]))
    assert seen == [(2, 3), (3, 4), (4, 5), (5, 6), (1, 2)]
    assert SPEC["speculative-num-steps"] == 1  # the input is not changed


def test_steps_leaves_draft_tokens_alone_when_topk_is_not_one() -> None:
    flags = apply_toggle({**SPEC, "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 8},
                         toggle("sglang", "s"))
    assert flags["speculative-num-steps"] == 2
    assert flags["speculative-num-draft-tokens"] == 8


def test_steps_needs_a_speculative_algorithm() -> None:
    with pytest.raises(FlagError, match="no --speculative-algorithm"):
        apply_toggle({}, toggle("sglang", "s"))


def test_pcg_flips_enforce_piecewise_cuda_graph() -> None:
    pcg = toggle("sglang", "g")
    on = apply_toggle(SPEC, pcg)
    assert on["enforce-piecewise-cuda-graph"] is True
    assert toggle_value(on, pcg) == "on"
    off = apply_toggle(on, pcg)
    assert "enforce-piecewise-cuda-graph" not in off  # off = absent, renders nothing
    assert toggle_value(off, pcg) == "off"


def test_overlap_changes_one_flag_per_press_and_comes_back() -> None:
    overlap = toggle("sglang", "o")
    flags: dict[str, FlagValue] = {}
    names = [toggle_value(flags, overlap)]
    for _ in range(4):
        new = apply_toggle(flags, overlap)
        changed = set(new.items()) ^ set(flags.items())
        assert len({name for name, _ in changed}) == 1
        flags = new
        names.append(toggle_value(flags, overlap))
    assert names == ["sched", "sched+sbo", "sbo", "off", "sched"]
    assert flags == {}


def test_vllm_spec_tokens_change_inside_the_json_and_keep_other_keys() -> None:
    spec = toggle("vllm", "s")
    flags: dict[str, FlagValue] = {"speculative-config": {"method": "ngram", "num_speculative_tokens": 3}}
    new = apply_toggle(flags, spec)
    assert new["speculative-config"] == {"method": "ngram", "num_speculative_tokens": 4}
    assert flags["speculative-config"] == {"method": "ngram", "num_speculative_tokens": 3}
    assert toggle_value(new, spec) == "4"
    with pytest.raises(FlagError, match="speculative-config"):
        apply_toggle({}, spec)


def test_vllm_cudagraph_mode_cycles_from_the_default() -> None:
    graphs = toggle("vllm", "g")
    assert toggle_value({}, graphs) == "FULL_AND_PIECEWISE (default)"
    flags: dict[str, FlagValue] = {}
    modes = []
    for _ in range(5):
        flags = apply_toggle(flags, graphs)
        modes.append(toggle_value(flags, graphs))
    assert modes == ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]


def test_vllm_enforce_eager_flip() -> None:
    eager = toggle("vllm", "e")
    assert apply_toggle({}, eager) == {"enforce-eager": True}
    assert apply_toggle({"enforce-eager": True}, eager) == {}
