"""SGLang 0.5.10-0.5.12's rules in the simulated server: speculation and overlap, mamba strategy, graphs.

Called by app.sim.server_args.resolve() after the shared defaults (docs/servers.md#sglang-command-line):
- EAGLE-type speculation: overlap scheduler off unless SGLANG_ENABLE_SPEC_V2 is true (default False), logged;
  NGRAM: overlap and mixed chunk off, logged; max running requests 48, logged;
- mamba `no_buffer` with the radix cache on turns the overlap schedule off, logged;
- piecewise CUDA graph (PCG): on by default, *silently* off with speculative decoding, a multimodal model,
  torch.compile, DP attention, pp > 1, LoRA or GGUF, unless --enforce-piecewise-cuda-graph; the state shows
  in `disable_piecewise_cuda_graph` (and `enable_piecewise_cuda_graph`, kept as what runs).
"""

from __future__ import annotations

import os
from typing import Any

from app.sim.resolved import (
    ADJUSTED_DRAFT_TOKENS,
    MAX_RUNNING_RESET,
    NGRAM_DRAFT_TOKENS,
    Running,
    auto_cuda_graph_max_bs,
    eagle_step_defaults,
)

VERSION = "0.5.10"
# ServerArgs.from_cli_args of 0.5.10: these parser dests become these dataclass fields.
CLI_TO_FIELD = {"tensor_parallel_size": "tp_size", "pipeline_parallel_size": "pp_size",
                "attention_context_parallel_size": "attn_cp_size", "moe_data_parallel_size": "moe_dp_size",
                "data_parallel_size": "dp_size", "expert_parallel_size": "ep_size"}
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"
OVERLAP_OFF_WITHOUT_SPEC_V2 = (
    "Overlap scheduler is disabled when spec v2 is off or using unsupported speculative algorithm. You can set "
    "env SGLANG_ENABLE_SPEC_V2=True to enable the experimental overlap scheduler. "
)


def apply(args: dict[str, Any], model: dict[str, Any], total_gb: float, msgs: list[str]) -> Running:
    """0.5.10's rules on `args` (in place); the messages go to `msgs` in SGLang's order."""
    if args["cuda_graph_max_bs"] is None:
        args["cuda_graph_max_bs"] = auto_cuda_graph_max_bs(total_gb, args["tp_size"])
    if args["attention_backend"] in ("torch_native", "flex_attention"):
        kind = "torch native" if args["attention_backend"] == "torch_native" else "torch Flex Attention"
        msgs.append(f"Cuda graph is disabled because of using {kind} attention backend")
        args["disable_cuda_graph"] = True
    speculation(args, msgs)
    if (model.get("mamba_cache_gib") and args["mamba_scheduler_strategy"] == "no_buffer"
            and not args["disable_radix_cache"] and not args["disable_overlap_schedule"]):
        msgs.append("Disabling overlap schedule since mamba no_buffer is not compatible with overlap schedule, "
                    "try to use --disable-radix-cache if overlap schedule is necessary")
        args["disable_overlap_schedule"] = True
    user_disabled_pcg = piecewise_cuda_graph(args, model)
    return Running(
        version=VERSION,
        decode_graph=not args["disable_cuda_graph"],
        graph_max_bs=int(args["cuda_graph_max_bs"]),
        prefill_graph=bool(args["enable_piecewise_cuda_graph"]),
        prefill_graph_backend="piecewise" if args["enable_piecewise_cuda_graph"] else "disabled",
        prefill_graph_max_tokens=int(args["piecewise_cuda_graph_max_tokens"]),
        prefill_graph_off_by_flag=user_disabled_pcg,
        overlap_schedule=not args["disable_overlap_schedule"],
        single_batch_overlap=bool(args["enable_single_batch_overlap"]),
        torch_compile=bool(args["enable_torch_compile"]),
        mamba=bool(model.get("mamba_cache_gib")),
        max_mamba_cache_size=int(model.get("max_mamba_cache_size", 0)),
    )


def speculation(args: dict[str, Any], msgs: list[str]) -> None:
    algo = args["speculative_algorithm"]
    if not algo:
        return
    if algo == "NGRAM":
        if args["speculative_num_draft_tokens"] is None:
            args["speculative_num_draft_tokens"] = 12
            msgs.append(NGRAM_DRAFT_TOKENS)
        args["speculative_num_steps"] = args["speculative_num_steps"] or 1
        args["speculative_eagle_topk"] = args["speculative_eagle_topk"] or 1
        msgs.append("The overlap scheduler and mixed chunked prefill are disabled because of using ngram "
                    "speculative decoding.")
        args["disable_overlap_schedule"] = True
    else:
        if eagle_step_defaults(args):
            msgs.append(ADJUSTED_DRAFT_TOKENS)
        spec_v2 = os.environ.get(SPEC_V2_ENV, "false").lower() in ("1", "true", "yes")
        if spec_v2 and algo in ("EAGLE", "EAGLE3"):
            if args["speculative_eagle_topk"] > 1:
                raise ValueError("Spec v2 currently only supports topk = 1 for speculative decoding.")
            msgs.append("Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule is "
                        "turned on.")
        else:
            msgs.append(OVERLAP_OFF_WITHOUT_SPEC_V2)
            args["disable_overlap_schedule"] = True
        if args["enable_mixed_chunk"]:
            msgs.append("Mixed chunked prefill is disabled because of using eagle speculative decoding.")
            args["enable_mixed_chunk"] = False
    if args["max_running_requests"] is None:
        args["max_running_requests"] = 48
        msgs.append(MAX_RUNNING_RESET)


def piecewise_cuda_graph(args: dict[str, Any], model: dict[str, Any]) -> bool:
    """PCG on by default in 0.5.10-0.5.12, silently off under any rule of the cascade; True: off by the user."""
    user_disabled_pcg = bool(args["disable_piecewise_cuda_graph"])
    if not args["enforce_piecewise_cuda_graph"] and not user_disabled_pcg and (
        args["speculative_algorithm"]
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
    return user_disabled_pcg
