"""Periodic and summary log lines -> typed figures: DecodeStats, PrefillStats, SpecDecodeStats, ServerCapacity.

The parser (app/core/logs/parser.py) finds a line's kind with the patterns of app/core/logs/patterns.py and hands
the matched text here. Each builder returns None when the line's figures cannot be read (the parser counts such
a line as unreadable); a field that is absent or not a number is None, never 0 (docs/servers.md#sglang-log-lines).
"""

from __future__ import annotations

import math
import re

from app.core.data import DecodeStats, LogLine, PrefillStats, ServerCapacity, SpecDecodeStats


def number(text: str | None) -> float | None:
    """A float from a log field ("12.5", "12.5%", "1,234"); None when it is not a finite number ("nan", "inf")."""
    if text is None:
        return None
    value = text.strip().rstrip("%").replace(",", "")
    value = value.split(" ", 1)[0]
    try:
        parsed = float(value)
    except ValueError:
        return None
    return parsed if math.isfinite(parsed) else None


def integer(text: str | None) -> int | None:
    """An int from a log field, None when it is not a number."""
    parsed = number(text)
    return int(parsed) if parsed is not None else None


def fields(text: str) -> dict[str, str]:
    """``key: value`` pairs of a comma-separated stats line (trailing ", " and "." tolerated)."""
    pairs: dict[str, str] = {}
    for part in text.rstrip().rstrip(",.").split(", "):
        key, sep, value = part.partition(": ")
        if sep:
            pairs.setdefault(key.strip(), value.strip())
    return pairs


def _token_usage(pairs: dict[str, str]) -> float | None:
    """The first pool usage a line prints: plain, hybrid (`full token usage`) or HiSparse (`gpu token usage`)."""
    return number(
        next((pairs[key] for key in ("token usage", "full token usage", "gpu token usage") if key in pairs), None)
    )


def _graph(pairs: dict[str, str]) -> bool | None:
    """The `cuda graph: True` field, whatever the device ("cpu graph", "npu graph", "musa graph")."""
    value = next((value for key, value in pairs.items() if key.endswith(" graph")), None)
    return {"True": True, "False": False}.get(value or "")


def sglang_decode(text: str, line: LogLine, timestamp: str | None) -> DecodeStats | None:
    """An SGLang ``Decode batch`` line's fields (the text after ``Decode batch, ``); None without gen tok/s."""
    pairs = fields(text)
    gen_tps = number(pairs.get("gen throughput (token/s)"))
    if gen_tps is None:
        return None
    return DecodeStats(
        gen_tps=gen_tps,
        line=line,
        accept_len=number(pairs.get("accept len")),
        accept_rate=number(pairs.get("accept rate")),
        running=integer(pairs.get("#running-req")),
        queued=integer(pairs.get("#queue-req")),
        token_usage=_token_usage(pairs),
        cuda_graph=_graph(pairs),
        timestamp=timestamp,
    )


def sglang_prefill(text: str, line: LogLine, timestamp: str | None) -> PrefillStats | None:
    """An SGLang ``Prefill batch`` line's fields; None when even ``#new-token`` cannot be read."""
    pairs = fields(text)
    new_tokens = integer(pairs.get("#new-token"))
    if new_tokens is None:
        return None
    return PrefillStats(
        input_tps=number(pairs.get("input throughput (token/s)")),
        line=line,
        new_seqs=integer(pairs.get("#new-seq")),
        new_tokens=new_tokens,
        cached_tokens=integer(pairs.get("#cached-token")),
        running=integer(pairs.get("#running-req")),
        queued=integer(pairs.get("#queue-req")),
        token_usage=_token_usage(pairs),
        cuda_graph=_graph(pairs),
        timestamp=timestamp,
    )


def sglang_capacity(match: re.Match[str], line: LogLine) -> ServerCapacity:
    """The scheduler's ``max_total_num_tokens=..., available_gpu_mem=F GB`` line (patterns.SGLANG_CAPACITY)."""
    return ServerCapacity(
        max_total_tokens=int(match.group("max_total_tokens")),
        line=line,
        max_running_requests=integer(match.group("max_running_requests")),
        context_len=integer(match.group("context_len")),
        chunked_prefill_size=integer(match.group("chunked_prefill_size")),
        max_prefill_tokens=integer(match.group("max_prefill_tokens")),
        available_gib=number(match.group("available_gib")),
    )


def vllm_throughput(text: str, line: LogLine, timestamp: str | None) -> DecodeStats | None:
    """A vLLM ``Avg prompt throughput: ...`` line; None without the generation throughput."""
    pairs = fields(text)
    gen_tps = number(pairs.get("Avg generation throughput"))
    if gen_tps is None:
        return None
    usage = next((value for key, value in pairs.items() if key.endswith("KV cache usage")), None)
    usage_pct = number(usage)
    waiting = pairs.get("Waiting", pairs.get("Pending"))
    return DecodeStats(
        gen_tps=gen_tps,
        line=line,
        running=integer(pairs.get("Running")),
        queued=integer(waiting),
        token_usage=usage_pct / 100.0 if usage_pct is not None else None,
        timestamp=timestamp,
    )


def vllm_spec_v1(text: str, line: LogLine, timestamp: str | None) -> SpecDecodeStats | None:
    """A vLLM V1 ``SpecDecoding metrics: ...`` line; None without the accepted and drafted counts."""
    pairs = fields(text)
    accepted = integer(pairs.get("Accepted"))
    drafted = integer(pairs.get("Drafted"))
    if accepted is None or drafted is None:
        return None
    rate = number(pairs.get("Avg Draft acceptance rate"))
    return SpecDecodeStats(
        mean_accept_len=number(pairs.get("Mean acceptance length")),
        accepted=accepted,
        drafted=drafted,
        line=line,
        accept_rate=rate / 100.0 if rate is not None else None,
        timestamp=timestamp,
    )


def vllm_spec_v0(match: re.Match[str], line: LogLine, timestamp: str | None) -> SpecDecodeStats:
    """V0 prints no mean acceptance length; derive it: emitted tokens per verify step, steps = drafts / k."""
    k, drafted, emitted = int(match.group("k")), int(match.group("draft")), int(match.group("emitted"))
    mean = emitted * k / drafted if drafted > 0 and k > 0 else None
    return SpecDecodeStats(
        mean_accept_len=mean,
        accepted=int(match.group("acc")),
        drafted=drafted,
        line=line,
        accept_rate=number(match.group("rate")),
        timestamp=timestamp,
    )
