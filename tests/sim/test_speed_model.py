"""The speed model responds to each flag in the documented direction and rough size (from its own parameters)."""

from __future__ import annotations

import pytest

from app.sim.server_args import load_models, parse, resolve
from app.sim.sglang import speed_config
from app.sim.speed import SpeedConfig, SpeedModel, load_params

P = load_params()
DEMO = load_models()["sim/qwen3.6-27b"]


def model(*flags: str) -> SpeedModel:
    ns = parse(["--model-path", "sim/qwen3.6-27b", "--tp-size", "2", *flags], "0.5.10")
    return SpeedModel(speed_config(resolve(ns, DEMO, 49140, "0.5.10"), DEMO), P, seed=1)


def test_calibration_of_the_demo_profile() -> None:
    one = model("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1")
    three = model("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3")
    tuned = model("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                  "--enforce-piecewise-cuda-graph", "--enable-single-batch-overlap")
    assert 35 <= one.mean_stream_tok_s() <= 40
    assert 50 <= three.mean_stream_tok_s() <= 57
    assert 3.0 <= three.mean_accept_len() <= 3.5
    assert 66 <= tuned.mean_stream_tok_s() <= 74


def test_more_steps_longer_acceptance_costlier_steps() -> None:
    one = model("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1")
    three = model("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3")
    assert three.mean_accept_len() > one.mean_accept_len()
    extra = 2 * (P["draft_step_ms"] + P["verify_per_draft_token_ms"])
    assert three.mean_step_ms() - one.mean_step_ms() == pytest.approx(extra)


def test_piecewise_graph_is_silently_off_for_multimodal_unless_enforced() -> None:
    spec = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3")
    assert model(*spec).mean_step_ms() == model(*spec, "--enable-piecewise-cuda-graph").mean_step_ms()
    enforced = model(*spec, "--enforce-piecewise-cuda-graph")
    saved = model(*spec).mean_step_ms() - enforced.mean_step_ms()
    assert saved == pytest.approx(P["overhead_ms"] * (1 - P["piecewise_overhead_factor"]))


def test_single_batch_overlap_and_cuda_graph_cut_overhead() -> None:
    base = model()
    sbo = model("--enable-single-batch-overlap")
    no_graph = model("--disable-cuda-graph")
    assert sbo.mean_step_ms() < base.mean_step_ms()
    assert no_graph.mean_step_ms() / base.mean_step_ms() > 1.3
    assert base.uses_cuda_graph(1) and not no_graph.uses_cuda_graph(1)


def test_overlap_scheduler_helps_and_spec_v2_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert model("--disable-overlap-schedule").mean_step_ms() > model().mean_step_ms()
    spec = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3")
    v1 = model(*spec)
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "True")
    v2 = model(*spec)
    assert v2.mean_step_ms() < v1.mean_step_ms()


def test_batching_raises_total_and_lowers_per_stream() -> None:
    m = model("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3")
    assert m.mean_stream_tok_s(8) < m.mean_stream_tok_s(1)
    assert 8 * m.mean_stream_tok_s(8) > 4 * m.mean_stream_tok_s(1)
    assert m.uses_cuda_graph(32) and not m.uses_cuda_graph(33)  # auto cuda_graph_max_bs for 48 GB, TP 2


def test_sampled_acceptance_matches_the_mean() -> None:
    m = model("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3")
    draws = [m.sample_accept() for _ in range(20000)]
    assert max(draws) == 4 and min(draws) == 1
    assert sum(draws) / len(draws) == pytest.approx(m.mean_accept_len(), rel=0.03)
    steps = [m.sample_step_ms(1) for _ in range(2000)]
    assert sum(steps) / len(steps) == pytest.approx(m.mean_step_ms() / m.launch_factor, rel=0.01)
    assert min(steps) != max(steps)  # a little noise


def test_speed_file_override(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "fast.toml"
    path.write_text("overhead_ms = 1.0\n[accept_prob]\nEAGLE = 0.5\n")
    monkeypatch.setenv("TUNEDASH_SIM_SPEED_FILE", str(path))
    params = load_params()
    assert params["overhead_ms"] == 1.0 and params["accept_prob"]["EAGLE"] == 0.5
    assert params["accept_prob"]["NGRAM"] == P["accept_prob"]["NGRAM"]
    m = SpeedModel(SpeedConfig(weights_gib=10, spec_algorithm="EAGLE", spec_steps=1), params)
    assert m.mean_accept_len() == pytest.approx(1.5)


def test_resolution_messages() -> None:
    ns = parse(["--model-path", "sim/qwen3.6-27b", "--speculative-algo", "NEXTN", "--speculative-num-steps", "2",
                "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8"], "0.5.10")
    resolved = resolve(ns, DEMO, 49140, "0.5.10")
    args, msgs = resolved.args, resolved.msgs
    assert args["speculative_algorithm"] == "EAGLE" and args["speculative_num_draft_tokens"] == 3
    adjusted = "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
    assert adjusted in msgs
    assert args["max_running_requests"] == 48


def _tok_s(steps: int, batch: int, context: float) -> float:
    spec = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(steps)) if steps else ()
    return model(*spec).mean_stream_tok_s(batch, context)


def _best_steps(batch: int, context: float) -> int:
    return max(range(8), key=lambda k: _tok_s(k, batch, context))


def test_the_optimum_moves_with_the_shape_as_published() -> None:
    # speed_model.toml's sources: best MTP steps ~4 at batch 1 and ~2 at batch 64 (SGLang PR #22246); the
    # speedup ~2.3x at 1K context falling to 1.1-1.26x at 50K (intel/llm-scaler #657), a loss at long context
    # with several streams (vLLM #47277, #47602)
    assert _best_steps(1, 1000) == 4
    assert _best_steps(64, 1000) == 2
    assert _best_steps(1, 50_000) == 2
    assert _best_steps(4, 32_000) == 0  # speculation loses
    assert 2.0 <= _tok_s(4, 1, 1000) / _tok_s(0, 1, 1000) <= 2.5
    assert 1.1 <= _tok_s(4, 1, 50_000) / _tok_s(0, 1, 50_000) <= 1.26
    assert _tok_s(4, 1, 120_000) < _tok_s(0, 1, 120_000)  # four steps are slower than none at 120K


def test_context_and_batch_enter_the_step_cost() -> None:
    m = model("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3")
    per_ktok = P["kv_ms_per_ktok"] + m.draft_tokens * P["spec_kv_ms_per_ktok"]
    assert m.mean_step_ms(2, 10_000) - m.mean_step_ms(2, 0) == pytest.approx(2 * 10 * per_ktok)
    plain = model()
    assert plain.mean_step_ms(2, 10_000) - plain.mean_step_ms(2, 0) == pytest.approx(2 * 10 * P["kv_ms_per_ktok"])
    # verifying the drafts of more streams than the knee costs per draft token and stream
    knee = int(P["verify_batch_knee"])
    grow = P["batch_cost"] * (P["draft_step_ms"] * 3 + P["verify_per_draft_token_ms"] * 3)
    extra = m.mean_step_ms(knee + 10) - m.mean_step_ms(knee) - 10 * grow
    plain_extra = plain.mean_step_ms(knee + 10) - plain.mean_step_ms(knee)
    assert extra - plain_extra == pytest.approx(10 * 3 * P["verify_batch_ms_per_draft_token"])


def test_calibration_holds_at_the_demo_bench_context() -> None:
    # the demo's [bench]: 256 input + 128 output tokens, so about 320 tokens of context on average
    assert 35 <= _tok_s(1, 1, 320) <= 40 and 50 <= _tok_s(3, 1, 320) <= 57
