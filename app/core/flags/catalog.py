"""The SGLang and vLLM launch-flag tables (what each flag does and where it was checked: docs/servers.md).

This module is data. Each row is a FlagSpec; `app.core.flags.values` builds the lookup tables from them.

Versions: `versions = (since, until)`, both release strings or "".
- since: the first release checked in which the flag exists; "" = in every release checked
  (SGLang 0.4.6.post5 onward, vLLM 0.11.0 onward).
- until: the last release checked in which the flag is a current, documented flag; "" = still current in
  the newest release checked (SGLang 0.5.23, vLLM 0.33.0). A later release may still accept it as a
  deprecated alias; the help says so where the research notes do (docs/servers.md#where-a-fact-was-checked).
SGLang releases checked: 0.4.6.post5, 0.4.10.post2, 0.5.3, 0.5.6, 0.5.9, 0.5.10, 0.5.12, 0.5.15.post1, 0.5.23.
vLLM releases checked: 0.11.0, 0.33.0. A flag marked "(unverified)" in its help is a well-known flag that the
research notes do not cover; its versions are "".

Kinds: bool (store_true; False renders as nothing, or as `--no-NAME` when `negatable`), int, float,
choice (value must be one of `choices`), str (free text; `choices`, when given, are only suggestions),
json (a JSON object: a TOML inline table, rendered as compact JSON), ints (a list of ints, one argv item
each, stored as a space-separated string), free (the `custom` backend's free-form flags: any name, a
bool, number or string, rendered as --NAME VALUE; see app.core.flags.values).

What a flag does to a warm relaunch (the weight cache daemon keeps serving, or its key changed and it restarts)
is `weights_effect(backend, name)`: "keeps the weights" or "changes the cache key (FIELDS)", from the servers' own
key dataclasses (app.core.flags.weight_cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.core.data import FlagValue
from app.core.flags.weight_cache import weights_effect as weights_effect

FlagKind = Literal["bool", "int", "float", "choice", "str", "json", "ints", "free"]


@dataclass(frozen=True)
class FlagSpec:
    """One launch flag of one backend."""

    name: str  # without the leading "--"
    kind: FlagKind
    default: FlagValue | None  # the backend's default; None = unset/automatic
    help: str  # one line
    choices: tuple[str, ...] = ()
    versions: tuple[str, str] = ("", "")  # (since, until), see the module docstring
    aliases: tuple[str, ...] = ()  # other spellings, without dashes ("tp", "tensor-parallel-size")
    negatable: bool = False  # the parser also accepts --no-NAME (argparse BooleanOptionalAction)
    replaced_by: str = ""  # what a newer release takes instead: "NAME" or "NAME=VALUE" (without dashes)

    @property
    def since(self) -> str:
        return self.versions[0]

    def replacement(self) -> str:
        """The newer release's spelling for people: "--cuda-graph-backend-prefill breakable", or ""."""
        if not self.replaced_by:
            return ""
        name, _, value = self.replaced_by.partition("=")
        return f"--{name} {value}".rstrip()

    @property
    def until(self) -> str:
        return self.versions[1]


F = FlagSpec
_LOAD_FORMATS = ("auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "gguf", "bitsandbytes",
                 "layered", "remote")
_SPEC_ALGOS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
_MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer")
_GRAPH_BACKENDS = ("full", "breakable", "tc_piecewise", "disabled")

SGLANG_FLAGS: tuple[FlagSpec, ...] = (
    # server
    F("model-path", "str", None, "Model weights: a Hugging Face id or a local folder (required).",
      aliases=("model",)),
    F("host", "str", "127.0.0.1", "Address the HTTP server binds."),
    F("port", "int", 30000, "HTTP port (SGLang also binds several extra ports)."),
    F("config", "str", None, "YAML file of flag values.", versions=("0.5.3", "")),
    F("trust-remote-code", "bool", False, "Allow the model's own Python code (unverified)."),
    F("served-model-name", "str", None, "Model name reported by the OpenAI API (unverified)."),
    F("tokenizer-path", "str", None, "Tokenizer, when not next to the weights (unverified)."),
    F("dtype", "str", "auto", "Weights and activations dtype (unverified).",
      choices=("auto", "half", "float16", "bfloat16", "float", "float32")),
    F("quantization", "str", None, "Quantization method (unverified)."),
    F("random-seed", "int", None, "Random seed (unverified)."),
    F("load-format", "str", "auto", "How to load the weights; `dummy` = random weights.", choices=_LOAD_FORMATS),
    F("context-length", "int", None, "Maximum context length; default from the model config."),
    # parallelism and memory
    F("tp-size", "int", 1, "Tensor-parallel size (GPUs per model copy).",
      aliases=("tensor-parallel-size", "tp")),
    F("dp-size", "int", 1, "Data-parallel size.", aliases=("data-parallel-size",)),
    F("pp-size", "int", 1, "Pipeline-parallel size (disables overlap and piecewise CUDA graph) (unverified).",
      aliases=("pipeline-parallel-size",)),
    F("base-gpu-id", "int", 0, "First GPU index the server uses (unverified)."),
    F("enable-dp-attention", "bool", False, "Data-parallel attention (disables piecewise CUDA graph)."),
    F("mem-fraction-static", "float", None,
      "Fraction of GPU memory for weights + KV cache; auto when unset.", aliases=("mem-frac",)),
    F("chunked-prefill-size", "int", None, "Tokens per prefill chunk."),
    F("max-running-requests", "int", None, "Cap on concurrent requests (48 by default with speculation)."),
    F("page-size", "int", None, "KV cache page size in tokens (unverified)."),
    F("kv-cache-dtype", "str", "auto", "KV cache dtype.", choices=("auto", "fp8_e5m2", "fp8_e4m3")),
    F("attention-backend", "str", None, "Attention kernel backend.",
      choices=("flashinfer", "triton", "torch_native", "flex_attention", "fa3")),
    F("disable-radix-cache", "bool", False, "Turn off prefix (radix) caching."),
    # speculative decoding
    F("speculative-algorithm", "choice", None, "Speculative decoding algorithm; NEXTN runs as EAGLE.",
      choices=_SPEC_ALGOS, aliases=("speculative-algo",)),
    F("speculative-draft-model-path", "str", None, "Draft model weights.",
      aliases=("speculative-draft-model",)),
    F("speculative-num-steps", "int", None, "Draft steps per verification; auto with topk/draft when unset."),
    F("speculative-eagle-topk", "int", None, "Branches per draft step; 1 forces draft tokens = steps + 1."),
    F("speculative-num-draft-tokens", "int", None, "Draft tokens verified per step (NGRAM default 12)."),
    # overlap
    F("disable-overlap-schedule", "bool", False, "Turn off the overlap scheduler (CPU work under GPU work)."),
    F("enable-single-batch-overlap", "bool", False, "Overlap communication and compute inside one batch.",
      versions=("0.5.3", "")),
    F("enable-two-batch-overlap", "bool", False, "Overlap two micro-batches.", versions=("0.4.10.post2", "")),
    # CUDA graphs, 0.5.x
    F("disable-cuda-graph", "bool", False, "Turn off decode CUDA graphs.", versions=("", "0.5.12")),
    F("cuda-graph-max-bs", "int", None, "Largest batch size captured in a CUDA graph; auto by GPU memory.",
      versions=("", "0.5.12"), replaced_by="cuda-graph-max-bs-decode"),
    F("cuda-graph-bs", "ints", None, "Explicit list of captured batch sizes.", replaced_by="cuda-graph-bs-decode"),
    F("enable-piecewise-cuda-graph", "bool", False,
      "Opt in to piecewise CUDA graph (experimental); a no-op from 0.5.10 where it is on by default.",
      versions=("0.5.6", "0.5.9")),
    F("disable-piecewise-cuda-graph", "bool", False, "Turn off piecewise CUDA graph (on by default).",
      versions=("0.5.10", "0.5.12"), replaced_by="cuda-graph-backend-prefill=disabled"),
    F("enforce-piecewise-cuda-graph", "bool", False,
      "Keep piecewise CUDA graph on, skipping every auto-disable rule (speculation, VLM, ...).",
      versions=("0.5.10", "0.5.12"), replaced_by="cuda-graph-backend-prefill=breakable"),
    F("piecewise-cuda-graph-max-tokens", "int", None, "Largest token count captured piecewise.",
      versions=("0.5.6", "0.5.12")),
    F("piecewise-cuda-graph-tokens", "ints", None, "Explicit token counts captured piecewise.",
      versions=("0.5.6", "")),
    F("piecewise-cuda-graph-compiler", "choice", "eager", "Compiler for piecewise graphs.",
      choices=("eager", "inductor"), versions=("0.5.6", "")),
    F("debug-cuda-graph", "bool", False, "CUDA graph debugging (disables piecewise graphs).",
      versions=("0.5.12", "")),
    F("enable-torch-compile", "bool", False, "torch.compile the model (disables piecewise CUDA graph)."),
    F("torch-compile-max-bs", "int", 32, "Largest batch size compiled by torch.compile."),
    # CUDA graphs, 0.5.15+ rework
    F("cuda-graph-config", "json", None, "Per-phase CUDA graph settings as JSON.", versions=("0.5.15.post1", "")),
    F("cuda-graph-backend-decode", "choice", None, "Decode CUDA graph backend.", choices=_GRAPH_BACKENDS,
      versions=("0.5.15.post1", "")),
    F("cuda-graph-backend-prefill", "choice", None, "Prefill CUDA graph backend (full is decode-only).",
      choices=_GRAPH_BACKENDS[1:], versions=("0.5.15.post1", "")),
    F("cuda-graph-max-bs-decode", "int", None, "Largest decode batch captured.", versions=("0.5.15.post1", "")),
    F("cuda-graph-max-bs-prefill", "int", None, "Largest prefill batch captured.",
      versions=("0.5.15.post1", "")),
    F("cuda-graph-bs-decode", "ints", None, "Decode batch sizes captured.", versions=("0.5.15.post1", "")),
    F("cuda-graph-bs-prefill", "ints", None, "Prefill batch sizes captured.", versions=("0.5.15.post1", "")),
    F("disable-prefill-cuda-graph", "bool", False, "Turn off prefill CUDA graphs.",
      versions=("0.5.15.post1", "")),
    F("disable-decode-cuda-graph", "bool", False, "Turn off decode CUDA graphs.",
      versions=("0.5.15.post1", "")),
    # communication
    F("enable-flashinfer-allreduce-fusion", "bool", False,
      "FlashInfer allreduce fusion (SM90/SM100 only; silently a no-op elsewhere).",
      versions=("0.4.10.post2", "0.5.12")),
    F("enforce-disable-flashinfer-allreduce-fusion", "bool", False, "Keep FlashInfer allreduce fusion off.",
      versions=("0.5.10", "")),
    F("flashinfer-allreduce-fusion-backend", "choice", "auto", "FlashInfer allreduce fusion backend.",
      choices=("auto", "trtllm", "mnnvl"), versions=("0.5.15.post1", "")),
    F("enable-nccl-nvls", "bool", False, "Set NCCL_NVLS_ENABLE=1 (unless already set in the environment)."),
    F("enable-symm-mem", "bool", False, "Symmetric memory (also sets NCCL_NVLS_ENABLE; disables piecewise graphs)."),
    # hybrid (mamba) models
    F("max-mamba-cache-size", "int", None, "Mamba state slots (hybrid models).", versions=("0.5.3", "")),
    F("mamba-ssm-dtype", "choice", None, "Mamba SSM state dtype; from the model config when unset (0.5.9+).",
      choices=("float32", "bfloat16", "float16"), versions=("0.5.3", "")),
    F("mamba-full-memory-ratio", "float", 0.9, "Memory ratio of mamba state to full-attention KV cache.",
      versions=("0.5.6", "")),
    F("mamba-scheduler-strategy", "choice", "auto", "Mamba radix-cache strategy (no_buffer disables overlap).",
      choices=_MAMBA_STRATEGIES, versions=("0.5.10", "0.5.12"), replaced_by="mamba-radix-cache-strategy"),
    F("mamba-radix-cache-strategy", "choice", "auto", "New name of --mamba-scheduler-strategy.",
      choices=_MAMBA_STRATEGIES, versions=("0.5.15.post1", "")),
    F("mamba-track-interval", "int", 256, "Tokens between tracked mamba states.", versions=("0.5.10", "")),
    F("mamba-backend", "choice", None, "Mamba kernel backend.", choices=("triton", "flashinfer"),
      versions=("0.5.10", "")),
    F("enable-multimodal", "bool", False, "Turn on multimodality for archs where it is off by default."),
    F("language-only", "bool", False, "Run only the language part of a VLM (EPD disaggregation).",
      versions=("0.5.9", "")),
    # observability
    F("enable-metrics", "bool", False, "Mount /metrics (Prometheus); 404 without it."),
    F("enable-metrics-for-all-schedulers", "bool", False, "Every TP rank exports metrics, not only rank 0.",
      versions=("0.4.10.post2", "")),
    F("decode-log-interval", "int", 40, "Decode steps between two 'Decode batch' log lines."),
    F("log-level", "str", "info", "Log level.", choices=("debug", "info", "warning", "error")),
    F("log-level-http", "str", None, "HTTP server log level (default: --log-level)."),
    F("skip-server-warmup", "bool", False, "Skip the warm-up request after start."),
    F("watchdog-timeout", "float", 300.0, "Seconds a stuck scheduler step may take before the server dies."),
)

_VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

VLLM_FLAGS: tuple[FlagSpec, ...] = (
    # server
    F("model", "str", None, "Model: a Hugging Face id or a local folder (`vllm serve MODEL`)."),
    F("host", "str", None, "Address to bind; all interfaces when unset."),
    F("port", "int", 8000, "HTTP port."),
    F("served-model-name", "str", None, "Model name reported by the OpenAI API."),
    F("trust-remote-code", "bool", False, "Allow the model's own Python code (unverified)."),
    F("dtype", "choice", "auto", "Weights and activations dtype (float32 on CPU).", choices=_VLLM_DTYPES),
    F("seed", "int", None, "Random seed."),
    F("load-format", "str", "auto", "How to load the weights; `dummy` = random weights.", choices=_LOAD_FORMATS),
    F("max-model-len", "int", None, "Maximum context length; default from the model config."),
    F("disable-log-stats", "bool", False, "Turn off the periodic throughput log line."),
    F("shutdown-timeout", "int", 0, "Seconds to drain requests on SIGTERM (0 = abort them).",
      versions=("0.33.0", "")),
    F("show-hidden-metrics-for-version", "str", None, "Re-expose metrics hidden since that version."),
    # parallelism and memory
    F("tensor-parallel-size", "int", 1, "Tensor-parallel size.", aliases=("tp",)),
    F("gpu-memory-utilization", "float", 0.92,
      "Fraction of total GPU memory for this instance (0.9 before 0.33; host RAM for KV on CPU)."),
    F("kv-cache-memory-bytes", "str", None,
      "KV cache size per device in bytes ('256M', '1G'); overrides gpu-memory-utilization (CPU: host RAM)."),
    F("swap-space", "float", None, "CPU swap space per GPU in GiB (unverified; gone in newer releases)."),
    F("kv-cache-dtype", "str", "auto", "KV cache dtype (unverified).", choices=("auto", "fp8", "fp8_e5m2",
                                                                                 "fp8_e4m3")),
    F("max-num-seqs", "int", None, "Cap on sequences per engine step."),
    F("max-num-batched-tokens", "int", None, "Cap on tokens per engine step."),
    F("enable-prefix-caching", "bool", None, "Prefix caching; `false` renders --no-enable-prefix-caching.",
      negatable=True),
    F("async-scheduling", "bool", None,
      "Asynchronous scheduling (0.11: experimental, off; 0.33: automatic); `false` renders --no-async-scheduling.",
      negatable=True),
    # speculative decoding
    F("speculative-config", "json", None,
      "Speculative decoding as JSON: method, model, num_speculative_tokens, ...", aliases=("sc",)),
    F("spec-method", "str", None, "Shorthand for speculative-config.method.", versions=("0.33.0", "")),
    F("spec-model", "str", None, "Shorthand for speculative-config.model.", versions=("0.33.0", "")),
    F("spec-tokens", "int", None, "Shorthand for speculative-config.num_speculative_tokens.",
      versions=("0.33.0", "")),
    # compilation and CUDA graphs
    F("enforce-eager", "bool", False, "No torch.compile and no CUDA graphs (overrides cudagraph_mode)."),
    F("compilation-config", "json", None,
      "Compilation as JSON: mode/level, cudagraph_mode (NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, "
      "FULL_AND_PIECEWISE), ...", aliases=("cc",)),
    F("optimization-level", "choice", "2", "Preset: 0 no compile/graphs, 1 piecewise, 2-3 full+piecewise.",
      choices=("0", "1", "2", "3"), versions=("0.33.0", ""), aliases=("O",)),
    F("performance-mode", "choice", None, "Tuning preset.", choices=("balanced", "interactivity", "throughput"),
      versions=("0.33.0", "")),
    F("cudagraph-capture-sizes", "ints", None, "Batch sizes captured in CUDA graphs."),
    F("max-cudagraph-capture-size", "int", None, "Largest batch size captured.", versions=("0.33.0", "")),
)


def release_tuple(version: str | None) -> tuple[int, ...] | None:
    """ "0.5.15.post1" -> (0, 5, 15, 1), "0.5.23" -> (0, 5, 23), "0.32.0+cpu" -> (0, 32, 0); None when unreadable."""
    if not version:
        return None
    parts: list[int] = []
    for piece in version.split("+")[0].replace("post", "").replace("rc", ".").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


# ---- the tuning flags: what a tab of `tunedash serve` may change (`ui --tuning-flags-only`) ------------------
# Speed knobs only: speculation, CUDA graphs and compilation, overlap, prefill chunking, memory and batch caps,
# kernels and communication on the GPUs the profile already names. Left out on purpose: anything that names
# code or data to fetch or run (trust-remote-code, model/tokenizer/draft paths and repos, load formats, config
# files, whole JSON tables that may name a module or a model), and anything that changes what or where the
# server serves (host, port, GPUs, parallel sizes, model dtype and length, seeds, logging). A JSON flag is
# allowed key by key, as a dotted name ("speculative-config.num_speculative_tokens").
SGLANG_TUNING_FLAGS = frozenset({
    "speculative-algorithm", "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens",
    "disable-overlap-schedule", "enable-single-batch-overlap", "enable-two-batch-overlap",
    "disable-cuda-graph", "cuda-graph-max-bs", "cuda-graph-bs", "enable-piecewise-cuda-graph",
    "disable-piecewise-cuda-graph", "enforce-piecewise-cuda-graph", "piecewise-cuda-graph-max-tokens",
    "piecewise-cuda-graph-tokens", "piecewise-cuda-graph-compiler", "debug-cuda-graph", "enable-torch-compile",
    "torch-compile-max-bs", "cuda-graph-backend-decode", "cuda-graph-backend-prefill", "cuda-graph-max-bs-decode",
    "cuda-graph-max-bs-prefill", "cuda-graph-bs-decode", "cuda-graph-bs-prefill", "disable-prefill-cuda-graph",
    "disable-decode-cuda-graph",
    "chunked-prefill-size", "mem-fraction-static", "max-running-requests", "page-size", "kv-cache-dtype",
    "attention-backend", "disable-radix-cache", "enable-dp-attention",
    "enable-flashinfer-allreduce-fusion", "enforce-disable-flashinfer-allreduce-fusion",
    "flashinfer-allreduce-fusion-backend", "enable-nccl-nvls", "enable-symm-mem",
    "max-mamba-cache-size", "mamba-ssm-dtype", "mamba-full-memory-ratio", "mamba-scheduler-strategy",
    "mamba-radix-cache-strategy", "mamba-track-interval", "mamba-backend",
    "decode-log-interval",
})
VLLM_TUNING_FLAGS = frozenset({
    "speculative-config.method", "speculative-config.num_speculative_tokens", "spec-method", "spec-tokens",
    "enforce-eager", "compilation-config.cudagraph_mode", "compilation-config.mode", "compilation-config.level",
    "compilation-config.cudagraph_capture_sizes", "compilation-config.max_cudagraph_capture_size",
    "optimization-level", "performance-mode", "cudagraph-capture-sizes", "max-cudagraph-capture-size",
    "gpu-memory-utilization", "kv-cache-memory-bytes", "swap-space", "kv-cache-dtype", "max-num-seqs",
    "max-num-batched-tokens", "enable-prefix-caching", "async-scheduling",
})
TUNING_FLAGS: dict[str, frozenset[str]] = {"sglang": SGLANG_TUNING_FLAGS, "vllm": VLLM_TUNING_FLAGS}
"""Per backend, the flags (canonical names; a JSON flag's keys dotted) a tuning-only dashboard may change; the
`custom` backend has none (its flags are free-form)."""


def is_tuning_flag(backend: str, name: str) -> bool:
    """Whether `name` (canonical, or dotted for one key of a JSON flag) is one of `backend`'s tuning flags."""
    return name in TUNING_FLAGS.get(backend, frozenset())
