"""An experiment's results as typed values: each arm's figures, its energy, the comparisons, and their JSON.

An arm's input (`ArmData`: its trial values per launch, errors, each trial's `TrialEnergy`) comes from a live
experiment (`ArmOutcome.data`) or from a stored run (`app.core.measure.report.run_report`); `experiment_report`
turns the arms into an `ExperimentReport` (per arm an `ArmResult` with its `ArmEnergy`, per arm after the first a
`Comparison` with A). The screens and the text reports read these dataclasses; `to_json` is the one place they
become JSON (`tunedash ab --json`, `export --format json`, the run's stored summary), so `tunedash export`
reproduces `tunedash ab --json`. The figures are held as reported: rounded as the JSON has them (a mean to 3
places, an interval to 3, a ratio to 4), so a table drawn from the dataclasses and one drawn from the JSON agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.measure.crossover import CrossoverStats, SlotLaunch, crossover_stats, crossover_verdict
from app.core.measure.stats import energy_clause, launch_arm_stats, launch_ratio_stats, launch_verdict

METRIC = "output tok/s per trial"
UNIT = "launch"


def energy_of(summary: dict[str, Any]) -> dict[str, Any] | None:
    """A trial summary's "energy" when it is usable (method, joules >= 0, output tokens >= 0), else None."""
    energy = summary.get("energy")
    if not isinstance(energy, dict):
        return None
    joules, tokens, method = energy.get("joules"), energy.get("output_tokens"), energy.get("method")
    if (not isinstance(joules, (int, float)) or isinstance(joules, bool) or not math.isfinite(joules)
            or joules < 0 or not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0
            or not isinstance(method, str)):
        return None
    return energy


def energy_note_of(summary: dict[str, Any]) -> str:
    """Why a trial summary has no energy, as the bench wrote it ("energy_note", naming the method), else ""."""
    note = summary.get("energy_note")
    if not isinstance(note, str) or energy_of(summary) is not None:
        return ""
    if note.startswith("not measured (") and note.endswith(")"):  # the bench's "not measured (no energy meter)"
        note = note[len("not measured ("):-1]
    return note[:200]


@dataclass(frozen=True)
class TrialEnergy:
    """One trial's energy, successful or not: its launch, the summary's energy as `energy_of` checked it (None
    when the trial has none) and, then, why not (`energy_note_of`)."""

    launch: int
    energy: dict[str, Any] | None
    note: str = ""

    @classmethod
    def of(cls, launch: int, summary: dict[str, Any]) -> TrialEnergy:
        """From a trial's summary (live, or as the store read it)."""
        return cls(launch, energy_of(summary), energy_note_of(summary))


@dataclass(frozen=True)
class ArmData:
    """What `experiment_report` needs of one arm (a live ArmOutcome or a stored run). `launches` None: one launch.

    energy: every trial's TrialEnergy, successful or not (None: a run stored before energy was measured)."""

    label: str
    overrides: str
    values: list[float]
    accept: list[float]
    errors: int
    requests: int
    output_tokens: int
    launches: list[list[float]] | None = None
    energy: list[TrialEnergy] | None = None
    launch_slots: list[int] | None = None  # the slot of each launch (ab --slots 2), parallel to `launches`

    @property
    def by_launch(self) -> list[list[float]]:
        return self.launches if self.launches is not None else [self.values]


@dataclass(frozen=True)
class ArmEnergy:
    """An arm's energy over its trials: J/token overall and per launch, or (`measured` False) why not."""

    measured: bool
    methods: tuple[str, ...]
    notes: tuple[str, ...] = ()  # the trials' reasons for no energy (only when not measured)
    missing: str = ""  # "energy missing in 1 of 6 trials: ..." (only when not measured)
    joules: float | None = None
    output_tokens: int | None = None
    j_per_token: float | None = None
    tokens_per_j: float | None = None
    launch_j_per_token: tuple[float, ...] = ()
    mean_w_per_gpu: tuple[float, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        if not self.measured:
            return {"measured": False, "methods": list(self.methods), "notes": list(self.notes),
                    "missing": self.missing}
        return {"measured": True, "methods": list(self.methods), "joules": self.joules,
                "output_tokens": self.output_tokens, "j_per_token": self.j_per_token,
                "tokens_per_j": self.tokens_per_j, "launch_j_per_token": list(self.launch_j_per_token),
                "mean_w_per_gpu": None if self.mean_w_per_gpu is None else list(self.mean_w_per_gpu)}


@dataclass(frozen=True)
class ArmResult:
    """One arm's figures: its trials (all, and per launch), the launch means with their mean, interval and both
    spreads, acceptance, errors and energy. None where nothing could be measured (no successful trial)."""

    label: str
    overrides: str
    trials: tuple[float, ...]  # every successful trial's tok/s, in order
    n: int  # successful trials
    launches: int  # launches with a successful trial
    trials_per_launch: tuple[int, ...]
    launch_trials: tuple[tuple[float, ...], ...]
    launch_values: tuple[float, ...]  # the launch means: the observations of the statistics
    mean: float | None
    launch_cv: float | None
    trial_cv: float | None
    ci95: tuple[float, float] | None
    accept_len: float | None
    errors: int
    requests: int
    output_tokens: int
    energy: ArmEnergy | None  # None: no trial carries an energy field (runs from before energy was measured)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "overrides": self.overrides, "trials": list(self.trials), "n": self.n,
            "launches": self.launches, "trials_per_launch": list(self.trials_per_launch),
            "launch_trials": [list(vals) for vals in self.launch_trials], "launch_values": list(self.launch_values),
            "mean": self.mean, "launch_cv": self.launch_cv, "trial_cv": self.trial_cv,
            "ci95": None if self.ci95 is None else list(self.ci95), "accept_len": self.accept_len,
            "errors": self.errors, "requests": self.requests, "output_tokens": self.output_tokens,
            "energy": None if self.energy is None else self.energy.to_json(),
        }


@dataclass(frozen=True)
class Comparison:
    """One arm against the first: B/A with its 95% interval (from the launches), the same for J/token, and the
    verdict in words (speed, then energy)."""

    arm: str
    ratio: float | None
    ratio_ci: tuple[float, float] | None
    df: float | None
    significant: bool
    energy_ratio: float | None
    energy_ratio_ci: tuple[float, float] | None
    speed_verdict: str
    energy_verdict: str
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return {"arm": self.arm, "ratio": self.ratio,
                "ratio_ci": None if self.ratio_ci is None else list(self.ratio_ci),
                "df": self.df, "significant": self.significant, "energy_ratio": self.energy_ratio,
                "energy_ratio_ci": None if self.energy_ratio_ci is None else list(self.energy_ratio_ci),
                "speed_verdict": self.speed_verdict, "energy_verdict": self.energy_verdict, "verdict": self.verdict}


@dataclass(frozen=True)
class ExperimentReport:
    """What an experiment measured (live, possibly partial, or stored): its arms and the comparisons with A."""

    run_id: int | None
    status: str
    arms: tuple[ArmResult, ...]
    comparisons: tuple[Comparison, ...] = ()
    note: str = ""
    crossover: Crossover | None = None  # A and B on two slots (ab --slots 2)

    @property
    def verdict(self) -> str | None:
        """The first comparison's verdict (B against A); None with a single arm."""
        return self.comparisons[0].verdict if self.comparisons else None

    def comparison(self, label: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.arm == label), None)

    def to_json(self) -> dict[str, Any]:
        """The experiment's JSON: the same keys, in the same order, as every tunedash has written."""
        data: dict[str, Any] = {"run_id": self.run_id, "status": self.status, "metric": METRIC, "unit": UNIT,
                                "arms": [arm.to_json() for arm in self.arms]}
        if self.comparisons:
            comparisons = [c.to_json() for c in self.comparisons]
            first = comparisons[0]
            data.update(ratio=first["ratio"], ratio_ci=first["ratio_ci"], verdict=first["verdict"],
                        comparisons=comparisons)
        if self.crossover is not None:
            data["crossover"] = self.crossover.to_json()
        if self.note:
            data["note"] = self.note
        return data


@dataclass(frozen=True)
class Crossover:
    """A and B on two slots (app.core.measure.crossover): the slots, each arm's launch slots, the slot effect
    (slot 1 / slot 0) with its interval (the A/A across slots) and B/A with the slot removed, as reported."""

    slots: tuple[str, ...]
    launch_slots: tuple[tuple[int, ...], ...]
    slot_ratio: float | None
    slot_ci: tuple[float, float] | None
    slot_significant: bool
    ratio: float | None
    ratio_ci: tuple[float, float] | None
    naive_ratio: float | None
    df: int

    def to_json(self) -> dict[str, Any]:
        return {"slots": list(self.slots), "launch_slots": [list(s) for s in self.launch_slots],
                "slot_ratio": self.slot_ratio, "slot_ci": None if self.slot_ci is None else list(self.slot_ci),
                "slot_significant": self.slot_significant, "ratio": self.ratio,
                "ratio_ci": None if self.ratio_ci is None else list(self.ratio_ci), "naive_ratio": self.naive_ratio,
                "df": self.df}


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def _interval(ci: tuple[float, float] | None, digits: int) -> tuple[float, float] | None:
    return None if ci is None else (round(ci[0], digits), round(ci[1], digits))


def _watts(value: Any) -> list[float] | None:
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in value):
        return None
    return [float(w) for w in value]


def arm_energy(arm: ArmData) -> ArmEnergy | None:
    """The arm's energy: J/token over all its trials and per launch; `measured` False when any trial lacks it.

    None when no trial carries an energy field at all (runs from before energy was measured)."""
    entries = arm.energy or []
    if not entries:
        return None
    got: list[tuple[int, dict[str, Any]]] = [(x.launch, x.energy) for x in entries if x.energy is not None]
    methods = tuple(sorted({str(e["method"]) for _, e in got}))
    notes = tuple(sorted({x.note for x in entries if x.energy is None and x.note}))
    why = f": {'; '.join(notes)}" if notes else ""
    if not got:
        return ArmEnergy(False, methods, notes, f"no trial measured energy{why}")
    if len(got) < len(entries):
        return ArmEnergy(False, methods, notes, f"energy missing in {len(entries) - len(got)} of {len(entries)} "
                                                f"trials{why}")
    joules = sum(float(e["joules"]) for _, e in got)
    tokens = sum(int(e["output_tokens"]) for _, e in got)
    per_launch: dict[int, list[float]] = {}
    for k, e in got:
        j, n = per_launch.setdefault(k, [0.0, 0.0])
        per_launch[k] = [j + float(e["joules"]), n + int(e["output_tokens"])]
    launch_jpt = [j / n for _, (j, n) in sorted(per_launch.items()) if n > 0]
    watts = [_watts(e.get("mean_w_per_gpu")) for _, e in got]
    mean_w: tuple[float, ...] | None = None
    first_w = watts[0]
    if first_w and all(w is not None and len(w) == len(first_w) for w in watts):  # the trials' mean, per GPU
        mean_w = tuple(round(statistics.fmean(w[i] for w in watts if w is not None), 2) for i in range(len(first_w)))
    return ArmEnergy(True, methods, joules=round(joules, 3), output_tokens=tokens,
                     j_per_token=round(joules / tokens, 6) if tokens else None,
                     tokens_per_j=round(tokens / joules, 6) if joules > 0 else None,
                     launch_j_per_token=tuple(round(v, 6) for v in launch_jpt), mean_w_per_gpu=mean_w)


def _energy_text(first: ArmData, other: ArmData, ea: ArmEnergy | None, eb: ArmEnergy | None) -> str:
    if ea and eb and ea.measured and eb.measured:
        return energy_clause([[v] for v in ea.launch_j_per_token], [[v] for v in eb.launch_j_per_token],
                             a_name=first.label, b_name=other.label)
    notes = sorted({n for e in (ea, eb) if e for n in e.notes})
    if notes:
        return f"energy not measured ({'; '.join(notes)})"
    methods = sorted({m for e in (ea, eb) if e for m in e.methods})
    return "energy not measured" + (f" (method {', '.join(methods)})" if methods else "")


def arm_result(arm: ArmData) -> ArmResult:
    """One arm's figures from its trials (launch_arm_stats), as reported."""
    st = launch_arm_stats(arm.by_launch)
    return ArmResult(
        label=arm.label, overrides=arm.overrides, trials=tuple(round(v, 4) for v in arm.values), n=st.trials,
        launches=st.launches, trials_per_launch=tuple(len(vals) for vals in arm.by_launch if vals),
        launch_trials=tuple(tuple(round(v, 4) for v in vals) for vals in arm.by_launch if vals),
        launch_values=tuple(round(v, 4) for v in st.launch_values), mean=_round(st.mean),
        launch_cv=_round(st.launch_cv, 5), trial_cv=_round(st.trial_cv, 5), ci95=_interval(st.ci95, 3),
        accept_len=_round(sum(arm.accept) / len(arm.accept)) if arm.accept else None, errors=arm.errors,
        requests=arm.requests, output_tokens=arm.output_tokens, energy=arm_energy(arm))


def _slot_launches(arm: ArmData) -> list[SlotLaunch]:
    slots = arm.launch_slots or []
    return [SlotLaunch(slot, vals) for slot, vals in zip(slots, arm.by_launch, strict=False) if vals]


def crossover_of(first: ArmData, other: ArmData) -> CrossoverStats | None:
    """The crossover statistics of two arms that ran on two slots; None when they did not."""
    if not first.launch_slots or not other.launch_slots:
        return None
    return crossover_stats(_slot_launches(first), _slot_launches(other))


def _comparison(first: ArmData, other: ArmData, ea: ArmEnergy | None, eb: ArmEnergy | None) -> Comparison:
    r = launch_ratio_stats(first.by_launch, other.by_launch)
    energy_ratio = None
    if ea and eb and ea.measured and eb.measured:
        energy_ratio = launch_ratio_stats([[v] for v in ea.launch_j_per_token], [[v] for v in eb.launch_j_per_token])
    speed = launch_verdict(first.by_launch, other.by_launch, a_name=first.label, b_name=other.label)
    cross = crossover_of(first, other)
    if cross is not None:  # on two slots: B/A with the slot removed, and the slot effect, in the verdict
        speed = crossover_verdict(cross, a_name=first.label, b_name=other.label)
        energy_text = _energy_text(first, other, ea, eb)
        return Comparison(
            arm=other.label, ratio=_round(cross.ratio, 4), ratio_ci=_interval(cross.ratio_ci, 4),
            df=float(cross.df) if cross.ratio_ci is not None else None, significant=cross.significant,
            energy_ratio=None if energy_ratio is None else _round(energy_ratio.ratio, 4),
            energy_ratio_ci=None if energy_ratio is None else _interval(energy_ratio.ci95, 4),
            speed_verdict=speed, energy_verdict=energy_text,
            verdict=f"{speed}{', and ' if energy_text.startswith('uses') else '; '}{energy_text}")
    energy_text = _energy_text(first, other, ea, eb)
    return Comparison(
        arm=other.label, ratio=_round(r.ratio, 4), ratio_ci=_interval(r.ci95, 4), df=r.df, significant=r.significant,
        energy_ratio=None if energy_ratio is None else _round(energy_ratio.ratio, 4),
        energy_ratio_ci=None if energy_ratio is None else _interval(energy_ratio.ci95, 4),
        speed_verdict=speed, energy_verdict=energy_text,
        verdict=f"{speed}{', and ' if energy_text.startswith('uses') else '; '}{energy_text}")


def _crossover(arms: list[ArmData], slot_labels: Sequence[str]) -> Crossover | None:
    if len(arms) != 2:
        return None
    cross = crossover_of(arms[0], arms[1])
    if cross is None:
        return None
    return Crossover(tuple(slot_labels), tuple(tuple(a.launch_slots or ()) for a in arms),
                     _round(cross.slot_ratio, 4), _interval(cross.slot_ci, 4), cross.slot_significant,
                     _round(cross.ratio, 4), _interval(cross.ratio_ci, 4), _round(cross.naive_ratio, 4), cross.df)


def experiment_report(status: str, arms: Sequence[ArmData], *, run_id: int | None = None,
                      note: str = "", slot_labels: Sequence[str] = ()) -> ExperimentReport:
    """Per arm its launches x trials, launch means, mean and 95% interval from the launches, both spreads and
    energy; per arm after the first, B/A from the launches and the verdict. Used for a live result and for a
    stored run alike."""
    items = list(arms)
    results = tuple(arm_result(arm) for arm in items)
    comparisons = tuple(_comparison(items[0], other, results[0].energy, results[i].energy)
                        for i, other in enumerate(items[1:], start=1)) if len(items) > 1 else ()
    return ExperimentReport(run_id, status, results, comparisons, note, _crossover(items, slot_labels))


def result_json(status: str, arms: Sequence[ArmData], *, run_id: int | None = None, note: str = "") -> dict[str, Any]:
    """`experiment_report(...).to_json()`: the JSON of an experiment, for where it leaves the process."""
    return experiment_report(status, arms, run_id=run_id, note=note).to_json()
