""""Slower than before?": the best recorded run of the same model, host and request shape, and its flag diff.

The history (app.core.measure.store) holds bench runs (one arm, "running"), A/B runs (one arm per
configuration) and tune runs (one arm per candidate, measured at each of the run's request shapes: the run counts
at every shape it measured, its candidates at that shape with their launches' mean total tok/s).
A reference is one arm of one finished run, ranked by output tok/s per stream (the run's
output tok/s over its concurrency) among runs of the same model and backend on the same host at the same
request shape. The diff against the running server's flags lists first the flags whose effect the history
measured (an A/B run whose arms differ in that flag: its B/A ratio and interval), then the known-impact flags,
then the rest.

Runs of the model at other request shapes are listed by shape with their counts (`RecordedHistory.shapes`), and
the nearest shape's best arm is offered as a note, never as a finding: tok/s at another concurrency or length is
not like for like. Nearest: the fewest doublings apart over concurrency, input and output length (|log2| of each
ratio, added up), a different endpoint, prompt file or ignore_eos counting as 3 doublings each; then the shape
with more runs, then the newer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.advisor.rules import Finding, PendingFlags
from app.core.data import FlagChange, FlagValue
from app.core.flags.values import format_value
from app.core.measure.store import HistoryStore, RunRow
from app.core.profiles.render import flag_diff

SHAPE_KEYS = ("concurrency", "input_len", "max_tokens", "endpoint", "prompt_file", "ignore_eos")
"""The request shape two runs must share to be compared (the number of requests and the seed may differ)."""

KNOWN_IMPACT = ("speculative-num-steps", "speculative-num-draft-tokens", "speculative-eagle-topk",
                "speculative-algorithm", "speculative-config.num_speculative_tokens",
                "enforce-piecewise-cuda-graph", "disable-piecewise-cuda-graph", "cuda-graph-backend-prefill",
                "cuda-graph-backend-decode", "disable-cuda-graph", "disable-prefill-cuda-graph",
                "disable-decode-cuda-graph", "cuda-graph-max-bs", "cuda-graph-max-bs-decode",
                "compilation-config.cudagraph_mode", "enforce-eager", "disable-overlap-schedule",
                "enable-single-batch-overlap", "enable-two-batch-overlap", "tp-size", "tensor-parallel-size",
                "mem-fraction-static", "gpu-memory-utilization", "context-length", "max-model-len")
"""Flags known to move tok/s: speculative steps and draft tokens, graph and overlap flags, TP, memory, context."""

RUN_LIMIT = 1000


@dataclass(frozen=True)
class Reference:
    """One arm of one recorded run: what it ran and how fast."""

    run_id: int
    kind: str  # "bench" | "ab"
    arm: str  # the arm's label ("running" for a bench)
    output_tok_s: float
    concurrency: int
    flags: Mapping[str, FlagValue]
    profile: str

    @property
    def per_stream(self) -> float:
        return self.output_tok_s / max(1, self.concurrency)

    def describe(self) -> str:
        arm = "" if self.kind == "bench" else f" arm {self.arm}"
        return (f"history run #{self.run_id} ({self.kind}{arm}): {self.output_tok_s:.1f} tok/s, "
                f"{self.per_stream:.1f} per stream at concurrency {self.concurrency}")


@dataclass(frozen=True)
class MeasuredEffect:
    """An A/B run whose arms differ in one flag: B/A and its 95% interval, from the stored summary."""

    run_id: int
    change: FlagChange  # arm A's value -> arm B's
    ratio: float
    ratio_ci: tuple[float, float] | None

    def describe(self) -> str:
        interval = "" if self.ratio_ci is None else f" (95% interval {self.ratio_ci[0]:.2f}-{self.ratio_ci[1]:.2f})"
        return (f"A/B run #{self.run_id}: {_value(self.change.old)} -> {_value(self.change.new)} gave "
                f"{self.ratio:.2f}x{interval}")


def _value(value: FlagValue | None) -> str:
    return "unset" if value is None else format_value(value)


def shape_of(bench: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(bench.get(key) for key in SHAPE_KEYS)


def shape_text(shape: Mapping[str, Any]) -> str:
    """A request shape as a person reads it: "concurrency 4 x 512 in / 256 out tokens" (and what else differs
    from a plain completions benchmark)."""
    text = (f"concurrency {shape.get('concurrency')} x {shape.get('input_len')} in / "
            f"{shape.get('max_tokens')} out tokens")
    extras = [f"endpoint {shape['endpoint']}" if shape.get("endpoint") not in (None, "completions") else "",
              f"prompts from {shape['prompt_file']}" if shape.get("prompt_file") else "",
              "stops at EOS" if shape.get("ignore_eos") is False else ""]
    return text + "".join(f", {extra}" for extra in extras if extra)


@dataclass(frozen=True)
class ShapeRuns:
    """The finished runs of the model at one request shape: how many, and (for the nearest shape) the best arm."""

    shape: Mapping[str, Any]  # SHAPE_KEYS -> value
    runs: int
    best: Reference | None = None

    def describe(self) -> str:
        return f"{shape_text(self.shape)}: {self.runs} run{'s' * (self.runs != 1)}"


@dataclass(frozen=True)
class RecordedHistory:
    """What the history holds for one model on one host, read once: the arms and measured effects at the asked
    request shape, the other shapes with their run counts, and the nearest other shape with its best arm."""

    arms: list[Reference]
    effects: dict[str, MeasuredEffect]
    shapes: tuple[ShapeRuns, ...] = ()  # other shapes, nearest first
    nearest: ShapeRuns | None = None
    asked: Mapping[str, Any] = field(default_factory=dict)


def _doublings(a: object, b: object) -> float:
    numbers = [_number(v) for v in (a, b)]
    if numbers[0] is None or numbers[1] is None:
        return 0.0 if a == b else 3.0
    return abs(math.log2(max(numbers[0], 1.0) / max(numbers[1], 1.0)))


def shape_distance(one: tuple[Any, ...], other: tuple[Any, ...]) -> float:
    """How far two shapes are apart (module docstring): doublings over the numeric keys, 3 per other difference."""
    total = 0.0
    for key, a, b in zip(SHAPE_KEYS, one, other, strict=True):
        if key in ("concurrency", "input_len", "max_tokens"):
            total += _doublings(a, b)
        elif a != b:
            total += 3.0
    return total


def _done_rows(store: HistoryStore, *, model: str, backend: str, hosts: Iterable[str]) -> dict[tuple[Any, ...],
                                                                                                list[RunRow]]:
    """The finished runs of `model` on `hosts`, newest first, by request shape (rows without arms or trials)."""
    names = set(hosts)
    by_shape: dict[tuple[Any, ...], list[RunRow]] = {}
    for row in store.runs(RUN_LIMIT):
        bench = row.params.get("bench") if isinstance(row.params, dict) else None
        if (row.status != "done" or row.model != model or row.backend != backend or row.host not in names
                or not isinstance(bench, dict)):
            continue
        try:
            for shape in _run_shapes(row, bench):
                by_shape.setdefault(shape, []).append(row)
        except TypeError:  # a shape value that is not hashable (a list in a hand-edited row): not comparable
            continue
    return by_shape


def _tune_shape(bench: Mapping[str, Any], entry: object) -> tuple[Any, ...] | None:
    """One request shape of a tune run (its params' "shapes" entry) in a bench's form, or None when unreadable."""
    if not isinstance(entry, dict):
        return None
    return shape_of({**bench, "concurrency": entry.get("concurrency"), "input_len": entry.get("input_len"),
                     "max_tokens": entry.get("output_len")})


def _run_shapes(row: RunRow, bench: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The request shapes a run measured: a bench's or an A/B's one; each shape of a tune run (every launch of a
    tune measures all of them)."""
    if row.kind != "tune":
        return [shape_of(bench)]
    shapes = row.params.get("shapes") if isinstance(row.params, dict) else None
    found = [s for entry in shapes if (s := _tune_shape(bench, entry)) is not None] if isinstance(shapes, list) else []
    return found or [shape_of(bench)]


def _tune_references(run: RunRow, shape: tuple[Any, ...] | None, concurrency: int) -> list[Reference]:
    """A tune run's candidates at `shape` (the board of that shape in its summary), each with its launches' mean
    total output tok/s."""
    bench = run.params.get("bench")
    summary = run.summary or {}
    flags = {arm.label: arm.flags for arm in run.arms}
    found = []
    for board in summary.get("shapes") or []:
        if not isinstance(board, dict) or not isinstance(bench, dict):
            continue
        try:
            if shape is not None and _tune_shape(bench, board) != shape:
                continue
        except TypeError:
            continue
        at = int(_number(board.get("concurrency")) or concurrency)
        for row in board.get("rows") or []:
            value = _number(row.get("total_tok_s")) if isinstance(row, dict) else None
            label = row.get("candidate") if isinstance(row, dict) else None
            if value is not None and label in flags:
                found.append(Reference(run.id, run.kind, str(label), value, max(1, at), flags[str(label)],
                                       run.profile))
        break
    return found


def _full(store: HistoryStore, rows: Iterable[RunRow]) -> list[RunRow]:
    return [full for row in rows if (full := store.run(row.id)) is not None]


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def references(runs: Iterable[RunRow], shape: tuple[Any, ...] | None = None) -> list[Reference]:
    """Every arm of `runs` with a measured output tok/s (a tune run's candidates at `shape`, or at its own shape
    when None)."""
    found = []
    for run in runs:
        bench = run.params.get("bench")
        concurrency = int(_number(bench.get("concurrency") if isinstance(bench, dict) else None) or 1)  # a row's JSON
        concurrency = concurrency if 1 <= concurrency <= 1 << 20 else 1
        summary = run.summary or {}
        if run.kind == "tune":
            found.extend(_tune_references(run, shape if shape is not None else (
                shape_of(bench) if isinstance(bench, dict) else None), concurrency))
            continue
        if run.kind == "bench":
            value = _number(summary.get("output_tok_s"))
            if value is not None and run.arms:
                found.append(Reference(run.id, run.kind, run.arms[0].label, value, concurrency, run.arms[0].flags,
                                       run.profile))
            continue
        for arm, stored in zip(run.arms, summary.get("arms") or [], strict=False):
            value = _number(stored.get("mean")) if isinstance(stored, dict) else None
            if value is not None:
                found.append(Reference(run.id, run.kind, arm.label, value, concurrency, arm.flags, run.profile))
    return found


def measured_effects(runs: Iterable[RunRow]) -> dict[str, MeasuredEffect]:
    """Per flag, the newest A/B run whose arm B differs from arm A in that flag, with its ratio."""
    effects: dict[str, MeasuredEffect] = {}
    for run in runs:  # newest first
        if run.kind != "ab" or len(run.arms) < 2:
            continue
        comparisons = (run.summary or {}).get("comparisons") or []
        for arm, comparison in zip(run.arms[1:], comparisons, strict=False):
            ratio = _number(comparison.get("ratio")) if isinstance(comparison, dict) else None
            if ratio is None:
                continue
            ci = comparison.get("ratio_ci")
            interval = (float(ci[0]), float(ci[1])) if isinstance(ci, list) and len(ci) == 2 else None
            for change in flag_diff(run.arms[0].flags, arm.flags):
                effects.setdefault(change.flag, MeasuredEffect(run.id, change, ratio, interval))
    return effects


def recorded_history(store: HistoryStore, *, model: str, backend: str, hosts: Iterable[str],
                     bench: Mapping[str, Any]) -> RecordedHistory:
    """The history of `model` on `hosts` for the request shape `bench` (RecordedHistory), the run list read once."""
    asked = shape_of(bench)
    by_shape = _done_rows(store, model=model, backend=backend, hosts=hosts)
    runs = _full(store, by_shape.get(asked, []))
    others = sorted((shape for shape in by_shape if shape != asked),
                    key=lambda shape: (shape_distance(asked, shape), -len(by_shape[shape]), -by_shape[shape][0].id))
    shapes = [ShapeRuns(dict(zip(SHAPE_KEYS, shape, strict=True)), len(by_shape[shape])) for shape in others]
    nearest = None
    for index, shape in enumerate(others):  # the nearest shape with a measured arm
        best = fastest(references(_full(store, by_shape[shape]), shape))
        if best is not None:
            nearest = shapes[index] = ShapeRuns(shapes[index].shape, shapes[index].runs, best)
            break
    return RecordedHistory(references(runs, asked), measured_effects(runs), tuple(shapes), nearest,
                           dict(zip(SHAPE_KEYS, asked, strict=True)))


def recorded_arms(store: HistoryStore, *, model: str, backend: str, hosts: Iterable[str],
                  bench: Mapping[str, Any]) -> tuple[list[Reference], dict[str, MeasuredEffect]]:
    """Every measured arm in the history at this request shape (the history read once), and the flags'
    measured effects."""
    history = recorded_history(store, model=model, backend=backend, hosts=hosts, bench=bench)
    return history.arms, history.effects


def fastest(arms: Iterable[Reference], flags: Mapping[str, FlagValue] | None = None) -> Reference | None:
    """The fastest arm per stream (only arms that ran exactly `flags`, when given)."""
    return max((r for r in arms if flags is None or dict(r.flags) == dict(flags)), key=lambda r: r.per_stream,
               default=None)


def best_reference(store: HistoryStore, *, model: str, backend: str, hosts: Iterable[str],
                   bench: Mapping[str, Any], flags: Mapping[str, FlagValue] | None = None
                   ) -> tuple[Reference | None, dict[str, MeasuredEffect]]:
    """fastest(recorded_arms(...)): the best arm at this request shape, and the flags' measured effects."""
    arms, effects = recorded_arms(store, model=model, backend=backend, hosts=hosts, bench=bench)
    return fastest(arms, flags), effects


def diff_findings(running: Mapping[str, FlagValue], reference: Mapping[str, FlagValue], source: str,
                  effects: Mapping[str, MeasuredEffect] | None = None) -> list[Finding]:
    """One finding per flag where `reference` differs from the running server: measured ones first, then the
    known-impact ones, then the rest; each fix sets the reference's value (None: unset the flag)."""
    effects = effects or {}
    changes = flag_diff(running, reference)

    def rank(change: FlagChange) -> tuple[int, int]:
        if change.flag in effects:
            return 0, 0
        if change.flag in KNOWN_IMPACT:
            return 1, KNOWN_IMPACT.index(change.flag)
        return 2, 0

    findings = []
    for change in sorted(changes, key=rank):
        effect = effects.get(change.flag)
        evidence = [source, f"running server: --{change.flag} {_value(change.old)}"]
        if effect is not None:
            evidence.append(effect.describe())
            why = f"measured here: {effect.describe()}"
        elif change.flag in KNOWN_IMPACT:
            why = "a flag known to move tok/s (speculation, graphs, overlap, TP, memory or context)"
        else:
            why = "differs from the reference; its effect is not measured"
        fix: PendingFlags = {change.flag: change.new}
        findings.append(Finding(f"history:{change.flag}", f"--{change.flag}", "fix",
                                f"the reference used --{change.flag} {_value(change.new)}; the server runs "
                                f"{_value(change.old)}", tuple(evidence), why, fix))
    return findings
