"""The advisor's one entry point: `advise(host, profile, ...) -> Advice`, and its JSON and terminal text.

Two sections: "slower than before" (the running flags against the best recorded run at the same request shape,
and against a named profile; without a run at that shape, the shapes the history has and the nearest one's best
run as a note) and "left on the table" (the rules of app.core.advisor.rules on what the server
itself reports). Nothing here launches or changes anything: each fix is a set of pending flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.advisor.evidence import Evidence, gather_evidence
from app.core.advisor.history import (
    Reference,
    ShapeRuns,
    diff_findings,
    fastest,
    recorded_history,
    shape_text,
)
from app.core.advisor.rules import RULES, Finding, PendingFlags, applies, evaluate, fix_text
from app.core.data import FlagChange
from app.core.errors import Reason, TunedashError
from app.core.flags.values import format_value, get_flag
from app.core.hosts.base import Host
from app.core.measure.bench import BenchSpec
from app.core.measure.store import HistoryStore
from app.core.profiles.render import flag_diff
from app.core.profiles.types import Profile
from app.core.server import jobs


class NothingRunning(TunedashError):
    """advise found no running server of the profile."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Reason.NOT_RUNNING)


@dataclass(frozen=True)
class Advice:
    """What the advisor found about one running server."""

    profile: str
    host: str
    backend: str
    version: str | None
    running_flags: dict[str, Any]
    reference: Reference | None
    against: str | None  # the profile named with --against
    slower_than_before: tuple[Finding, ...]
    left_on_table: tuple[Finding, ...]
    sources: dict[str, str] = field(default_factory=dict)  # evidence source -> what was read
    own: Reference | None = None  # the best recorded run of exactly the running flags at the same shape
    shape: dict[str, Any] | None = None  # the request shape a reference must share (None: no history read)
    other_shapes: tuple[ShapeRuns, ...] = ()  # the model's runs at other shapes, nearest first, with counts
    nearest: ShapeRuns | None = None  # without a reference: the nearest other shape, with its best arm (a note)

    def nearest_differs(self) -> list[FlagChange]:
        """How the nearest shape's best arm's flags differ from the running ones (old: running, new: its)."""
        if self.nearest is None or self.nearest.best is None:
            return []
        return flag_diff(self.running_flags, self.nearest.best.flags)

    def pending(self) -> PendingFlags:
        """Every fix together, as pending flags (the reference's first, then the rules')."""
        merged: PendingFlags = {}
        for finding in (*self.slower_than_before, *self.left_on_table):
            for name, value in finding.fix.items():
                merged.setdefault(name, value)
        return merged


def keep_known_gains(slower: list[Finding], running: dict[str, Any], backend: str, version: str | None,
                     effects: Mapping[str, Any], measured_running: bool) -> list[Finding]:
    """The reference's differences, except that one undoing a gain the rules know (the running value is what a
    rule's fix leads to: `Rule.prefers`) is no fix while neither an A/B effect of that flag nor a run of the
    running flags says the reference is better: an older run without the gain is not evidence against it."""
    if measured_running:
        return slower
    kept = []
    for finding in slower:
        flag = next(iter(finding.fix), None) if finding.rule.startswith("history:") else None
        rule = next((r for r in RULES if flag is not None and applies(r, backend, version) and flag in r.prefers
                     and get_flag(running, flag) == r.prefers[flag]), None)
        if rule is None or flag in effects:
            kept.append(finding)
            continue
        kept.append(replace(finding, status="advice", fix={}, reason=(
            f"kept: the running value is the advisor's own fix for \"{rule.title}\" (a known gain), which the "
            "reference run did not have; `b` (or `tunedash bench`) measures the running flags")))
    return kept


def _sources(ev: Evidence) -> dict[str, str]:
    facts = ev.gpu_facts
    sources = {
        "server_info": "read" if ev.resolved is not None else "not read",
        "log": "not read" if ev.log_lines is None else f"{ev.log_lines} lines",
        "smi": f"{len(ev.gpus)} GPUs" if ev.gpus else "not read",
        "gpu_facts": "not read" if facts is None else ", ".join(
            f"{name} {'read' if value else 'not read'}" for name, value in (
                ("compute capability", facts.compute_cap), ("interconnect", facts.interconnect))),
        "page_cache": "not read" if ev.page_cache is None else ev.page_cache.describe(),
    }
    if ev.problems:  # why a source was not read, in the words of the tool or host that failed
        sources["problems"] = "; ".join(ev.problems)
    return sources


async def advise(host: Host, profile: Profile, *, store: HistoryStore | None = None,
                 against: Profile | None = None, bench: BenchSpec | None = None) -> Advice:
    """Advice on the server of `profile` running on `host`; raises NothingRunning when none runs.

    `bench` is the request shape a reference run must share (default: the profile's [bench]).
    """
    record = await jobs.load_job(host, profile)
    if record is None or not await jobs.job_members(host, record):
        raise NothingRunning(f"{profile.name}: no server of this profile is running on {host.name}; start it with "
                             f"`tunedash launch {profile.name} --wait`")
    ev = await gather_evidence(host, record)
    running = dict(record.flags)
    reference = own = nearest = None
    shapes: tuple[ShapeRuns, ...] = ()
    asked: dict[str, Any] | None = None
    slower: list[Finding] = []
    if store is not None:
        shape = (bench or BenchSpec.from_settings(profile.bench)).to_json()
        hosts = {host.name, profile.host}
        history = await store.in_thread(recorded_history, store, model=record.model, backend=record.backend,
                                        hosts=hosts, bench=shape)
        arms, effects, shapes, asked = history.arms, history.effects, history.shapes, dict(history.asked)
        reference, own = fastest(arms), fastest(arms, running)
        nearest = history.nearest if reference is None else None
        # The running flags measured at least as fast as the best run: nothing is slower than before.
        if reference is not None and not (own is not None and own.per_stream >= reference.per_stream):
            slower += keep_known_gains(diff_findings(running, reference.flags, reference.describe(), effects),
                                       running, record.backend, ev.version, effects, own is not None)
    if against is not None:
        slower += diff_findings(running, dict(against.flags), f"profile {against.name} ({against.source})")
    return Advice(profile.name, host.name, record.backend, ev.version, running, reference,
                  against.name if against else None, tuple(slower), tuple(evaluate(ev)), _sources(ev), own,
                  asked, shapes, nearest)


def finding_to_json(finding: Finding) -> dict[str, Any]:
    return {"rule": finding.rule, "title": finding.title, "status": finding.status, "what": finding.what,
            "evidence": list(finding.evidence), "why": finding.why,
            "fix": dict(finding.fix) if finding.fix else None,
            "nothing_to_do": finding.reason if finding.status == "nothing_to_do" else None,
            "note": finding.reason if finding.status != "nothing_to_do" else None}


def _reference_json(ref: Reference) -> dict[str, Any]:
    return {"run_id": ref.run_id, "kind": ref.kind, "arm": ref.arm, "profile": ref.profile,
            "output_tok_s": round(ref.output_tok_s, 3), "per_stream_tok_s": round(ref.per_stream, 3),
            "concurrency": ref.concurrency, "flags": dict(ref.flags)}


def _nearest_json(advice: Advice) -> dict[str, Any] | None:
    near = advice.nearest
    if near is None or near.best is None:
        return None
    return {"note": "another request shape: not a like-for-like comparison", "shape": dict(near.shape),
            "runs": near.runs, "best": _reference_json(near.best),
            "differs": [{"flag": c.flag, "running": c.old, "nearest": c.new} for c in advice.nearest_differs()]}


def advice_to_json(advice: Advice) -> dict[str, Any]:
    """The shape of `tunedash advise --json`."""
    ref = advice.reference
    return {
        "profile": advice.profile, "host": advice.host, "backend": advice.backend, "version": advice.version,
        "running_flags": advice.running_flags,
        "reference": None if ref is None else _reference_json(ref),
        "shape": advice.shape,
        "other_shapes": [{"shape": dict(other.shape), "runs": other.runs} for other in advice.other_shapes],
        "nearest_shape": _nearest_json(advice),
        "running_run": None if advice.own is None else {
            "run_id": advice.own.run_id, "output_tok_s": round(advice.own.output_tok_s, 3),
            "per_stream_tok_s": round(advice.own.per_stream, 3)},
        "against": advice.against,
        "slower_than_before": [finding_to_json(f) for f in advice.slower_than_before],
        "left_on_table": [finding_to_json(f) for f in advice.left_on_table],
        "pending": dict(advice.pending()),
        "sources": advice.sources,
    }


def _finding_lines(finding: Finding) -> list[str]:
    mark = {"fix": "FIX", "nothing_to_do": "ok", "not_read": "??", "advice": "note"}[finding.status]
    lines = [f"  [{mark}] {finding.title}: {finding.what}"]
    lines += [f"        evidence: {item}" for item in finding.evidence if item]
    lines.append(f"        why: {finding.why}")
    if finding.fix:
        lines.append(f"        fix: {fix_text(finding.fix)}")
    if finding.status == "nothing_to_do":
        lines.append(f"        nothing to do on this hardware: {finding.reason}")
    elif finding.reason:
        lines.append(f"        {'not read' if finding.status == 'not_read' else 'note'}: {finding.reason}")
    return lines


SHAPES_SHOWN = 6
"""Other request shapes listed in the text (nearest first); `--json` lists every one."""


def _no_reference_lines(advice: Advice) -> list[str]:
    """Why there is no reference, which shapes the history has instead, and the nearest one's best run as a note."""
    asked = f" ({shape_text(advice.shape)})" if advice.shape else ""
    lines = [f"  no recorded run of this model on this host at this request shape{asked}; "
             f"`tunedash bench {advice.profile}` records one"]
    if not advice.other_shapes:
        return lines
    shown = advice.other_shapes[:SHAPES_SHOWN]
    more = len(advice.other_shapes) - len(shown)
    lines.append("  recorded at other shapes: " + "; ".join(other.describe() for other in shown)
                 + (f"; {more} more shape{'s' * (more != 1)}" if more else ""))
    near = advice.nearest
    if near is not None and near.best is not None:
        lines.append(f"  note, another shape (not like for like): the nearest, {shape_text(near.shape)}, "
                     f"best {near.best.describe()}")
        differs = advice.nearest_differs()
        lines.append("        its flags: " + ("the running ones" if not differs else ", ".join(
            f"--{c.flag} {_flag_value(c.new)} (running {_flag_value(c.old)})" for c in differs)))
    return lines


def _flag_value(value: Any) -> str:
    return "unset" if value is None else format_value(value)


def advice_text(advice: Advice) -> str:
    """The advice for a terminal: both sections, each finding with its evidence, why and fix."""
    version = advice.version or "version not reported"
    lines = [f"advice for {advice.profile} on {advice.host} ({advice.backend} {version})", "",
             "Slower than before?"]
    if advice.reference is not None:
        lines.append(f"  best recorded run: {advice.reference.describe()}")
        if advice.own is not None and advice.own.per_stream >= advice.reference.per_stream:
            lines.append(f"  the running flags measured as fast: {advice.own.describe()}: nothing is slower")
        elif advice.own is None:
            lines.append("  the running flags have no run at this request shape (b, or `tunedash bench`, "
                         "measures them); until then the best recorded run is the reference")
        else:
            lines.append(f"  the running flags measured slower: {advice.own.describe()}")
    else:
        lines += _no_reference_lines(advice)
    if advice.against:
        lines.append(f"  compared with profile {advice.against}")
    if not advice.slower_than_before and advice.against:
        lines.append("  the running flags are the named profile's")
    for finding in advice.slower_than_before:
        lines += _finding_lines(finding)
    lines += ["", "Left on the table"]
    if not advice.left_on_table:
        lines.append("  nothing found in what the server reports")
    for finding in advice.left_on_table:
        lines += _finding_lines(finding)
    lines += ["", "read: " + ", ".join(f"{k} {v}" for k, v in advice.sources.items())]
    pending = advice.pending()
    if pending:
        lines.append(f"all fixes as pending flags: {fix_text(pending)}")
    return "\n".join(lines)
