"""Log parser on SGLang 0.5.14-0.5.23 lines (rendered from the 0.5.23 format strings): startup phases with one
row per graph capture, hybrid-model decode and prefill lines, capacity, prefill-graph notices, crash lines, and
the live state they move a starting server through."""

from __future__ import annotations

from typing import TypeVar

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
    ServerCapacity,
    ServerState,
)
from app.core.logs.parser import LogParser, detect_backend, parse_lines, read_log_lines, summary_to_json
from app.core.server.states import state_after, state_from_log, telling_fatal
from tests.log_helpers import LOGS, feed, of_type, parse

T = TypeVar("T")
STARTUP = "sglang_0523_startup.log"  # spec decoding, `--cuda-graph-backend-prefill breakable`, ready, decode
CRASH = "sglang_0523_crash.log"  # the prefill graph auto-disabled, ready, then a scheduler killed (-9)


def one(line: str, backend: str | None = "sglang") -> list[LogEvent]:
    return feed(line, backend)


def only(line: str, kind: type[T], backend: str | None = "sglang") -> T:
    (event,) = one(line, backend)
    assert isinstance(event, kind), event
    return event


def states_through(events: list[LogEvent]) -> list[ServerState]:
    """The states a server launched with these events goes through, from LAUNCHING on."""
    state, seen = ServerState.LAUNCHING, []
    for event in events:
        target = state_after(state, event)
        if target is not None:
            state = target
            seen.append(state)
    return seen


# --- the whole 0.5.23 startup ------------------------------------------------------------------------------


def test_0523_startup_phases_in_order_one_per_capture() -> None:
    events = of_type(parse(STARTUP), PhaseEvent)
    assert [(e.phase, e.begin, e.detail.get("capture")) for e in events] == [
        (Phase.INIT, True, None),  # server_args={...}: the 0.5.19+ dict form starts a launch
        (Phase.INIT, False, None),  # Init parallel ends. elapsed=
        (Phase.WEIGHTS, True, None),
        (Phase.WEIGHTS, False, None),  # the target
        (Phase.WEIGHTS, True, None),
        (Phase.WEIGHTS, False, None),  # the draft (MTP)
        (Phase.KV_CACHE, True, None),  # Mamba cache
        (Phase.KV_CACHE, True, None),  # KV cache, with "dtype: ..."
        (Phase.KV_CACHE, False, None),
        (Phase.KV_CACHE, True, None),  # the draft's KV cache
        (Phase.KV_CACHE, False, None),
        (Phase.CUDA_GRAPH, True, "target prefill"),
        (Phase.CUDA_GRAPH, False, "target prefill"),
        (Phase.CUDA_GRAPH, True, "target verify"),
        (Phase.CUDA_GRAPH, False, "target verify"),
        (Phase.CUDA_GRAPH, True, "draft decode"),
        (Phase.CUDA_GRAPH, False, "draft decode"),
        (Phase.CUDA_GRAPH, True, "draft extend"),
        (Phase.CUDA_GRAPH, False, "draft extend"),
        (Phase.WARMUP, True, None),
    ]
    assert all(" TP1]" not in event.line.text for event in events)


def test_0523_capture_details_carry_seconds_memory_and_backend() -> None:
    events = of_type(parse(STARTUP), PhaseEvent)
    ends = [
        (e.detail["capture"], e.seconds, e.detail["mem_usage_gb"])
        for e in events
        if "capture" in e.detail and not e.begin
    ]
    assert ends == [
        ("target prefill", 6.02, "0.31"),
        ("target verify", 12.41, "0.62"),
        ("draft decode", 3.05, "0.21"),
        ("draft extend", 2.18, "0.14"),
    ]
    begins = {e.detail["capture"]: e.detail for e in events if "capture" in e.detail and e.begin}
    assert begins["target prefill"]["backend"] == "breakable"
    assert (begins["target verify"]["backend"], begins["target verify"]["num_tokens_per_req"]) == ("full", "4")
    assert begins["target verify"]["avail_mem_gb"] == "4.39"
    verify_end = next(e for e in events if e.detail.get("capture") == "target verify" and not e.begin)
    assert verify_end.detail["bs"].startswith("1, 2, 3") and verify_end.detail["bs"].endswith("44, 48")
    weights = [e.detail for e in events if e.phase is Phase.WEIGHTS and not e.begin]
    assert [(w["arch"], w["mem_usage_gb"]) for w in weights] == [
        ("Qwen3_5ForConditionalGeneration", "25.11"),
        ("Qwen3_5ForCausalLMMTP", "0.85"),
    ]
    mamba = next(e.detail for e in events if "max_mamba_cache_size" in e.detail)
    assert (mamba["max_mamba_cache_size"], mamba["ssm_state_gb"], mamba["intermediate_conv_gb"]) == (
        "128",
        "2.95",
        "0.04",
    )


def test_0523_startup_moves_the_server_through_capturing_to_ready() -> None:
    events = parse(STARTUP)
    assert states_through(events) == [
        ServerState.LOADING,
        ServerState.CAPTURING,
        ServerState.WARMING,
        ServerState.READY,
    ]
    assert state_from_log(events) == ServerState.READY
    kinds = [type(event).__name__ for event in events]
    assert kinds.index("ReadyEvent") > max(
        i for i, e in enumerate(events) if isinstance(e, PhaseEvent) and e.phase is Phase.CUDA_GRAPH
    )


def test_0510_startup_still_moves_the_same_way() -> None:
    assert states_through(parse("sglang_0510_startup.log")) == [
        ServerState.LOADING,
        ServerState.CAPTURING,
        ServerState.WARMING,
        ServerState.READY,
    ]


def test_0523_throughput_prefill_and_capacity() -> None:
    events = parse(STARTUP)
    decode = of_type(events, DecodeStats)
    assert [(d.gen_tps, d.accept_len, d.accept_rate) for d in decode] == [
        (51.80, 3.02, 0.67),
        (57.90, 3.35, 0.78),
        (55.31, 3.21, 0.74),
    ]
    assert all((d.running, d.queued, d.cuda_graph, d.token_usage) == (1, 0, True, 0.0) for d in decode)
    warmup_prefill, prefill = of_type(events, PrefillStats)
    assert (warmup_prefill.new_tokens, warmup_prefill.input_tps) == (6, 0.0)
    assert (prefill.new_tokens, prefill.input_tps, prefill.cuda_graph, prefill.timestamp) == (
        512,
        1204.33,
        True,  # the breakable prefill graph served it
        "2026-06-02 09:15:37",
    )
    (capacity,) = of_type(events, ServerCapacity)
    assert (capacity.max_total_tokens, capacity.max_running_requests, capacity.context_len) == (393216, 48, 262144)
    assert (capacity.chunked_prefill_size, capacity.max_prefill_tokens, capacity.available_gib) == (8192, 16384, 3.40)


def test_0523_startup_notices() -> None:
    notices = of_type(parse(STARTUP), Notice)
    assert [(n.kind, n.feature) for n in notices] == [("deprecation", None), ("auto_adjusted", None)]
    assert "'sglang serve' is the recommended entrypoint" in notices[0].text


def test_0523_summary_times_each_capture_with_its_memory() -> None:
    parsed = parse_lines(read_log_lines(LOGS / STARTUP))
    summary = parsed.summary()
    assert (summary.ready, summary.ready_seconds) == (True, 75.0)  # 09:14:05 -> 09:15:20
    rows = [(t.phase, t.capture, t.seconds, t.source, t.gib) for t in summary.phases]
    assert rows == [
        (Phase.INIT, None, 0.85, "backend", None),
        (Phase.WEIGHTS, None, pytest.approx(31.12 + 1.94), "backend", pytest.approx(25.11 + 0.85)),
        # Mamba (conv + ssm + intermediate) + target K/V + draft K/V, timed by the timestamps
        (Phase.KV_CACHE, None, 1.0, "timestamps", pytest.approx(4.60 + 10.94 + 0.68)),
        (Phase.CUDA_GRAPH, "target prefill", 6.02, "backend", 0.31),
        (Phase.CUDA_GRAPH, "target verify", 12.41, "backend", 0.62),
        (Phase.CUDA_GRAPH, "draft decode", 3.05, "backend", 0.21),
        (Phase.CUDA_GRAPH, "draft extend", 2.18, "backend", 0.14),
        (Phase.WARMUP, None, 2.0, "timestamps", None),  # uvicorn up 09:15:18 -> ready 09:15:20
    ]
    assert summary.mean_accept_len == pytest.approx((3.02 + 3.35 + 3.21) / 3)
    document = summary_to_json(summary)
    assert document["phases"][4] == {
        "phase": "cuda_graph",
        "capture": "target verify",
        "seconds": 12.41,
        "source": "backend",
        "gib": 0.62,
    }
    assert document["phases"][0] == {"phase": "init", "seconds": 0.85, "source": "backend"}


def test_0510_summary_keeps_one_graph_row() -> None:
    rows = summary_to_json(parse_lines(read_log_lines(LOGS / "sglang_0510_startup.log")).summary())["phases"]
    assert [(row["phase"], row["seconds"], row["source"]) for row in rows] == [
        ("init", 8.0, "timestamps"),
        ("weights", 12.0, "timestamps"),
        ("kv_cache", 0.0, "timestamps"),
        ("cuda_graph", pytest.approx(4.92 + 2.61 + 1.80), "backend"),
        ("warmup", 5.0, "timestamps"),
    ]
    assert not any("capture" in row for row in rows)
    assert [row.get("gib") for row in rows] == [1.12, 7.52, 64.0, pytest.approx(0.48 + 0.21 + 0.15), None]


def test_every_line_of_the_0523_fixtures_is_accounted_for() -> None:
    for name in (STARTUP, CRASH):
        parser = LogParser()
        events: list[LogEvent] = []
        for line in read_log_lines(LOGS / name):
            events.extend(parser.feed(line))
        events.extend(parser.flush())
        assert len({e.line.number for e in events}) + parser.traceback_lines + parser.skipped == parser.lines
        assert parser.unreadable == 0
        assert parser.backend == "sglang"


def test_detect_backend_of_the_0523_logs() -> None:
    assert detect_backend(read_log_lines(LOGS / STARTUP)) == "sglang"
    assert detect_backend(["[2026-06-02 09:14:05] server_args={'model_path': 'm'}"]) == "sglang"


# --- the crash: auto-disabled prefill graph, then a scheduler killed -------------------------------------------


def test_0523_crash_log_notices_say_the_prefill_graph_was_switched_off() -> None:
    events = parse(CRASH)
    graph_notices = [(n.kind, n.feature, n.text.split(" ")[0]) for n in of_type(events, Notice) if n.feature]
    assert graph_notices == [
        ("auto_disabled", "prefill_cuda_graph", "Breakable"),  # the multimodal rule, before server_args
        ("auto_disabled", "prefill_cuda_graph", "Disable"),  # at capture time (TP1's copy is not repeated)
    ]
    assert not any(e.detail.get("capture") == "target prefill" for e in of_type(events, PhaseEvent))
    assert all(p.cuda_graph is False for p in of_type(events, PrefillStats))


def test_0523_crash_after_ready_names_the_crashed_scheduler() -> None:
    events = parse(CRASH)
    assert of_type(events, ReadyEvent)
    crashed, echo = of_type(events, FatalEvent)
    assert (crashed.kind, echo.kind) == ("child_crashed", "child_failed")
    assert crashed.text.startswith("Subprocess scheduler_1 (pid=48377) crashed with exit code -9.")
    assert crashed.context[-1] == crashed.line.text
    cause = None
    for fatal in (crashed, echo):
        cause = telling_fatal(cause, fatal)
    assert cause is crashed  # the exit code tells more than "a child failed"
    assert telling_fatal(crashed, FatalEvent("oom", "CUDA out of memory", crashed.line)).kind == "oom"


@pytest.mark.parametrize(
    "line",
    [
        "[2026-06-02 10:00:00] Subprocess scheduler_0 (pid=4711) crashed with exit code -9. Triggering SIGQUIT for "
        "cleanup...",
        "[2026-06-02 10:00:00] Subprocess detokenizer (pid=4712) crashed with exit code 1. Triggering SIGQUIT for "
        "cleanup...",
        "[2026-06-02 10:00:00 TP0] Scheduler or DataParallelController 4711 terminated with -9",
    ],
)
def test_child_crash_lines(line: str) -> None:
    assert only(line, FatalEvent).kind == "child_crashed"


def test_scheduler_died_during_initialization_traceback_is_a_child_crash() -> None:
    lines = [
        "[2026-06-02 10:00:00] Traceback (most recent call last):",
        '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/entrypoints/engine.py", line 2029, in '
        "_wait_for_scheduler_ready",
        "    raise _scheduler_died_error(i, scheduler_procs[i])",
        "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a "
        "common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
    ]
    events = parse_lines(lines, "sglang").events
    (fatal,) = events
    assert isinstance(fatal, FatalEvent)
    assert fatal.kind == "child_crashed" and fatal.text.startswith("RuntimeError: Rank 0 scheduler died")


# --- single lines of 0.5.14-0.5.23 -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "capture", "detail"),
    [
        pytest.param(
            "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=5.30 GB",
            "target decode",
            {"backend": "full", "num_tokens_per_req": "1", "avail_mem_gb": "5.30", "device": "CUDA"},
            id="0.5.23-target-decode",
        ),
        pytest.param(
            "Capture target verify CUDA graph begin. backend=full, num_tokens_per_bs=4, bs=[1, 2, 4], "
            "avail mem=5.30 GB",
            "target verify",
            {"num_tokens_per_req": "4", "bs": "1, 2, 4", "avail_mem_gb": "5.30"},
            id="0.5.14-num-tokens-per-bs-and-bs-on-begin",
        ),
        pytest.param(
            "Capture draft prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8], avail mem=3.10 GB",
            "draft prefill",
            {"backend": "breakable", "avail_mem_gb": "3.10"},
            id="draft-prefill",
        ),
        pytest.param(
            "Capture draft extend CUDA graph begin. step=2, avail mem=3.56 GB",
            "draft extend",
            {"step": "2", "avail_mem_gb": "3.56"},
            id="multi-layer-eagle-step",
        ),
        pytest.param(
            "Capture UNO tree draft CUDA graph begin. num_tokens_per_req=8, avail mem=3.00 GB",
            "UNO tree draft",
            {"num_tokens_per_req": "8"},
            id="0.5.20-uno",
        ),
        pytest.param("Capture Frozen-KV MTP draft cuda graph begin.", "Frozen-KV MTP draft", {}, id="frozen-kv"),
        pytest.param(
            "Capture target decode CPU graph begin. backend=full, num_tokens_per_req=1, avail mem=60.00 GB",
            "target decode",
            {"device": "CPU"},
            id="cpu",
        ),
    ],
)
def test_capture_begin_lines_of_every_role_and_kind_move_to_capturing(
    message: str, capture: str, detail: dict[str, str]
) -> None:
    event = only(f"[2026-06-02 09:14:56 TP0] {message}", PhaseEvent)
    assert (event.phase, event.begin, event.detail["capture"]) == (Phase.CUDA_GRAPH, True, capture)
    assert detail.items() <= event.detail.items()
    assert state_after(ServerState.LOADING, event) == ServerState.CAPTURING
    assert state_after(ServerState.LAUNCHING, event) == ServerState.CAPTURING


@pytest.mark.parametrize(
    ("message", "seconds", "detail"),
    [
        pytest.param(
            "Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=12.41 s, mem usage=0.62 GB, "
            "avail mem=4.68 GB.",
            12.41,
            {"bs": "1, 2, 4", "mem_usage_gb": "0.62", "avail_mem_gb": "4.68"},
            id="0.5.23-bs-on-end",
        ),
        pytest.param(
            "Capture target prefill CUDA graph end. elapsed=6.02 s, mem usage=0.31 GB, avail mem=4.39 GB.",
            6.02,
            {"mem_usage_gb": "0.31"},
            id="prefill",
        ),
        pytest.param(
            "Capture draft extend CUDA graph end. step=1, elapsed=0.90 s, mem usage=0.05 GB, avail mem=3.51 GB.",
            0.90,
            {"step": "1"},
            id="step",
        ),
        pytest.param("Capture Frozen-KV MTP draft cuda graph end.", None, {}, id="frozen-kv-no-figures"),
    ],
)
def test_capture_end_lines(message: str, seconds: float | None, detail: dict[str, str]) -> None:
    event = only(f"[2026-06-02 09:15:09 TP0] {message}", PhaseEvent)
    assert (event.phase, event.begin, event.seconds) == (Phase.CUDA_GRAPH, False, seconds)
    assert detail.items() <= event.detail.items()
    assert state_after(ServerState.CAPTURING, event) is None  # an end moves nothing


def test_capture_lines_of_secondary_ranks_are_not_repeated() -> None:
    assert one("[2026-06-02 09:14:56 TP1] Capture target verify CUDA graph begin. backend=full, avail mem=1 GB") == []
    assert one("[2026-06-02 09:14:56 ATTN_CP1 TP0] Capture target verify CUDA graph begin. backend=full") == []
    (event,) = one("[2026-06-02 09:14:56 ATTN_CP0 TP0] Capture target verify CUDA graph begin. backend=full")
    assert isinstance(event, PhaseEvent) and event.line.text.startswith("[2026-06-02 09:14:56 ATTN_CP0")


def test_summary_adds_up_draft_extend_steps() -> None:
    lines = [
        "[2026-06-02 09:15:00 TP0] Capture draft extend CUDA graph begin. step=1, avail mem=3.56 GB",
        "[2026-06-02 09:15:01 TP0] Capture draft extend CUDA graph end. step=1, elapsed=0.90 s, mem usage=0.05 GB, "
        "avail mem=3.51 GB.",
        "[2026-06-02 09:15:01 TP0] Capture draft extend CUDA graph begin. step=0, avail mem=3.51 GB",
        "[2026-06-02 09:15:02 TP0] Capture draft extend CUDA graph end. step=0, elapsed=0.80 s, mem usage=0.04 GB, "
        "avail mem=3.47 GB.",
    ]
    (row,) = parse_lines(lines, "sglang").summary().phases
    assert (row.capture, row.seconds, row.gib) == ("draft extend", pytest.approx(1.70), pytest.approx(0.09))


@pytest.mark.parametrize(
    ("message", "phase", "begin", "seconds", "detail"),
    [
        pytest.param("Init parallel ends. elapsed=0.85 s", Phase.INIT, False, 0.85, {}, id="0.5.21-init-parallel"),
        pytest.param(
            "Init torch distributed ends. elapsed=1.20 s, mem usage=0.52 GB",
            Phase.INIT,
            False,
            1.20,
            {"mem_usage_gb": "0.52"},
            id="0.5.12-init-torch-distributed",
        ),
        pytest.param(
            "Load weight end. elapsed=31.12 s, type=Qwen3_5ForConditionalGeneration, quant=fp8, fmt=e4m3, "
            "avail mem=21.80 GB, mem usage=25.11 GB.",
            Phase.WEIGHTS,
            False,
            31.12,
            {"arch": "Qwen3_5ForConditionalGeneration", "avail_mem_gb": "21.80", "mem_usage_gb": "25.11"},
            id="quantization-part",
        ),
        pytest.param(
            "Load weight end. Committed real weights after CUDA graph capture in 4.20 s (capture overlap window "
            "20.10 s, startup overlap total 30.00 s)",
            Phase.WEIGHTS,
            False,
            4.20,
            {},
            id="0.5.18-startup-overlap-commit",
        ),
        pytest.param(
            "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 65536, KV size: 2.00 GB",
            Phase.KV_CACHE,
            True,
            None,
            {"kv_dtype": "torch.bfloat16", "tokens": "65536", "kv_size_gb": "2.00"},
            id="0.5.23-labelled-pool",
        ),
        pytest.param(
            "Mamba Cache is allocated. max_mamba_cache_size: 64, conv_state size: 0.07GB, ssm_state size: 1.48GB ",
            Phase.KV_CACHE,
            True,
            None,
            {"max_mamba_cache_size": "64", "conv_state_gb": "0.07", "ssm_state_gb": "1.48"},
            id="mamba-without-spec",
        ),
    ],
)
def test_startup_lines(message: str, phase: Phase, begin: bool, seconds: float | None, detail: dict[str, str]) -> None:
    event = only(f"[2026-06-02 09:14:13 TP0] {message}", PhaseEvent)
    assert (event.phase, event.begin, event.seconds) == (phase, begin, seconds)
    assert detail.items() <= event.detail.items()


def test_capacity_on_cpu() -> None:
    capacity = only(
        "[2026-06-02 09:15:15] max_total_num_tokens=8192, chunked_prefill_size=-1, max_prefill_tokens=16384, "
        "max_running_requests=8, context_len=4096, available_cpu_mem=60.25 GB",
        ServerCapacity,
    )
    assert (capacity.max_total_tokens, capacity.chunked_prefill_size, capacity.available_gib) == (8192, -1, 60.25)
    assert (
        one(
            "[2026-06-02 09:15:15 DP1 TP0] max_total_num_tokens=8192, chunked_prefill_size=-1, "
            "max_prefill_tokens=16384, max_running_requests=8, context_len=4096, available_gpu_mem=1.00 GB"
        )
        == []
    )


def test_two_0523_launches_in_one_log_get_one_ready_each() -> None:
    lines = [
        "[2026-06-02 09:14:05] server_args={'model_path': 'Qwen/Qwen3.6-27B'}",
        "[2026-06-02 09:15:20] The server is fired up and ready to roll!",
        "[2026-06-02 09:20:05] server_args={'model_path': 'Qwen/Qwen3.6-27B'}",
        "[2026-06-02 09:21:20] The server is fired up and ready to roll!",
    ]
    assert len([e for e in parse_lines(lines).events if isinstance(e, ReadyEvent)]) == 2


# --- decode and prefill lines ----------------------------------------------------------------------------------

HYBRID_DECODE = (
    "Decode batch, #running-req: 1, #full token: 1537, full token usage: 0.00, mamba num: 2, mamba usage: 0.02, "
    "accept len: 3.21, accept rate: 0.74, cuda graph: True, gen throughput (token/s): 55.31, #queue-req: 0"
)


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(HYBRID_DECODE, id="0.5.23-hybrid"),
        pytest.param(HYBRID_DECODE.replace("Decode batch,", "Decode batch [8120],"), id="iter"),
        pytest.param(
            HYBRID_DECODE.replace("accept rate: 0.74, ", "accept rate: 0.74, cap len: 3.90, block accept len: 3.50, "),
            id="cap-len-block-accept-len",
        ),
        pytest.param(
            HYBRID_DECODE + ", est. decode TFLOPS/s (per GPU): 41.20, est. read BW (GB/s per GPU): 812.40, "
            "est. write BW (GB/s per GPU): 3.10, fwd occupancy: 93.12%, fwd+idle occupancy: 99.00%",
            id="mfu-and-occupancy-tails",
        ),
    ],
)
def test_hybrid_decode_lines(message: str) -> None:
    stats = only(f"[2026-06-02 09:15:42 TP0] {message}", DecodeStats)
    assert (stats.gen_tps, stats.accept_len, stats.accept_rate, stats.cuda_graph) == (55.31, 3.21, 0.74, True)
    assert (stats.running, stats.queued, stats.token_usage) == (1, 0, 0.0)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param(
            "Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.00, #running-req: 0, "
            "#queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 1204.33",
            {"input_tps": 1204.33, "new_seqs": 1, "new_tokens": 512, "cached_tokens": 0, "cuda_graph": False},
            id="0.5.23",
        ),
        pytest.param(
            "Prefill batch [301], #new-seq: 2, #new-token: 8192, #cached-token: 1024, full token usage: 0.03, "
            "mamba usage: 0.05, #running-req: 3, #queue-req: 4, #pending-token: 0, #bootstrap-req: 0, "
            "#inflight-req: 0, #optimistic-req: 0, cuda graph: True, input throughput (token/s): 9001.50, "
            "est. prefill TFLOPS/s (per GPU): 350.10",
            {"input_tps": 9001.5, "running": 3, "queued": 4, "token_usage": 0.03, "cuda_graph": True},
            id="hybrid-iter-pd-tails",
        ),
        pytest.param(
            "Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0, "
            "#queue-req: 0, ",
            {"input_tps": None, "new_tokens": 6},
            id="0.4-no-input-throughput",
        ),
    ],
)
def test_prefill_lines(message: str, expected: dict[str, object]) -> None:
    stats = only(f"[2026-06-02 09:15:37 TP0] {message}", PrefillStats)
    for name, value in expected.items():
        assert getattr(stats, name) == value, name


def test_unreadable_throughput_lines_are_counted_not_guessed() -> None:
    parser = LogParser("sglang")
    for message in (
        "Decode batch, #running-req: 1, #token: 5, gen throughput (token/s): nan, #queue-req: 0",
        "Decode batch, #running-req: 1, gen throughput (token/s): inf",
        "Prefill batch, #new-seq: 1, #new-token: many, #cached-token: 0",
    ):
        assert parser.feed(f"[2026-06-02 09:15:37 TP0] {message}") == []
    assert parser.feed('[2026-06-02 09:15:38] INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK') == []
    assert (parser.lines, parser.skipped, parser.unreadable) == (4, 4, 3)


# --- notices -----------------------------------------------------------------------------------------------------

NOTICE_CASES_0523 = [
    (
        "Breakable CUDA graph is incompatible with multimodal model; disabling prefill CUDA graph.",
        "auto_disabled",
        "prefill_cuda_graph",
    ),
    (
        "Full prefill CUDA graph is incompatible with LoRA; disabling prefill CUDA graph.",
        "auto_disabled",
        "prefill_cuda_graph",
    ),
    (
        "Disabling breakable prefill CUDA graph by default for pipeline parallelism. Set "
        "--cuda-graph-backend-prefill=breakable to opt in.",
        "auto_disabled",
        "prefill_cuda_graph",
    ),
    (
        "Disabling prefill CUDA graph (breakable) by default for the DeepSeek-V3 arch on the trtllm_mla attention "
        "backend (a captured prefill graph forces a FlashAttention fallback that regresses prefill). Set the prefill "
        "cuda graph backend explicitly (e.g. --cuda-graph-backend-prefill breakable) to override.",
        "auto_disabled",
        "prefill_cuda_graph",
    ),
    (
        "Disable prefill CUDA graph because cuda_graph_config resolved prefill.backend='disabled' (e.g. via "
        "--cuda-graph-backend-prefill=disabled or auto-disable rules).",
        "auto_disabled",
        "prefill_cuda_graph",
    ),
    ("Disable prefill CUDA graph because some layers do not apply Standard GQA", "auto_disabled", "prefill_cuda_graph"),
    (
        "Disable target prefill CUDA graph because the target model does not have a 'layers' attribute",
        "auto_disabled",
        "prefill_cuda_graph",
    ),
    (
        "Disable prefill CUDA graph capture because no configured capture size fits backend=full with "
        "max_capture_tokens=4096 (max_capture_requests=1, context_length=4096, request-pool size=8).",
        "auto_disabled",
        "prefill_cuda_graph",
    ),
    (
        "Disable prefill CUDA graph for EAGLE target on tc_piecewise to avoid FP4/MoE decode-replay corruption "
        "(#28386).",
        "auto_disabled",
        "prefill_cuda_graph",
    ),
    (
        "--debug-cuda-graph is not supported on non CUDA/HIP devices. Disabling breakable CUDA graph.",
        "auto_disabled",
        "prefill_cuda_graph",
    ),
    (
        "Disable DFLASH draft cuda graph because dp attention is enabled (draft runs eager).",
        "auto_disabled",
        "cuda_graph",
    ),
    (
        "Disable DSpark draft cuda graph because only 0.80 GB GPU memory is available after target backend "
        "initialization.",
        "auto_disabled",
        "cuda_graph",
    ),
    ("CUDA graph is disabled because --enable-mis is set.", "auto_disabled", "cuda_graph"),
    (
        "Cuda graph is disabled for prefill server when piecewise cuda graph is not enabled.",
        "auto_disabled",
        "cuda_graph",
    ),
    ("Disable piecewise CUDA graph because the capture size is not set", "auto_disabled", "prefill_cuda_graph"),
    ("Overlap scheduler is disabled because of using eagle speculative decoding.", "auto_disabled", None),
]


@pytest.mark.parametrize(("message", "kind", "feature"), NOTICE_CASES_0523)
def test_0523_notices_say_what_they_switched_off(message: str, kind: str, feature: str | None) -> None:
    notice = only(f"[2026-06-02 09:14:05] {message}", Notice)
    assert (notice.kind, notice.feature, notice.text) == (kind, feature, message)


def test_sglang_serve_recommendation_is_a_deprecation_notice() -> None:
    line = (
        "/opt/venv/lib/python3.12/site-packages/sglang/launch_server.py:71: UserWarning: 'python -m "
        "sglang.launch_server' is still supported, but 'sglang serve' is the recommended entrypoint."
    )
    assert only(line, Notice, backend=None).kind == "deprecation"
