"""The simulated server's command line: its release's real flags, the values it resolves, that release's rules.

parse() builds the parser of the release this process speaks (app.sim.flag_parser, from the real flags
committed in app/sim/sglang_versions/). resolve() fills in the auto values both releases compute alike here
(tokenizer, context length, chunked prefill size, decode-graph batch size, speculative defaults, max running
requests, mem fraction) and applies the release's own rules (app.sim.rules_0510, app.sim.rules_0523:
docs/servers.md#sglang-command-line). It returns a Resolved:
- args: every field under the release's real names, after the rules: what `server_args=ServerArgs(...)`
  logs and /get_server_info reports (0.5.10: disable_piecewise_cuda_graph; 0.5.23: cuda_graph_backend_prefill);
- running: what the ranks, the engine and the speed model act on, in the same words for both releases;
- msgs: the lines the main process logs before `server_args=`, in order.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from app.sim import rules_0510, rules_0523
from app.sim.flag_parser import build_parser
from app.sim.resolved import Resolved, Running
from app.sim.versions import current_version, flag_table

MODELS_FILE = Path(__file__).with_name("models.toml")


def load_models() -> dict[str, dict[str, Any]]:
    with MODELS_FILE.open("rb") as fh:
        return dict(tomllib.load(fh)["models"])


def parse(argv: list[str], version: str | None = None) -> argparse.Namespace:
    """The release's real parser on argv (argparse's own exit 2 and message on a flag it does not know)."""
    return build_parser(flag_table(version or current_version())).parse_args(argv)


def shared_defaults(args: dict[str, Any], model: dict[str, Any], total_gb: float) -> None:
    """The auto values both releases fill in the same way (here), before the release's own rules."""
    if args["tokenizer_path"] is None:
        args["tokenizer_path"] = args["model_path"]
    if args["served_model_name"] is None:
        args["served_model_name"] = args["model_path"]
    if args["context_length"] is None:
        args["context_length"] = int(model["context_length"])
    if args["chunked_prefill_size"] is None:
        args["chunked_prefill_size"] = 2048 if total_gb < 35 else 4096 if total_gb < 60 else 8192
    if args.get("mamba_ssm_dtype") is None and model.get("mamba_cache_gib"):
        args["mamba_ssm_dtype"] = "float32"
    if args["speculative_algorithm"] == "NEXTN":
        args["speculative_algorithm"] = "EAGLE"


def finish(args: dict[str, Any], total_gb: float, running: Running) -> None:
    """The values both releases fill in after the rules: max running requests, mem fraction, seed."""
    if args["max_running_requests"] is None:
        args["max_running_requests"] = 256 if total_gb < 60 else 1024
    if args["mem_fraction_static"] is None:
        reserved_gb = 5.0 + (0.5 if args["speculative_algorithm"] else 0.0) + (0.5 if running.prefill_graph else 0.0)
        args["mem_fraction_static"] = round((total_gb - reserved_gb) / total_gb, 3)
    if args["random_seed"] is None:
        args["random_seed"] = 42


def resolve(ns: argparse.Namespace, model: dict[str, Any], gpu_total_mib: int, version: str | None = None) -> Resolved:
    """Resolved server args (every flag, auto values filled in), what runs, and the main process's messages."""
    version = version or current_version()
    rules = rules_0523 if version == "0.5.23" else rules_0510
    args = {rules.CLI_TO_FIELD.get(dest, dest): value for dest, value in vars(ns).items()}
    msgs: list[str] = []
    total_gb = gpu_total_mib / 1024
    shared_defaults(args, model, total_gb)
    running = rules.apply(args, model, total_gb, msgs)
    finish(args, total_gb, running)
    return Resolved(args=args, running=running, msgs=msgs)


def server_args_repr(args: dict[str, Any]) -> str:
    """`ServerArgs(model_path='...', ...)` like the dataclass repr SGLang logs at start."""
    body = ", ".join(f"{k}={v!r}" for k, v in args.items() if not k.startswith("_"))
    return f"ServerArgs({body})"
