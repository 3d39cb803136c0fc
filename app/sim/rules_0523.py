"""SGLang 0.5.23's rules in the simulated server: CUDA graph config, speculation with overlap, mamba strategy.

Called by app.sim.server_args.resolve() after the shared defaults. Read in the 0.5.23 wheel's source
(docs/servers.md#sglang-command-line, **sglang-wheel**):
- CUDA graphs (arg_groups/cuda_graph_hook.py): decode backend `full`, prefill backend `breakable` by default
  (CUDA); --disable-cuda-graph (deprecated), --disable-prefill-cuda-graph / --disable-decode-cuda-graph,
  --cuda-graph-backend-{decode,prefill} and --cuda-graph-config JSON override them, in that order. A prefill
  backend given by any of those is *locked*: the auto-disable cascade skips it. Unlocked, `breakable` is
  turned off for pp > 1, two-batch overlap or a multimodal model whose architecture is not on SGLang's list
  of breakable-capable ones, with `Breakable CUDA graph is incompatible with multimodal model; disabling
  prefill CUDA graph.` The resolved backends are reported under their real names
  (`cuda_graph_backend_prefill`, `cuda_graph_backend_decode`).
- Speculation (arg_groups/speculative_hook.py): spec v1 is gone; the overlap schedule stays on with EAGLE-type
  speculation (no notice) unless --disable-overlap-schedule (`Non-overlap (synchronous) spec v2 is used ...`).
- Mamba radix cache (`--mamba-radix-cache-strategy`, 0.5.10's --mamba-scheduler-strategy): `auto` becomes
  `extra_buffer` while the overlap schedule is on, else `no_buffer`.
"""

from __future__ import annotations

from typing import Any

from app.sim.resolved import (
    ADJUSTED_DRAFT_TOKENS,
    MAX_RUNNING_RESET,
    NGRAM_DRAFT_TOKENS,
    Running,
    auto_cuda_graph_max_bs,
    eagle_step_defaults,
)

VERSION = "0.5.23"
CLI_TO_FIELD: dict[str, str] = {}  # the parser's dests are ServerArgs's field names
# multimodal_breakable_cuda_graph_supported_model_archs of the 0.5.23 source (configs/model_config.py).
BREAKABLE_MULTIMODAL_ARCHS = frozenset({
    "MiniMaxM3SparseForConditionalGeneration", "Cohere2VisionForConditionalGeneration",
    "Glm5NextForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
    "PaddleOCRVLForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "Qwen4ExpForConditionalGeneration", "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration",
    "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration", "MiniMaxM3SparseForCausalLM",
})
BREAKABLE_OFF = "Breakable CUDA graph is incompatible with {}; disabling prefill CUDA graph."
PP_BREAKABLE_OFF = ("Disabling breakable prefill CUDA graph by default for pipeline parallelism. Set "
                    "--cuda-graph-backend-prefill=breakable to opt in.")
WEIGHT_CACHE_WITH_SPEC = (
    "--weight-cache-mode is not supported together with speculative decoding (--speculative-algorithm): the weight "
    "cache daemon does not export the draft model's weights. Disable one of them (--weight-cache-mode off) for this "
    "configuration.")
SYNCHRONOUS_SPEC = "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative decoding."


def apply(args: dict[str, Any], model: dict[str, Any], total_gb: float, msgs: list[str]) -> Running:
    """0.5.23's rules on `args` (in place); the messages go to `msgs` in SGLang's order."""
    if args.get("weight_cache_mode", "off") != "off" and args.get("speculative_algorithm") is not None:
        raise ValueError(WEIGHT_CACHE_WITH_SPEC)  # arg_groups/model_path_hook.py _handle_load_format
    decode, prefill, prefill_locked = graph_backends(args)
    if args.get("attention_backend") in ("torch_native", "flex_attention"):
        kind = "torch native attention" if args["attention_backend"] == "torch_native" else "torch Flex Attention"
        msgs.append(f"Cuda graph is disabled because of using {kind} backend")
        decode = prefill = "disabled"
    speculation(args, msgs)
    mamba_strategy(args, model)
    if not prefill_locked and prefill == "breakable":
        reason = breakable_incompatibility(args, model)
        if reason == "pp":
            msgs.append(PP_BREAKABLE_OFF)
            prefill = "disabled"
        elif reason:
            msgs.append(BREAKABLE_OFF.format(reason))
            prefill = "disabled"
    max_bs = args.get("cuda_graph_max_bs_decode") or args.get("cuda_graph_max_bs")
    args["cuda_graph_max_bs_decode"] = int(max_bs) if max_bs else auto_cuda_graph_max_bs(total_gb, args["tp_size"])
    args["cuda_graph_backend_decode"], args["cuda_graph_backend_prefill"] = decode, prefill
    prefill_max = args.get("cuda_graph_max_bs_prefill") or args["chunked_prefill_size"]
    return Running(
        version=VERSION,
        decode_graph=decode != "disabled",
        graph_max_bs=int(args["cuda_graph_max_bs_decode"]),
        prefill_graph=prefill != "disabled",
        prefill_graph_backend=prefill,
        prefill_graph_max_tokens=int(prefill_max),
        prefill_graph_off_by_flag=prefill_locked and prefill == "disabled",
        overlap_schedule=not args["disable_overlap_schedule"],
        single_batch_overlap=bool(args.get("enable_single_batch_overlap")),
        torch_compile=bool(args.get("enable_torch_compile")),
        mamba=bool(model.get("mamba_cache_gib")),
        max_mamba_cache_size=int(model.get("max_mamba_cache_size", 0)),
    )


def graph_backends(args: dict[str, Any]) -> tuple[str, str, bool]:
    """(decode backend, prefill backend, prefill locked) from the flags, like parse_cuda_graph_config."""
    decode, prefill, locked = "full", "breakable", False
    if args.get("disable_cuda_graph"):
        decode, prefill, locked = "disabled", "disabled", True
    if args.get("disable_prefill_cuda_graph"):
        prefill, locked = "disabled", True
    if args.get("disable_decode_cuda_graph"):
        decode = "disabled"
    if args.get("cuda_graph_backend_decode"):
        decode = str(args["cuda_graph_backend_decode"])
    if args.get("cuda_graph_backend_prefill"):
        prefill, locked = str(args["cuda_graph_backend_prefill"]), True
    config = args.get("cuda_graph_config")
    if isinstance(config, dict):
        decode = str((config.get("decode") or {}).get("backend", decode))
        if "backend" in (config.get("prefill") or {}):
            prefill, locked = str(config["prefill"]["backend"]), True
    return decode, prefill, locked


def breakable_incompatibility(args: dict[str, Any], model: dict[str, Any]) -> str:
    """Why an unlocked breakable prefill graph is turned off ("" when it stays on); "pp" for pipeline parallel."""
    if int(args.get("pp_size") or 1) > 1:
        return "pp"
    if args.get("enable_two_batch_overlap"):
        return "two-batch overlap"
    allowlisted = model.get("multimodal_breakable_cuda_graph", model["architecture"] in BREAKABLE_MULTIMODAL_ARCHS)
    if model.get("multimodal") and not allowlisted:
        return "multimodal model"
    return ""


def speculation(args: dict[str, Any], msgs: list[str]) -> None:
    algo = args["speculative_algorithm"]
    if not algo:
        return
    if args["max_running_requests"] is None:
        args["max_running_requests"] = 48
        msgs.append(MAX_RUNNING_RESET)
    if algo == "NGRAM":
        args["enable_mixed_chunk"] = False
        topk = int(args.get("speculative_ngram_max_bfs_breadth") or 1)
        args["speculative_eagle_topk"] = topk
        if args["speculative_num_draft_tokens"] is None:
            args["speculative_num_draft_tokens"] = 12
            msgs.append(NGRAM_DRAFT_TOKENS)
        if args["speculative_num_steps"] is None:
            args["speculative_num_steps"] = args["speculative_num_draft_tokens"] // topk
        return
    if args["disable_overlap_schedule"]:
        msgs.append(SYNCHRONOUS_SPEC)
    if args.get("enable_mixed_chunk"):
        args["enable_mixed_chunk"] = False
        msgs.append(f"Mixed chunked prefill is disabled: {algo} speculative decoding does not support it.")
    if eagle_step_defaults(args):
        msgs.append(ADJUSTED_DRAFT_TOKENS)


def mamba_strategy(args: dict[str, Any], model: dict[str, Any]) -> None:
    """`auto` resolves to extra_buffer with the overlap schedule on, else no_buffer (which needs it off)."""
    if not model.get("mamba_cache_gib") or args.get("disable_radix_cache"):
        return
    if args.get("mamba_radix_cache_strategy", "auto") == "auto":
        overlap = not args["disable_overlap_schedule"]
        args["mamba_radix_cache_strategy"] = "extra_buffer" if overlap else "no_buffer"
    if args["mamba_radix_cache_strategy"] == "no_buffer" and not args["disable_overlap_schedule"]:
        raise AssertionError("no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.")
