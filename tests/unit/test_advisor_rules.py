"""The advisor's rules on hand-made evidence: real logs (SGLang 0.5.23, vLLM) and simulated server info, missing
fields, `[N/A]`, an older server without the /get_server_info fields, a vLLM server, and the GPU facts both ways.
A rule fires only on what the evidence shows, and its fix is in the flags of the release in front of it."""

from __future__ import annotations

from typing import Any

from app.core.advisor.evidence import Evidence
from app.core.advisor.rules import Finding, evaluate
from app.core.data import DecodeStats, GpuSample, LogLine, Notice, SpecDecodeStats
from app.core.logs.parser import parse_lines
from app.core.telemetry.topology import ComputeCapability, GpuFacts, parse_compute_caps, parse_topology
from tests.helpers import DATA

LOGS = DATA / "logs"
SMI = DATA / "smi"


def _a6000_facts() -> GpuFacts:
    """2 x RTX A6000 over PCIe, from the captured nvidia-smi outputs."""
    caps, _ = parse_compute_caps((SMI / "topo_compute_cap_2xa6000.csv").read_text())
    return GpuFacts(tuple(caps), parse_topology((SMI / "topo_2gpu_pcie_phb.txt").read_text()))


def _h200_facts() -> GpuFacts:
    """8 x H200 on NVLink (the captured topology), SM 9.0."""
    topology = parse_topology((SMI / "topo_8gpu_nv18_nics.txt").read_text())
    return GpuFacts(tuple(ComputeCapability(g, 9, 0) for g in topology.gpus), topology)
DEMO_FLAGS: dict[str, Any] = {"tp-size": 2, "mem-fraction-static": 0.88, "speculative-algorithm": "NEXTN",
                              "speculative-num-steps": 1, "speculative-eagle-topk": 1,
                              "speculative-num-draft-tokens": 2}
SIM_0510_INFO: dict[str, Any] = {  # what the simulated 0.5.10 answers on /get_server_info for the demo
    "version": "0.5.10", "tp_size": 2, "mem_fraction_static": 0.88, "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2,
    "disable_piecewise_cuda_graph": True, "enable_piecewise_cuda_graph": False, "disable_overlap_schedule": True,
    "enable_single_batch_overlap": False, "enable_flashinfer_allreduce_fusion": False, "enable_nccl_nvls": False,
    "disable_cuda_graph": False, "cuda_graph_max_bs": 32}


def _from_log(name: str, backend: str, **fields: Any) -> Evidence:
    events = parse_lines((LOGS / name).read_text().splitlines(), backend).events
    return Evidence(backend=backend, notices=tuple(e for e in events if isinstance(e, Notice)),
                    decode=tuple(e for e in events if isinstance(e, DecodeStats)),
                    spec_decode=tuple(e for e in events if isinstance(e, SpecDecodeStats)),
                    log_lines=len(events), **fields)


def _by_rule(findings: list[Finding]) -> dict[str, Finding]:
    return {f.rule: f for f in findings}


def _decode(n: int, *, running: int = 1, graph: bool | None = True, accept: float | None = None) -> DecodeStats:
    text = f"Decode batch, #running-req: {running}, cuda graph: {graph}, gen throughput (token/s): 50.0"
    return DecodeStats(50.0, LogLine(n, text), accept_len=accept, running=running, cuda_graph=graph)


def test_real_0523_log_names_the_multimodal_auto_disable_with_0523s_flag() -> None:
    ev = _from_log("sglang_0523_crash.log", "sglang", requested=DEMO_FLAGS, version="0.5.23")
    graph = _by_rule(evaluate(ev))["prefill_graph_auto_disabled"]
    assert graph.status == "fix" and graph.fix == {"cuda-graph-backend-prefill": "breakable"}
    assert "multimodal" in graph.what
    assert any("Breakable CUDA graph is incompatible with multimodal model" in line for line in graph.evidence)


def test_real_0523_log_with_the_graph_requested_and_good_acceptance_claims_neither() -> None:
    flags = {**DEMO_FLAGS, "cuda-graph-backend-prefill": "breakable", "speculative-num-steps": 3,
             "speculative-num-draft-tokens": 4}
    rules = _by_rule(evaluate(_from_log("sglang_0523_startup.log", "sglang", requested=flags, version="0.5.23")))
    assert "prefill_graph_auto_disabled" not in rules
    assert "accept_length_low" not in rules and "decode_without_graph" not in rules
    assert "speculation" not in rules  # 3 steps, topk 1, 4 draft tokens: consistent


def test_simulated_0510_server_info_fires_the_graph_and_overlap_rules_in_0510s_flags() -> None:
    rules = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=SIM_0510_INFO)))
    graph = rules["prefill_graph_auto_disabled"]
    assert graph.fix == {"enforce-piecewise-cuda-graph": True}
    assert "/get_server_info disable_piecewise_cuda_graph=True (requested: on by default)" in graph.evidence
    # no notice and no /model_info: only what /get_server_info shows is named (0.5.10's silent rule, condition 2)
    assert "because speculative decoding is on" in graph.what and "multimodal" not in graph.what
    assert "/get_server_info speculative_algorithm='EAGLE'" in graph.evidence
    assert rules["single_batch_overlap_off"].fix == {"enable-single-batch-overlap": True}
    assert rules["overlap_schedule_off"].status == "advice" and not rules["overlap_schedule_off"].fix


SIM_0510_MODEL_INFO: dict[str, Any] = {  # the simulated 0.5.10's /model_info for the demo's model (real fields)
    "model_path": "sim/qwen3.6-27b", "tokenizer_path": "sim/qwen3.6-27b", "is_generation": True,
    "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": True,
    "has_audio_understanding": False, "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"]}


def test_0510_names_the_multimodal_class_from_model_info_and_every_condition_met() -> None:
    graph = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=SIM_0510_INFO,
                                       model_info=SIM_0510_MODEL_INFO)))["prefill_graph_auto_disabled"]
    assert "the model class Qwen3_5ForConditionalGeneration counts as multimodal" in graph.what
    assert "speculative decoding is on" in graph.what
    assert any(line.startswith("/model_info architectures=['Qwen3_5ForConditionalGeneration']")
               and "has_image_understanding=True" in line for line in graph.evidence)
    # --language-only is not part of the fix: real 0.5.10 ignores it for this rule and refuses it without encoders
    assert graph.fix == {"enforce-piecewise-cuda-graph": True}


def test_0510_with_a_text_model_and_no_condition_met_names_no_cause() -> None:
    info = {**SIM_0510_INFO, "speculative_algorithm": None}
    text_model = {**SIM_0510_MODEL_INFO, "has_image_understanding": False, "architectures": ["LlamaForCausalLM"]}
    flags = {"tp-size": 2}
    graph = _by_rule(evaluate(Evidence("sglang", flags, version="0.5.10", resolved=info,
                                       model_info=text_model)))["prefill_graph_auto_disabled"]
    assert "neither the log nor the server's answers say which" in graph.what
    assert graph.evidence == ("/get_server_info disable_piecewise_cuda_graph=True (requested: on by default)",)


def test_0510_model_info_placeholders_claim_no_multimodal_cause() -> None:
    for bad in ({"has_image_understanding": "[N/A]"}, {"architectures": None}, {}):
        info = {"architectures": ["X"], **bad}
        graph = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=SIM_0510_INFO,
                                           model_info=info)))["prefill_graph_auto_disabled"]
        assert "multimodal" not in graph.what


def test_the_graph_turned_off_by_the_users_own_flag_is_not_called_auto_disabled() -> None:
    flags = {**DEMO_FLAGS, "disable-piecewise-cuda-graph": True}
    assert "prefill_graph_auto_disabled" not in _by_rule(evaluate(
        Evidence("sglang", flags, version="0.5.10", resolved=SIM_0510_INFO)))


def test_an_older_server_without_the_fields_claims_only_what_the_argv_shows() -> None:
    ev = Evidence("sglang", {**DEMO_FLAGS, "speculative-num-draft-tokens": 3}, version="0.5.10",
                  resolved={"version": "0.5.10"})
    rules = _by_rule(evaluate(ev))
    for silent in ("prefill_graph_auto_disabled", "single_batch_overlap_off", "overlap_schedule_off",
                   "graph_max_bs_below_batch", "memory_idle"):
        assert silent not in rules
    # the requested flags still show draft tokens inconsistent with 1 step at topk 1
    assert rules["speculation"].fix == {"speculative-num-draft-tokens": 2}


def test_na_values_and_unread_memory_are_not_evidence() -> None:
    info = {**SIM_0510_INFO, "disable_piecewise_cuda_graph": "[N/A]", "enable_single_batch_overlap": "[N/A]",
            "disable_overlap_schedule": "[N/A]"}
    gpus = tuple(GpuSample(i, f"GPU-{i}", "NVIDIA RTX A6000", None, 49140, unavailable={"memory": "[N/A]"})
                 for i in (0, 1))
    rules = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=info, gpus=gpus)))
    silent = ("prefill_graph_auto_disabled", "single_batch_overlap_off", "overlap_schedule_off", "memory_idle")
    for rule in silent:
        assert rule not in rules
    # the control: the same server with readable values fires every one of them
    read = tuple(GpuSample(i, f"GPU-{i}", "NVIDIA RTX A6000", 20000, 49140) for i in (0, 1))
    fired = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=SIM_0510_INFO, gpus=read)))
    assert set(silent) <= set(fired)


def test_gpu_rules_say_not_read_without_facts_and_nothing_to_do_on_sm86() -> None:
    unread = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=SIM_0510_INFO)))
    for rule in ("flashinfer_allreduce_fusion", "nccl_nvls"):
        assert unread[rule].status == "not_read" and not unread[rule].fix
        assert "compute capability: not read" in unread[rule].evidence
    a6000 = _a6000_facts()
    rules = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=SIM_0510_INFO,
                                       gpu_facts=a6000)))
    for rule in ("flashinfer_allreduce_fusion", "nccl_nvls"):
        assert rules[rule].status == "nothing_to_do" and not rules[rule].fix
        assert "SM 8.6" in rules[rule].reason


def test_gpu_rules_on_sm90_with_nvlink_are_actionable() -> None:
    h200 = _h200_facts()
    rules = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=SIM_0510_INFO,
                                       gpu_facts=h200)))
    assert rules["flashinfer_allreduce_fusion"].fix == {"enable-flashinfer-allreduce-fusion": True}
    assert rules["nccl_nvls"].fix == {"enable-nccl-nvls": True}


def test_tp1_has_no_communication_rules() -> None:
    flags = {**DEMO_FLAGS, "tp-size": 1}
    info = {**SIM_0510_INFO, "tp_size": 1}
    rules = _by_rule(evaluate(Evidence("sglang", flags, version="0.5.10", resolved=info,
                                       gpu_facts=_h200_facts())))
    communication = ("single_batch_overlap_off", "flashinfer_allreduce_fusion", "nccl_nvls")
    for rule in communication:
        assert rule not in rules
    assert rules["prefill_graph_auto_disabled"].status == "fix"  # the other rules ran on the same evidence
    tp2 = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=SIM_0510_INFO,
                                     gpu_facts=_h200_facts())))
    assert set(communication) <= set(tp2)


def test_batches_above_the_graph_size_get_the_releases_max_bs_flag() -> None:
    lines = tuple(_decode(n, running=40, graph=False) for n in range(1, 5))
    for version, flag in (("0.5.10", "cuda-graph-max-bs"), ("0.5.23", "cuda-graph-max-bs-decode")):
        rules = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version=version, resolved=SIM_0510_INFO,
                                           decode=lines)))
        assert rules["graph_max_bs_below_batch"].fix == {flag: 40}
        assert "decode_without_graph" not in rules  # explained by the batch size


def test_low_acceptance_and_eager_decode_lines_are_reported_with_their_line() -> None:
    lines = tuple(_decode(n, accept=1.05, graph=False) for n in range(1, 6))
    rules = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=SIM_0510_INFO,
                                       decode=lines)))
    assert rules["accept_length_low"].status == "advice"
    assert rules["accept_length_low"].evidence[0].startswith("log line 5: Decode batch")
    assert rules["decode_without_graph"].evidence[0].startswith("log line 5:")
    few = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, resolved=SIM_0510_INFO, decode=lines[:2])))
    assert "accept_length_low" not in few  # two lines are not a trend


def test_idle_memory_raises_the_fraction() -> None:
    gpus = tuple(GpuSample(i, f"GPU-{i}", "NVIDIA RTX A6000", 20000, 49140) for i in (0, 1))
    rules = _by_rule(evaluate(Evidence("sglang", DEMO_FLAGS, version="0.5.10", resolved=SIM_0510_INFO, gpus=gpus)))
    fix = rules["memory_idle"].fix
    assert set(fix) == {"mem-fraction-static"} and 0.88 < fix["mem-fraction-static"] <= 0.95  # type: ignore[operator]


def test_vllm_gets_no_sglang_rule_and_claims_nothing_from_its_log() -> None:
    ev = _from_log("vllm_033.log", "vllm", requested={"tensor-parallel-size": 2}, version="0.33.0")
    findings = evaluate(ev)
    assert {f.rule for f in findings} <= {"accept_length_low", "memory_idle"}
    low = tuple(SpecDecodeStats(1.02, 2, 100, LogLine(n, "SpecDecoding metrics: ...")) for n in range(1, 5))
    rules = _by_rule(evaluate(Evidence("vllm", {"speculative-config": {"num_speculative_tokens": 3}},
                                       spec_decode=low)))
    assert rules["accept_length_low"].status == "advice" and set(rules) == {"accept_length_low"}


def _vllm_from_log(name: str, flags: dict[str, Any]) -> Evidence:
    from app.core.data import PhaseEvent
    from app.core.logs.parser import vllm_engine_config

    lines = (LOGS / name).read_text().splitlines()
    events = parse_lines(lines, "vllm").events
    engine, where = vllm_engine_config(lines)
    return Evidence("vllm", flags, version=engine.get("version"), engine=engine, engine_line=where,
                    notices=tuple(e for e in events if isinstance(e, Notice)),
                    phases=tuple(e for e in events if isinstance(e, PhaseEvent)))


def test_real_vllm_cpu_engine_line_is_read_field_by_field() -> None:
    from app.core.logs.parser import vllm_engine_config

    engine, where = vllm_engine_config((LOGS / "vllm_cpu_0320_compiled_real.log").read_text().splitlines())
    assert engine == {"version": "0.32.0", "enforce_eager": "False", "device": "cpu",
                      "compilation_mode": "DYNAMO_TRACE_ONCE", "cudagraph_mode": "NONE",
                      "speculative_config": "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=3)"}
    assert where is not None and where.number == 23
    assert vllm_engine_config(["no engine here", "Initializing a V1 LLM engine without config"]) == ({}, None)


def test_real_vllm_cpu_eager_is_advice_and_graphs_have_nothing_to_do_on_cpu() -> None:
    eager = _by_rule(evaluate(_vllm_from_log("vllm_cpu_0320_real.log", {"enforce-eager": True})))
    assert eager["eager_mode"].status == "advice" and not eager["eager_mode"].fix  # CPU: no CUDA graphs to lose
    assert any("Enforce eager set" in line for line in eager["eager_mode"].evidence)
    assert "cudagraph_mode_none" not in eager  # eager explains it
    compiled = _by_rule(evaluate(_vllm_from_log("vllm_cpu_0320_compiled_real.log", {})))
    assert "eager_mode" not in compiled
    assert compiled["cudagraph_mode_none"].status == "nothing_to_do"
    assert "no CUDA graphs on CPU" in compiled["cudagraph_mode_none"].reason
    assert "speculation" not in compiled  # n-gram speculation runs


def test_vllm_on_a_gpu_gets_the_eager_and_graph_fixes_in_its_own_flags() -> None:
    line = LogLine(7, "Initializing a V1 LLM engine (v0.33.0) with config: ...")
    gpu = {"version": "0.33.0", "enforce_eager": "True", "device": "cuda", "cudagraph_mode": "NONE"}
    eager = _by_rule(evaluate(Evidence("vllm", {"enforce-eager": True}, engine=gpu, engine_line=line)))
    assert eager["eager_mode"].fix == {"enforce-eager": None}
    no_graph = {**gpu, "enforce_eager": "False", "compilation_mode": "VLLM_COMPILE", "speculative_config": "None"}
    rules = _by_rule(evaluate(Evidence("vllm", {}, version="0.33.0", engine=no_graph, engine_line=line)))
    assert rules["cudagraph_mode_none"].fix == {"compilation-config.cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert "log line 7 (engine config): cudagraph_mode=NONE" in rules["cudagraph_mode_none"].evidence
    assert rules["speculation"].status == "advice"
    # without the engine line nothing is claimed
    assert not {"eager_mode", "cudagraph_mode_none", "speculation"} & set(_by_rule(evaluate(Evidence("vllm", {}))))
