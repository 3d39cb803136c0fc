"""SGLang 0.5.10-0.5.12 command line for the simulated server: argparse, auto-resolved values, auto-disable rules.

Flags carry SGLang's real names (argparse with prefix matching, like SGLang; unknown flags exit 2 with
`launch_server.py: error: unrecognized arguments: ...`). resolve() applies the 0.5.10 rules
(docs/servers.md#sglang-command-line) and returns the messages SGLang logs from the main process, in order;
silent rules (piecewise CUDA graph off with speculative decoding, a multimodal architecture, torch.compile,
DP attention, pp>1, LoRA) log nothing but show in the resolved values (`disable_piecewise_cuda_graph`).
The overlap/spec-v2 rules follow 0.5.10: SGLANG_ENABLE_SPEC_V2 defaults to False.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path
from typing import Any

MODELS_FILE = Path(__file__).with_name("models.toml")
SIM_VERSION = "0.5.10"
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")


def load_models() -> dict[str, dict[str, Any]]:
    with MODELS_FILE.open("rb") as fh:
        return dict(tomllib.load(fh)["models"])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_server.py")
    a = p.add_argument
    a("--model-path", "--model", dest="model_path", type=str, required=True)
    a("--tokenizer-path", type=str, default=None)
    a("--served-model-name", type=str, default=None)
    a("--host", type=str, default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    a("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    a("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    a("--base-gpu-id", type=int, default=0)
    a("--mem-fraction-static", type=float, default=None)
    a("--context-length", type=int, default=None)
    a("--load-format", type=str, default="auto",
      choices=["auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "gguf", "bitsandbytes",
               "layered", "remote"])
    a("--dtype", type=str, default="auto")
    a("--kv-cache-dtype", type=str, default="auto")
    a("--trust-remote-code", action="store_true")
    a("--speculative-algorithm", type=str, default=None,
      choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"])
    a("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path",
      type=str, default=None)
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-single-batch-overlap", action="store_true")
    a("--enable-two-batch-overlap", action="store_true")
    a("--enable-piecewise-cuda-graph", action="store_true", help="Deprecated: piecewise CUDA graph is on by default.")
    a("--disable-piecewise-cuda-graph", action="store_true")
    a("--enforce-piecewise-cuda-graph", action="store_true")
    a("--piecewise-cuda-graph-max-tokens", type=int, default=None)
    a("--piecewise-cuda-graph-tokens", type=int, nargs="+", default=None)
    a("--piecewise-cuda-graph-compiler", type=str, default="eager", choices=["eager", "inductor"])
    a("--language-only", action="store_true")
    a("--cuda-graph-max-bs", type=int, default=None)
    a("--cuda-graph-bs", type=int, nargs="+", default=None)
    a("--disable-cuda-graph", action="store_true")
    a("--enable-torch-compile", action="store_true")
    a("--torch-compile-max-bs", type=int, default=32)
    a("--enable-flashinfer-allreduce-fusion", action="store_true")
    a("--enforce-disable-flashinfer-allreduce-fusion", action="store_true")
    a("--enable-nccl-nvls", action="store_true")
    a("--max-mamba-cache-size", type=int, default=None)
    a("--mamba-ssm-dtype", type=str, default=None, choices=["float32", "bfloat16", "float16"])
    a("--mamba-full-memory-ratio", type=float, default=0.9)
    a("--mamba-scheduler-strategy", type=str, default="auto", choices=["auto", "no_buffer", "extra_buffer"])
    a("--enable-metrics", action="store_true")
    a("--enable-metrics-for-all-schedulers", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    a("--skip-server-warmup", action="store_true")
    a("--log-level", type=str, default="info")
    a("--log-level-http", type=str, default=None)
    a("--watchdog-timeout", type=float, default=300)
    a("--chunked-prefill-size", type=int, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--max-total-tokens", type=int, default=None)
    a("--attention-backend", type=str, default=None)
    a("--disable-radix-cache", action="store_true")
    a("--enable-dp-attention", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    a("--enable-lora", action="store_true")
    a("--stream-interval", type=int, default=1)
    a("--random-seed", type=int, default=None)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def _auto_cuda_graph_max_bs(total_gb: float, tp: int) -> int:
    # SGLang 0.5.6's own table, read in its source (a "notes" fact: docs/servers.md#where-a-fact-was-checked).
    if total_gb < 20:
        return 8
    if total_gb < 35:
        return 24 if tp < 4 else 80
    if total_gb < 60:
        return 32 if tp < 4 else 160
    return 256 if tp < 4 else 512


def resolve(ns: argparse.Namespace, model: dict[str, Any], gpu_total_mib: int) -> tuple[dict[str, Any], list[str]]:
    """Resolved server args (every flag, auto values filled in) and the messages the main process logs."""
    args = dict(vars(ns))
    msgs: list[str] = []
    total_gb = gpu_total_mib / 1024
    spec_v2 = os.environ.get("SGLANG_ENABLE_SPEC_V2", "false").lower() in ("1", "true", "yes")

    if args["tokenizer_path"] is None:
        args["tokenizer_path"] = args["model_path"]
    if args["served_model_name"] is None:
        args["served_model_name"] = args["model_path"]
    if args["context_length"] is None:
        args["context_length"] = int(model["context_length"])
    if args["chunked_prefill_size"] is None:
        args["chunked_prefill_size"] = 2048 if total_gb < 35 else 4096 if total_gb < 60 else 8192
    if args["cuda_graph_max_bs"] is None:
        args["cuda_graph_max_bs"] = _auto_cuda_graph_max_bs(total_gb, args["tp_size"])
    if args["mamba_ssm_dtype"] is None and model.get("mamba_cache_gib"):
        args["mamba_ssm_dtype"] = "float32"
    if args["attention_backend"] in ("torch_native", "flex_attention"):
        kind = "torch native" if args["attention_backend"] == "torch_native" else "torch Flex Attention"
        msgs.append(f"Cuda graph is disabled because of using {kind} attention backend")
        args["disable_cuda_graph"] = True

    algo = args["speculative_algorithm"]
    if algo == "NEXTN":
        algo = args["speculative_algorithm"] = "EAGLE"
    if algo:
        if algo == "NGRAM":
            if args["speculative_num_draft_tokens"] is None:
                args["speculative_num_draft_tokens"] = 12
                msgs.append("speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
                            "You can override this by explicitly setting --speculative-num-draft-tokens.")
            args["speculative_num_steps"] = args["speculative_num_steps"] or 1
            args["speculative_eagle_topk"] = args["speculative_eagle_topk"] or 1
            msgs.append("The overlap scheduler and mixed chunked prefill are disabled because of using ngram "
                        "speculative decoding.")
            args["disable_overlap_schedule"] = True
        else:
            if (args["speculative_num_steps"], args["speculative_eagle_topk"],
                    args["speculative_num_draft_tokens"]) == (None, None, None):
                args["speculative_num_steps"], args["speculative_eagle_topk"] = 3, 1
                args["speculative_num_draft_tokens"] = 4
            if args["speculative_num_steps"] is None:
                args["speculative_num_steps"] = 3
            if args["speculative_eagle_topk"] is None:
                args["speculative_eagle_topk"] = 1
            steps, topk = args["speculative_num_steps"], args["speculative_eagle_topk"]
            if topk == 1 and args["speculative_num_draft_tokens"] != steps + 1:
                if args["speculative_num_draft_tokens"] is not None:
                    msgs.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                                "speculative_eagle_topk == 1")
                args["speculative_num_draft_tokens"] = steps + 1
            if args["speculative_num_draft_tokens"] is None:
                args["speculative_num_draft_tokens"] = steps * topk + 1
            if spec_v2 and algo in ("EAGLE", "EAGLE3"):
                if topk > 1:
                    raise ValueError("Spec v2 currently only supports topk = 1 for speculative decoding.")
                msgs.append("Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule is "
                            "turned on.")
            else:
                msgs.append("Overlap scheduler is disabled when spec v2 is off or using unsupported speculative "
                            "algorithm. You can set env SGLANG_ENABLE_SPEC_V2=True to enable the experimental "
                            "overlap scheduler. ")
                args["disable_overlap_schedule"] = True
            if args["enable_mixed_chunk"]:
                msgs.append("Mixed chunked prefill is disabled because of using eagle speculative decoding.")
                args["enable_mixed_chunk"] = False
        if args["max_running_requests"] is None:
            args["max_running_requests"] = 48
            msgs.append("Max running requests is reset to 48 for speculative decoding. You can override this "
                        "by explicitly setting --max-running-requests.")
    if args["max_running_requests"] is None:
        args["max_running_requests"] = 256 if total_gb < 60 else 1024

    if (model.get("mamba_cache_gib") and args["mamba_scheduler_strategy"] == "no_buffer"
            and not args["disable_radix_cache"] and not args["disable_overlap_schedule"]):
        msgs.append("Disabling overlap schedule since mamba no_buffer is not compatible with overlap schedule, "
                    "try to use --disable-radix-cache if overlap schedule is necessary")
        args["disable_overlap_schedule"] = True

    # Piecewise CUDA graph: on by default in 0.5.10-0.5.12, silently off under any rule of the cascade.
    user_disabled_pcg = bool(args["disable_piecewise_cuda_graph"])
    if not args["enforce_piecewise_cuda_graph"] and not user_disabled_pcg and (
        algo
        or model.get("multimodal")
        or args["enable_torch_compile"]
        or args["enable_dp_attention"]
        or args["pp_size"] > 1
        or args["enable_lora"]
        or args["load_format"] == "gguf"
    ):
        args["disable_piecewise_cuda_graph"] = True
    if args["enforce_piecewise_cuda_graph"]:
        args["disable_piecewise_cuda_graph"] = False
    args["enable_piecewise_cuda_graph"] = not args["disable_piecewise_cuda_graph"]
    if args["piecewise_cuda_graph_max_tokens"] is None:
        args["piecewise_cuda_graph_max_tokens"] = args["chunked_prefill_size"]
    args["_user_disabled_pcg"] = user_disabled_pcg

    if args["mem_fraction_static"] is None:
        reserved_gb = 5.0 + (0.5 if algo else 0.0) + (0.5 if args["enable_piecewise_cuda_graph"] else 0.0)
        args["mem_fraction_static"] = round((total_gb - reserved_gb) / total_gb, 3)
    if args["random_seed"] is None:
        args["random_seed"] = 42
    return args, msgs


def server_args_repr(args: dict[str, Any]) -> str:
    """`ServerArgs(model_path='...', ...)` like the dataclass repr SGLang logs at start."""
    body = ", ".join(f"{k}={v!r}" for k, v in args.items() if not k.startswith("_"))
    return f"ServerArgs({body})"
