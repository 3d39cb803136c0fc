"""Log parser: the SGLang and vLLM lines of docs/servers.md -> typed events."""

from __future__ import annotations

import pytest

from app.core.data import (
    DecodeStats,
    FatalEvent,
    LogEvent,
    Notice,
    Phase,
    PhaseEvent,
    PrefillStats,
    ReadyEvent,
    SpecDecodeStats,
)
from app.core.logs.parser import LogParser, detect_backend, parse_lines, read_log_lines
from tests.log_helpers import LOGS, feed, of_type, parse


def phases(events: list[LogEvent]) -> list[tuple[Phase, bool]]:
    return [(event.phase, event.begin) for event in of_type(events, PhaseEvent)]


def one(line: str, backend: str | None = None) -> list[LogEvent]:
    return feed(line, backend)


def decode(line: str, backend: str | None = None) -> DecodeStats:
    (stats,) = of_type(one(line, backend), DecodeStats)
    return stats


# --- whole logs -------------------------------------------------------------------------------------


def test_sglang_startup_log_gives_phases_in_order_then_ready_then_throughput() -> None:
    events = parse("sglang_0510_startup.log")
    assert phases(events) == [
        (Phase.INIT, True),
        (Phase.INIT, False),
        (Phase.WEIGHTS, True),
        (Phase.WEIGHTS, False),
        (Phase.KV_CACHE, True),
        (Phase.KV_CACHE, False),
        (Phase.CUDA_GRAPH, True),
        (Phase.CUDA_GRAPH, False),
        (Phase.CUDA_GRAPH, True),
        (Phase.CUDA_GRAPH, False),
        (Phase.CUDA_GRAPH, True),
        (Phase.CUDA_GRAPH, False),
        (Phase.WARMUP, True),
    ]
    kinds = [type(event).__name__ for event in events]
    assert kinds.index("ReadyEvent") < kinds.index("DecodeStats")
    assert [stats.gen_tps for stats in of_type(events, DecodeStats)] == [1203.55, 1187.10, 2001.90]
    assert not of_type(events, FatalEvent)


def test_sglang_phase_details_carry_the_backend_figures() -> None:
    events = of_type(parse("sglang_0510_startup.log"), PhaseEvent)
    weights_end = next(e for e in events if e.phase is Phase.WEIGHTS and not e.begin)
    assert weights_end.detail == {
        "arch": "LlamaForCausalLM",
        "dtype": "torch.bfloat16",
        "avail_mem_gb": "70.41",
        "mem_usage_gb": "7.52",
    }
    kv = next(e for e in events if e.phase is Phase.KV_CACHE and e.begin)
    assert kv.detail["tokens"] == "1048576"
    assert kv.detail["k_size_gb"] == "32.00"
    graph_ends = [(e.detail["graph"], e.seconds) for e in events if e.phase is Phase.CUDA_GRAPH and not e.begin]
    assert graph_ends == [("cuda", 4.92), ("draft cuda", 2.61), ("draft extend cuda", 1.80)]
    warmup = next(e for e in events if e.phase is Phase.WARMUP)
    assert warmup.line.text.endswith("Application startup complete.")


def test_sglang_secondary_ranks_do_not_repeat_phases() -> None:
    events = of_type(parse("sglang_0510_startup.log"), PhaseEvent)
    assert all(" TP1]" not in event.line.text for event in events)


def test_sglang_startup_notices_and_deprecation() -> None:
    notices = of_type(parse("sglang_0510_startup.log"), Notice)
    assert [(notice.kind, notice.text.split(" ")[0]) for notice in notices] == [
        ("auto_disabled", "Overlap"),
        ("auto_adjusted", "Max"),
        ("auto_adjusted", "speculative_num_draft_tokens"),
        ("auto_disabled", "Mixed"),
        ("deprecation", "Endpoint"),
    ]
    assert not notices[0].text.startswith("[")  # the message, without the prefix


def test_sglang_crash_while_loading_gives_oom_with_its_traceback_then_child_failed() -> None:
    events = parse("sglang_crash_loading.log")
    assert not of_type(events, ReadyEvent)
    oom, child = of_type(events, FatalEvent)
    assert oom.kind == "oom"
    assert oom.text == "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    assert oom.line.number == 5
    assert "Scheduler hit an exception" in oom.line.text
    assert oom.context[0].endswith("mem_fraction_static=0.95)")  # the lines before it
    assert oom.context[-1] == oom.text
    assert any("raise RuntimeError(" in line for line in oom.context)
    assert child.kind == "child_failed"
    assert child.line.number == 13
    (notice,) = of_type(events, Notice)
    assert "profiled value -561981" in notice.text


def test_vllm_011_ansi_subprocess_log() -> None:
    events = parse("vllm_011.log")
    assert all("\x1b" not in event.line.text for event in events)
    assert phases(events) == [
        (Phase.INIT, True),
        (Phase.WEIGHTS, False),
        (Phase.WEIGHTS, False),
        (Phase.KV_CACHE, True),
        (Phase.KV_CACHE, False),
        (Phase.CUDA_GRAPH, True),
        (Phase.CUDA_GRAPH, False),
        (Phase.WARMUP, True),  # "Starting vLLM API server 0 on URL": uvicorn does not listen yet
    ]
    kv_end = next(e for e in of_type(events, PhaseEvent) if e.phase is Phase.KV_CACHE and not e.begin)
    assert kv_end.detail == {"device": "GPU", "tokens": "854592"}
    (ready,) = of_type(events, ReadyEvent)
    assert ready.line.text.endswith("Application startup complete.")
    first = of_type(events, DecodeStats)[0]
    assert (first.gen_tps, first.running, first.queued, first.token_usage) == (1843.7, 12, 3, pytest.approx(0.042))
    spec, idle_spec = of_type(events, SpecDecodeStats)
    assert (spec.mean_accept_len, spec.accepted, spec.drafted) == (2.84, 11952, 19500)
    assert spec.accept_rate == pytest.approx(0.613)
    assert (idle_spec.mean_accept_len, idle_spec.accept_rate) == (None, None)  # "nan"


def test_vllm_tqdm_carriage_return_updates_give_one_capture_begin() -> None:
    events = parse("vllm_011.log")
    begins = [e for e in of_type(events, PhaseEvent) if e.phase is Phase.CUDA_GRAPH and e.begin]
    assert len(begins) == 1
    assert begins[0].line.text.startswith("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%")


def test_vllm_033_notices_and_ready() -> None:
    events = parse("vllm_033.log")
    notices = of_type(events, Notice)
    assert [n.kind for n in notices] == ["auto_disabled"] * 3
    assert notices[0].text.startswith("Enforce eager set, disabling torch.compile and CUDAGraphs")
    assert notices[1].text == "Cudagraph is disabled under eager mode"
    assert notices[2].text.startswith("Async scheduling will be disabled")
    (ready,) = of_type(events, ReadyEvent)  # not "Starting vLLM server on URL": printed before uvicorn listens
    assert ready.line.text.endswith("Application startup complete.")
    warmup = next(e for e in of_type(events, PhaseEvent) if e.phase is Phase.WARMUP)
    assert warmup.line.text.endswith("Starting vLLM server on http://0.0.0.0:8000")
    (stats,) = of_type(events, DecodeStats)
    assert (stats.gen_tps, stats.running, stats.queued, stats.token_usage) == (910.5, 8, 1, pytest.approx(0.015))


def test_vllm_cpu_build_is_ready_at_uvicorn_startup_complete() -> None:
    events = parse("vllm_cpu.log")
    (ready,) = of_type(events, ReadyEvent)
    assert ready.line.text == "INFO:     Application startup complete."
    assert ready.timestamp == "11-30 10:02:41"  # the last timestamp before it
    (stats,) = of_type(events, DecodeStats)
    assert (stats.gen_tps, stats.token_usage) == (194.4, 0.0)
    kv_end = next(e for e in of_type(events, PhaseEvent) if e.phase is Phase.KV_CACHE)
    assert kv_end.detail == {"device": "CPU", "tokens": "27296"}


def test_vllm_port_in_use_is_fatal() -> None:
    (fatal,) = of_type(parse("vllm_port_in_use.log"), FatalEvent)
    assert fatal.kind == "port_in_use"
    assert fatal.line.number == 6
    assert fatal.context[-1] == fatal.line.text


# --- backend detection --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "backend"),
    [
        ("sglang_0510_startup.log", "sglang"),
        ("sglang_crash_loading.log", "sglang"),
        ("vllm_011.log", "vllm"),
        ("vllm_033.log", "vllm"),
        ("vllm_cpu.log", "vllm"),
        ("vllm_port_in_use.log", "vllm"),
    ],
)
def test_detect_backend_of_each_log(name: str, backend: str) -> None:
    assert detect_backend(read_log_lines(LOGS / name)) == backend
    assert parse_lines(read_log_lines(LOGS / name)).backend == backend


def test_detect_backend_none_for_unrelated_text() -> None:
    assert detect_backend(["hello", "INFO:     Application startup complete."]) is None


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="sglang, vllm"):
        LogParser("tgi")


def test_forced_backend_ignores_the_other_backends_lines() -> None:
    parser = LogParser("sglang")
    assert (
        parser.feed("INFO 11-30 12:00:51 [api_server.py:1912] Starting vLLM API server 0 on http://0.0.0.0:8000") == []
    )
    assert parser.backend == "sglang"


# --- SGLang Decode batch variants (docs/servers.md#sglang-log-lines) --------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "[16:43:29 TP0] Decode batch. #running-req: 3, #token: 1200, token usage: 0.02, "
            "gen throughput (token/s): 95.43, #queue-req: 0",
            {"gen_tps": 95.43, "running": 3, "queued": 0, "token_usage": 0.02, "cuda_graph": None, "accept_len": None},
            id="0.3-time-only",
        ),
        pytest.param(
            "[2025-03-07 23:50:27 TP0] Decode batch. #running-req: 1, #token: 533, token usage: "
            "0.00, accept len: 2.71, "
            "gen throughput (token/s): 151.67, largest-len: 0, #queue-req: 0, ",
            {"gen_tps": 151.67, "running": 1, "queued": 0, "accept_len": 2.71},
            id="0.4.3-trailing-comma-largest-len",
        ),
        pytest.param(
            "[2025-05-20 10:00:00 TP0] Decode batch. #running-req: 2, #token: 700, token usage: "
            "0.01, accept len: 3.05, "
            "pre-allocated usage: 0.00, cuda graph: True, gen throughput (token/s): 310.20, #queue-req: 0",
            {"gen_tps": 310.20, "accept_len": 3.05, "cuda_graph": True, "token_usage": 0.01},
            id="0.4.6-cuda-graph-and-accept-len",
        ),
        pytest.param(
            "[2025-08-01 10:00:00 TP0] Decode batch. #running-req: 4, #full token: 8000, full token usage: 0.05, "
            "#swa token: 4000, swa token usage: 0.10, cuda graph: False, gen throughput (token/s): 400.00, "
            "#queue-req: 1, ",
            {"gen_tps": 400.0, "token_usage": 0.05, "cuda_graph": False, "queued": 1},
            id="0.4.10-hybrid-swa",
        ),
        pytest.param(
            "[2025-08-01 10:00:00] Decode batch. #running-req: 1, #token: 90, token usage: 0.00, cpu graph: True, "
            "gen throughput (token/s): 12.50, #queue-req: 0, ",
            {"gen_tps": 12.5, "cuda_graph": True},
            id="0.5.3-cpu-graph",
        ),
        pytest.param(
            "[2025-10-01 10:00:00 TP0] Decode batch. #running-req: 1, #token: 100, token usage: "
            "0.00, accept len: 3.20, "
            "accept rate: 0.73, cuda graph: True, gen throughput (token/s): 250.00, #queue-req: 0, ",
            {"gen_tps": 250.0, "accept_len": 3.2, "accept_rate": 0.73},
            id="0.5.4-accept-rate",
        ),
        pytest.param(
            "[2025-11-01 10:00:00 TP0] Decode batch [1240], #running-req: 5, #token: 300, token usage: 0.01, "
            "cuda graph: True, gen throughput (token/s): 600.00, #queue-req: 2, ",
            {"gen_tps": 600.0, "running": 5, "queued": 2},
            id="0.5.5-comma-and-iter",
        ),
        pytest.param(
            "[2026-01-10 10:00:00 TP0] Decode batch, #running-req: 2, #full token: 500, full token usage: 0.01, "
            "mamba num: 2, mamba usage: 0.02, npu graph: True, gen throughput (token/s): 80.00, #queue-req: 0",
            {"gen_tps": 80.0, "token_usage": 0.01, "cuda_graph": True},
            id="0.5.9-no-trailing-comma-mamba-npu",
        ),
        pytest.param(
            "[2026-01-10 10:00:00 TP0] Decode batch, #running-req: 2, #token: 500, token usage: 0.01, "
            "musa graph: False, gen throughput (token/s): 70.00, waiting-image-req: 0, #queue-req: 3",
            {"gen_tps": 70.0, "cuda_graph": False, "queued": 3},
            id="0.5.9-musa-language-only",
        ),
        pytest.param(
            "[2026-03-10 10:00:00 TP0] Decode batch, #running-req: 2, #gpu token: 500, gpu token usage: 0.03, "
            "#cpu token: 100, cpu token usage: 0.01, cuda graph: True, gen throughput (token/s): 77.00, #queue-req: 0",
            {"gen_tps": 77.0, "token_usage": 0.03},
            id="0.5.12-hisparse",
        ),
        pytest.param(
            "[2025-11-01 10:00:00 DP1 TP0] Decode batch, #running-req: 5, #token: 300, token usage: 0.01, "
            "#prealloc-req: 0, #transfer-req: 1, #retracted-req: 0, cuda graph: True, "
            "gen throughput (token/s): 611.00, #queue-req: 2, ",
            {"gen_tps": 611.0, "running": 5},
            id="pd-decode-dp-rank",
        ),
        pytest.param(
            "(SGLangEngine pid=41820) [2025-11-30 12:00:00 TP0] Decode batch, #running-req: 1, #token: 10, "
            "token usage: 0.00, cuda graph: True, gen throughput (token/s): 42.00, #queue-req: 0",
            {"gen_tps": 42.0, "timestamp": "2025-11-30 12:00:00"},
            id="ray-prefix",
        ),
        pytest.param(
            "2025-03-07 23:50:27,531 - __main__ - INFO - [2025-03-07 23:50:27 TP0] Decode batch. #running-req: 1, "
            "#token: 533, token usage: 0.00, gen throughput (token/s): 151.67, #queue-req: 0, ",
            {"gen_tps": 151.67, "timestamp": "2025-03-07 23:50:27"},
            id="embedding-app-prefix",
        ),
        pytest.param(
            "2025-12-04 20:35:53 INFO 151972 [scheduler_metrics_mixin.py:287] Decode batch. #running-req: 7, "
            "#token: 900, token usage: 0.04, cuda graph: True, gen throughput (token/s): 321.00, #queue-req: 0",
            {"gen_tps": 321.0, "running": 7, "timestamp": "2025-12-04 20:35:53"},
            id="custom-logging-config",
        ),
    ],
)
def test_sglang_decode_variants(line: str, expected: dict[str, object]) -> None:
    stats = decode(line)
    for field, value in expected.items():
        assert (
            getattr(stats, field) == pytest.approx(value)
            if isinstance(value, float)
            else getattr(stats, field) == value
        ), field


def test_sglang_decode_with_both_accept_len_and_cuda_graph_keeps_accept_len() -> None:
    # The research notes' DECODE regex drops accept len when cuda graph is present (lazy .*? skips the group;
    # docs/decisions.md#decode-line-as-key-value-pairs).
    line = (
        "[2025-11-30 12:51:02 TP0] Decode batch, #running-req: 8, #token: 9344, token usage: 0.01, accept len: 3.42, "
        "accept rate: 0.81, cuda graph: True, gen throughput (token/s): 1203.55, #queue-req: 0"
    )
    stats = decode(line)
    assert (stats.accept_len, stats.accept_rate, stats.cuda_graph) == (3.42, 0.81, True)


def test_prefill_lines_are_not_decode_stats() -> None:
    line = (
        "[2026-01-10 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0, cuda graph: False, input throughput (token/s): 0.00"
    )
    (prefill,) = one(line)  # a PrefillStats (tests/unit/test_logwatch_0523.py), never a DecodeStats
    assert isinstance(prefill, PrefillStats)
    assert (prefill.new_tokens, prefill.input_tps, prefill.cuda_graph) == (6, 0.0, False)


# --- vLLM throughput and spec decoding --------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "gen_tps", "running", "queued", "usage"),
    [
        pytest.param(
            "INFO 01-22 18:27:20 metrics.py:449] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
            "35.2 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 2 reqs, GPU KV cache usage: 0.1%, "
            "CPU KV cache usage: 0.0%.",
            35.2,
            1,
            2,
            0.001,
            id="v0",
        ),
        pytest.param(
            "INFO 11-30 12:01:11 [loggers.py:127] Engine 000: Avg prompt throughput: 1.9 tokens/s, Avg generation "
            "throughput: 194.4 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, "
            "Prefix cache hit rate: 0.0%",
            194.4,
            0,
            0,
            0.0,
            id="0.11-cpu",
        ),
        pytest.param(
            "(APIServer pid=7) INFO 11-30 12:01:11 [loggers.py:241] Engine 000: Avg prompt throughput: 10.0 tokens/s, "
            "Avg generation throughput: 88.8 tokens/s, Running: 3 reqs, Waiting: 4 reqs, Deferred: 1 reqs, "
            "Preemptions: 2, XPU KV cache usage: 55.5%, Prefix cache hit rate: 1.0%, Corrupted: 0 reqs",
            88.8,
            3,
            4,
            0.555,
            id="0.33-optional-parts",
        ),
        pytest.param(
            "Sep 22 23:46:42 gpu01 vllm[1234]: INFO 09-22 23:46:42 [loggers.py:123] Engine 000: Avg prompt "
            "throughput: 0.0 tokens/s, Avg generation throughput: 61.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
            "GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%",
            61.0,
            1,
            0,
            0.01,
            id="journald",
        ),
    ],
)
def test_vllm_throughput_variants(line: str, gen_tps: float, running: int, queued: int, usage: float) -> None:
    stats = decode(line)
    assert (stats.gen_tps, stats.running, stats.queued) == (gen_tps, running, queued)
    assert stats.token_usage == pytest.approx(usage)
    assert stats.accept_len is None


@pytest.mark.parametrize("tokens", ["", " tokens"])
def test_vllm_spec_decode_v0(tokens: str) -> None:
    line = (
        "INFO 07-10 10:00:00 metrics.py:400] Speculative metrics: Draft acceptance rate: 0.651, System efficiency: "
        f"0.570, Number of speculative tokens: 4, Number of accepted tokens: 2604, Number of draft tokens{tokens}: "
        f"4000, Number of emitted tokens{tokens}: 2850."
    )
    (spec,) = of_type(one(line), SpecDecodeStats)
    assert (spec.accepted, spec.drafted, spec.accept_rate) == (2604, 4000, 0.651)
    assert spec.mean_accept_len == pytest.approx(2850 * 4 / 4000)  # emitted tokens per verify step


# --- notices (docs/servers.md#sglang-log-lines) -----------------------------------------------------------

NOTICE_CASES = [
    (
        "Piecewise cuda graph is disabled for MoE runner backend 'flashinfer_trtllm' (bypassed topk is incompatible "
        "with torch.compile).",
        "auto_disabled",
    ),
    (
        "XPU platform does not support piecewise CUDA graph, ignoring "
        "--disable-piecewise-cuda-graph flag and disabling "
        "piecewise CUDA graph.",
        "auto_disabled",
    ),
    ("Piecewise CUDA graph is enabled, use MLA for prefill.", "auto_adjusted"),
    ("Enable piecewise CUDA graph, enabling auto MOE kernel.", "auto_adjusted"),
    ("Disable piecewise CUDA graph because --disable-piecewise-cuda-graph is set", "auto_disabled"),
    ("Disable piecewise CUDA graph because the model is not a language model", "auto_disabled"),
    ("Disable piecewise CUDA graph because the capture size is not set", "auto_disabled"),
    ("Disable piecewise CUDA graph because the model does not have a 'layers' attribute", "auto_disabled"),
    ("Piecewise CUDA Graph failed with error: boom", "warning"),
    ("Breakable CUDA graph is incompatible with MLA attention; disabling prefill CUDA graph.", "auto_disabled"),
    ("Disabling breakable prefill CUDA graph by default for pipeline parallelism", "auto_disabled"),
    ("Overlap scheduler is disabled because of using eagle speculative decoding.", "auto_disabled"),
    ("Pipeline parallelism is incompatible with overlap schedule.", "auto_disabled"),
    (
        "The overlap scheduler and mixed chunked prefill are disabled because of using ngram speculative decoding.",
        "auto_disabled",
    ),
    ("Overlap scheduler is disabled because of using eagle3 or standalone speculative decoding.", "auto_disabled"),
    (
        "Disabling overlap schedule since MambaRadixCache is not compatible with overlap schedule "
        "currently, try to use "
        "--disable-radix-cache if overlap schedule is necessary",
        "auto_disabled",
    ),
    ("Overlap schedule is disabled because of using diffusion LLM inference", "auto_disabled"),
    ("Overlap scheduler is disabled when using sparse head for embedding model.", "auto_disabled"),
    (
        "Overlap scheduler is disabled when using DFLASH speculative decoding (spec v2 is not supported yet).",
        "auto_disabled",
    ),
    ("Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule is turned on.", "auto_adjusted"),
    ("Beta spec is enabled for eagle speculative decoding and overlap schedule is turned on.", "auto_adjusted"),
    ("Spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding.", "auto_adjusted"),
    (
        "Spec v1 is used for eagle/eagle3/standalone speculative decoding because SGLANG_ENABLE_SPEC_V2=False.",
        "auto_disabled",
    ),
    (
        "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly setting "
        "--max-running-requests.",
        "auto_adjusted",
    ),
    (
        "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1",
        "auto_adjusted",
    ),
    (
        "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. You can override this by "
        "explicitly setting --speculative-num-draft-tokens.",
        "auto_adjusted",
    ),
    ("speculative_eagle_topk is adjusted to 1 when page_size > 1", "auto_adjusted"),
    ("Mixed chunked prefill is disabled because of using eagle speculative decoding.", "auto_disabled"),
    ("DeepSeek MTP does not require setting speculative_draft_model_path.", "warning"),
    ("Cuda graph is disabled because of using torch native attention backend", "auto_disabled"),
    ("Cuda graph is disabled because of using torch Flex Attention backend", "auto_disabled"),
    ("Cuda graph is disabled because deepep_mode=`normal`", "auto_disabled"),
    ("Cuda graph is disabled for prefill server", "auto_disabled"),
    ("Cuda graph is disabled for prefill server when piecewise cuda graph is not enabled.", "auto_disabled"),
    ("Cuda graph and server warmup are disabled because of using tensor dump mode", "auto_disabled"),
    ("Cuda graph is disabled because of using diffusion LLM inference", "auto_disabled"),
    ("CUDA graph is disabled because --enable-mis is set.", "auto_disabled"),
    ("Auto-enabling FlashInfer AllReduce Fusion on SM90/SM10X for DeepseekV3ForCausalLM", "auto_adjusted"),
    ("Enable FlashInfer AllReduce Fusion on sm100 for DeepseekV3ForCausalLM", "auto_adjusted"),
    (
        "FlashInfer allreduce fusion is forcibly disabled via --enforce-disable-flashinfer-allreduce-fusion.",
        "auto_disabled",
    ),
    ("Disable --enable-flashinfer-allreduce-fusion because deterministic inference is enabled.", "auto_disabled"),
    (
        "Failed to initialize FlashInfer workspace: oops. Disabling flashinfer allreduce fusion permanently.",
        "auto_disabled",
    ),
    ("flashinfer.comm is not available, falling back to standard implementation", "auto_disabled"),
    (
        "NCCL_ALGO is set to 'allreduce:tree' and custom all reduce is disabled for deterministic "
        "inference when TP size "
        "> 1.",
        "auto_disabled",
    ),
    (
        "DP attention is enabled. The chunked prefill size is adjusted to 4096 to avoid MoE kernel issues. ",
        "auto_adjusted",
    ),
    ("FlashInfer TRTLLM MoE is enabled. --disable-shared-experts-fusion is automatically set.", "auto_adjusted"),
    ("Disabling Radix Cache for Qwen3NextForCausalLM as it is not yet supported.", "auto_disabled"),
    ("Disable hybrid SWA memory for GptOssForCausalLM as it is not yet supported.", "auto_disabled"),
    ("Multimodal is disabled for gemma3. To enable it, set --enable-multimodal.", "auto_disabled"),
    ("Automatically reduce --mem-fraction-static to 0.760 because this is a multimodal model.", "auto_adjusted"),
    ("Multimodal model: Dynamically adjusted --mem-fraction-static from: 0.88 to: 0.80.", "auto_adjusted"),
    (
        "Endpoint '/get_model_info' is deprecated and will be removed in a future version. Please use '/model_info' "
        "instead.",
        "deprecation",
    ),
    ("token_to_kv_pool_allocator memory leak detected! available_size=1, protected_size=0", "warning"),
]


@pytest.mark.parametrize(("message", "kind"), NOTICE_CASES)
def test_sglang_notices(message: str, kind: str) -> None:
    (notice,) = one(f"[2025-11-30 12:50:10] {message}")
    assert isinstance(notice, Notice)
    assert (notice.kind, notice.text) == (kind, message.strip())


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (
            "(APIServer pid=1) WARNING 11-30 12:00:00 [config.py:1] Enforce eager set, disabling torch.compile and "
            "CUDAGraphs. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none",
            "auto_disabled",
        ),
        ("WARNING 11-30 12:00:00 [compilation.py:1] Cudagraph is disabled under eager mode", "auto_disabled"),
        (
            "WARNING 11-30 12:00:00 [scheduler.py:1] Async scheduling will be disabled because it "
            "is not supported with "
            "the `ray` distributed executor backend. ",
            "auto_disabled",
        ),
        (
            "INFO 11-30 12:00:00 [arg_utils.py:1] Defaulting to mp-based distributed executor backend for async "
            "scheduling.",
            "auto_adjusted",
        ),
        ("WARNING 11-30 12:00:00 [api_server.py:1] SECURITY WARNING: Development endpoints are enabled!", "warning"),
        ("WARNING 11-30 12:00:00 [utils.py:1] Something unexpected but harmless", "warning"),
        ("WARNING 11-30 12:00:00 [arg_utils.py:1] --foo is deprecated; use --bar", "deprecation"),
    ],
)
def test_vllm_notices(line: str, kind: str) -> None:
    (notice,) = one(line)
    assert isinstance(notice, Notice)
    assert notice.kind == kind


def test_plain_info_lines_are_not_notices() -> None:
    assert one("INFO 11-30 12:00:05 [model.py:1510] Using max model len 131072") == []
    assert one("[2025-11-30 12:50:30 TP0] Using KV cache dtype: torch.bfloat16") == []


def test_notices_of_secondary_ranks_are_not_repeated() -> None:
    line = "[2025-11-30 12:50:10 TP3] Disable piecewise CUDA graph because the capture size is not set"
    assert one(line) == []


# --- fatal ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("[2025-11-30 11:18:41] RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "oom"),
        (
            "[2025-11-30 11:18:41 TP0] Exception: Capture cuda graph failed: CUDA out of memory. "
            "Tried to allocate 2.00 "
            "GiB",
            "oom",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB", "oom"),
        (
            "[2025-11-30 11:18:41] ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): "
            "address already in use",
            "port_in_use",
        ),
        (
            "[2025-11-30 11:18:41] ValueError: rpc_port at 30001 is not available in 30 seconds. rpc_port is used by a "
            "process already. process.name()='python' process.cmdline()=['python']",
            "port_in_use",
        ),
        ("OSError: [Errno 98] Address already in use", "port_in_use"),
        (
            "[2025-11-30 11:18:42] Received sigquit from a child process. It usually means the child failed.",
            "child_failed",
        ),
        (
            "[2025-11-30 11:18:42] SIGQUIT received. signum=3, frame=None. It usually means one child failed.",
            "child_failed",
        ),
        ("[2025-11-30 11:18:42] Initialization failed. warmup error: timed out", "error"),
        (
            "(APIServer pid=1) ERROR 11-30 12:00:00 [async_llm.py:1] vllm.v1.engine.exceptions.EngineDeadError: "
            "EngineCore encountered an issue.",
            "error",
        ),
        ("(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.", "error"),
    ],
)
def test_fatal_lines(line: str, kind: str) -> None:
    (fatal,) = one(line)
    assert isinstance(fatal, FatalEvent)
    assert fatal.kind == kind
    assert fatal.context[-1] == fatal.line.text


def test_fatal_context_holds_the_lines_before_it() -> None:
    parser = LogParser("sglang", context_lines=5)
    for number in range(10):
        assert parser.feed(f"[2025-11-30 11:18:{number:02d}] line {number}") == []
    (fatal,) = parser.feed(
        "[2025-11-30 11:18:41] Received sigquit from a child process. It usually means the child failed."
    )
    assert isinstance(fatal, FatalEvent)
    assert len(fatal.context) == 5
    assert fatal.context[0].endswith("line 6")
    assert fatal.line.number == 11


TRACEBACK = [
    "[2025-11-30 11:18:41 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sglang/srt/managers/scheduler.py", line 2843, in run_scheduler_process',
    "    scheduler.event_loop_overlap()",
    "ValueError: first",
    "",
    "The above exception was the direct cause of the following exception:",
    "",
    "Traceback (most recent call last):",
    '  File "/sglang/srt/managers/scheduler.py", line 900, in event_loop_overlap',
    "    raise RuntimeError('second')",
    "RuntimeError: second",
]


def test_chained_traceback_gives_one_event_with_the_final_exception() -> None:
    parser = LogParser()
    events: list[LogEvent] = []
    for line in TRACEBACK:
        events += parser.feed(line)
    assert events == []  # still collecting: the next line may continue the chain
    events += parser.feed(
        "[2025-11-30 11:18:42] Received sigquit from a child process. It usually means the child failed."
    )
    tb, child = events
    assert isinstance(tb, FatalEvent) and isinstance(child, FatalEvent)
    assert (tb.kind, tb.text, tb.line.number) == ("error", "RuntimeError: second", 1)
    assert tb.context == tuple(TRACEBACK)
    assert child.kind == "child_failed"


def test_traceback_at_end_of_stream_is_flushed() -> None:
    parser = LogParser("sglang")
    for line in TRACEBACK[:4]:
        assert parser.feed(line) == []
    (tb,) = parser.flush()
    assert isinstance(tb, FatalEvent)
    assert tb.text == "ValueError: first"
    assert parser.flush() == []


def test_plain_traceback_kind_is_traceback() -> None:
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "KeyError: 'model'", "next"]
    (tb,) = parse_lines(lines).events
    assert isinstance(tb, FatalEvent)
    assert (tb.kind, tb.text) == ("traceback", "KeyError: 'model'")


def test_interleaved_lines_inside_a_traceback_are_still_parsed() -> None:
    lines = [
        "[2025-11-30 11:18:41 TP1] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sglang/srt/model_executor/cuda_graph_runner.py", line 400, in capture',
        "[2025-11-30 11:18:41 TP0] Decode batch, #running-req: 1, #token: 10, token usage: 0.00, cuda graph: True, "
        "gen throughput (token/s): 42.00, #queue-req: 0",
        "    out = run_once()",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
    ]
    events = list(parse_lines(lines).events)
    stats, tb = events
    assert isinstance(stats, DecodeStats) and isinstance(tb, FatalEvent)
    assert tb.kind == "oom"
    assert tb.text.startswith("torch.OutOfMemoryError")
    assert len([e for e in events if isinstance(e, FatalEvent)]) == 1  # the OOM line is not a second event


def test_vllm_traceback_with_a_prefix_on_every_line() -> None:
    prefix = "\x1b[1;36m(EngineCore_DP0 pid=4188)\x1b[0;0m ERROR 11-30 12:00:30 [core.py:718] "
    lines = [
        prefix + "EngineCore failed to start.",
        prefix + "Traceback (most recent call last):",
        prefix + '  File "/vllm/v1/engine/core.py", line 709, in run_engine_core',
        prefix + "    engine_core = EngineCoreProc(*args, **kwargs)",
        prefix + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB.",
        "\x1b[1;36m(APIServer pid=4100)\x1b[0;0m RuntimeError: Engine core initialization failed. "
        "See root cause above.",
    ]
    events = list(parse_lines(lines).events)
    oom, init_failed = events
    assert isinstance(oom, FatalEvent) and isinstance(init_failed, FatalEvent)
    assert (oom.kind, oom.line.number) == ("oom", 2)
    assert oom.text == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB."
    assert init_failed.kind == "error"


# --- readiness rules --------------------------------------------------------------------------------


def test_sglang_uvicorn_lines_are_warmup_not_ready() -> None:
    parser = LogParser("sglang")
    events = parser.feed("[2025-11-30 12:50:42] INFO:     Application startup complete.")
    events += parser.feed(
        "[2025-11-30 12:50:42] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)"
    )
    assert phases(events) == [(Phase.WARMUP, True)]
    assert not of_type(events, ReadyEvent)
    (ready,) = parser.feed("[2025-11-30 12:50:47] The server is fired up and ready to roll!")
    assert isinstance(ready, ReadyEvent)
    assert ready.timestamp == "2025-11-30 12:50:47"


def test_vllm_uvicorn_startup_is_not_a_second_ready() -> None:
    events = parse("vllm_011.log")
    assert len(of_type(events, ReadyEvent)) == 1


def test_each_launch_in_one_log_gets_its_own_ready() -> None:
    launch = [
        "[2025-11-30 12:50:08] server_args=ServerArgs(model_path='m')",
        "[2025-11-30 12:50:42] INFO:     Application startup complete.",
        "[2025-11-30 12:50:47] The server is fired up and ready to roll!",
    ]
    events = list(parse_lines(launch + launch).events)
    assert len(of_type(events, ReadyEvent)) == 2
    assert phases(events).count((Phase.WARMUP, True)) == 2


def test_chunk_with_several_lines_counts_each_line() -> None:
    parser = LogParser()
    events = parser.feed("[2025-11-30 12:50:08] server_args=ServerArgs(model_path='m')\nhello\n")
    assert parser.lines == 2
    assert phases(events) == [(Phase.INIT, True)]
    assert parser.backend == "sglang"
    assert parser.first_timestamp == "2025-11-30 12:50:08"
