"""The "left on the table" rules as data: one table (RULES) per backend and version range, and `evaluate`.

Each Rule names its check (Evidence -> Verdict or None), why it matters and, through
its check, the fix as pending flags in the spelling of the release in front of it (app.core.flags.toggles:
`prefill_graph_toggle`; the catalog's versions), or "nothing to do on this hardware" with the reason. A check
that lacks its evidence returns None, or a "not_read" verdict saying which evidence was not read: a rule never
claims what the server did not report (docs/architecture.md, the advisor).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from app.core.advisor.evidence import Evidence
from app.core.data import FlagValue, LogLine, Phase
from app.core.flags.catalog import release_tuple
from app.core.flags.toggles import PREFILL_BACKEND_SINCE, prefill_graph_toggle
from app.core.flags.values import format_value

Status = Literal["fix", "nothing_to_do", "not_read", "advice"]
PendingFlags = dict[str, FlagValue | None]  # flag -> value to set; None = unset it

LOW_ACCEPT_LEN = 1.3
"""An acceptance length at or below this (1.0 = no draft token accepted) means speculation is not paying."""
IDLE_SHARE = 0.2
"""A GPU of the server with more than this share of its memory unused is "a large share idle"."""
MIN_LINES = 3
SLOW_WEIGHTS_S = 10.0
"""A weights phase shorter than this is not worth a page-cache finding."""
COLD_SHARE = 0.5
"""Less than this share of the model's files in the page cache: a launch now reads most of it from disk."""
DISK_RATE_GIB_S = 2.0
"""A weights phase that read the checkpoint slower than this read it from disk, not from RAM (the project's notes:
~10 GB/s from a hot page cache on one 8-GPU host, ~0.23 GB/s from network storage with the cache dropped)."""
PREFETCH_SINCE = "0.5.12"  # SGLang's --weight-loader-prefetch-checkpoints (the real parsers' dumps)


@dataclass(frozen=True)
class Verdict:
    """What a rule's check found: what, the evidence lines, and the fix (or why there is none)."""

    status: Status
    what: str
    evidence: tuple[str, ...]
    fix: PendingFlags = field(default_factory=dict)
    reason: str = ""  # nothing_to_do / not_read: why; advice: what a user can do that is not a flag


@dataclass(frozen=True)
class Rule:
    """One row of the table."""

    id: str
    backend: str
    versions: tuple[str, str]  # (since, until) release strings, "" = open; an unknown release: applies
    title: str
    why: str
    check: Callable[[Evidence], Verdict | None]
    # The flag values the rule's fixes lead to: a server already running one of them has that gain, and the
    # "slower than before?" section does not offer to undo it on the word of an older run (advise.py).
    prefers: Mapping[str, FlagValue | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    """One line of advice: what, the evidence, why it matters, the fix or the reason there is none."""

    rule: str
    title: str
    status: Status
    what: str
    evidence: tuple[str, ...]
    why: str
    fix: PendingFlags = field(default_factory=dict)
    reason: str = ""


def _line(line: LogLine) -> str:
    return f"log line {line.number}: {line.text.strip()[:240]}"


def _later(version: str | None, since: tuple[int, ...]) -> bool:
    release = release_tuple(version)
    return release is not None and release >= since


def _graph_off_by_user(ev: Evidence) -> bool:
    return any(ev.flag(name) is True for name in ("disable-piecewise-cuda-graph", "disable-prefill-cuda-graph",
                                                  "disable-cuda-graph")) or ev.flag(
        "cuda-graph-backend-prefill") == "disabled"


def fix_text(fix: PendingFlags) -> str:
    """The flags of a fix for people: "--enable-single-batch-overlap, unset --disable-overlap-schedule"."""
    parts = []
    for name, value in fix.items():
        if value is None:
            parts.append(f"unset --{name}")
        elif value is True:
            parts.append(f"--{name}")
        else:
            parts.append(f"--{name} {format_value(value)}")
    return ", ".join(parts)


def _is_true(value: object) -> bool:
    return value is True


def _above(limit: int) -> Callable[[object], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value > limit


# SGLang 0.5.10-0.5.12 turn the piecewise CUDA graph off *silently* (ServerArgs._handle_piecewise_cuda_graph of the
# real 0.5.10, read from the package: scripts/sglang-cli-env): these are its conditions that /get_server_info
# shows, as (field, test, cause). The multimodal one comes from /model_info (`_multimodal_cause`).
SILENT_PREFILL_GRAPH_RULES: tuple[tuple[str, Callable[[object], bool], str], ...] = (
    ("speculative_algorithm", lambda value: isinstance(value, str) and bool(value), "speculative decoding is on"),
    ("enable_dp_attention", _is_true, "DP attention is on"),
    ("enable_torch_compile", _is_true, "torch.compile is on"),
    ("pp_size", _above(1), "pipeline parallelism is on"),
    ("moe_a2a_backend", lambda value: isinstance(value, str) and value not in ("", "none"), "a MoE all-to-all "
     "backend is set"),
    ("enable_lora", _is_true, "LoRA is on"),
    ("load_format", lambda value: value == "gguf", "the weights are GGUF"),
    ("quantization", lambda value: value == "gguf", "the weights are GGUF"),
    ("dllm_algorithm", lambda value: isinstance(value, str) and bool(value), "a diffusion LLM algorithm is set"),
    ("cpu_offload_gb", _above(0), "CPU offload is on"),
    ("enable_hierarchical_cache", _is_true, "the hierarchical cache is on"),
    ("enable_deterministic_inference", _is_true, "deterministic inference is on"),
    ("disaggregation_mode", lambda value: isinstance(value, str) and value not in ("", "null"), "PD "
     "disaggregation is on"),
    ("enable_symm_mem", _is_true, "symmetric memory is on"),
    ("enable_eplb", _is_true, "EPLB is on"),
    ("attn_cp_size", _above(1), "context parallelism is on"),
)


def _multimodal_cause(ev: Evidence) -> tuple[str, str] | None:
    """(cause, evidence) when /model_info says the model class is multimodal; None when it says not, or is absent."""
    info = ev.model_info or {}
    flags = {name: info.get(name) for name in ("has_image_understanding", "has_audio_understanding")}
    if not any(value is True for value in flags.values()):
        return None
    architectures = info.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures and isinstance(
        architectures[0], str) else "the model's class"
    shown = ", ".join(f"{key}={value}" for key, value in flags.items() if value is not None)
    return (f"the model class {name} counts as multimodal (a text-only deployment does not need that)",
            f"/model_info architectures={architectures!r}, {shown}")


def silent_prefill_graph_causes(ev: Evidence) -> list[tuple[str, str]]:
    """The conditions of 0.5.10-0.5.12's silent rule that the server's own answers show as met: (cause, evidence)."""
    causes = []
    multimodal = _multimodal_cause(ev)
    if multimodal is not None:
        causes.append(multimodal)
    for name, test, cause in SILENT_PREFILL_GRAPH_RULES:
        value = ev.field(name)
        if test(value):
            causes.append((cause, f"/get_server_info {name}={value!r}"))
    return causes


def check_prefill_graph(ev: Evidence) -> Verdict | None:
    """The prefill (piecewise) CUDA graph requested or defaulted on, resolved off by SGLang's own rules."""
    if _graph_off_by_user(ev):
        return None
    toggle = prefill_graph_toggle("sglang", ev.version)
    fix: PendingFlags = dict(zip(toggle.flags, toggle.states[-1], strict=True))
    if all(ev.flag(name) == value for name, value in fix.items()):
        return None  # already enforced: nothing new to say
    notices = [n for n in ev.notices if n.feature == "prefill_cuda_graph" and n.kind == "auto_disabled"
               and "because --" not in n.text]
    evidence = [_line(n.line) for n in notices[:1]]
    if ev.field("disable_piecewise_cuda_graph") is True:
        evidence.append("/get_server_info disable_piecewise_cuda_graph=True (requested: on by default)")
    if ev.field("cuda_graph_backend_prefill") == "disabled":
        evidence.append("/get_server_info cuda_graph_backend_prefill='disabled' (requested: default)")
    if not evidence:
        return None
    if any("multimodal" in n.text for n in notices):
        cause = "because the model class counts as multimodal (a text-only deployment does not need that)"
    elif notices:
        cause = "by SGLang's auto-disable rules (the notice above says why)"
    else:
        # 0.5.10-0.5.12 log nothing: the causes are the rule's conditions the server's answers show as met
        causes = silent_prefill_graph_causes(ev) if not _later(ev.version, PREFILL_BACKEND_SINCE) else []
        evidence += [source for _, source in causes]
        cause = (f"because {' and '.join(text for text, _ in causes)} (SGLang {ev.version or ''} does so without "
                 "a log line)" if causes else "by SGLang's auto-disable rules; neither the log nor the server's "
                 "answers say which")
    shown = fix_text(fix)
    return Verdict("fix", f"the prefill (piecewise) CUDA graph was switched off {cause}", tuple(evidence), fix,
                   f"{shown} keeps it on in {ev.version or 'this release'}")


def check_single_batch_overlap(ev: Evidence) -> Verdict | None:
    tp, tp_source = ev.tp_size
    if tp <= 1:
        return None
    resolved = ev.field("enable_single_batch_overlap")
    if resolved is True or ev.flag("enable-single-batch-overlap") is True:
        return None
    if resolved is False:
        evidence = "/get_server_info enable_single_batch_overlap=False"
    elif ev.resolved is None:
        evidence = "argv: no --enable-single-batch-overlap (default off)"
    else:
        return None  # the server answered without the field: an older release, claim nothing
    return Verdict("fix", f"single-batch overlap is off with TP {tp}", (evidence, tp_source),
                   {"enable-single-batch-overlap": True})


def check_overlap_schedule(ev: Evidence) -> Verdict | None:
    resolved = ev.field("disable_overlap_schedule")
    requested = ev.flag("disable-overlap-schedule") is True
    if requested:
        return Verdict("fix", "the overlap scheduler is off (--disable-overlap-schedule)",
                       ("argv: --disable-overlap-schedule",), {"disable-overlap-schedule": None})
    if resolved is not True:
        return None
    evidence = ["/get_server_info disable_overlap_schedule=True (requested: on by default)"]
    why = [n for n in ev.notices if "verlap schedul" in n.text]
    evidence += [_line(n.line) for n in why[:1]]
    if why and "SGLANG_ENABLE_SPEC_V2" in why[0].text:
        advice = ("the server turned it off for speculative decoding without spec v2: SGLANG_ENABLE_SPEC_V2=True "
                  "in the profile's env turns it on (experimental in this release; A/B it)")
    else:
        advice = "the server turned it off by its own rules; the notice above says why when there is one"
    return Verdict("advice", "the overlap scheduler is off although not requested", tuple(evidence), {}, advice)


def _compute_cap(ev: Evidence) -> tuple[int, int] | None:
    cap = ev.gpu_facts.compute_cap if ev.gpu_facts else None
    parts = (cap or "").split(".")
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return int(parts[0]), int(parts[1])
    return None


def _sm(cap: tuple[int, int]) -> str:
    return f"SM {cap[0]}.{cap[1]}"


def _links(ev: Evidence) -> str:
    topology = ev.gpu_facts.topology if ev.gpu_facts else None
    if topology is None:
        return "not read"
    cells = [f"GPU{link.a}-GPU{link.b} {link.kind}{'' if link.nvlinks is None else f' x{link.nvlinks}'}"
             for link in topology.links_among(topology.gpus) if link is not None]
    return ", ".join(cells) or "no pair"


def check_allreduce_fusion(ev: Evidence) -> Verdict | None:
    tp, tp_source = ev.tp_size
    if tp <= 1 or ev.flag("enable-flashinfer-allreduce-fusion") is True:
        return None
    what = "FlashInfer all-reduce fusion"
    cap = _compute_cap(ev)
    if cap is None:
        return Verdict("not_read", f"whether this GPU supports {what} is not known",
                       ("compute capability: not read", tp_source), {}, "it needs SM90 or SM100")
    source = f"nvidia-smi compute_cap {cap[0]}.{cap[1]}"
    if cap[0] not in (9, 10):
        return Verdict("nothing_to_do", f"{what} is unavailable on {_sm(cap)}", (source,), {},
                       f"it needs SM90 or SM100; this GPU is {_sm(cap)}")
    if _later(ev.version, PREFILL_BACKEND_SINCE):
        if ev.flag("enforce-disable-flashinfer-allreduce-fusion") is True:
            return Verdict("fix", f"{what} is kept off on {_sm(cap)}", (source, "argv: "
                           "--enforce-disable-flashinfer-allreduce-fusion"),
                           {"enforce-disable-flashinfer-allreduce-fusion": None})
        return None  # on by default where supported from 0.5.15; its flag is gone
    if ev.field("enable_flashinfer_allreduce_fusion") is True:
        return None
    return Verdict("fix", f"{what} is off on {_sm(cap)} with TP {tp}", (source, tp_source),
                   {"enable-flashinfer-allreduce-fusion": True})


def check_nccl_nvls(ev: Evidence) -> Verdict | None:
    tp, tp_source = ev.tp_size
    if tp <= 1 or ev.flag("enable-nccl-nvls") is True or ev.field("enable_nccl_nvls") is True:
        return None
    what = "NCCL NVLS (NVLink SHARP all-reduce)"
    cap = _compute_cap(ev)
    if cap is None:
        return Verdict("not_read", f"whether these GPUs support {what} is not known",
                       ("compute capability: not read", "interconnect: not read"), {},
                       "it needs SM90+ GPUs joined by an NVLink Switch")
    source = f"nvidia-smi compute_cap {cap[0]}.{cap[1]}"
    if cap[0] < 9:
        return Verdict("nothing_to_do", f"{what} is unavailable on {_sm(cap)}", (source,), {},
                       f"it needs SM90+ with an NVLink Switch; this GPU is {_sm(cap)}")
    link = ev.gpu_facts.interconnect if ev.gpu_facts else None
    if link is None:
        return Verdict("not_read", f"the link between the TP ranks, which {what} needs, is not known",
                       (source, "interconnect: not read"), {}, "it needs an NVLink Switch between the ranks")
    link_source = f"nvidia-smi topo -m: {_links(ev)}"
    if link != "nvlink":
        return Verdict("nothing_to_do", f"{what} is unavailable over {link.upper()}", (source, link_source),
                       {}, "the TP ranks are not joined by NVLink")
    return Verdict("fix", f"{what} is off on {_sm(cap)} GPUs joined by NVLink",
                   (source, link_source, tp_source), {"enable-nccl-nvls": True},
                   "NVLS needs an NVLink Switch; `nvidia-smi topo -m` shows NVLink, not the switch: A/B it")


def _spec_value(ev: Evidence, name: str) -> tuple[object, str]:
    value = ev.field(name.replace("-", "_"))
    if value is not None:
        return value, f"/get_server_info {name.replace('-', '_')}={value}"
    value = ev.flag(name)
    return value, (f"argv --{name} {value}" if value is not None else "")


def check_speculation(ev: Evidence) -> Verdict | None:
    algo, _ = _spec_value(ev, "speculative-algorithm")
    if algo is None:
        if ev.resolved is not None and "speculative_algorithm" not in ev.resolved:
            return None  # an older server without the field: claim nothing
        evidence = "/get_server_info speculative_algorithm=None" if ev.resolved else "argv: no --speculative-algorithm"
        return Verdict("advice", "speculative decoding is off", (evidence,), {},
                       "it needs a draft model (EAGLE) or the model's own MTP heads (NEXTN); the server does not "
                       "say whether this model has them")
    if algo == "NGRAM":
        return None
    steps, steps_source = _spec_value(ev, "speculative-num-steps")
    topk, topk_source = _spec_value(ev, "speculative-eagle-topk")
    draft, draft_source = _spec_value(ev, "speculative-num-draft-tokens")
    if topk == 1 and isinstance(steps, int) and isinstance(draft, int) and draft != steps + 1:
        return Verdict("fix", f"draft tokens {draft} do not match {steps} steps with topk 1 (draft = steps + 1)",
                       (steps_source, topk_source, draft_source), {"speculative-num-draft-tokens": steps + 1})
    return None


def check_accept_length(ev: Evidence) -> Verdict | None:
    if ev.backend == "vllm":
        pairs = [(s.mean_accept_len, s.line) for s in ev.spec_decode if s.mean_accept_len is not None]
    else:
        pairs = [(d.accept_len, d.line) for d in ev.decode if d.accept_len is not None]
    recent = pairs[-10:]
    if len(recent) < MIN_LINES:
        return None
    median = statistics.median(value for value, _ in recent if value is not None)
    if median > LOW_ACCEPT_LEN:
        return None
    return Verdict("advice", f"accept length {median:.2f} (median of the last {len(recent)} lines): speculation "
                   "is not paying", (_line(recent[-1][1]),), {},
                   "fewer speculative steps, another draft, or no speculation: A/B it")


def _decode_graph_off_by_user(ev: Evidence) -> bool:
    return (any(ev.flag(name) is True for name in ("disable-cuda-graph", "disable-decode-cuda-graph", "enforce-eager"))
            or ev.flag("cuda-graph-backend-decode") == "disabled" or ev.field("disable_cuda_graph") is True
            or ev.field("cuda_graph_backend_decode") == "disabled")


def _graph_max_bs(ev: Evidence) -> tuple[int | None, str]:
    for name in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"):
        value = ev.field(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value, f"/get_server_info {name}={value}"
    return None, ""


def check_graph_max_bs(ev: Evidence) -> Verdict | None:
    if _decode_graph_off_by_user(ev):
        return None
    max_bs, source = _graph_max_bs(ev)
    over = [d for d in ev.decode if d.cuda_graph is False and max_bs is not None and (d.running or 0) > max_bs]
    if not over or max_bs is None:
        return None
    peak = max(d.running or 0 for d in over)
    flag = "cuda-graph-max-bs-decode" if _later(ev.version, PREFILL_BACKEND_SINCE) else "cuda-graph-max-bs"
    return Verdict("fix", f"{len(over)} decode batches of up to {peak} requests ran without a CUDA graph: the "
                   f"graph covers batches up to {max_bs}", (_line(over[-1].line), source), {flag: peak})


def check_decode_graph(ev: Evidence) -> Verdict | None:
    if _decode_graph_off_by_user(ev):
        return None
    max_bs, _ = _graph_max_bs(ev)
    off = [d for d in ev.decode if d.cuda_graph is False and (max_bs is None or (d.running or 0) <= max_bs)]
    if len(off) < MIN_LINES:
        return None
    return Verdict("advice", f"{len(off)} of {len(ev.decode)} decode lines say `cuda graph: False` although "
                   "graphs were expected", (_line(off[-1].line),), {},
                   "`tunedash log` shows whether the decode graph was captured; a startup notice may say why not")


def check_memory_idle(ev: Evidence) -> Verdict | None:
    read = [g for g in ev.gpus if g.memory_used_mib is not None and g.memory_total_mib]
    if not read or len(read) < len(ev.gpus):
        return None
    shares = [1 - (g.memory_used_mib or 0) / (g.memory_total_mib or 1) for g in read]
    idle = min(shares)
    if idle <= IDLE_SHARE:
        return None
    flag, field_name = (("mem-fraction-static", "mem_fraction_static") if ev.backend == "sglang"
                        else ("gpu-memory-utilization", "gpu_memory_utilization"))
    current, source = ev.number(field_name, flag)
    evidence = tuple(f"nvidia-smi GPU {g.index}: {g.memory_used_mib} of {g.memory_total_mib} MiB used" for g in read)
    what = f"{idle:.0%} of GPU memory is idle on every GPU of the server"
    why = "more KV cache pays only when requests queue or contexts are long"
    if current is None:
        return Verdict("advice", what, evidence, {}, f"--{flag} raises it; {why}")
    target = round(min(0.95, current + idle - 0.1), 2)
    if target <= current:
        return None
    return Verdict("fix", what, (*evidence, source), {flag: target}, why)


def _weights_seconds(ev: Evidence) -> tuple[float | None, str]:
    """The weights phase's own elapsed figure (the largest: target and draft load apart), with its log line."""
    timed = [p for p in ev.phases if p.phase == Phase.WEIGHTS and p.seconds is not None]
    if not timed:
        return None, ""
    longest = max(timed, key=lambda p: p.seconds or 0.0)
    return longest.seconds, f"log line {longest.line.number}: weights took {longest.seconds:.1f} s"


def check_cold_page_cache(ev: Evidence) -> Verdict | None:
    """A slow weights phase whose checkpoint is (or was, at launch) not in the host's page cache."""
    seconds, line = _weights_seconds(ev)
    cache = ev.page_cache
    if seconds is None or seconds < SLOW_WEIGHTS_S or cache is None:
        return None
    share, total = cache.fraction, cache.total_bytes
    if share is None or not total:
        return None
    rate = total / 2**30 / seconds
    evidence = (line, f"page cache ({cache.tool}): {cache.describe()}")
    fix = "`tunedash prewarm PROFILE` reads the files into RAM before the next launch"
    release = release_tuple(ev.version)
    since = release_tuple(PREFETCH_SINCE)
    if ev.backend == "sglang" and (release is None or since is None or release >= since):
        fix += ("; SGLang can do it itself at launch with --weight-loader-prefetch-checkpoints (each rank a share "
                "of the shards: meant for network storage)")
    if ev.flag("weight-loader-drop-cache-after-load"):
        fix += "; --weight-loader-drop-cache-after-load empties the cache after every load: drop that flag"
    if share < COLD_SHARE:
        what = (f"cold page cache: the weights phase took {seconds:.1f} s and only {share:.0%} of the model's "
                f"{total / 2**30:.1f} GiB is in the page cache: a launch now reads the rest from disk")
        return Verdict("advice", what, evidence, {}, fix)
    if rate < DISK_RATE_GIB_S:
        what = (f"the weights phase read the checkpoint at {rate:.2f} GiB/s ({total / 2**30:.1f} GiB in "
                f"{seconds:.1f} s), disk speed: the page cache was most likely cold at launch (it holds "
                f"{share:.0%} now, which this load filled)")
        return Verdict("advice", what, evidence, {}, fix)
    return None


def _engine(ev: Evidence, name: str) -> tuple[str | None, str]:
    """One field of vLLM's engine-config line, with the evidence text naming the line."""
    value = ev.engine.get(name)
    if value is None or ev.engine_line is None:
        return None, ""
    shown = "mode" if name == "compilation_mode" else name
    return value, f"log line {ev.engine_line.number} (engine config): {shown}={value}"


def _vllm_on_cpu(ev: Evidence) -> bool:
    return ev.engine.get("device") == "cpu" or any(p.detail.get("device") == "CPU" for p in ev.phases)


def check_vllm_eager(ev: Evidence) -> Verdict | None:
    """--enforce-eager (asked for, or in the engine config): no CUDA graphs and no torch.compile."""
    value, source = _engine(ev, "enforce_eager")
    requested = ev.flag("enforce-eager") is True
    if value != "True" and not requested:
        return None
    evidence = tuple(e for e in (source, "argv: --enforce-eager" if requested else "") if e)
    notice = [n for n in ev.notices if n.text.startswith("Enforce eager set")]
    evidence += tuple(_line(n.line) for n in notice[:1])
    if _vllm_on_cpu(ev):
        return Verdict("advice", "eager mode: torch.compile is off", evidence, {},
                       "on CPU there are no CUDA graphs to lose; without --enforce-eager vLLM compiles the model "
                       "once at start (slower start, maybe faster steps): A/B it")
    return Verdict("fix", "eager mode: CUDA graphs and torch.compile are off", evidence, {"enforce-eager": None},
                   "every decode step then pays the kernel launch overhead")


def check_vllm_cudagraph_mode(ev: Evidence) -> Verdict | None:
    """cudagraph_mode NONE in the engine config while not eager: no CUDA graph although graphs are possible."""
    mode, source = _engine(ev, "cudagraph_mode")
    if mode != "NONE" or ev.engine.get("enforce_eager") == "True" or ev.flag("enforce-eager") is True:
        return None
    if _vllm_on_cpu(ev):
        return Verdict("nothing_to_do", "cudagraph_mode is NONE", (source, "engine config: device=cpu"), {},
                       "there are no CUDA graphs on CPU")
    if ev.flag("compilation-config.cudagraph_mode") == "NONE":
        return None  # asked for
    evidence = [source]
    _, compilation_source = _engine(ev, "compilation_mode")
    if compilation_source:
        evidence.append(compilation_source)
    evidence += [_line(n.line) for n in ev.notices if n.text.startswith("Cudagraph mode")][:1]
    return Verdict("fix", "vLLM runs without CUDA graphs (cudagraph_mode NONE) although not asked to", tuple(evidence),
                   {"compilation-config.cudagraph_mode": "FULL_AND_PIECEWISE"},
                   "FULL_AND_PIECEWISE is vLLM's default where the compilation mode allows it")


def check_vllm_speculation(ev: Evidence) -> Verdict | None:
    value, source = _engine(ev, "speculative_config")
    if value != "None":
        return None
    return Verdict("advice", "speculative decoding is off", (source,), {},
                   "--speculative-config (n-gram needs no draft model; EAGLE/MTP need a draft or the model's heads): "
                   "A/B it")


def check_weight_cache_miss(ev: Evidence) -> Verdict | None:
    """The engine runs as a weight cache client but loaded its weights from disk: the cache missed."""
    misses = [n for n in ev.notices if n.feature == "weight_cache" and "falling back to disk" in n.text]
    if not misses:
        return None
    found = tuple(_line(n.line) for n in misses[:1])
    return Verdict("advice", "the weights came from disk, not from the weight cache daemon", found, {},
                   "no daemon served these GPUs (its socket was missing, or its key differed): with `warm = true` "
                   "tunedash starts the daemon before the engine; `tunedash kill --all` then a launch starts a fresh "
                   "one")


RULES: tuple[Rule, ...] = (
    Rule("weight_cache_miss", "sglang", ("0.5.23", ""), "Weight cache missed",
          "a warm relaunch maps the weights from the daemon in about a second; from disk they take the full load",
          check_weight_cache_miss),
    Rule("weight_cache_miss", "vllm", ("", ""), "Weight cache missed",
          "a warm relaunch maps the weights from the daemon in about a second; from disk they take the full load",
          check_weight_cache_miss),
    Rule("prefill_graph_auto_disabled", "sglang", ("0.5.10", ""), "Prefill (piecewise) CUDA graph auto-disabled",
          "without it every prefill runs eagerly: slower time to first token and slower mixed batches",
          check_prefill_graph, {"enforce-piecewise-cuda-graph": True, "cuda-graph-backend-prefill": "breakable"}),
    Rule("single_batch_overlap_off", "sglang", ("0.5.3", ""), "Single-batch overlap off with TP > 1",
          "the TP all-reduce and the compute of one batch run one after the other",
          check_single_batch_overlap, {"enable-single-batch-overlap": True}),
    Rule("overlap_schedule_off", "sglang", ("", ""), "Overlap scheduler off",
          "the CPU's scheduling of the next batch waits for the GPU instead of running under it",
          check_overlap_schedule, {"disable-overlap-schedule": None}),
    Rule("flashinfer_allreduce_fusion", "sglang", ("0.4.10.post2", ""), "FlashInfer all-reduce fusion",
          "fuses the TP all-reduce with the norm that follows it",
          check_allreduce_fusion, {"enable-flashinfer-allreduce-fusion": True}),
    Rule("nccl_nvls", "sglang", ("", ""), "NCCL NVLS",
          "all-reduce inside the NVLink Switch: less time in TP communication", check_nccl_nvls,
          {"enable-nccl-nvls": True}),
    Rule("speculation", "sglang", ("", ""), "Speculative decoding off or inconsistent",
          "speculation multiplies tokens per step; mismatched draft tokens waste verify work", check_speculation),
    Rule("accept_length_low", "sglang", ("", ""), "Speculation not paying",
          "every draft costs a verify step; at accept length 1 nothing comes back for it", check_accept_length),
    Rule("accept_length_low", "vllm", ("", ""), "Speculation not paying",
          "every draft costs a verify step; at accept length 1 nothing comes back for it", check_accept_length),
    Rule("graph_max_bs_below_batch", "sglang", ("", ""), "CUDA graph max batch size below the running batch",
          "batches above the captured size run eagerly, several times slower per step",
          check_graph_max_bs),
    Rule("decode_without_graph", "sglang", ("", ""), "Decode without CUDA graph",
          "an eager decode step pays the kernel launch overhead every token", check_decode_graph),
    Rule("memory_idle", "sglang", ("", ""), "GPU memory left idle",
          "memory the server does not hold is KV cache it cannot use", check_memory_idle),
    Rule("eager_mode", "vllm", ("", ""), "Eager mode (--enforce-eager)",
          "CUDA graphs replay a decode step as one launch; torch.compile fuses its kernels", check_vllm_eager,
          {"enforce-eager": None}),
    Rule("cudagraph_mode_none", "vllm", ("0.10.2", ""), "CUDA graphs off (cudagraph_mode NONE)",
          "an eager decode step pays the kernel launch overhead every token", check_vllm_cudagraph_mode,
          {"compilation-config.cudagraph_mode": "FULL_AND_PIECEWISE"}),
    Rule("speculation", "vllm", ("", ""), "Speculative decoding off",
          "speculation multiplies tokens per step", check_vllm_speculation),
    Rule("memory_idle", "vllm", ("", ""), "GPU memory left idle",
          "memory the server does not hold is KV cache it cannot use", check_memory_idle),
    Rule("cold_page_cache", "sglang", ("", ""), "Weights read from disk (cold page cache)",
          "a checkpoint in the page cache loads at RAM speed; from disk it can take ten times longer",
          check_cold_page_cache),
    Rule("cold_page_cache", "vllm", ("", ""), "Weights read from disk (cold page cache)",
          "a checkpoint in the page cache loads at RAM speed; from disk it can take ten times longer",
          check_cold_page_cache),
)


def applies(rule: Rule, backend: str, version: str | None) -> bool:
    """Whether `rule` is about this backend and release (an unknown release: every rule of the backend)."""
    if rule.backend != backend:
        return False
    release = release_tuple(version)
    if release is None:
        return True
    since, until = (release_tuple(v) for v in rule.versions)
    return (since is None or release >= since) and (until is None or release[:len(until)] <= until)


def evaluate(ev: Evidence, rules: tuple[Rule, ...] = RULES) -> list[Finding]:
    """Every rule of the table that applies to the server in front of it, and that found something."""
    findings: list[Finding] = []
    for rule in rules:
        if not applies(rule, ev.backend, ev.version):
            continue
        verdict = rule.check(ev)
        if verdict is not None:
            findings.append(Finding(rule.id, rule.title, verdict.status, verdict.what, verdict.evidence, rule.why,
                                    verdict.fix, verdict.reason))
    return findings
