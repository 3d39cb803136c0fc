"""A tune run's results as data: per shape the leaderboard with intervals and the winner (or the tie), the best
single config across shapes and what it loses at each, and the Pareto fronts (tok/s per stream against total tok/s,
and against J/token). The same JSON for a live run (`tune --json`), the stored summary and `export`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.measure.store import RunRow
from app.core.profiles.types import TuneShape
from app.core.tune.model import OBJECTIVE_TEXT, LaunchDone, TuneSpec, TuneState, race_value, state_from_run
from app.core.tune.race import Decision, RaceRule, ShapeBoard, decide
from app.core.tune.space import Candidate


@dataclass(frozen=True)
class RaceSetup:
    """What the results need of a tune run (a live TuneSpec's, or a stored run's params)."""

    candidates: tuple[Candidate, ...]
    shapes: tuple[TuneShape, ...]
    objective: str
    rule: RaceRule
    base_flags: dict[str, Any]

    @classmethod
    def of(cls, spec: TuneSpec) -> RaceSetup:
        return cls(spec.candidates, spec.shapes, spec.settings.objective, spec.rule(), dict(spec.profile.flags))

    @classmethod
    def from_run(cls, run: RunRow) -> RaceSetup:
        """From a stored tune run: the arms are the candidates, the params hold shapes, objective and rule."""
        params = run.params
        sources = {c.get("label"): c for c in params.get("candidates", []) if isinstance(c, dict)}
        candidates = tuple(Candidate(a.label, dict(a.flags), str(sources.get(a.label, {}).get("source", "space")))
                           for a in run.arms)
        shapes = tuple(TuneShape(int(s["concurrency"]), int(s["input_len"]), int(s["output_len"]),
                                 int(s["requests"])) for s in params.get("shapes", []))
        rule = params.get("rule", {})
        return cls(candidates, shapes, str(params.get("objective", "stream_tok_s")),
                   RaceRule(confidence=float(rule.get("confidence", 0.95)), tie_pct=float(rule.get("tie_pct", 2.0)),
                            max_launches=rule.get("max_launches"), min_launches=int(rule.get("min_launches", 1))),
                   dict(run.arms[0].flags) if run.arms else {})


def _mean(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.fmean(got) if got else None


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _figures(setup: RaceSetup, launches: Sequence[LaunchDone]) -> dict[tuple[int, int], dict[str, Any]]:
    """Per (candidate, shape): the launch means of stream/total tok/s, J/token, TTFT/TPOT p95, constraint breaks."""
    got: dict[tuple[int, int], list[Any]] = {}
    for ln in launches:
        for t in ln.trials:
            got.setdefault((ln.candidate, t.shape), []).append(t)
    out = {}
    for key, trials in got.items():
        out[key] = {"stream_tok_s": _r(_mean([t.stream_tok_s for t in trials]), 3),
                    "total_tok_s": _r(_mean([t.total_tok_s for t in trials]), 3),
                    "j_per_token": _r(_mean([t.j_per_token for t in trials]), 6),
                    "ttft_p95_ms": _r(_mean([t.ttft_p95_ms for t in trials]), 1),
                    "tpot_p95_ms": _r(_mean([t.tpot_p95_ms for t in trials]), 2),
                    "over": sorted({t.over for t in trials if t.over})}
    return out


def shown_value(objective: str, raced: float | None) -> float | None:
    """A raced value as the objective reports it (tokens/J back to J/token)."""
    if raced is None:
        return None
    return 1.0 / raced if objective == "j_per_token" and raced > 0 else raced


def _interval(objective: str, ci: tuple[float, float] | None) -> list[float] | None:
    if ci is None:
        return None
    low, high = shown_value(objective, ci[0]), shown_value(objective, ci[1])
    if low is None or high is None:
        return None
    return sorted([round(low, 6), round(high, 6)])


def board_verdict(board: ShapeBoard, tie_pct: float) -> str:
    if board.front is None:
        return "no value: no candidate measured this shape"
    if board.leader is None:
        front = f"; ahead so far: {board.front}" if board.front else ""
        return f"not separated ({len(board.open)} still open){front}"
    if board.tied:
        return f"these {len(board.tied)} are within {tie_pct:g}% of each other: {', '.join(board.tied)}"
    return f"winner: {board.leader}"


def _best_single(setup: RaceSetup, boards: Sequence[ShapeBoard], alive: set[str]) -> dict[str, Any] | None:
    """The config best across shapes: the highest geometric mean of its ratio to each shape's best (raced values),
    among alive candidates with a value at every shape; and what it loses at each shape."""
    means: dict[str, list[float | None]] = {}
    for board in boards:
        for row in board.rows:
            means.setdefault(row.candidate, []).append(row.mean)
    best_at = [max((r.mean for r in b.rows if r.mean is not None and r.candidate in alive), default=None)
               for b in boards]
    scored = []
    for name, values in means.items():
        if name not in alive or any(v is None for v in values) or any(b is None for b in best_at):
            continue
        ratios = [v / b for v, b in zip(values, best_at, strict=True) if v is not None and b]
        scored.append((math.exp(statistics.fmean(math.log(x) for x in ratios)), name, ratios))
    if not scored:
        return None
    score, name, ratios = max(scored, key=lambda x: x[0])
    return {"candidate": name, "score": round(score, 4),
            "loses": [{"shape": b.shape, "vs_best": round(x, 4), "loss_pct": round((1 - x) * 100, 2),
                       "best": next((r.candidate for r in b.rows if r.mean is not None and r.candidate in alive),
                                    None)} for b, x in zip(boards, ratios, strict=True)]}


def pareto_front(points: Sequence[tuple[float, float]], *, x_higher: bool = True, y_higher: bool = True) -> list[int]:
    """Indices of the points no other point beats on both axes (ties kept), sorted by x."""
    def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
        ax, ay = (a[0] if x_higher else -a[0]), (a[1] if y_higher else -a[1])
        bx, by = (b[0] if x_higher else -b[0]), (b[1] if y_higher else -b[1])
        return ax >= bx and ay >= by and (ax > bx or ay > by)

    front = [i for i, p in enumerate(points) if not any(better(q, p) for j, q in enumerate(points) if j != i)]
    return sorted(front, key=lambda i: points[i][0])


def _pareto(setup: RaceSetup, figures: dict[tuple[int, int], dict[str, Any]]) -> dict[str, Any]:
    names = [c.label for c in setup.candidates]
    rows = [{"candidate": names[c], "shape": setup.shapes[s].label, **f} for (c, s), f in sorted(figures.items())]
    total = [(i, (r["stream_tok_s"], r["total_tok_s"])) for i, r in enumerate(rows)
             if r["stream_tok_s"] is not None and r["total_tok_s"] is not None]
    energy = [(i, (r["stream_tok_s"], r["j_per_token"])) for i, r in enumerate(rows)
              if r["stream_tok_s"] is not None and r["j_per_token"] is not None]
    front_total = [total[k][0] for k in pareto_front([p for _, p in total])]
    front_energy = [energy[k][0] for k in pareto_front([p for _, p in energy], y_higher=False)]
    return {"points": rows,
            "stream_vs_total": {"x": "output tok/s per stream", "y": "total output tok/s", "front": front_total},
            "stream_vs_j_per_token": {"x": "output tok/s per stream", "y": "J per output token (lower is better)",
                                      "front": front_energy,
                                      "note": "" if energy else "energy not measured in this run"}}


def tune_results(spec: TuneSpec | RaceSetup, state: TuneState, decision: Decision, *, status: str,
                 run_id: int | None, note: str = "", ended_on: str = "") -> dict[str, Any]:
    """The results JSON (module docstring)."""
    setup = spec if isinstance(spec, RaceSetup) else RaceSetup.of(spec)
    objective = setup.objective
    names = [c.label for c in setup.candidates]
    counted = [ln for ln in state.launches if ln.outcome != "partial"]
    figures = _figures(setup, counted)
    alive = {n for n in names if n not in decision.eliminated}
    shapes_out = []
    for s, board in enumerate(decision.boards):
        rows = []
        for row in board.rows:
            c = names.index(row.candidate)
            fig = figures.get((c, s), {})
            rows.append({"candidate": row.candidate, "launches": row.launches,
                         "mean": _r(shown_value(objective, row.mean), 6), "ci95": _interval(objective, row.ci),
                         "alive": row.alive, "why_out": row.why_out, "state": row.state,
                         "vs_front": _r(row.vs_front), **fig})
        shapes_out.append({"shape": board.shape, **_shape_json(setup.shapes[s]), "leader": board.leader,
                           "front": board.front, "tied": list(board.tied), "open": list(board.open),
                           "verdict": board_verdict(board, setup.rule.tie_pct), "rows": rows})
    best = _best_single(setup, decision.boards, alive)
    n = len(names)
    verdict = "; ".join(f"{b['shape']}: {_short_verdict(b, setup.rule.tie_pct)}" for b in shapes_out)
    failed = sum(1 for ln in counted if ln.outcome != "ready")
    data: dict[str, Any] = {
        "run_id": run_id, "kind": "tune", "status": status, "objective": objective,
        "metric": OBJECTIVE_TEXT.get(objective, objective), "unit": "launch",
        "candidates": [{"label": c.label, "source": c.source, "overrides": c.overrides(setup.base_flags),
                        "launches": sum(1 for ln in counted if ln.candidate == i),
                        "alive": c.label in alive, "why_out": decision.eliminated.get(c.label, "")}
                       for i, c in enumerate(setup.candidates)],
        "launches": {"spent": len(counted), "failed": failed, "redone_partial": state.partial,
                     "budget": setup.rule.max_launches, "grid_one_launch": n, "grid_two_launch": 2 * n,
                     "vs_two_launch_grid": round(len(counted) / (2 * n), 3) if n else None},
        "done": decision.done, "why_done": decision.why_done,
        "shapes": shapes_out, "best_single": best, "pareto": _pareto(setup, figures),
        "verdict": verdict, "ended_on": ended_on,
    }
    if note:
        data["note"] = note
    return data


def _short_verdict(board: dict[str, Any], tie_pct: float) -> str:
    """A shape's outcome in a few words, for the history's one line: the winner, the tie, or who is ahead."""
    if board["leader"] is None:
        return f"{board['front']} ahead, not separated" if board["front"] else "no value"
    if board["tied"]:
        return f"{len(board['tied'])} within {tie_pct:g}% ({board['leader']} first)"
    return str(board["leader"])


def _shape_json(shape: TuneShape) -> dict[str, int]:
    return {"concurrency": shape.concurrency, "input_len": shape.input_len, "output_len": shape.output_len,
            "requests": shape.requests}


def run_results(run: RunRow) -> dict[str, Any]:
    """The results of a stored tune run, recomputed from its launches and trials (an interrupted run has no
    summary; a finished one gives the same figures as its summary)."""
    setup = RaceSetup.from_run(run)
    state = state_from_run(run, len(setup.shapes))
    names = [c.label for c in setup.candidates]
    shapes = [s.label for s in setup.shapes]
    from app.core.tune.race import Obs

    obs = []
    for ln in state.launches:
        if ln.outcome == "partial":
            continue
        by_shape = {t.shape: t for t in ln.trials}
        for s, shape in enumerate(shapes):
            value = race_value(setup.objective, by_shape[s]) if s in by_shape else None
            obs.append(Obs(names[ln.candidate], shape, ln.launch, () if value is None else (value,), ln.slot))
    decision = decide(names, shapes, obs, setup.rule)
    stored = run.summary or {}
    return tune_results(setup, state, decision, status=run.shown_status, run_id=run.id, note=run.note or "",
                        ended_on=str(stored.get("ended_on", "")))
