"""The readable form of a LogSummary (`tunedash log FILE`): the startup phases as a table with seconds and GiB, the
weights and KV cache, the ready time, the decode tok/s, the notices and the fatal events.

The figures are the summary's own (app/core/logs/summary.py says where each comes from); nothing is computed here
but the layout. Log text (notices, fatal events) is shown with control characters replaced, so a log cannot move
the cursor or recolour the terminal. At most NOTICES_SHOWN notices are listed; `--json` has every one.
"""

from __future__ import annotations

from app.core.data import Phase
from app.core.logs.summary import LogSummary, PhaseTiming

NOTICES_SHOWN = 12
"""Notices listed in the table; the rest are counted (`tunedash log --json` lists all)."""


def _printable(text: str) -> str:
    return "".join(char if char.isprintable() else "\N{REPLACEMENT CHARACTER}" for char in text)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _phase_name(timing: PhaseTiming) -> str:
    return timing.phase.value + (f" ({timing.capture})" if timing.capture else "")


def _ready_line(summary: LogSummary) -> str:
    if not summary.ready:
        return "not ready: no ready line" + (" (fatal events below)" if summary.fatal else "")
    if summary.ready_seconds is None:
        return "ready (how long it took is unknown: the log's timestamps do not allow it)"
    return f"ready {summary.ready_seconds:.1f} s after the log's first timestamp"


def _phase_rows(summary: LogSummary) -> list[str]:
    if not summary.phases:
        return ["phases       none found"]
    names = [_phase_name(timing) for timing in summary.phases]
    width = max(len("phase"), *(len(name) for name in names))
    rows = [f"{'phase':<{width}}  {'seconds':>8}  {'GiB':>7}  from"]
    for name, timing in zip(names, summary.phases, strict=True):
        source = timing.source if timing.seconds is not None else "-"
        rows.append(f"{name:<{width}}  {_seconds(timing.seconds):>8}  {_gib(timing.gib):>7}  {source}")
    return rows


def _phase_gib(summary: LogSummary, phase: Phase) -> float | None:
    sizes = [timing.gib for timing in summary.phases if timing.phase == phase and timing.gib is not None]
    return sum(sizes) if sizes else None


def _memory_rows(summary: LogSummary) -> list[str]:
    weights = _phase_gib(summary, Phase.WEIGHTS)
    kv_gib = _phase_gib(summary, Phase.KV_CACHE)
    kv_parts = []
    if summary.kv_cache_tokens is not None:
        kv_parts.append(f"{summary.kv_cache_tokens:,} tokens")
    if kv_gib is not None:
        kv_parts.append(f"{kv_gib:.2f} GiB")
    rows = [
        f"weights      {'-' if weights is None else f'{weights:.2f} GiB'}",
        f"KV cache     {', '.join(kv_parts) or '-'}",
    ]
    cap = summary.capacity
    if cap is not None:
        parts = [f"max running requests {cap.max_running_requests}" if cap.max_running_requests is not None else "",
                 f"context {cap.context_len:,} tokens" if cap.context_len is not None else "",
                 f"{cap.available_gib:.2f} GiB left on the GPU" if cap.available_gib is not None else ""]
        rows.append(f"capacity     {', '.join(part for part in parts if part) or '-'}")
    return rows


def _decode_row(summary: LogSummary) -> str:
    lines = len(summary.tps_series)
    if not lines:
        return "decode       no throughput lines"
    busy = sum(1 for sample in summary.tps_series if sample.gen_tps > 0)
    mean = "-" if summary.mean_gen_tps is None else f"{summary.mean_gen_tps:.1f}"
    peak = "-" if summary.max_gen_tps is None else f"{summary.max_gen_tps:.1f}"
    text = (f"decode       mean {mean} tok/s, max {peak} tok/s over {lines} throughput line{'s' * (lines != 1)}"
            + (f" ({lines - busy} idle, left out of the mean)" if busy != lines else ""))
    if summary.mean_accept_len is not None:
        text += f"; accept len {summary.mean_accept_len:.2f}"
    return text


def _event_rows(title: str, events: list[tuple[int, str, str]], limit: int | None) -> list[str]:
    if not events:
        return [f"{title:<12} none"]
    rows = [f"{title:<12} {len(events)}"]
    shown = events if limit is None else events[:limit]
    width = max(len(kind) for _, kind, _ in shown)
    for number, kind, text in shown:
        rows.append(f"  line {number:<6} {kind:<{width}}  {_printable(text)}")
    if len(shown) < len(events):
        rows.append(f"  ... {len(events) - len(shown)} more (tunedash log --json lists every one)")
    return rows


def summary_table(summary: LogSummary, source: str) -> list[str]:
    """The lines `tunedash log FILE` prints for `summary` of the log at `source` (module docstring)."""
    backend = summary.backend or "unknown backend"
    lines = [f"{_printable(source)}: {backend} log, {_ready_line(summary)}", ""]
    lines += _phase_rows(summary)
    lines.append("")
    lines += _memory_rows(summary)
    lines.append(_decode_row(summary))
    lines += _event_rows("notices", [(n.line.number, n.kind, n.text) for n in summary.notices], NOTICES_SHOWN)
    lines += _event_rows("fatal", [(f.line.number, f.kind, f.text) for f in summary.fatal], None)
    return lines
