"""The advisor's "slower than before?": the best recorded arm at the same request shape, and the flag diff with
the measured effects first, then the known-impact flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core.advisor.history import best_reference, diff_findings
from app.core.measure.results import ArmData, result_json
from app.core.measure.store import HistoryStore

SHAPE: dict[str, Any] = {"requests": 6, "concurrency": 2, "input_len": 32, "max_tokens": 48, "warmup": 1,
                         "endpoint": "completions", "seed": 0, "ignore_eos": True, "prompt_file": None,
                         "timeout_s": 600.0}
ONE = {"tp-size": 2, "speculative-num-steps": 1, "speculative-num-draft-tokens": 2, "decode-log-interval": 40}
THREE = {**ONE, "speculative-num-steps": 3, "speculative-num-draft-tokens": 4, "decode-log-interval": 10}


def _bench(store: HistoryStore, flags: dict[str, Any], tok_s: float, *, shape: dict[str, Any] = SHAPE,
           host: str = "sim") -> int:
    run = store.start_run("bench", profile="t", host=host, backend="sglang", model="m", params={"bench": shape},
                          arms=[("running", "", flags)])
    store.finish_run(run, "done", summary={"output_tok_s": tok_s})
    return run


def test_best_arm_at_the_same_shape_and_measured_effects_first(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        _bench(store, ONE, 40.0)
        best = _bench(store, THREE, 90.0)
        _bench(store, ONE, 500.0, shape={**SHAPE, "concurrency": 64})  # another request shape
        _bench(store, ONE, 600.0, host="elsewhere")
        ab = store.start_run("ab", profile="t", host="sim", backend="sglang", model="m",
                             params={"bench": SHAPE, "trials": 3},
                             arms=[("A", "", ONE), ("B", "decode-log-interval=10", {**ONE, "decode-log-interval": 10})])
        store.finish_run(ab, "done", summary=result_json("done", [  # two launches of two trials per arm
            ArmData("A", "", [40.0, 41.0, 39.0, 40.0], [], 0, 8, 128, [[40.0, 41.0], [39.0, 40.0]]),
            ArmData("B", "", [40.5, 41.2, 39.1, 40.4], [], 0, 8, 128, [[40.5, 41.2], [39.1, 40.4]])]))
        reference, effects = best_reference(store, model="m", backend="sglang", hosts={"sim"}, bench=SHAPE)
    assert reference is not None and reference.run_id == best and reference.per_stream == 45.0
    findings = diff_findings(ONE, reference.flags, reference.describe(), effects)
    assert [f.rule for f in findings] == ["history:decode-log-interval", "history:speculative-num-steps",
                                          "history:speculative-num-draft-tokens"]
    assert findings[0].fix == {"decode-log-interval": 10}
    assert f"A/B run #{ab}: 40 -> 10 gave" in findings[0].why and "95% interval" in findings[0].why
    assert findings[1].fix == {"speculative-num-steps": 3} and "the server runs 1" in findings[1].what


def test_no_matching_run_is_no_reference(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        _bench(store, THREE, 90.0, shape={**SHAPE, "max_tokens": 512})
        reference, effects = best_reference(store, model="m", backend="sglang", hosts={"sim"}, bench=SHAPE)
    assert reference is None and effects == {}


def test_the_running_flags_own_run_is_found_so_a_faster_config_is_not_told_to_go_back(tmp_path: Path) -> None:
    """The best run used 3 steps; the running config (3 steps + overlap) was measured faster: the advisor must
    not offer the reference's flags as fixes (advise() compares the two); unmeasured, it has no own run."""
    faster = {**THREE, "enable-single-batch-overlap": True}
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        _bench(store, THREE, 90.0)
        reference, _ = best_reference(store, model="m", backend="sglang", hosts={"sim"}, bench=SHAPE)
        unmeasured, _ = best_reference(store, model="m", backend="sglang", hosts={"sim"}, bench=SHAPE, flags=faster)
        own_id = _bench(store, faster, 120.0)
        own, _ = best_reference(store, model="m", backend="sglang", hosts={"sim"}, bench=SHAPE, flags=faster)
    assert reference is not None and unmeasured is None
    assert own is not None and own.run_id == own_id and own.per_stream > reference.per_stream


def test_a_known_gain_is_not_undone_on_the_word_of_an_older_run() -> None:
    from app.core.advisor.advise import keep_known_gains

    running = {**THREE, "enforce-piecewise-cuda-graph": True, "enable-single-batch-overlap": True}
    reference = {**THREE, "speculative-num-steps": 1}
    diffs = diff_findings(running, reference, "history run #1 (bench)")
    kept = {f.rule: f for f in keep_known_gains(diffs, running, "sglang", "0.5.10", {}, measured_running=False)}
    for gain in ("enforce-piecewise-cuda-graph", "enable-single-batch-overlap"):
        assert kept[f"history:{gain}"].status == "advice" and not kept[f"history:{gain}"].fix
        assert "known gain" in kept[f"history:{gain}"].reason
    assert kept["history:speculative-num-steps"].fix == {"speculative-num-steps": 1}  # no rule prefers a value
    # measured: a run of the running flags slower than the reference, or an A/B effect of the flag, decides
    assert keep_known_gains(diffs, running, "sglang", "0.5.10", {}, measured_running=True) == diffs
    by_effect = {f.rule: f for f in keep_known_gains(diffs, running, "sglang", "0.5.10",
                                                     {"enable-single-batch-overlap": object()}, False)}
    assert by_effect["history:enable-single-batch-overlap"].status == "fix"
    assert by_effect["history:enforce-piecewise-cuda-graph"].status == "advice"
    # 0.5.23 prefers the breakable backend; a value the rule does not lead to is not protected
    other = {**THREE, "cuda-graph-backend-prefill": "full"}
    plain = keep_known_gains(diff_findings(other, THREE, "ref"), other, "sglang", "0.5.23", {}, False)
    assert [f.status for f in plain] == ["fix"]


def test_another_shape_is_listed_with_counts_and_the_nearest_offered_as_a_note(tmp_path: Path) -> None:
    """The recorded runs used other request shapes: nothing like for like, but the advisor says what exists (by
    shape, with counts) and offers the nearest shape's best arm, as a note."""
    from app.core.advisor.advise import Advice, advice_text, advice_to_json
    from app.core.advisor.history import recorded_history

    with HistoryStore(tmp_path / "h.sqlite3") as store:
        _bench(store, ONE, 700.0, shape={**SHAPE, "concurrency": 64})  # 5 doublings away
        _bench(store, ONE, 710.0, shape={**SHAPE, "concurrency": 64})
        _bench(store, THREE, 80.0, shape={**SHAPE, "max_tokens": 96})  # 1 doubling: the nearest
        near = _bench(store, THREE, 90.0, shape={**SHAPE, "max_tokens": 96})
        _bench(store, THREE, 95.0, shape={**SHAPE, "max_tokens": 96, "endpoint": "chat"})  # 1 + 3
        _bench(store, THREE, 999.0, shape={**SHAPE, "max_tokens": 96}, host="elsewhere")
        history = recorded_history(store, model="m", backend="sglang", hosts={"sim"}, bench=SHAPE)
    assert history.arms == [] and history.effects == {}  # nothing at this shape: no reference, no finding
    assert [(other.shape["concurrency"], other.shape["max_tokens"], other.shape["endpoint"], other.runs)
            for other in history.shapes] == [(2, 96, "completions", 2), (2, 96, "chat", 1),
                                             (64, 48, "completions", 2)]
    assert history.nearest is not None and history.nearest.best is not None
    assert history.nearest.best.run_id == near and history.nearest.best.output_tok_s == 90.0

    advice = Advice("t", "sim", "sglang", "0.5.10", dict(ONE), None, None, (), (), {}, None,
                    dict(history.asked), history.shapes, history.nearest)
    assert advice.pending() == {}  # a note, never a fix
    text = advice_text(advice)
    assert ("no recorded run of this model on this host at this request shape (concurrency 2 x 32 in / 48 out "
            "tokens)") in text
    assert ("recorded at other shapes: concurrency 2 x 32 in / 96 out tokens: 2 runs; concurrency 2 x 32 in / "
            "96 out tokens, endpoint chat: 1 run; concurrency 64 x 32 in / 48 out tokens: 2 runs") in text
    assert (f"note, another shape (not like for like): the nearest, concurrency 2 x 32 in / 96 out tokens, best "
            f"history run #{near} (bench): 90.0 tok/s") in text
    assert "--speculative-num-steps 3 (running 1)" in text
    data = advice_to_json(advice)
    assert data["reference"] is None and data["slower_than_before"] == []
    assert [(s["shape"]["max_tokens"], s["runs"]) for s in data["other_shapes"]] == [(96, 2), (96, 1), (48, 2)]
    nearest = data["nearest_shape"]
    assert nearest["note"].startswith("another request shape") and nearest["best"]["run_id"] == near
    assert {"flag": "speculative-num-steps", "running": 1, "nearest": 3} in nearest["differs"]
