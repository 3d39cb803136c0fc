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


@dataclass(frozen=True)
class Figures:
    """One candidate at one shape: the launch means of stream/total tok/s, J/token, TTFT/TPOT p95, constraints
    broken (as reported: rounded as the JSON has them)."""

    stream_tok_s: float | None
    total_tok_s: float | None
    j_per_token: float | None
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    over: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"stream_tok_s": self.stream_tok_s, "total_tok_s": self.total_tok_s, "j_per_token": self.j_per_token,
                "ttft_p95_ms": self.ttft_p95_ms, "tpot_p95_ms": self.tpot_p95_ms, "over": list(self.over)}

    def axis(self, key: str) -> float | None:
        """A plot axis by its JSON name ("total_tok_s" or "j_per_token")."""
        return self.total_tok_s if key == "total_tok_s" else self.j_per_token


def _figures(setup: RaceSetup, launches: Sequence[LaunchDone]) -> dict[tuple[int, int], Figures]:
    """Per (candidate, shape): the launch means of stream/total tok/s, J/token, TTFT/TPOT p95, constraint breaks."""
    got: dict[tuple[int, int], list[Any]] = {}
    for ln in launches:
        for t in ln.trials:
            got.setdefault((ln.candidate, t.shape), []).append(t)
    out = {}
    for key, trials in got.items():
        def m(attr: str, digits: int) -> float | None:
            return _r(_mean([getattr(t, attr) for t in trials]), digits)  # noqa: B023 (called in this loop only)

        out[key] = Figures(m("stream_tok_s", 3), m("total_tok_s", 3), m("j_per_token", 6), m("ttft_p95_ms", 1),
                           m("tpot_p95_ms", 2), tuple(sorted({t.over for t in trials if t.over})))
    return out


@dataclass(frozen=True)
class BoardRow:
    """One candidate on one shape's leaderboard: its launches, mean and 95% interval (as the objective reports
    them), state, why out, ratio to the front, and its figures (None: no launch measured it at this shape)."""

    candidate: str
    launches: int
    mean: float | None
    ci95: tuple[float, float] | None
    alive: bool
    why_out: str
    state: str
    vs_front: float | None
    figures: Figures | None = None

    def to_json(self) -> dict[str, Any]:
        data = {"candidate": self.candidate, "launches": self.launches, "mean": self.mean,
                "ci95": None if self.ci95 is None else list(self.ci95), "alive": self.alive, "why_out": self.why_out,
                "state": self.state, "vs_front": self.vs_front}
        return data | self.figures.to_json() if self.figures is not None else data


@dataclass(frozen=True)
class ShapeResult:
    """One shape's leaderboard: the shape, the leader (None while unresolved), the provisional front, the tie,
    who is still open, the verdict in words, and the rows best first."""

    shape: str  # its label
    concurrency: int
    input_len: int
    output_len: int
    requests: int
    leader: str | None
    front: str | None
    tied: tuple[str, ...]
    open: tuple[str, ...]
    verdict: str
    rows: tuple[BoardRow, ...]

    def short_verdict(self, tie_pct: float) -> str:
        """The outcome in a few words, for the history's one line: the winner, the tie, or who is ahead."""
        if self.leader is None:
            return f"{self.front} ahead, not separated" if self.front else "no value"
        if self.tied:
            return f"{len(self.tied)} within {tie_pct:g}% ({self.leader} first)"
        return str(self.leader)

    def to_json(self) -> dict[str, Any]:
        return {"shape": self.shape, "concurrency": self.concurrency, "input_len": self.input_len,
                "output_len": self.output_len, "requests": self.requests, "leader": self.leader, "front": self.front,
                "tied": list(self.tied), "open": list(self.open), "verdict": self.verdict,
                "rows": [r.to_json() for r in self.rows]}


@dataclass(frozen=True)
class CandidateResult:
    """One candidate over the run: where it came from, its overrides of the profile, launches counted, alive or
    why out."""

    label: str
    source: str
    overrides: str
    launches: int
    alive: bool
    why_out: str

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "source": self.source, "overrides": self.overrides, "launches": self.launches,
                "alive": self.alive, "why_out": self.why_out}


@dataclass(frozen=True)
class LaunchCount:
    """The launches spent (failed, re-done after an interruption) against the budget and the grids."""

    spent: int
    failed: int
    redone_partial: int
    budget: int | None
    grid_one_launch: int
    grid_two_launch: int
    vs_two_launch_grid: float | None

    def to_json(self) -> dict[str, Any]:
        return {"spent": self.spent, "failed": self.failed, "redone_partial": self.redone_partial,
                "budget": self.budget, "grid_one_launch": self.grid_one_launch,
                "grid_two_launch": self.grid_two_launch, "vs_two_launch_grid": self.vs_two_launch_grid}


@dataclass(frozen=True)
class ShapeLoss:
    """What the best single config gives up at one shape: its ratio to that shape's best, and who is best."""

    shape: str
    vs_best: float
    loss_pct: float
    best: str | None

    def to_json(self) -> dict[str, Any]:
        return {"shape": self.shape, "vs_best": self.vs_best, "loss_pct": self.loss_pct, "best": self.best}


@dataclass(frozen=True)
class BestSingle:
    """The config best across shapes (geometric mean of its ratios to each shape's best) and its losses."""

    candidate: str
    score: float
    loses: tuple[ShapeLoss, ...]

    def to_json(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "score": self.score, "loses": [x.to_json() for x in self.loses]}


@dataclass(frozen=True)
class ParetoPoint:
    """One (candidate, shape) with its figures: a point of both Pareto plots."""

    candidate: str
    shape: str
    figures: Figures

    def to_json(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "shape": self.shape, **self.figures.to_json()}


@dataclass(frozen=True)
class ParetoFront:
    """One Pareto plot: its axes in words and the points on the front (indices into the points, by x)."""

    x: str
    y: str
    front: tuple[int, ...]
    note: str | None = None  # why it has no points (the energy plot only; None: no note in the JSON)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"x": self.x, "y": self.y, "front": list(self.front)}
        if self.note is not None:
            data["note"] = self.note
        return data


@dataclass(frozen=True)
class ParetoFronts:
    """Every (candidate, shape) point and the two fronts: per stream vs total tok/s, per stream vs J/token."""

    points: tuple[ParetoPoint, ...]
    stream_vs_total: ParetoFront
    stream_vs_j_per_token: ParetoFront

    def to_json(self) -> dict[str, Any]:
        return {"points": [p.to_json() for p in self.points], "stream_vs_total": self.stream_vs_total.to_json(),
                "stream_vs_j_per_token": self.stream_vs_j_per_token.to_json()}


@dataclass(frozen=True)
class TuneResults:
    """A tune run's results (module docstring), live or stored; `to_json` is the one place they become JSON."""

    run_id: int | None
    status: str
    objective: str
    metric: str
    candidates: tuple[CandidateResult, ...]
    launches: LaunchCount
    done: bool
    why_done: str
    shapes: tuple[ShapeResult, ...]
    best_single: BestSingle | None
    pareto: ParetoFronts
    verdict: str
    ended_on: str = ""
    note: str = ""
    unit: str = "launch"

    @property
    def out(self) -> tuple[CandidateResult, ...]:
        """The eliminated candidates."""
        return tuple(c for c in self.candidates if not c.alive)

    def to_json(self) -> dict[str, Any]:
        """The results JSON: the same keys, in the same order, as every tunedash has written."""
        data: dict[str, Any] = {
            "run_id": self.run_id, "kind": "tune", "status": self.status, "objective": self.objective,
            "metric": self.metric, "unit": self.unit, "candidates": [c.to_json() for c in self.candidates],
            "launches": self.launches.to_json(), "done": self.done, "why_done": self.why_done,
            "shapes": [s.to_json() for s in self.shapes],
            "best_single": None if self.best_single is None else self.best_single.to_json(),
            "pareto": self.pareto.to_json(), "verdict": self.verdict, "ended_on": self.ended_on,
        }
        if self.note:
            data["note"] = self.note
        return data


def shown_value(objective: str, raced: float | None) -> float | None:
    """A raced value as the objective reports it (tokens/J back to J/token)."""
    if raced is None:
        return None
    return 1.0 / raced if objective == "j_per_token" and raced > 0 else raced


def _interval(objective: str, ci: tuple[float, float] | None) -> tuple[float, float] | None:
    if ci is None:
        return None
    low, high = shown_value(objective, ci[0]), shown_value(objective, ci[1])
    if low is None or high is None:
        return None
    a, b = sorted([round(low, 6), round(high, 6)])
    return a, b


def board_verdict(board: ShapeBoard, tie_pct: float) -> str:
    if board.front is None:
        return "no value: no candidate measured this shape"
    if board.leader is None:
        front = f"; ahead so far: {board.front}" if board.front else ""
        return f"not separated ({len(board.open)} still open){front}"
    if board.tied:
        return f"these {len(board.tied)} are within {tie_pct:g}% of each other: {', '.join(board.tied)}"
    return f"winner: {board.leader}"


def _best_single(setup: RaceSetup, boards: Sequence[ShapeBoard], alive: set[str]) -> BestSingle | None:
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
    return BestSingle(name, round(score, 4), tuple(
        ShapeLoss(b.shape, round(x, 4), round((1 - x) * 100, 2),
                  next((r.candidate for r in b.rows if r.mean is not None and r.candidate in alive), None))
        for b, x in zip(boards, ratios, strict=True)))


def pareto_front(points: Sequence[tuple[float, float]], *, x_higher: bool = True, y_higher: bool = True) -> list[int]:
    """Indices of the points no other point beats on both axes (ties kept), sorted by x."""
    def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
        ax, ay = (a[0] if x_higher else -a[0]), (a[1] if y_higher else -a[1])
        bx, by = (b[0] if x_higher else -b[0]), (b[1] if y_higher else -b[1])
        return ax >= bx and ay >= by and (ax > bx or ay > by)

    front = [i for i, p in enumerate(points) if not any(better(q, p) for j, q in enumerate(points) if j != i)]
    return sorted(front, key=lambda i: points[i][0])


def _pareto(setup: RaceSetup, figures: dict[tuple[int, int], Figures]) -> ParetoFronts:
    names = [c.label for c in setup.candidates]
    rows = tuple(ParetoPoint(names[c], setup.shapes[s].label, f) for (c, s), f in sorted(figures.items()))
    total = [(i, (r.figures.stream_tok_s, r.figures.total_tok_s)) for i, r in enumerate(rows)
             if r.figures.stream_tok_s is not None and r.figures.total_tok_s is not None]
    energy = [(i, (r.figures.stream_tok_s, r.figures.j_per_token)) for i, r in enumerate(rows)
              if r.figures.stream_tok_s is not None and r.figures.j_per_token is not None]
    front_total = tuple(total[k][0] for k in pareto_front([p for _, p in total]))
    front_energy = tuple(energy[k][0] for k in pareto_front([p for _, p in energy], y_higher=False))
    return ParetoFronts(rows, ParetoFront("output tok/s per stream", "total output tok/s", front_total),
                        ParetoFront("output tok/s per stream", "J per output token (lower is better)", front_energy,
                                    "" if energy else "energy not measured in this run"))


def tune_results(spec: TuneSpec | RaceSetup, state: TuneState, decision: Decision, *, status: str,
                 run_id: int | None, note: str = "", ended_on: str = "") -> TuneResults:
    """The results of a race so far (module docstring); `.to_json()` where they leave the process."""
    setup = spec if isinstance(spec, RaceSetup) else RaceSetup.of(spec)
    objective = setup.objective
    names = [c.label for c in setup.candidates]
    counted = [ln for ln in state.launches if ln.outcome != "partial"]
    figures = _figures(setup, counted)
    alive = {n for n in names if n not in decision.eliminated}
    shapes = []
    for s, board in enumerate(decision.boards):
        rows = tuple(BoardRow(row.candidate, row.launches, _r(shown_value(objective, row.mean), 6),
                              _interval(objective, row.ci), row.alive, row.why_out, row.state, _r(row.vs_front),
                              figures.get((names.index(row.candidate), s))) for row in board.rows)
        shape = setup.shapes[s]
        shapes.append(ShapeResult(board.shape, shape.concurrency, shape.input_len, shape.output_len, shape.requests,
                                  board.leader, board.front, tuple(board.tied), tuple(board.open),
                                  board_verdict(board, setup.rule.tie_pct), rows))
    n = len(names)
    failed = sum(1 for ln in counted if ln.outcome != "ready")
    return TuneResults(
        run_id=run_id, status=status, objective=objective, metric=OBJECTIVE_TEXT.get(objective, objective),
        candidates=tuple(CandidateResult(c.label, c.source, c.overrides(setup.base_flags),
                                         sum(1 for ln in counted if ln.candidate == i), c.label in alive,
                                         decision.eliminated.get(c.label, ""))
                         for i, c in enumerate(setup.candidates)),
        launches=LaunchCount(len(counted), failed, state.partial, setup.rule.max_launches, n, 2 * n,
                             round(len(counted) / (2 * n), 3) if n else None),
        done=decision.done, why_done=decision.why_done, shapes=tuple(shapes),
        best_single=_best_single(setup, decision.boards, alive), pareto=_pareto(setup, figures),
        verdict="; ".join(f"{b.shape}: {b.short_verdict(setup.rule.tie_pct)}" for b in shapes),
        ended_on=ended_on, note=note)


def run_results(run: RunRow) -> TuneResults:
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
