"""Reports of benchmark and A/B runs: the arms table as text or Markdown, CSV of trials, JSON, from live or stored data.

The same functions render `tunedash ab` output and `tunedash export ID`, from the same typed report
(app.core.measure.results.ExperimentReport: a live `ExperimentResult.report()`, or `run_report` of a stored run), so
an export reproduces the table the run printed. Statistics are recomputed from the stored trial values, which is
deterministic. JSON is made only here and in results.py, where data leaves the process (`--json`, exports).
"""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import dataclass
from typing import Any

from app.core.data import FlagChange
from app.core.measure.crossover import SLOT_KEY, stored_slot
from app.core.measure.results import ArmData, ArmEnergy, ExperimentReport, TrialEnergy, energy_of, experiment_report
from app.core.measure.store import LaunchRow, RunRow
from app.core.profiles.render import flag_diff


@dataclass(frozen=True)
class RunReport:
    """A stored run as the screens and exports read it: the run, its experiment report (recomputed from the
    stored trials), the flags that differ between its first two arms, and for a bench its one trial's summary."""

    run: RunRow
    experiment: ExperimentReport
    config_diff: tuple[FlagChange, ...]
    summary: dict[str, Any] | None = None  # a bench's BenchSummary as stored (JSON), None for an A/B

    @property
    def verdict(self) -> str | None:
        return self.experiment.verdict

    def to_json(self) -> dict[str, Any]:
        """For "ab" the experiment JSON (arms, ratio, ratio_ci, verdict) plus the run's context."""
        run = self.run
        data = self.experiment.to_json()
        data.update(kind=run.kind, profile=run.profile, host=run.host, backend=run.backend, model=run.model,
                    started_at=run.started_at, finished_at=run.finished_at, params=run.params,
                    config_diff=[_change_json(c) for c in self.config_diff],
                    launches=[_launch_json(ln) for ln in run.launches])
        if self.summary is not None:
            data["summary"] = self.summary
        return data


def run_report(run: RunRow) -> RunReport:
    """A stored run's report: per arm its trial values by launch, acceptance, errors and energy."""
    arms = []
    for arm in run.arms:
        trials = [t for t in run.trials if t.arm_idx == arm.idx]
        accept = [t.accept_len for t in trials if t.accept_len is not None]
        errors = sum(int(t.summary.get("errors") or 0) for t in trials)
        requests = sum(int(t.summary.get("requests") or 0) for t in trials)
        tokens = sum(int(t.summary.get("output_tokens") or 0) for t in trials)
        energy = [TrialEnergy.of(t.launch_idx, t.summary) for t in trials]
        arms.append(ArmData(arm.label, arm.overrides, run.values(arm.idx), accept, errors, requests, tokens,
                            run.trials_by_launch(arm.idx), energy, launch_slots=_launch_slots(run, arm.idx)))
    report = experiment_report(run.status, arms, run_id=run.id, note=run.note or "", slot_labels=_slot_labels(run))
    summary = run.trials[0].summary if run.kind == "bench" and run.trials else None
    return RunReport(run, report, tuple(config_diff(run)), summary)


def _ready_launches(run: RunRow, arm_idx: int | None = None) -> list[LaunchRow]:
    return sorted((ln for ln in run.launches if ln.outcome == "ready" and (arm_idx is None or ln.arm_idx == arm_idx)),
                  key=lambda ln: (ln.arm_idx or 0, ln.launch_idx))


def _launch_slots(run: RunRow, arm_idx: int) -> list[int] | None:
    """The slot of each of an arm's launches (`ab --slots 2`, app.core.measure.crossover.stored_slot), or None."""
    measured = {t.launch_idx for t in run.trials if t.arm_idx == arm_idx and t.value is not None}
    slots = [stored_slot(ln.flags) for ln in _ready_launches(run, arm_idx) if ln.launch_idx in measured]
    return [s for s in slots if s is not None] if slots and all(s is not None for s in slots) else None


def _slot_labels(run: RunRow) -> list[str]:
    labels: dict[int, str] = {}
    for ln in _ready_launches(run):
        slot = ln.flags.get(SLOT_KEY)
        index = stored_slot(ln.flags)
        if index is not None and isinstance(slot, dict):
            gpus = ",".join(str(g) for g in slot.get("gpus") or [])
            labels.setdefault(index, f"slot {index} (GPUs {gpus}, port {slot.get('port')})")
    return [labels[i] for i in sorted(labels)]


def run_json(run: RunRow) -> dict[str, Any]:
    """A stored run as JSON (`export --format json`): `run_report(run).to_json()`."""
    return run_report(run).to_json()


def _change_json(change: FlagChange) -> dict[str, Any]:
    return {"flag": change.flag, "a": change.old, "b": change.new}


def _launch_json(launch: LaunchRow) -> dict[str, Any]:
    return {"arm": launch.arm_idx, "launch": launch.launch_idx, "outcome": launch.outcome,
            "phase_times": launch.phase_times, "argv": launch.argv}


def config_diff(run: RunRow) -> list[FlagChange]:
    """Flags that differ between the first arm and the second."""
    if len(run.arms) < 2:
        return []
    return flag_diff(run.arms[0].flags, run.arms[1].flags)


def _fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _pct_cv(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f}%"


def _design(trials_per_launch: tuple[int, ...]) -> str:
    """"2x3": launches x trials per launch ("2x3+2" when a launch ran fewer trials: cancelled or failed)."""
    if not trials_per_launch:
        return "0"
    if len(set(trials_per_launch)) == 1:
        return f"{len(trials_per_launch)}x{trials_per_launch[0]}"
    return "+".join(str(n) for n in trials_per_launch)


def energy_cell(energy: ArmEnergy | None) -> str:
    """J/token of an arm, or why there is none ("not measured", never 0)."""
    if energy is None:
        return "n/a"
    if not energy.measured:
        return "not measured"
    return "n/a" if energy.j_per_token is None else f"{energy.j_per_token:.3f}"


def arm_rows(report: ExperimentReport) -> list[list[str]]:
    """Header + one row per arm: launches x trials, mean and 95% CI from the launches, both spreads, B/A, J/token."""
    rows = [["arm", "config", "launches x trials", "mean tok/s", "95% CI (launches)", "launch CV", "trial CV",
             "vs A (95% CI)", "J/token", "accept len", "errors"]]
    for arm in report.arms:
        ci = arm.ci95
        comp = report.comparison(arm.label)
        if comp is not None and comp.ratio is not None:
            rc = comp.ratio_ci
            vs = f"{comp.ratio:.3f}" + (f" ({rc[0]:.3f}-{rc[1]:.3f})" if rc else "")
        else:
            vs = "-"
        rows.append([arm.label, arm.overrides or "(profile)", _design(arm.trials_per_launch), _fmt(arm.mean),
                     "n/a" if ci is None else f"{ci[0]:.1f}-{ci[1]:.1f}", _pct_cv(arm.launch_cv),
                     _pct_cv(arm.trial_cv), vs, energy_cell(arm.energy),
                     _fmt(arm.accept_len, 2), f"{arm.errors}/{arm.requests}"])
    return rows


def launch_lines(report: ExperimentReport) -> list[str]:
    """Per arm, its launch means (the observations the interval comes from) and, when measured, J/token."""
    out = []
    for arm in report.arms:
        values = ", ".join(f"{v:.1f}" for v in arm.launch_values) or "none"
        line = f"{arm.label} launch means (tok/s): {values}"
        energy = arm.energy
        if energy is not None and energy.measured:
            jpt = ", ".join(f"{v:.3f}" for v in energy.launch_j_per_token)
            watts = energy.mean_w_per_gpu
            line += f"; J/token per launch: {jpt} ({', '.join(energy.methods)})"
            if watts:
                line += f"; mean W per GPU: {', '.join(f'{w:.0f}' for w in watts)}"
        elif energy is not None:
            line += f"; energy not measured ({energy.missing})"
        out.append(line)
    cross = report.crossover
    if cross is not None:
        on = "; ".join(f"{arm.label} on slots {' '.join(map(str, slots))}"
                       for arm, slots in zip(report.arms, cross.launch_slots, strict=False))
        naive = f"; B/A without the slot removed {cross.naive_ratio:.3f}" if cross.naive_ratio is not None else ""
        out.append(f"crossover on {', '.join(cross.slots) or 'two slots'}: {on}{naive}")
    return out


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def experiment_text(report: ExperimentReport) -> str:
    """The arms table and the verdict(s), for a terminal."""
    out = [text_table(arm_rows(report)), *launch_lines(report)]
    for comp in report.comparisons:
        out.append(f"verdict: {comp.verdict}")
    if report.status != "done":
        out.append(f"status: {report.status}" + (f" ({report.note})" if report.note else ""))
    return "\n".join(out)


def run_markdown(run: RunRow) -> str:
    """Ready to paste into a pull request: what changed, the table, the verdict, how it was measured."""
    report = run_report(run)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started_at))
    out = [f"### tunedash {run.kind} #{run.id}: {run.profile} ({run.backend}, {run.model}) on {run.host}, {when}", ""]
    if run.kind == "ab":
        diff = config_diff(run)
        if diff:
            out.append("Config diff (A -> B):")
            out.append("")
            out += [f"- `--{c.flag}`: `{c.old if c.old is not None else 'unset'}` -> "
                    f"`{c.new if c.new is not None else 'unset'}`" for c in diff]
            out.append("")
        out.append(markdown_table(arm_rows(report.experiment)))
        out.append("")
        out += [f"- {line}" for line in launch_lines(report.experiment)]
        out.append("")
        for comp in report.experiment.comparisons:
            out.append(f"**Verdict:** {comp.verdict}")
        out.append("")
    elif report.summary:
        out.append(markdown_table(bench_rows(report.summary)))
        out.append("")
    bench = run.params.get("bench", run.params)
    if run.kind == "ab" and "launches" in run.params:
        design = (f"{run.params['launches']} launch(es) per arm of {run.params.get('trials', 1)} trial(s) each "
                  f"of {bench.get('requests')} requests")
        stats = ("the launch is the unit: one value per launch (the mean of its trials); B/A and its 95% interval "
                 "by the pooled t interval on log launch means (df = both arms' launches - 2); per-arm intervals by "
                 "Student's t on the launch means")
        order = " Launches interleaved (A B B A ...)." if run.params.get("interleave") else ""
        if run.params.get("design") == "crossover":
            stats = ("the launch is the unit: one value per launch (the mean of its trials); log launch means fitted "
                     "with arm and slot as factors, B/A with the slot effect removed and the slot effect (slot 1 / "
                     "slot 0, the A/A across slots), each with its t interval (df = both arms' launches - 3); "
                     "per-arm intervals by Student's t on the launch means")
            order = (" A and B ran at the same time on two slots (sharing the host's CPU), crossed over: round r "
                     "A on slot r % 2, B on the other.")
    else:  # a run from before launches were the unit: one launch per arm
        design = f"{run.params.get('trials', 1)} trial(s) per arm of {bench.get('requests')} requests"
        stats = "one launch per arm: no launch-level interval"
        order = " Arms interleaved (A B B A)." if run.params.get("interleave") else ""
    out.append(f"Method: {design} at "
               f"concurrency {bench.get('concurrency')}, input ~{bench.get('input_len')} tokens, "
               f"{bench.get('max_tokens')} output tokens, {bench.get('warmup')} warm-up request(s) after each "
               f"relaunch excluded; output tokens from the server's usage; {stats}." + order)
    if run.status != "done":
        out.append("")
        out.append(f"Status: {run.status}" + (f" ({run.note})" if run.note else ""))
    return "\n".join(out) + "\n"


def bench_rows(s: dict[str, Any]) -> list[list[str]]:
    """A benchmark summary as a two-column table."""
    def dist(name: str, key: str) -> list[str]:
        d = s.get(key) or {}
        return [name, " / ".join(_fmt(d.get(p)) for p in ("p50", "p90", "p99")) + " ms (p50/p90/p99)"]

    return [
        ["measure", "value"],
        ["output tok/s", _fmt(s.get("output_tok_s"))],
        ["per-stream decode tok/s", _fmt(s.get("stream_decode_tok_s"))],
        ["requests ok / sent", f"{s.get('completed')}/{s.get('requests')}"],
        ["output tokens (usage)", str(s.get("output_tokens"))],
        dist("TTFT", "ttft_ms"), dist("TPOT", "tpot_ms"), dist("ITL", "itl_ms"), dist("end-to-end", "e2e_ms"),
        ["accept len", _fmt(s.get("accept_len"), 2) + (f" ({src})" if (src := s.get("accept_source")) else "")],
        ["wall", f"{_fmt(s.get('wall_s'), 2)} s"],
    ]


def run_csv(run: RunRow) -> str:
    """One row per trial: run, arm, label, overrides, launch and trial (1-based), tok/s, accept len, requests,
    errors, tokens, and the trial's energy (joules, J/token, method; empty when not measured)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["run", "arm", "label", "overrides", "launch", "trial", "output_tok_s", "accept_len", "requests",
                     "errors", "output_tokens", "joules", "j_per_token", "energy_method"])
    labels = {a.idx: a for a in run.arms}
    for t in run.trials:
        arm = labels.get(t.arm_idx)
        energy = energy_of(t.summary)
        jpt = energy.get("j_per_token") if energy else None
        writer.writerow([run.id, t.arm_idx, arm.label if arm else "", arm.overrides if arm else "", t.launch_idx + 1,
                         t.trial_idx + 1, "" if t.value is None else round(t.value, 4),
                         "" if t.accept_len is None else round(t.accept_len, 4),
                         t.summary.get("requests"), t.summary.get("errors"), t.summary.get("output_tokens"),
                         "" if energy is None else round(float(energy["joules"]), 4),
                         "" if not isinstance(jpt, (int, float)) else round(float(jpt), 6),
                         "" if energy is None else energy["method"]])
    return buf.getvalue()


def export_run(run: RunRow, fmt: str) -> str:
    if fmt == "md":
        return run_markdown(run)
    if fmt == "csv":
        return run_csv(run)
    return json.dumps(run_report(run).to_json(), indent=2) + "\n"
