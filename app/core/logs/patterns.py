"""The data behind the log parser: line prefixes, phase rows, notice and fatal tables for SGLang and vLLM.

Every pattern here matches a line shown in docs/servers.md, which says where each was checked. The
parser (app/core/logs/parser.py) applies them with `search`, never `match`, because log files carry foreign
prefixes (Ray, journald, embedding applications, custom logging configs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.core.data import Phase

SGLANG = "sglang"
VLLM = "vllm"
BACKENDS = (SGLANG, VLLM)

# --- cleaning ------------------------------------------------------------------------------------------

# CSI sequences (colours, tqdm's cursor moves), OSC titles and two-byte escapes.
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()#][0-9A-Za-z]|\x1b[=>78]")

# --- prefixes ------------------------------------------------------------------------------------------

# journald: "Sep 22 23:46:42 host vllm[pid]: "
JOURNALD = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S+ [\w.@/-]+(?:\[\d+\])?: ")
# vLLM subprocesses and Ray actors: "(EngineCore_DP0 pid=123) ", "(VllmWorker rank=1 pid=9) ",
# "(RayWorkerWrapper pid=5, ip=10.0.0.1) ", "(SGLangEngine pid=41820) ". Exactly one space is eaten so
# that the indentation of traceback lines survives.
PROC = re.compile(r"^\((?P<proc>[\w-]+)(?: rank=(?P<rank>\d+))? pid=\d+(?:, ip=[\d.]+)?\) ?")
# SGLang: "[2025-11-30 11:18:05 DP0 TP1] ", "[16:43:29 TP0] ", "[2025-11-30 11:18:05.123] "; with context or MoE
# data parallelism " ATTN_CP1" and " MOE_DP1" stand between PP and TP (0.5.10-0.5.23 alike).
_RANKS = r"(?: (?:DP|TP|PP|EP|ATTN_CP|MOE_DP)\d+)"
SGLANG_PREFIX = re.compile(
    r"\[(?P<ts>(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?:\.\d{3})?)(?P<ranks>" + _RANKS + r"*)\] ?"
)
# vLLM V1 "INFO 11-30 12:50:10 [loggers.py:123] " and V0 "INFO 01-22 18:27:20 metrics.py:449] ".
VLLM_PREFIX = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.\d+)? "
    r"\[?[\w.-]+:\d+\] ?"
)
# Custom logging configs and embedding applications: "2025-12-04 20:35:53 INFO ..." at the line start.
ISO_PREFIX = re.compile(r"^(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:[.,]\d+)?")
RANK_NUMBER = re.compile(r"(?:DP|TP|PP|EP|CP|_)(\d+)")

# --- backend detection ---------------------------------------------------------------------------------

# Decisive markers: a line holding one of these comes from that backend.
DETECT: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        SGLANG,
        re.compile(
            r"server_args=(?:ServerArgs\(|\{')|Decode batch|Prefill batch|Load weight (?:begin|end)\."
            r"|The server is fired up and ready to roll!|Capture cuda graph|KV Cache is allocated\."
            r"|\(SGLangEngine pid=|sglang::|\[(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}(?:\.\d{3})?" + _RANKS + r"+\]"
        ),
    ),
    (
        VLLM,
        re.compile(
            r"vLLM (?:API )?server version|Starting vLLM (?:API )?server|non-default args: "
            r"|Avg prompt throughput: |SpecDecoding metrics: |Speculative metrics: |\(EngineCore"
            r"|VLLM::|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d{2}-\d{2} \d{2}:\d{2}:\d{2} \[?[\w.-]+:\d+\]"
        ),
    ),
)

# --- phases --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseRow:
    """One startup milestone: a pattern whose named groups become the event's detail.

    The group `secs` becomes PhaseEvent.seconds. `restart` marks the first line of a launch (it resets
    per-launch state such as "ready already seen"); `once` emits the row at most once per launch.
    """

    backend: str
    pattern: re.Pattern[str]
    phase: Phase
    begin: bool
    restart: bool = False
    once: bool = False
    detail: tuple[tuple[str, str], ...] = ()  # constant detail entries


_GRAPH = r"(?P<graph>cuda|cpu|npu|musa|draft cuda|draft extend cuda)"
# 0.5.14+: "Capture target verify CUDA graph begin. ...", "Capture draft extend CUDA graph end. ...", the prefill
# graph as "Capture target prefill CUDA graph ...", "Capture UNO tree draft CUDA graph ...", and 0.5.12+
# "Capture Frozen-KV MTP draft cuda graph begin." (no figures). The device word is "CUDA", "CPU", "NPU", "XPU"...
_CAPTURE = (
    r"Capture (?P<capture>(?:target|draft) (?:decode|verify|prefill|extend)|UNO tree draft|Frozen-KV MTP draft) "
    r"(?P<device>\w+) graph"
)


def _anywhere(field: str) -> str:
    """An optional lookahead: the named groups in `field` are filled when the rest of the line holds it.

    The capture lines' `key=value` parts moved between releases (0.5.14-0.5.21 print `bs=` on the begin line,
    0.5.22+ on the end line), so each is looked for on its own, in any order.
    """
    return rf"(?=(?:.*?\b{field})?)"


_CAPTURE_BEGIN = re.compile(
    _CAPTURE
    + r" begin\."
    + _anywhere(r"backend=(?P<backend>\w+)")
    + _anywhere(r"num_tokens_per_(?:req|bs)=(?P<num_tokens_per_req>\d+)")
    + _anywhere(r"bs=\[(?P<bs>[\d, ]*)\]")
    + _anywhere(r"step=(?P<step>\d+)")
    + _anywhere(r"avail mem=(?P<avail_mem_gb>[\d.]+) GB")
)
_CAPTURE_END = re.compile(
    _CAPTURE
    + r" end\."
    + _anywhere(r"bs=\[(?P<bs>[\d, ]*)\]")
    + _anywhere(r"step=(?P<step>\d+)")
    + _anywhere(r"elapsed=(?P<secs>[\d.]+) s")
    + _anywhere(r"mem usage=(?P<mem_usage_gb>[\d.]+) GB")
    + _anywhere(r"avail mem=(?P<avail_mem_gb>[\d.]+) GB")
)

PHASE_ROWS: tuple[PhaseRow, ...] = (
    # SGLang startup (docs/servers.md#sglang-log-lines)
    # 0.5.10-0.5.18 print the dataclass (`server_args=ServerArgs(...)`), 0.5.19+ its resolved dict
    # (`server_args={'model_path': ...}`).
    PhaseRow(SGLANG, re.compile(r"server_args=(?:ServerArgs\(|\{')"), Phase.INIT, True, restart=True),
    PhaseRow(
        SGLANG,
        re.compile(
            r"Init torch distributed ends\.(?: elapsed=(?P<secs>[\d.]+) s,)? mem usage=(?P<mem_usage_gb>[\d.]+) GB"
        ),
        Phase.INIT,
        False,
    ),
    # 0.5.21+: "Init parallel ends. elapsed=0.85 s" (its memory figure moved to "Memory baseline taken. ...")
    PhaseRow(SGLANG, re.compile(r"Init parallel ends\. elapsed=(?P<secs>[\d.]+) s"), Phase.INIT, False),
    PhaseRow(SGLANG, re.compile(r"Load weight begin\. avail mem=(?P<avail_mem_gb>[\d.]+) GB"), Phase.WEIGHTS, True),
    PhaseRow(
        SGLANG,
        re.compile(
            r"Load weight end\.(?: elapsed=(?P<secs>[\d.]+) s,)? type=(?P<arch>\w+),(?: dtype=(?P<dtype>[\w.]+),)?"
            r"(?:[^,]*,)*? avail mem=(?P<avail_mem_gb>[\d.]+) GB(?:, mem usage=(?P<mem_usage_gb>[\d.]+) GB)?"
        ),
        Phase.WEIGHTS,
        False,
    ),
    # 0.5.18+ with the startup weight-load overlap: the real weights land after the graph capture.
    PhaseRow(
        SGLANG,
        re.compile(r"Load weight end\. Committed real weights after CUDA graph capture in (?P<secs>[\d.]+) s"),
        Phase.WEIGHTS,
        False,
    ),
    # 0.5.13+ add "dtype: torch.bfloat16, "; later releases may name the pool ("Full KV Cache", "SWA KV Cache").
    PhaseRow(
        SGLANG,
        re.compile(
            r"KV Cache is allocated\. (?:dtype: (?P<kv_dtype>[\w.]+), )?#tokens: (?P<tokens>\d+), "
            r"(?:K size: (?P<k_size_gb>[\d.]+) GB, V size: (?P<v_size_gb>[\d.]+) GB|KV size: (?P<kv_size_gb>[\d.]+) GB)"
        ),
        Phase.KV_CACHE,
        True,
    ),
    PhaseRow(
        SGLANG,
        re.compile(
            r"Mamba Cache is allocated\.(?: max_mamba_cache_size: (?P<max_mamba_cache_size>\d+))?"
            r"(?:, conv_state size: (?P<conv_state_gb>[\d.]+) ?GB, ssm_state size: (?P<ssm_state_gb>[\d.]+) ?GB)?"
            r"(?:,? intermediate_ssm_state_cache size: (?P<intermediate_ssm_gb>[\d.]+) ?GB)?"
            r"(?:,? intermediate_conv_window_cache size: (?P<intermediate_conv_gb>[\d.]+) ?GB)?"
        ),
        Phase.KV_CACHE,
        True,
    ),
    PhaseRow(SGLANG, re.compile(r"Memory pool end\. avail mem=(?P<avail_mem_gb>[\d.]+) GB"), Phase.KV_CACHE, False),
    PhaseRow(
        SGLANG,
        re.compile(r"Capture " + _GRAPH + r" graph begin\.(?:.*?avail mem=(?P<avail_mem_gb>[\d.]+) GB)?"),
        Phase.CUDA_GRAPH,
        True,
    ),
    PhaseRow(
        SGLANG,
        re.compile(
            r"Capture " + _GRAPH + r" graph end\. Time elapsed: (?P<secs>[\d.]+) s"
            r"(?:\. mem usage=(?P<mem_usage_gb>[\d.]+) GB\. avail mem=(?P<avail_mem_gb>[\d.]+) GB)?"
        ),
        Phase.CUDA_GRAPH,
        False,
    ),
    PhaseRow(
        SGLANG,
        re.compile(r"Capture piecewise CUDA graph begin\.(?: avail mem=(?P<avail_mem_gb>[\d.]+) GB)?"),
        Phase.PIECEWISE_CUDA_GRAPH,
        True,
        detail=(("graph", "piecewise"),),
    ),
    PhaseRow(
        SGLANG,
        re.compile(
            r"Capture piecewise CUDA graph end\. Time elapsed: (?P<secs>[\d.]+) s"
            r"(?:\. mem usage=(?P<mem_usage_gb>[\d.]+) GB\. avail mem=(?P<avail_mem_gb>[\d.]+) GB)?"
        ),
        Phase.PIECEWISE_CUDA_GRAPH,
        False,
        detail=(("graph", "piecewise"),),
    ),
    # 0.5.14+: one begin/end pair per capture (detail "capture": "target verify", "draft extend"...). Every capture
    # is a CUDA_GRAPH phase, the prefill graph too: `capture` says which, `backend` (full, breakable) how.
    PhaseRow(SGLANG, _CAPTURE_BEGIN, Phase.CUDA_GRAPH, True),
    PhaseRow(SGLANG, _CAPTURE_END, Phase.CUDA_GRAPH, False),
    # uvicorn is up but SGLang still warms up: WARMUP begins (never READY: docs/decisions.md#vllm-ready-line).
    PhaseRow(SGLANG, re.compile(r"Application startup complete\."), Phase.WARMUP, True, once=True),
    PhaseRow(SGLANG, re.compile(r"Uvicorn running on (?P<url>\S+)"), Phase.WARMUP, True, once=True),
    # vLLM startup (docs/servers.md#vllm-log-lines)
    PhaseRow(
        VLLM,
        # 0.32.0 prints no such line: its start banner is ASCII art ending in "█  version 0.32.0".
        re.compile(r"(?:vLLM (?:API )?server version|[█▀▄] +version) (?P<version>[^\s,]+)"
                   r"(?:, serving model (?P<model>\S+))?"),
        Phase.INIT,
        True,
        restart=True,
    ),
    PhaseRow(VLLM, re.compile(r"non-default args: "), Phase.INIT, True, once=True),
    PhaseRow(VLLM, re.compile(r"Loading weights took (?P<secs>[\d.]+) seconds"), Phase.WEIGHTS, False),
    # 0.32.0 with --load-format dummy: "Initializing model took 0.236178 seconds" (no "Loading weights").
    PhaseRow(VLLM, re.compile(r"Initializing model took (?P<secs>[\d.]+) seconds"), Phase.WEIGHTS, False),
    PhaseRow(
        VLLM,
        re.compile(r"Model loading took (?P<mem_gib>[\d.]+) GiB(?: memory)? and (?P<secs>[\d.]+) seconds"),
        Phase.WEIGHTS,
        False,
    ),
    PhaseRow(VLLM, re.compile(r"Available KV cache memory: (?P<kv_mem_gib>[\d.]+) GiB"), Phase.KV_CACHE, True),
    PhaseRow(
        VLLM, re.compile(r"\b(?P<device>[A-Z]{2,4}) KV cache size: (?P<tokens>[\d,]+) tokens"), Phase.KV_CACHE, False
    ),
    PhaseRow(VLLM, re.compile(r"Capturing CUDA graphs"), Phase.CUDA_GRAPH, True, once=True),
    # "Starting vLLM server on URL" comes before uvicorn binds the port (0.32.0: /health refused the connection
    # right after it), so it only starts WARMUP; uvicorn's "Application startup complete." is the ready line.
    PhaseRow(VLLM, re.compile(r"Starting vLLM (?:API )?server (?:\d+ )?on (?P<url>\S+)"), Phase.WARMUP, True,
             once=True),
    PhaseRow(
        VLLM,
        re.compile(r"Graph capturing finished in (?P<secs>[\d.]+) secs?(?:, took (?P<mem_gib>[\d.]+) GiB)?"),
        Phase.CUDA_GRAPH,
        False,
    ),
)

# --- ready ---------------------------------------------------------------------------------------------

SGLANG_READY = re.compile(r"The server is fired up and ready to roll!")
UVICORN_STARTUP = re.compile(r"Application startup complete\.")

# --- throughput ----------------------------------------------------------------------------------------

SGLANG_DECODE = re.compile(r"Decode batch(?: \[\d+\])?[.,] (?P<fields>#running-req: .*)$")
SGLANG_PREFILL = re.compile(r"Prefill batch(?: \[\d+\])?[.,] (?P<fields>#new-seq: .*)$")
# The scheduler's summary once the model runner is up (0.5.10-0.5.23, tp rank 0 of each DP rank).
SGLANG_CAPACITY = re.compile(
    r"max_total_num_tokens=(?P<max_total_tokens>\d+), chunked_prefill_size=(?P<chunked_prefill_size>-?\d+|None), "
    r"max_prefill_tokens=(?P<max_prefill_tokens>\d+), max_running_requests=(?P<max_running_requests>\d+), "
    r"context_len=(?P<context_len>\d+), available_(?:gpu|cpu)_mem=(?P<available_gib>[\d.]+) GB"
)
VLLM_THROUGHPUT = re.compile(r"(?P<fields>Avg prompt throughput: .*)$")
VLLM_SPEC_V1 = re.compile(r"SpecDecoding metrics: (?P<fields>.*)$")
VLLM_SPEC_V0 = re.compile(
    r"Speculative metrics: Draft acceptance rate: (?P<rate>[\d.]+|nan), System efficiency: (?:[\d.]+|nan), "
    r"Number of speculative tokens: (?P<k>\d+), Number of accepted tokens: (?P<acc>\d+), "
    r"Number of draft tokens(?: tokens)?: (?P<draft>\d+), Number of emitted tokens(?: tokens)?: (?P<emitted>\d+)"
)
# vLLM's engine start: "Initializing a V1 LLM engine (v0.32.0) with config: model=..., enforce_eager=False, ...,
# device_config=cpu, ..., compilation_config={'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>, ...,
# 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, ...}" (v1/engine/core.py; the dict is CompilationConfig.__repr__,
# which leaves out what was not set). Read by the advisor (app.core.advisor.evidence); each field optional.
VLLM_ENGINE_CONFIG = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)\s]+)\) with config: ")
VLLM_ENGINE_FIELDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("enforce_eager", re.compile(r"\benforce_eager=(True|False)\b")),
    ("device", re.compile(r"\bdevice_config=([a-z]+)\b")),
    ("compilation_mode", re.compile(r"'mode': <CompilationMode\.([A-Z_]+): ")),
    ("cudagraph_mode", re.compile(r"'cudagraph_mode': <CUDAGraphMode\.([A-Z_]+): ")),
    ("speculative_config", re.compile(r"\bspeculative_config=(None|SpeculativeConfig\([^)]*\))")),
)

# --- notices (docs/servers.md: SGLang's auto-disable rules, vLLM's warnings) --------------------------------

AUTO_DISABLED = "auto_disabled"
AUTO_ADJUSTED = "auto_adjusted"
DEPRECATION = "deprecation"
WARNING = "warning"

# (pattern, kind); the first row that matches a line wins.
NOTICE_ROWS: tuple[tuple[str, str], ...] = (
    # piecewise CUDA graph / prefill graphs
    (r"Piecewise CUDA Graph failed with error", WARNING),
    (r"Piecewise cuda graph is disabled for MoE runner backend", AUTO_DISABLED),
    (r"platform does not support piecewise CUDA graph", AUTO_DISABLED),
    (r"Disable piecewise CUDA graph because", AUTO_DISABLED),
    (r"(?:Breakable|Full prefill) CUDA graph is incompatible with", AUTO_DISABLED),
    (r"Disabling (?:breakable )?prefill CUDA graph|Disabling breakable CUDA graph", AUTO_DISABLED),
    # 0.5.15+ at capture time: "Disable prefill CUDA graph because ...", "Disable target prefill CUDA graph because
    # the target model does not have a 'layers' attribute", "... capture because no configured capture size fits"
    (r"Disable (?:\w+ )?prefill CUDA graph(?: capture)? (?:because|for)", AUTO_DISABLED),
    (r"Disable (?:DFLASH|DSpark) draft cuda graph because", AUTO_DISABLED),
    (r"Piecewise CUDA graph is enabled, use MLA for prefill", AUTO_ADJUSTED),
    (r"Enable piecewise CUDA graph, enabling auto MOE kernel", AUTO_ADJUSTED),
    # overlap scheduler and speculative decoding
    (
        r"[Oo]verlap schedul\w* (?:is|are) disabled|overlap scheduler and mixed chunked prefill are disabled",
        AUTO_DISABLED,
    ),
    (r"Disabling overlap schedule|is incompatible with overlap schedule", AUTO_DISABLED),
    (r"Spec v1 is used for", AUTO_DISABLED),
    (r"Spec v2 is enabled|Beta spec is enabled", AUTO_ADJUSTED),
    (r"Mixed chunked prefill is disabled", AUTO_DISABLED),
    (r"Max running requests is reset to", AUTO_ADJUSTED),
    (r"speculative_\w+ is (?:adjusted to|set to \d+ by default)", AUTO_ADJUSTED),
    (r"does not require setting speculative_draft_model_path", WARNING),
    # CUDA graph (decode)
    (r"(?i:cuda ?graph)(?: and server warmup)? (?:is|are) disabled", AUTO_DISABLED),
    # 0.11-0.31: "... disabling torch.compile and CUDAGraphs."; 0.32: "... disabling torch.compile, CUDAGraphs,
    # and JIT kernel warmup."
    (r"Enforce eager set, disabling torch\.compile,? (?:and )?CUDAGraphs", AUTO_DISABLED),
    (r"Cudagraph mode \S+ is not compatible with compilation mode", AUTO_ADJUSTED),
    # FlashInfer allreduce fusion, NCCL, caches
    (r"FlashInfer allreduce fusion is forcibly disabled", AUTO_DISABLED),
    (r"Disable --enable-flashinfer-allreduce-fusion because", AUTO_DISABLED),
    (r"Disabling flashinfer allreduce fusion permanently", AUTO_DISABLED),
    (r"flashinfer\.comm is not available, falling back", AUTO_DISABLED),
    (r"Auto-enabling FlashInfer AllReduce Fusion|Enable FlashInfer AllReduce Fusion on", AUTO_ADJUSTED),
    (r"custom all reduce is disabled for deterministic inference", AUTO_DISABLED),
    (r"Disabling Radix Cache for|Disable hybrid SWA memory for", AUTO_DISABLED),
    (r"Multimodal is disabled for", AUTO_DISABLED),
    # memory and batch sizes
    (r"(?:Automatically reduce|Dynamically adjusted) --mem-fraction-static", AUTO_ADJUSTED),
    (r"The chunked prefill size is adjusted to", AUTO_ADJUSTED),
    (r"--disable-shared-experts-fusion is automatically set", AUTO_ADJUSTED),
    (r"is larger than the profiled value -?\d+\. Use the profiled value instead", AUTO_ADJUSTED),
    # vLLM scheduling
    (r"Async scheduling will be disabled", AUTO_DISABLED),
    (r"Defaulting to mp-based distributed executor backend for async scheduling", AUTO_ADJUSTED),
    # the weight cache (SGLang 0.5.23 ipc_loader.py, vLLM 0.32 weight_cache/ipc_loader.py): the engine loaded its
    # weights from disk although it runs as the daemon's client
    (r"Weight cache not available or config mismatch, falling back to disk load"
     r"|Weight cache unusable \(.*\); falling back to disk loading", WARNING),
    # health
    (r"memory leak detected!", WARNING),
    (r"Health check failed\.", WARNING),
    (r"SECURITY WARNING", WARNING),
    # 0.5.23 (a Python UserWarning on stderr): "'python -m sglang.launch_server' is still supported, but 'sglang
    # serve' is the recommended entrypoint."
    (r"is still supported, but 'sglang serve' is the recommended entrypoint", DEPRECATION),
    # deprecations anywhere: "Endpoint '/get_model_info' is deprecated", DeprecationWarning, FutureWarning
    (r"\b(?:[Dd]eprecat(?:ed|ion)|DeprecationWarning|FutureWarning)\b", DEPRECATION),
)

# What a notice is about, when the advisor can act on it (Notice.feature); the first row that matches wins.
WEIGHT_CACHE = "weight_cache"  # the weight cache daemon: a cache miss, a dead daemon
PREFILL_CUDA_GRAPH = "prefill_cuda_graph"  # SGLang's piecewise (0.5.10-0.5.12) / breakable or full (0.5.15+) graph
CUDA_GRAPH = "cuda_graph"  # the decode graph (SGLang), the whole-model graphs (vLLM)

NOTICE_FEATURE_ROWS: tuple[tuple[str, str], ...] = (
    (r"[Ww]eight cache", WEIGHT_CACHE),
    # "Cuda graph is disabled for prefill server when piecewise cuda graph is not enabled." is about the decode graph
    (r"^\s*(?i:cuda ?graph)(?: and server warmup)? (?:is|are) disabled", CUDA_GRAPH),
    (
        r"[Pp]iecewise (?:CUDA|cuda) [Gg]raph|[Bb]reakable (?:prefill )?CUDA graph|[Pp]refill CUDA graph",
        PREFILL_CUDA_GRAPH,
    ),
    (r"(?i:cuda ?graph)|CUDAGraphs", CUDA_GRAPH),
)

# --- fatal ---------------------------------------------------------------------------------------------

OOM = "oom"
PORT_IN_USE = "port_in_use"
TRACEBACK = "traceback"
CHILD_FAILED = "child_failed"
CHILD_CRASHED = "child_crashed"
ERROR = "error"

WEIGHT_CACHE_DIED = "weight_cache_died"

FATAL_ROWS: tuple[tuple[str, str], ...] = (
    # SGLang 0.5.23's client watchdog: "[IpcModelLoader] Weight cache daemon (pid=P) died while this engine holds its
    # weights via CUDA IPC. ... Terminating this process."
    (r"Weight cache daemon \(pid=\d+\) died while this engine holds its weights", WEIGHT_CACHE_DIED),
    (r"CUDA out of memory|\bOutOfMemoryError\b|Not enough memory\. Please try to increase --mem-fraction-static", OOM),
    (r"[Aa]ddress already in use|is not available in \d+ seconds|is used by a process already", PORT_IN_USE),
    (r"Received sigquit from a child process|SIGQUIT received\..*child failed", CHILD_FAILED),
    # SGLang's watchdog (0.5.10-0.5.23): "Subprocess scheduler_0 (pid=4711) crashed with exit code -9. Triggering
    # SIGQUIT for cleanup..."; while starting: "RuntimeError: Rank 0 scheduler died during initialization (exit
    # code: -9). ..."; on other nodes: "Scheduler or DataParallelController 4711 terminated with -9".
    (
        r"Subprocess \S+ \(pid=\d+\) crashed with exit code|scheduler died during initialization \(exit code"
        r"|Scheduler or DataParallelController \d+ terminated with",
        CHILD_CRASHED,
    ),
    (
        r"Scheduler hit an exception|Initialization failed\. warmup error|EngineDeadError"
        r"|Engine core initialization failed",
        ERROR,
    ),
)

TRACEBACK_START = "Traceback (most recent call last):"
TRACEBACK_CHAIN = re.compile(r"^(?:The above exception was the direct cause|During handling of the above exception)")
# The last line of a traceback: "RuntimeError: ...", "torch.OutOfMemoryError: ...", "KeyboardInterrupt".
EXCEPTION_LINE = re.compile(r"^(?P<name>(?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?P<rest>: .*|:)?$")
EXCEPTION_NAME_ENDINGS = ("Error", "Exception", "Exit", "Interrupt", "Iteration", "Failure", "Fault")


@dataclass(frozen=True)
class KindTable:
    """Rows of (pattern, kind) in priority order, plus one alternation of all of them as a fast pre-check."""

    rows: tuple[tuple[re.Pattern[str], str], ...]
    any_row: re.Pattern[str]

    @classmethod
    def build(cls, rows: tuple[tuple[str, str], ...]) -> KindTable:
        """Compile every row and the combined pre-check."""
        compiled = tuple((re.compile(pattern), kind) for pattern, kind in rows)
        return cls(compiled, re.compile("|".join(f"(?:{pattern})" for pattern, _kind in rows)))

    def kind_of(self, text: str) -> str | None:
        """The kind of the first row (in table order) found anywhere in `text`, or None."""
        if not self.any_row.search(text):
            return None
        for pattern, kind in self.rows:
            if pattern.search(text):
                return kind
        return None


NOTICES = KindTable.build(NOTICE_ROWS)
NOTICE_FEATURES = KindTable.build(NOTICE_FEATURE_ROWS)
FATALS = KindTable.build(FATAL_ROWS)
