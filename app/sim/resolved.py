"""What the simulated server resolves from its command line (app.sim.server_args) and what both releases'
rules (app.sim.rules_0510, app.sim.rules_0523) share: the Running summary, the speculative defaults, messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Running:
    """What the simulated server really runs after its release's rules, in words both releases share."""

    version: str
    decode_graph: bool = True  # the decode (with speculation: verify) CUDA graph is captured and replayed
    graph_max_bs: int = 32  # the largest batch the decode graph covers
    # The prefill-side graph the `g` toggle keeps on: 0.5.10's piecewise CUDA graph, 0.5.23's prefill CUDA graph.
    prefill_graph: bool = False
    prefill_graph_backend: str = "disabled"  # 0.5.10: "piecewise"; 0.5.23: "breakable" | "full"; off: "disabled"
    prefill_graph_max_tokens: int = 0
    prefill_graph_off_by_flag: bool = False  # turned off by the user's own flag (0.5.10 logs it)
    overlap_schedule: bool = True
    single_batch_overlap: bool = False
    torch_compile: bool = False
    mamba: bool = False
    max_mamba_cache_size: int = 0


@dataclass
class Resolved:
    """resolve()'s answer: the real-named args, what runs, and the main process's messages."""

    args: dict[str, Any]
    running: Running
    msgs: list[str] = field(default_factory=list)


def auto_cuda_graph_max_bs(total_gb: float, tp: int) -> int:
    # SGLang 0.5.6's own table, read in its source (a "notes" fact: docs/servers.md#where-a-fact-was-checked).
    if total_gb < 20:
        return 8
    if total_gb < 35:
        return 24 if tp < 4 else 80
    if total_gb < 60:
        return 32 if tp < 4 else 160
    return 256 if tp < 4 else 512


def eagle_step_defaults(args: dict[str, Any]) -> bool:
    """Steps, topk and draft tokens of EAGLE-type speculation; True when a given draft-token count was adjusted."""
    if (args["speculative_num_steps"], args["speculative_eagle_topk"],
            args["speculative_num_draft_tokens"]) == (None, None, None):
        args["speculative_num_steps"], args["speculative_eagle_topk"] = 3, 1
        args["speculative_num_draft_tokens"] = 4
    if args["speculative_num_steps"] is None:
        args["speculative_num_steps"] = 3
    if args["speculative_eagle_topk"] is None:
        args["speculative_eagle_topk"] = 1
    steps, topk = args["speculative_num_steps"], args["speculative_eagle_topk"]
    adjusted = False
    if topk == 1 and args["speculative_num_draft_tokens"] != steps + 1:
        adjusted = args["speculative_num_draft_tokens"] is not None
        args["speculative_num_draft_tokens"] = steps + 1
    if args["speculative_num_draft_tokens"] is None:
        args["speculative_num_draft_tokens"] = steps * topk + 1
    return adjusted


ADJUSTED_DRAFT_TOKENS = ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                         "speculative_eagle_topk == 1")
MAX_RUNNING_RESET = ("Max running requests is reset to 48 for speculative decoding. You can override this by "
                     "explicitly setting --max-running-requests.")
NGRAM_DRAFT_TOKENS = ("speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. You "
                      "can override this by explicitly setting --speculative-num-draft-tokens.")


