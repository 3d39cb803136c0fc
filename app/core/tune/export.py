"""A tune run's results (app.core.tune.results.TuneResults) as text for the terminal (with a run on slots' lines),
Markdown, CSV (one row per launch and shape) and an SVG of the leaderboards' winners and both Pareto fronts (plain
SVG, no UI toolkit)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from app.core.measure.report import markdown_table, text_table
from app.core.measure.store import RunRow

if TYPE_CHECKING:
    from app.core.tune.results import ParetoFront, ParetoPoint, ShapeResult, TuneResults


def _num(x: Any, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _digits(objective: str) -> int:
    return 4 if objective in ("j_per_token", "goodput") else 1


def _ci(ci: Sequence[float] | None, digits: int) -> str:
    return "n/a" if not ci else f"{ci[0]:.{digits}f}-{ci[1]:.{digits}f}"


def board_rows(data: TuneResults, shape: ShapeResult) -> list[list[str]]:
    d = _digits(data.objective)
    rows = [["#", "candidate", "launches", data.metric, "95% CI", "per stream", "total tok/s", "TTFT p95 ms",
             "state"]]
    for i, r in enumerate(shape.rows, start=1):
        state = r.state if r.alive else "out"
        fig = r.figures
        if fig is not None and fig.over:
            state += " (" + "; ".join(fig.over) + ")"
        rows.append([str(i), r.candidate, str(r.launches), _num(r.mean, d), _ci(r.ci95, d),
                     _num(fig and fig.stream_tok_s), _num(fig and fig.total_tok_s), _num(fig and fig.ttft_p95_ms, 0),
                     state])
    return rows


def summary_lines(data: TuneResults) -> list[str]:
    ln = data.launches
    lines = [f"launches: {ln.spent} spent ({ln.failed} failed to start"
             + (f", {ln.redone_partial} re-done after an interruption" if ln.redone_partial else "")
             + f"); a one-launch grid takes {ln.grid_one_launch}, a two-launch grid {ln.grid_two_launch}"
             + (f" ({ln.vs_two_launch_grid * 100:.0f}% of it)" if ln.vs_two_launch_grid is not None else "")
             + (f"; budget {ln.budget}" if ln.budget else "")]
    lines.append(f"stopped: {data.why_done}" if data.done else f"status: {data.status}")
    best = data.best_single
    if best:
        losses = ", ".join(f"{x.shape} -{x.loss_pct:.1f}%" if x.loss_pct > 0.05 else f"{x.shape} best"
                           for x in best.loses)
        lines.append(f"best single config across shapes: {best.candidate} ({losses})")
    return lines


def out_lines(data: TuneResults) -> list[str]:
    return [f"  {c.label}: {c.why_out}" for c in data.out]


def _fronts(data: TuneResults) -> tuple[tuple[ParetoFront, str], tuple[ParetoFront, str]]:
    """Both fronts with the figure their y axis is."""
    return (data.pareto.stream_vs_total, "total_tok_s"), (data.pareto.stream_vs_j_per_token, "j_per_token")


def pareto_lines(data: TuneResults) -> list[str]:
    points = data.pareto.points
    lines = []
    for front, yk in _fronts(data):
        if not front.front:
            lines.append(f"Pareto ({front.x} vs {front.y}): {front.note or 'no points'}")
            continue
        items = ", ".join(f"{points[i].candidate} @ {points[i].shape} ({points[i].figures.stream_tok_s or 0:.1f}, "
                          f"{points[i].figures.axis(yk) or 0:.4g})" for i in front.front)
        lines.append(f"Pareto front ({front.x} vs {front.y}): {items}")
    return lines


def slot_lines(slots: dict[str, Any]) -> list[str]:
    """A run on slots (TuneRunner.slots_json): the A/A across the slots, then a line per slot with its launches and
    its estimated factor."""
    lines = ["slots: " + (slots["aa"] or "one slot measured so far: no slot effect")]
    for row in slots["slots"]:
        factor = "" if row["factor"] is None else f", factor {row['factor']:.3f}" + (
            f" ({row['ci'][0]:.3f}-{row['ci'][1]:.3f})" if row["ci"] else "")
        lines.append(f"  slot {row['index']} (GPUs {','.join(map(str, row['gpus']))}, port {row['port']}): "
                     f"{row['launches']} launches{factor}")
    return lines


def results_text(data: TuneResults) -> str:
    out = [f"tune run #{data.run_id} ({data.status}), ranked by {data.metric}; the launch is the unit"]
    for shape in data.shapes:
        out.append("")
        out.append(f"{shape.shape} (concurrency {shape.concurrency}, {shape.input_len} in / "
                   f"{shape.output_len} out, {shape.requests} requests): {shape.verdict}")
        out.append(text_table(board_rows(data, shape)))
    out.append("")
    out.extend(summary_lines(data))
    if data.out:
        out.append("eliminated:")
        out.extend(out_lines(data))
    out.extend(pareto_lines(data))
    if data.ended_on:
        out.append(f"the server runs {data.ended_on}")
    return "\n".join(out)


def results_markdown(data: TuneResults) -> str:
    out = [f"## tune run #{data.run_id} ({data.status})", "",
           f"Ranked by {data.metric}; the launch is the unit of the intervals.", ""]
    for shape in data.shapes:
        out += [f"### {shape.shape}", "", f"**{shape.verdict}**", "", markdown_table(board_rows(data, shape)), ""]
    out += [f"- {line}" for line in summary_lines(data)]
    if data.out:
        out += ["", "Eliminated:", ""] + [f"- {c.label}: {c.why_out}" for c in data.out]
    out += ["", *[f"- {line}" for line in pareto_lines(data)]]
    if data.ended_on:
        out += ["", f"The server runs {data.ended_on}."]
    out += ["", "Candidates:", "", markdown_table([["candidate", "source", "overrides", "launches"]] + [
        [c.label, c.source, c.overrides or "(the profile as is)", str(c.launches)] for c in data.candidates])]
    return "\n".join(out) + "\n"


def results_csv(run: RunRow) -> str:
    """One row per stored trial (a shape of a launch), partial launches included (marked)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    names = {a.idx: a.label for a in run.arms}
    shapes = [s.get("label", "") for s in run.params.get("shapes", []) if isinstance(s, dict)]
    writer.writerow(["run_id", "candidate", "launch", "shape", "value", "stream_tok_s", "total_tok_s", "j_per_token",
                     "ttft_p95_ms", "tpot_p95_ms", "errors", "over"])
    for t in run.trials:
        tune = t.summary.get("tune") if isinstance(t.summary, dict) else None
        tune = tune if isinstance(tune, dict) else {}
        writer.writerow([run.id, names.get(t.arm_idx, t.arm_idx), t.launch_idx,
                         shapes[t.trial_idx] if 0 <= t.trial_idx < len(shapes) else t.trial_idx, t.value,
                         tune.get("stream_tok_s"), tune.get("total_tok_s"), tune.get("j_per_token"),
                         tune.get("ttft_p95_ms"), tune.get("tpot_p95_ms"), tune.get("errors"), tune.get("over")])
    return buf.getvalue()


def _plot(points: Sequence[ParetoPoint], front: Sequence[int], yk: str, title: str, x0: int, y0: int, w: int,
          h: int) -> list[str]:
    got = [(i, x, y) for i, p in enumerate(points)
           if (x := p.figures.stream_tok_s) is not None and (y := p.figures.axis(yk)) is not None]
    parts = [f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#888"/>',
             f'<text x="{x0 + 4}" y="{y0 - 6}" font-size="13">{escape(title)}</text>']
    if not got:
        parts.append(f'<text x="{x0 + 10}" y="{y0 + h // 2}" font-size="12">no points</text>')
        return parts
    xs = [x for _, x, _ in got]
    ys = [y for _, _, y in got]
    xl, xh = min(xs), max(xs)
    yl, yh = min(ys), max(ys)

    def px(x: float) -> float:
        return x0 + 30 + (x - xl) / ((xh - xl) or 1) * (w - 60)

    def py(y: float) -> float:
        return y0 + h - 30 - (y - yl) / ((yh - yl) or 1) * (h - 60)

    at = {i: (x, y) for i, x, y in got}
    line = " ".join(f"{px(at[i][0]):.1f},{py(at[i][1]):.1f}" for i in front if i in at)
    if line:
        parts.append(f'<polyline points="{line}" fill="none" stroke="#d33" stroke-width="2"/>')
    for i, x, y in got:
        on = i in front
        p = points[i]
        parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{5 if on else 3}" '
                     f'fill="{"#d33" if on else "#58a"}"><title>{escape(p.candidate)} @ {escape(p.shape)}: '
                     f'{x:.1f}, {y:.4g}</title></circle>')
    parts.append(f'<text x="{x0 + 30}" y="{y0 + h - 8}" font-size="11">per stream {xl:.1f}-{xh:.1f} tok/s</text>')
    parts.append(f'<text x="{x0 + 4}" y="{y0 + 14}" font-size="11">{escape(yk)} {yl:.4g}-{yh:.4g}</text>')
    return parts


def results_svg(data: TuneResults) -> str:
    """The verdict per shape, the best single config, and both Pareto plots, as one SVG."""
    width = 960
    lines = [f"tune run #{data.run_id} ({data.status}), {data.metric}"]
    lines += [f"{s.shape}: {s.verdict}" for s in data.shapes]
    lines += summary_lines(data)
    height = 40 + 18 * len(lines) + 340
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="monospace"><rect width="100%" height="100%" fill="#fff"/>']
    for i, text in enumerate(lines):
        parts.append(f'<text x="12" y="{24 + 18 * i}" font-size="{14 if i == 0 else 12}">{escape(text)}</text>')
    top = 40 + 18 * len(lines) + 20
    pareto = data.pareto
    parts += _plot(pareto.points, pareto.stream_vs_total.front, "total_tok_s",
                   "Pareto: tok/s per stream vs total tok/s", 12, top, 460, 300)
    parts += _plot(pareto.points, pareto.stream_vs_j_per_token.front, "j_per_token",
                   "Pareto: tok/s per stream vs J/token", 488, top, 460, 300)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def export_tune(run: RunRow, fmt: str) -> str:
    """A stored tune run as md / csv / json / svg (results recomputed from the stored launches)."""
    from app.core.tune.results import run_results

    if fmt == "csv":
        return results_csv(run)
    data = run_results(run)
    if fmt == "json":
        return json.dumps(data.to_json(), indent=2) + "\n"
    if fmt == "svg":
        return results_svg(data)
    return results_markdown(data)
