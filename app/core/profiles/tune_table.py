"""The profile's [tune] table -> TuneSettings, read with the profile reader's errors (every problem, named).

    [tune]
    objective     "stream_tok_s" (default: output tok/s per stream) | "total_tok_s" | "goodput" (requests/s within
                  [bench] slo_ttft_ms / slo_tpot_ms, which must be set) | "j_per_token" (lower is better)
    shapes        [{ concurrency = 1, input_len = 256, output_len = 128, requests = 8 }, ...]; input_len,
                  output_len and requests default to [bench]'s (requests: at least twice the concurrency)
                  default: the [bench] shape, and the same at concurrency 1 and at 4x [bench]'s concurrency
    exclude       [{ speculative-num-steps = 5, o = "off" }, ...]: a candidate matching every key of an entry is
                  left out (keys: flags of [tune.flags] or toggle keys of [tune.toggles]; values as written there)
    max_launches  int >= 1  default: twice the candidates (what a two-launch grid spends)
    time_budget   seconds >= 1 of wall time, or unset
    confidence    0.5-0.999 (0.95)   tie_pct  0-50 (2.0: within this % counts as a tie)   min_launches 1+ (1)
    advisor_seeds true (default): the advisor's fixes of the running server join as candidates
    [tune.flags]     flag = [values]   any catalog flag, each value checked by the catalog (false/"unset" on a
                     non-negatable flag leaves it out); speculative-num-steps keeps --speculative-num-draft-tokens
                     at steps + 1 when topk is 1 (the toggle rule), unless draft tokens are tuned too
    [tune.toggles]   key = [state names] or "all"   a toggle's states by its key: g = ["off", "on"],
                     o = ["sched", "off"]; a flip's states are "off"/"on", a cycle's its names or its values
    [tune.constraints] ttft_p95_ms, tpot_p95_ms: a candidate whose launches' mean p95 is over it at a shape
                     cannot win that shape (and leaves the race when it fails at every shape)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from app.core.data import FlagValue
from app.core.flags.catalog import FlagSpec
from app.core.flags.toggles import Toggle, toggle_for_flag
from app.core.flags.values import FlagError, check_value, format_value
from app.core.profiles.types import (
    TUNE_OBJECTIVES,
    BenchSettings,
    ProfileError,
    TuneAxis,
    TuneOption,
    TuneSettings,
    TuneShape,
)

T = TypeVar("T")


class ProfileReader(Protocol):
    """What the [tune] reader uses of app.core.profiles.schema.ProfileReader (its problems list and checks)."""

    problems: list[str]

    def attempt(self, default: T, read: Any, *args: Any) -> T: ...

    def unknown_keys(self, table: Mapping[str, Any], allowed: Sequence[str], prefix: str) -> None: ...

    def flag_spec(self, backend: str, name: str, key: str) -> FlagSpec: ...

TUNE_KEYS = ("objective", "shapes", "exclude", "max_launches", "time_budget", "confidence", "tie_pct",
             "min_launches", "advisor_seeds", "flags", "toggles", "constraints")
SHAPE_KEYS = ("concurrency", "input_len", "output_len", "requests")
CONSTRAINT_KEYS = ("ttft_p95_ms", "tpot_p95_ms")
MAX_CANDIDATES = 512  # a space larger than this is a typo more often than a plan; the error says how big it is


def _describe(value: object) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)
    return f"{kind} {value!r}"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def default_shapes(bench: BenchSettings) -> tuple[TuneShape, ...]:
    """The [bench] shape, then the same lengths at concurrency 1 and at 4x (duplicates dropped)."""
    shapes: list[TuneShape] = []
    for concurrency in (bench.concurrency, 1, 4 * bench.concurrency):
        shape = TuneShape(concurrency, bench.input_len, bench.output_len, max(bench.requests, 2 * concurrency))
        if all(s.concurrency != concurrency for s in shapes):
            shapes.append(shape)
    return tuple(shapes)


def option_label(value: FlagValue | None) -> str:
    """How a flag value reads in a candidate's name: "3", "on", "unset"."""
    return format_value(value)


def toggle_state_labels(toggle: Toggle) -> list[str]:
    """The names a [tune.toggles] entry picks a toggle's states by: its names, "off"/"on" for a flip, else the
    values as they read."""
    if toggle.names:
        return list(toggle.names)
    if toggle.kind == "flip":
        return ["off", "on"]
    return ["/".join(format_value(v) for v in state) for state in toggle.states]


class TuneReader:
    """Reads one [tune] table for a ProfileReader: problems go to the reader's list, each named tune.KEY."""

    def __init__(self, reader: ProfileReader, backend: str, toggles: Sequence[Toggle], bench: BenchSettings) -> None:
        self.reader = reader
        self.backend = backend
        self.toggles = {t.key: t for t in toggles}
        self.bench = bench

    def problem(self, key: str, text: str) -> None:
        self.reader.problems.append(f"tune.{key}: {text}")

    def read(self, table: Mapping[str, Any]) -> TuneSettings | None:
        """The settings, or None with the problems in the reader's list."""
        before = len(self.reader.problems)
        self.reader.attempt(None, self.reader.unknown_keys, table, TUNE_KEYS, "tune.")
        axes: list[TuneAxis] = []
        flags = table.get("flags", {})
        if not isinstance(flags, dict):
            self.problem("flags", f"expected a table of flag = [values], got {_describe(flags)}")
        else:
            axes.extend(a for key, raw in flags.items() if (a := self.flag_axis(key, raw)) is not None)
        toggles = table.get("toggles", {})
        if not isinstance(toggles, dict):
            self.problem("toggles", f"expected a table of key = [state names], got {_describe(toggles)}")
        else:
            axes.extend(a for key, raw in toggles.items() if (a := self.toggle_axis(key, raw)) is not None)
        flag_names = [name for a in axes for name, _ in a.options[0].sets] if axes else []
        if len(set(flag_names)) != len(flag_names):
            twice = sorted({n for n in flag_names if flag_names.count(n) > 1})
            self.problem("flags", f"--{twice[0]} is tuned twice (in [tune.flags] and by a toggle of "
                         "[tune.toggles]); keep one")
        if not axes and "flags" not in table and "toggles" not in table:
            self.problem("flags", "the space is empty; add [tune.flags] (e.g. speculative-num-steps = [1, 2, 3]) "
                         "or [tune.toggles] (e.g. g = [\"off\", \"on\"])")
        size = math.prod(len(a.options) for a in axes) if axes else 0
        if size > MAX_CANDIDATES:
            self.problem("flags", f"{size} candidates ({' x '.join(str(len(a.options)) for a in axes)}); at most "
                         f"{MAX_CANDIDATES}: tune fewer values, or exclude combinations")
        shapes = self.shapes(table.get("shapes"))
        exclude = self.exclude(table.get("exclude", []), axes)
        objective = table.get("objective", "stream_tok_s")
        if objective not in TUNE_OBJECTIVES:
            self.problem("objective", f"expected one of {', '.join(TUNE_OBJECTIVES)}, got {_describe(objective)}")
            objective = "stream_tok_s"
        if objective == "goodput" and self.bench.slo_ttft_ms is None and self.bench.slo_tpot_ms is None:
            self.problem("objective", "goodput needs an SLO: set [bench] slo_ttft_ms and/or slo_tpot_ms")
        constraints = self.constraints(table.get("constraints", {}))
        settings = TuneSettings(
            axes=tuple(axes), shapes=shapes, exclude=exclude, objective=objective,
            ttft_p95_ms=constraints.get("ttft_p95_ms"), tpot_p95_ms=constraints.get("tpot_p95_ms"),
            max_launches=self.integer(table, "max_launches", 1, None),
            time_budget_s=self.real(table, "time_budget", 1.0, math.inf, None),
            confidence=self.real(table, "confidence", 0.5, 0.999, 0.95) or 0.95,
            tie_pct=self.real(table, "tie_pct", 0.0, 50.0, 2.0) or 0.0,
            min_launches=self.integer(table, "min_launches", 1, 1) or 1,
            advisor_seeds=self.boolean(table, "advisor_seeds", True))
        return settings if len(self.reader.problems) == before else None

    # ---- axes ----------------------------------------------------------------------------------------
    def flag_axis(self, key: str, raw: Any) -> TuneAxis | None:
        where = f"flags.{key}"
        try:
            spec = self.reader.flag_spec(self.backend, key, f"tune.{where}")
        except ProfileError as exc:
            self.reader.problems.extend(exc.problems)
            return None
        values = raw if isinstance(raw, list) else None
        if not values:
            self.problem(where, f"expected a list of values to try, e.g. [1, 2, 3], got {_describe(raw)}")
            return None
        options: list[TuneOption] = []
        for i, item in enumerate(values):
            if item == "unset":
                value: FlagValue | None = None
            else:
                try:
                    value = check_value(spec, item)
                except FlagError as exc:
                    self.problem(f"{where}[{i}]", str(exc))
                    continue
                if value is False and not spec.negatable:
                    value = None
            label = "off" if item is False else option_label(value)
            if any(o.label == label for o in options):
                self.problem(f"{where}[{i}]", f"{label} is listed twice")
                continue
            options.append(TuneOption(label, ((spec.name, value),)))
        toggle = toggle_for_flag(list(self.toggles.values()), spec.name)
        label = toggle.label if toggle is not None and toggle.flags == (spec.name,) else spec.name
        return TuneAxis(spec.name, label, tuple(options)) if len(options) == len(values) else None

    def toggle_axis(self, key: str, raw: Any) -> TuneAxis | None:
        where = f"toggles.{key}"
        toggle = self.toggles.get(key)
        if toggle is None:
            known = ", ".join(f"{t.key} ({t.label})" for t in self.toggles.values()) or "none"
            self.problem(where, f"no toggle has the key {key!r}; the profile's toggles: {known}")
            return None
        labels = toggle_state_labels(toggle)
        picked = labels if raw == "all" else raw
        if not isinstance(picked, list) or not picked:
            self.problem(where, f"expected \"all\" or a list of {toggle.label}'s states ({', '.join(labels)}), "
                         f"got {_describe(raw)}")
            return None
        options: list[TuneOption] = []
        for i, item in enumerate(picked):
            name = format_value(item) if not isinstance(item, str) else item
            if name not in labels:
                self.problem(f"{where}[{i}]", f"{toggle.label} has no state {item!r}; its states: {', '.join(labels)}")
                continue
            if any(o.label == name for o in options):
                self.problem(f"{where}[{i}]", f"{name} is listed twice")
                continue
            state = toggle.states[labels.index(name)]
            options.append(TuneOption(name, tuple(zip(toggle.flags, state, strict=True))))
        return TuneAxis(key, toggle.label, tuple(options)) if len(options) == len(picked) else None

    # ---- shapes, exclusions, constraints --------------------------------------------------------------
    def shapes(self, raw: Any) -> tuple[TuneShape, ...]:
        if raw is None:
            return default_shapes(self.bench)
        if not isinstance(raw, list) or not raw:
            self.problem("shapes", "expected a list of { concurrency = N, input_len = N, output_len = N } tables, "
                         f"got {_describe(raw)}")
            return ()
        shapes: list[TuneShape] = []
        for i, entry in enumerate(raw):
            where = f"shapes[{i}]"
            if not isinstance(entry, dict):
                self.problem(where, f"expected a table {{ concurrency = N, ... }}, got {_describe(entry)}")
                continue
            unknown = [k for k in entry if k not in SHAPE_KEYS]
            for k in unknown:
                self.problem(f"{where}.{k}", f"unknown key; allowed keys: {', '.join(SHAPE_KEYS)}")
            if "concurrency" not in entry:
                self.problem(where, "needs concurrency = N")
                continue
            got: dict[str, int] = {}
            for k in SHAPE_KEYS:
                if k not in entry:
                    continue
                v = entry[k]
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    self.problem(f"{where}.{k}", f"expected an integer >= 1, got {_describe(v)}")
                else:
                    got[k] = v
            if unknown or len(got) != len([k for k in entry if k in SHAPE_KEYS]):
                continue
            c = got["concurrency"]
            shape = TuneShape(c, got.get("input_len", self.bench.input_len),
                              got.get("output_len", self.bench.output_len),
                              got.get("requests", max(self.bench.requests, 2 * c)))
            if any(s.label == shape.label for s in shapes):
                self.problem(where, f"the shape {shape.label} is listed twice")
                continue
            shapes.append(shape)
        return tuple(shapes)

    def exclude(self, raw: Any, axes: Sequence[TuneAxis]) -> tuple[tuple[tuple[str, str], ...], ...]:
        if not isinstance(raw, list):
            self.problem("exclude", f"expected a list of {{ flag = value, key = state }} tables, got {_describe(raw)}")
            return ()
        by_name = {a.name: a for a in axes}
        rules: list[tuple[tuple[str, str], ...]] = []
        for i, entry in enumerate(raw):
            where = f"exclude[{i}]"
            if not isinstance(entry, dict) or not entry:
                self.problem(where, f"expected a table such as {{ speculative-num-steps = 5, o = \"off\" }}, got "
                             f"{_describe(entry)}")
                continue
            rule: list[tuple[str, str]] = []
            for key, value in entry.items():
                axis = by_name.get(key)
                if axis is None and len(key) > 1:
                    spec = self.reader.attempt(None, self.reader.flag_spec, self.backend, key, f"tune.{where}.{key}")
                    if spec is None:
                        continue
                    axis = by_name.get(spec.name)
                if axis is None:
                    self.problem(f"{where}.{key}", f"not tuned; exclusions name flags of [tune.flags] or keys of "
                                 f"[tune.toggles] ({', '.join(by_name) or 'none'})")
                    continue
                label = (value if isinstance(value, str) and len(axis.name) == 1 else "off" if value is False
                         else option_label(None if value == "unset" else value))
                if all(o.label != label for o in axis.options):
                    self.problem(f"{where}.{key}", f"{value!r} is not one of the values tuned: "
                                 f"{', '.join(o.label for o in axis.options)}")
                    continue
                rule.append((axis.name, label))
            if len(rule) == len(entry):
                rules.append(tuple(rule))
        return tuple(rules)

    def constraints(self, raw: Any) -> dict[str, float]:
        if not isinstance(raw, dict):
            self.problem("constraints", f"expected a table such as {{ ttft_p95_ms = 500 }}, got {_describe(raw)}")
            return {}
        got: dict[str, float] = {}
        for key, value in raw.items():
            if key not in CONSTRAINT_KEYS:
                self.problem(f"constraints.{key}", f"unknown constraint; allowed: {', '.join(CONSTRAINT_KEYS)}")
                continue
            number = _number(value)
            if number is None or number <= 0:
                self.problem(f"constraints.{key}", f"expected a number of milliseconds above 0, got {_describe(value)}")
                continue
            got[key] = number
        return got

    # ---- scalars ---------------------------------------------------------------------------------------
    def integer(self, table: Mapping[str, Any], key: str, least: int, default: int | None) -> int | None:
        if key not in table:
            return default
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            self.problem(key, f"expected an integer >= {least}, got {_describe(value)}")
            return default
        return value

    def real(self, table: Mapping[str, Any], key: str, low: float, high: float, default: float | None) -> float | None:
        if key not in table:
            return default
        number = _number(table[key])
        if number is None or not low <= number <= high:
            bound = f"{low:g} or more" if high == math.inf else f"{low:g}-{high:g}"
            self.problem(key, f"expected a number {bound}, got {_describe(table[key])}")
            return default
        return number

    def boolean(self, table: Mapping[str, Any], key: str, default: bool) -> bool:
        if key not in table:
            return default
        value = table[key]
        if not isinstance(value, bool):
            self.problem(key, f"expected true or false, got {_describe(value)}")
            return default
        return value
