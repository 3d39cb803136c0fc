"""A tune run's typed record: the spec (candidates, shapes, rule, budget), one shape's trial, one launch, the
state so far, and both read back from a stored run (app.core.measure.store) for a resume or an export."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.errors import Reason, TunedashError
from app.core.measure.bench import BenchSpec, percentile
from app.core.measure.slots import Slot
from app.core.measure.store import RunRow
from app.core.profiles.types import Profile, TuneSettings, TuneShape
from app.core.tune.race import RaceRule
from app.core.tune.space import Candidate

KIND = "tune"


class TuneFailed(TunedashError):
    """The tune run cannot go on (the host refused a launch: GPUs held by someone else, a port taken)."""

    title = "Tune stopped"

    def __init__(self, message: str, reason: Reason = Reason.START_FAILED) -> None:
        super().__init__(message, reason)


@dataclass(frozen=True)
class ShapeTrial:
    """One shape measured in one launch of one candidate: the objective's value and the figures the results use."""

    candidate: int
    launch: int
    shape: int
    value: float | None  # the objective as reported (J/token for j_per_token); None: no value
    total_tok_s: float | None
    stream_tok_s: float | None
    goodput_rps: float | None
    j_per_token: float | None
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    errors: int = 0
    over: str = ""  # the constraint it broke ("TTFT p95 812 ms > 500 ms"), "" when none

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShapeTrial | None:
        try:
            return cls(**{k: data[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError):
            return None


@dataclass(frozen=True)
class LaunchDone:
    """One launch of one candidate: its number, whether it came up, and its trials (all shapes when complete)."""

    candidate: int
    launch: int
    outcome: str  # ready | crashed | stuck | ...
    trials: tuple[ShapeTrial, ...] = ()
    wall_s: float | None = None
    slot: int | None = None  # the parallel slot it ran on (`--slots N`); None without slots


@dataclass(frozen=True)
class TuneSpec:
    """What one tune run races: the profile (its flags are the starting config), the candidates, the shapes."""

    profile: Profile
    candidates: tuple[Candidate, ...]
    shapes: tuple[TuneShape, ...]
    settings: TuneSettings
    max_launches: int
    time_budget_s: float | None = None
    ready_timeout_s: float = 600.0
    restore: bool = False  # end on the starting config instead of the winner

    def rule(self) -> RaceRule:
        return RaceRule(confidence=self.settings.confidence, tie_pct=self.settings.tie_pct,
                        max_launches=self.max_launches, min_launches=self.settings.min_launches)

    def bench(self, shape: TuneShape) -> BenchSpec:
        base = BenchSpec.from_settings(self.profile.bench)
        return replace(base, requests=shape.requests, concurrency=shape.concurrency, input_len=shape.input_len,
                       max_tokens=shape.output_len, warmup=0)

    def own_shape(self) -> int:
        """The shape matching the profile's [bench] (the one the server ends on), else the first at its concurrency,
        else the first."""
        b = self.profile.bench
        for i, s in enumerate(self.shapes):
            if (s.concurrency, s.input_len, s.output_len) == (b.concurrency, b.input_len, b.output_len):
                return i
        return next((i for i, s in enumerate(self.shapes) if s.concurrency == b.concurrency), 0)

    def params_json(self) -> dict[str, Any]:
        st = self.settings
        return {
            "objective": st.objective, "unit": "launch", "metric": OBJECTIVE_TEXT[st.objective],
            "shapes": [{"concurrency": s.concurrency, "input_len": s.input_len, "output_len": s.output_len,
                        "requests": s.requests, "label": s.label} for s in self.shapes],
            "candidates": [{"label": c.label, "source": c.source, "settings": [list(x) for x in c.settings]}
                           for c in self.candidates],
            "rule": {"confidence": st.confidence, "tie_pct": st.tie_pct, "min_launches": st.min_launches,
                     "max_launches": self.max_launches},
            "time_budget_s": self.time_budget_s,
            "constraints": {"ttft_p95_ms": st.ttft_p95_ms, "tpot_p95_ms": st.tpot_p95_ms},
            "warmup": self.profile.bench.warmup, "restore": self.restore,
            # the profile's own shape, in a bench's form: the advisor's history finds the run by it
            "bench": self.bench(self.shapes[self.own_shape()]).to_json(),
        }


OBJECTIVE_TEXT = {"stream_tok_s": "output tok/s per stream", "total_tok_s": "total output tok/s",
                  "goodput": "goodput (requests/s within the SLOs)", "j_per_token": "J per output token"}


def p95_ms(values: Sequence[float | None]) -> float | None:
    got = [v * 1000 for v in values if v is not None]
    p = percentile(got, 95)
    return None if p is None else round(p, 3)


def race_value(objective: str, trial: ShapeTrial) -> float | None:
    """The value the rule races on (higher is better, above 0): tokens/J for J/token; None when none."""
    if trial.over or trial.value is None:
        return None
    if objective == "j_per_token":
        return 1.0 / trial.value if trial.value > 0 else None
    return trial.value if trial.value > 0 else None


@dataclass
class TuneState:
    """Everything measured so far (this session and, after a resume, the stored ones)."""

    launches: list[LaunchDone] = field(default_factory=list)
    partial: int = 0  # stored launches that came up without all their trials (re-done)

    def next_launch(self, candidate: int) -> int:
        """The next launch number of `candidate`: one past every number used, partial launches included."""
        used = [ln.launch for ln in self.launches if ln.candidate == candidate]
        return max(used, default=-1) + 1

    def spent(self) -> int:
        """The launches the budget counts, as the rule does: complete and failed ones. A partial launch (a crash
        cut it off before all its shapes; resume does it again) is not one, so a resumed run's progress reads
        "launch 6/6" for its redo, not "7/6"."""
        return sum(1 for ln in self.launches if ln.outcome != "partial")


def state_from_run(run: RunRow, shapes: int) -> TuneState:
    """The launches of a stored tune run: complete ones and failed ones count; a ready launch without all its
    shapes' trials is counted in `partial` and left out (its number stays used). In a run whose launches ran on
    slots (`--slots N`, resumed with another N), a launch stored without a slot ran on the profile's own GPUs and
    port, which is slot 0, and reads back as slot 0, so the rule blocks on every launch alike."""
    state = TuneState()
    slotted = any(ln.slot is not None for ln in run.launches if ln.arm_idx is not None)
    trials: dict[tuple[int, int], list[ShapeTrial]] = {}
    for t in run.trials:
        data = t.summary.get("tune") if isinstance(t.summary, dict) else None
        trial = ShapeTrial.from_json(data) if isinstance(data, dict) else None
        if trial is not None:
            trials.setdefault((t.arm_idx, t.launch_idx), []).append(trial)
    used: dict[int, int] = {}
    for ln in run.launches:
        if ln.arm_idx is None:
            continue
        key = (ln.arm_idx, ln.launch_idx)
        stored = Slot.from_json(ln.slot)
        slot = stored.index if stored is not None else 0 if slotted else None
        got = sorted({tr.shape: tr for tr in trials.get(key, [])}.values(), key=lambda tr: tr.shape)
        used[ln.arm_idx] = max(used.get(ln.arm_idx, -1), ln.launch_idx)
        if ln.outcome != "ready":
            state.launches.append(LaunchDone(ln.arm_idx, ln.launch_idx, ln.outcome, slot=slot))
        elif len(got) == shapes:
            state.launches.append(LaunchDone(ln.arm_idx, ln.launch_idx, "ready", tuple(got), slot=slot))
        else:
            state.partial += 1
            state.launches.append(LaunchDone(ln.arm_idx, ln.launch_idx, "partial", slot=slot))
    return state


def spec_from_run(profile: Profile, run: RunRow, *, restore: bool = False, ready_timeout_s: float = 600.0,
                  max_launches: int | None = None, time_budget_s: float | None = None) -> TuneSpec:
    """The spec of a stored tune run, to resume it on `profile` (the run's own profile): the candidates, shapes,
    objective, constraints and rule as they were stored, whatever the profile's [tune] says now. A budget given
    again (`--launches`, `--time-budget`) replaces the stored one."""
    if run.kind != KIND:
        raise TuneFailed(f"run #{run.id} is not a tune run (kind {run.kind}); `tunedash history` lists the runs",
                         Reason.BAD_INPUT)
    if run.profile != profile.name:
        raise TuneFailed(f"run #{run.id} tuned profile {run.profile!r}, not {profile.name!r}; resume it with "
                         f"`tunedash tune {run.profile} --resume {run.id}`", Reason.BAD_INPUT)
    if run.status == "done":
        raise TuneFailed(f"run #{run.id} is finished ({run.note or 'done'}); `tunedash export {run.id}` shows it",
                         Reason.BAD_INPUT)
    params = run.params
    try:
        sources = {c["label"]: c for c in params["candidates"]}
        candidates = tuple(
            Candidate(a.label, dict(a.flags), str(sources.get(a.label, {}).get("source", "space")),
                      tuple((str(x[0]), str(x[1])) for x in sources.get(a.label, {}).get("settings", [])))
            for a in run.arms)
        shapes = tuple(TuneShape(int(s["concurrency"]), int(s["input_len"]), int(s["output_len"]), int(s["requests"]))
                       for s in params["shapes"])
        rule, limits = params["rule"], params.get("constraints") or {}
        settings = TuneSettings(axes=(), shapes=shapes, objective=str(params["objective"]),
                                ttft_p95_ms=limits.get("ttft_p95_ms"), tpot_p95_ms=limits.get("tpot_p95_ms"),
                                confidence=float(rule["confidence"]), tie_pct=float(rule["tie_pct"]),
                                min_launches=int(rule["min_launches"]))
        budget = int(max_launches or rule["max_launches"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise TuneFailed(f"run #{run.id}: its stored parameters are unreadable ({exc!r}); it cannot be resumed",
                         Reason.BAD_INPUT) from None
    if not candidates or not shapes:
        raise TuneFailed(f"run #{run.id} has no candidates or no shapes stored; it cannot be resumed", Reason.BAD_INPUT)
    base = replace(profile, flags=dict(run.arms[0].flags)) if run.arms[0].label == "running" else profile
    return TuneSpec(base, candidates, shapes, settings, budget,
                    time_budget_s if time_budget_s is not None else params.get("time_budget_s"),
                    ready_timeout_s, restore or bool(params.get("restore")))
