"""`tunedash tune PROFILE`: race the profile's [tune] candidates over its request shapes (app.core.tune).

`--dry-run` lists the candidates (and the ones dropped, with why) and the budget, launching nothing. A run prints a
line per launch and per shape with the launches spent, the budget and an ETA, then the leaderboards; `--json` prints
only the results JSON. `--resume ID` goes on with a stored run that did not finish (a quit, a crash, a lost
connection): nothing measured is repeated. At the end the server runs the winner for the profile's own [bench]
shape, or the starting config with `--restore`; the last line says which. `--slots N` runs up to N candidates at
once on disjoint GPU sets of the host (app.core.measure.slots.plan_on_host: slot 0 the profile's own GPUs and port,
the others on free GPUs no one else holds, each with its own port, job record and driver lock); at the end the
other slots' servers are killed and their GPUs confirmed free (free_slots, shared with the dashboard's tune on
slots); `--dry-run --slots N` prints the plan. On a `slurm:` profile a slot is an allocation of its own
(`_plan_slurm`, CLI-only; `--grant-deadline S`), given back at the end. Exit codes
(app.cli.common): 2 bad input (slots that do not fit included), 4 the host refused a launch, 130 cancelled (the run
is kept and resumable).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from app.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_START_FAILED,
    CliError,
    drive,
    exit_code,
    lifecycle_for,
    load_profile,
    open_host,
    say,
    with_take_over,
)
from app.core.advisor.advise import NothingRunning, advise
from app.core.errors import TunedashError
from app.core.flags.discovery import ServerFlags, discover_flags
from app.core.hosts.base import Host
from app.core.hosts.slurm import SlurmHost
from app.core.measure.slots import MAX_PORT, Slot, SlotError, free_slots, plan_on_host, slot_profile
from app.core.measure.store import HistoryStore, StoreError
from app.core.profiles.render import launch_env
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.driver import DrivenElsewhere
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.energy import energy_meter_for
from app.core.tune.export import results_text, slot_lines
from app.core.tune.model import OBJECTIVE_TEXT, TuneFailed, TuneSpec, spec_from_run
from app.core.tune.results import tune_results
from app.core.tune.run import TuneProgress, TuneRunner
from app.core.tune.space import TuneSpace, build_space


def _store() -> HistoryStore:
    try:
        return HistoryStore()
    except StoreError as exc:
        raise CliError(str(exc)) from None


async def _running_and_fixes(host: Host, profile: Profile, store: HistoryStore | None,
                             use_advisor: bool) -> tuple[dict[str, Any] | None, list[tuple[str, dict[str, Any]]], str]:
    """The running server's flags (None when none runs) and the advisor's fixes of it, with a note on either."""
    record = await jobs.load_job(host, profile)
    if record is None or not await jobs.job_members(host, record):
        return None, [], "no server runs: the starting config is the profile's flags; no advisor seeds"
    if not use_advisor:
        return dict(record.flags), [], "advisor seeds off"
    try:
        advice = await advise(host, profile, store=store)
    except NothingRunning:
        return dict(record.flags), [], "no server runs: no advisor seeds"
    except TunedashError as exc:
        return dict(record.flags), [], f"advisor seeds skipped: {exc}"
    fixes = [(f.rule, dict(f.fix)) for f in (*advice.slower_than_before, *advice.left_on_table) if f.fix]
    return dict(record.flags), fixes, f"{len(fixes)} advisor fix{'es' if len(fixes) != 1 else ''} seeded"


def _space_json(space: TuneSpace, profile: Profile) -> dict[str, Any]:
    return {"candidates": [{"label": c.label, "source": c.source, "overrides": c.overrides(profile.flags)}
                           for c in space.candidates],
            "dropped": [{"label": d.label, "why": d.why} for d in space.dropped]}


async def _plan_slurm(host: SlurmHost, profile: Profile, n: int, deadline_s: float,
                      *, asked: bool = True) -> tuple[list[Slot], list[Host], list[str]]:
    """The `--slots n` plan on a slurm: profile, where a slot is an allocation
    (docs/architecture.md#tune---slots-n-over-several-allocations-built). Slot 0 is the profile's host; slots 1..
    are SlurmHosts of the same request, each asking for its own allocation, all at once, each granted within
    `deadline_s` (salloc --immediate) or left out with a note. Each slot runs on port + i, on its allocation's GRES
    IDX when the profile names node-wide indices, else on the profile's. Slots granted are numbered 0.. in order
    (the runner's slots are contiguous). `asked` False (--dry-run): the plan only, nothing asked."""
    if not profile.gpus:
        raise SlotError(f"profile {profile.name} names no GPUs (`gpus = [...]`): each slot's server runs on them")
    if profile.port + n - 1 > MAX_PORT:
        raise SlotError(f"profile {profile.name}: slot {n - 1} would listen on port {profile.port + n - 1}, past "
                        f"{MAX_PORT}: give the profile a lower `port`")
    wanted = [host.for_slot(i, max(1, round(deadline_s)), len(profile.gpus)) for i in range(1, n)]
    if not asked:
        return [Slot(i, tuple(profile.gpus), profile.port + i) for i in range(n)], [], []
    try:  # slot 0 first: asked beside the others, it could lose the node's GPUs to them and wait in the queue
        await host.where()
    except TunedashError as exc:
        for each in wanted:
            await each.close()
        raise SlotError(f"slot 0: {exc}") from None
    granted = await asyncio.gather(*(each.where() for each in wanted), return_exceptions=True)
    slots = [Slot(0, tuple(profile.gpus), profile.port)]
    hosts: list[Host] = []
    notes: list[str] = []
    # The profile names node-wide GPU indices when they are slot 0's allocation's own IDX (no device confinement:
    # every allocation on a node sees all its GPUs): then each slot runs on its allocation's IDX, else on the
    # profile's (a confined allocation numbers its own GPUs from 0).
    node_wide = await host.gpu_indices() == tuple(profile.gpus)
    for each, outcome in zip(wanted, granted, strict=True):
        if isinstance(outcome, BaseException):
            notes.append(f"slot {each.slot} left out: no allocation granted within {deadline_s:g} s ({outcome}); the "
                         "run goes on with the others")
            await _give_back(each)
            continue
        index = len(slots)
        gpus = (await each.gpu_indices() if node_wide else ()) or tuple(profile.gpus)
        slots.append(Slot(index, gpus, profile.port + index))
        hosts.append(each)
        notes.append(f"slot {index}: job {outcome[0]} on {outcome[1]} (asked as tunedash@slot{each.slot})")
    return slots, hosts, notes


async def _give_back(host: SlurmHost) -> None:
    """Close a slot's host that takes no part, giving back an allocation it may hold."""
    try:
        await host.release()
    except TunedashError:
        pass
    finally:
        await host.close()


async def _release_slot_hosts(args: argparse.Namespace, hosts: list[Host]) -> None:
    """At the end: give back each slot's allocation that tunedash asked for (`scancel J`; its server was killed
    and its GPUs confirmed free before), and say so."""
    for each in hosts:
        if not isinstance(each, SlurmHost):
            continue
        job = each.job
        try:
            await each.release()
        except TunedashError as exc:
            line = f"{each.name}: the allocation was not given back: {exc}"
        else:
            line = f"{each.name}: allocation {job} given back (scancel {job})" if job is not None else ""
        finally:
            await each.close()
        if line:
            print(line, file=sys.stderr) if args.json else say(line)


def _slots_json(profile: Profile, slots: list[Slot]) -> list[dict[str, Any]]:
    return [{"index": s.index, "name": slot_profile(profile, s).name, "gpus": list(s.gpus), "port": s.port}
            for s in slots]


def _dry_run(args: argparse.Namespace, profile: Profile, space: TuneSpace, spec: TuneSpec, notes: list[str],
             slots: list[Slot] | None, slot_error: str) -> int:
    n = len(space.candidates)
    budget = {"max_launches": spec.max_launches, "time_budget_s": spec.time_budget_s, "first_round": n,
              "grid_one_launch": n, "grid_two_launch": 2 * n}
    if args.json:
        extra: dict[str, Any] = {}
        if args.slots > 1:
            extra = {"slots": None if slots is None else _slots_json(profile, slots), "slot_error": slot_error or None}
        say(json.dumps({"profile": profile.name, "objective": spec.settings.objective,
                        "shapes": [s.label for s in spec.shapes], **_space_json(space, profile), "budget": budget,
                        "notes": notes, **extra}, indent=2))
        return EXIT_BAD_INPUT if slot_error else EXIT_OK
    say(f"tune {profile.name}: {n} candidates x {len(spec.shapes)} shapes, ranked by "
        f"{OBJECTIVE_TEXT[spec.settings.objective]}")
    for note in notes:
        say(f"  ({note})")
    say("shapes (each launch measures every one): " + ", ".join(
        f"{s.label} ({s.requests} requests)" for s in spec.shapes))
    for i, c in enumerate(space.candidates, start=1):
        say(f"  {i:3}. {c.label}  [{c.source}]  {c.overrides(profile.flags) or '(the profile as is)'}")
    if space.dropped:
        say(f"dropped ({len(space.dropped)}):")
        for d in space.dropped:
            say(f"  - {d.label}: {d.why}")
    say(f"budget: at most {spec.max_launches} launches"
        + (f" or {spec.time_budget_s:g} s" if spec.time_budget_s else "")
        + f"; the first round is {n} launches (one per candidate); a one-launch grid takes {n}, a two-launch "
        f"grid {2 * n}")
    if slots is not None:
        say(f"slots ({len(slots)}, one candidate on each at once):")
        for slot in slots:
            say(f"  {slot.label}  as {slot_profile(profile, slot).name}")
    say("nothing was launched (--dry-run)")
    if slot_error:
        print(f"tunedash: {slot_error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def _printer(quiet: bool) -> Any:
    def on_progress(p: TuneProgress) -> None:
        if quiet:
            return
        eta = f", ETA {p.eta_s / 60:.1f} min" if p.eta_s is not None else ""
        if p.kind == "decision":
            d = p.decision
            if d is not None and not d.done:
                say(f"[{p.launches_done}/{p.launches_budget}] {len(d.eliminated)} out; {p.text}{eta}")
            return
        if p.kind in ("done",):
            return
        say(f"[{p.launches_done}/{p.launches_budget}] {p.text}" if p.kind != "shape" else p.text)

    return on_progress


async def cmd_tune(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    if args.launches is not None and args.launches < 1:
        raise CliError(f"--launches must be at least 1 (got {args.launches})")
    if args.slots < 1:
        raise CliError(f"--slots must be at least 1 (got {args.slots})")
    if args.time_budget is not None and args.time_budget <= 0:
        raise CliError(f"--time-budget must be seconds above 0 (got {args.time_budget})")
    host = open_host(profile)
    store = _store()
    try:
        return await _tune(args, profile, host, store)
    finally:
        store.close()


async def _tune(args: argparse.Namespace, profile: Profile, host: Host, store: HistoryStore) -> int:
    found: ServerFlags = await discover_flags(host, profile.backend, profile.python, profile.module,
                                              launch_env(profile))
    resume = None
    notes: list[str] = []
    if args.resume is not None:
        try:
            resume = await store.in_thread(store.run, args.resume)  # off the loop, as every store call here
        except StoreError as exc:
            raise CliError(str(exc)) from None
        if resume is None:
            raise CliError(f"no run #{args.resume} in {store.path}; `tunedash history` lists the runs")
        try:
            spec = spec_from_run(profile, resume, restore=args.restore, ready_timeout_s=args.ready_timeout,
                                 max_launches=args.launches, time_budget_s=args.time_budget)
        except TuneFailed as exc:
            raise CliError(str(exc)) from None
        space = TuneSpace(spec.candidates)
    else:
        tune = profile.tune
        if tune is None:
            raise CliError(f"{profile.source}: the profile has no [tune] table; add one, e.g.\n  [tune.flags]\n  "
                           "speculative-num-steps = [1, 2, 3]\n(README: `tunedash tune`)")
        running, fixes, note = await _running_and_fixes(host, profile, store, tune.advisor_seeds)
        notes.append(note)
        if not found.known:
            notes.append(f"the installed server's flags are unknown ({found.reason}): no candidate dropped for them")
        space = build_space(profile, tune, running=running, fixes=fixes, server=found)
        if not space.candidates:
            raise CliError(f"{profile.source}: [tune] leaves no candidate: "
                           + "; ".join(f"{d.label}: {d.why}" for d in space.dropped[:3]))
        n = len(space.candidates)
        spec = TuneSpec(profile, space.candidates, tune.shapes, tune,
                        args.launches or tune.max_launches or 2 * n,
                        args.time_budget if args.time_budget is not None else tune.time_budget_s,
                        args.ready_timeout, args.restore)
    slots: list[Slot] | None = None
    slot_error = ""
    slot_hosts: list[Host] = []  # a slurm: profile's slots 1.. each on its own allocation (_plan_slurm)
    if args.slots > 1:
        try:
            if isinstance(host, SlurmHost):
                slots, slot_hosts, left_out = await _plan_slurm(host, spec.profile, args.slots, args.grant_deadline,
                                                                asked=not args.dry_run)
                notes.extend(left_out)
                if args.json and not args.dry_run:  # the notes are narration: stderr with --json
                    for note in left_out:
                        print(f"({note})", file=sys.stderr)
            else:
                slots = await plan_on_host(host, spec.profile, args.slots)
        except SlotError as exc:
            if not args.dry_run:
                raise CliError(str(exc)) from None
            slot_error = str(exc)
    if args.dry_run:
        return _dry_run(args, profile, space, spec, notes, slots, slot_error)
    try:
        return await _tune_on(args, profile, host, store, spec, space, found, resume, notes, slots, slot_hosts)
    finally:
        await _release_slot_hosts(args, slot_hosts)


async def _tune_on(args: argparse.Namespace, profile: Profile, host: Host, store: HistoryStore, spec: TuneSpec,
                   space: TuneSpace, found: ServerFlags, resume: Any, notes: list[str], slots: list[Slot] | None,
                   slot_hosts: list[Host]) -> int:
    quiet = argparse.Namespace(**{**vars(args), "json": True})  # no narration
    lifecycle = lifecycle_for(spec.profile, host, quiet)
    lifecycles = [lifecycle]
    for i, slot in enumerate((slots or [])[1:]):
        lifecycles.append(lifecycle_for(slot_profile(spec.profile, slot), slot_hosts[i] if slot_hosts else host,
                                        quiet))
    hosts_by_name = {each.profile.name: each.host for each in lifecycles}
    left = [(slot, lifecycle_for(slot_profile(spec.profile, slot), host, quiet))
            for slot in await _left_slots(host, spec.profile, resume, len(slots) if slots else 1)]
    for each in [*lifecycles, *(life for _, life in left)]:
        each.server_flags = found
        try:
            await drive(each, args, "tune")  # one driver lock per slot (its own profile name)
        except DrivenElsewhere as exc:  # the hint names the command to run: the profile's, not the slot's name
            raise DrivenElsewhere(str(exc).replace(f"tunedash tune {each.profile.name} ",
                                                   f"tunedash tune {profile.name} ")) from None
    pairs = list(zip(slots, lifecycles, strict=True)) if slots else None
    runner = TuneRunner(spec, lifecycle, store, resume=resume, on_progress=_printer(args.json),
                        energy_for=lambda p: energy_meter_for(hosts_by_name.get(p.name, host), p), slots=pairs)
    if not args.json:
        say(f"tune {profile.name} on {host.name}: {len(spec.candidates)} candidates x {len(spec.shapes)} shapes, "
            f"at most {spec.max_launches} launches" + (f" or {spec.time_budget_s:g} s" if spec.time_budget_s else "")
            + (f", {len(slots)} slots at once" if slots else ""))
        for slot in slots or []:
            say(f"  {slot.label}")
        for note in notes:
            say(f"  ({note})")
    code = EXIT_OK
    try:
        await runner.run()
    except TuneFailed as exc:
        print(f"tunedash: {exc}", file=sys.stderr)
        code = exit_code(exc)
    except asyncio.CancelledError:
        _report(args, spec, runner)  # what the finished launches say so far
        print(f"cancelled: run #{runner.run_id} is kept; `tunedash tune {profile.name} --resume {runner.run_id}` "
              "goes on without repeating a finished launch", file=sys.stderr)
        raise
    finally:
        try:
            if slots:
                await _free_slots(args, slots, lifecycles)
            if left:
                _say_lines(args, await free_slots(left))
        finally:
            for each in [*lifecycles, *(life for _, life in left)]:
                await each.close()
    _report(args, spec, runner)
    if code == EXIT_OK and runner.state.launches and not any(ln.trials for ln in runner.counted()):
        print(f"tunedash: no launch of {profile.name} came up with a measurement "
              f"({len(runner.counted())} launches); see the server's log (`tunedash status {profile.name}`)",
              file=sys.stderr)
        code = EXIT_START_FAILED
    return code


async def _free_slots(args: argparse.Namespace, slots: list[Slot], lifecycles: list[ServerLifecycle]) -> None:
    """Kill every slot's server but slot 0's and confirm its GPUs free (app.core.measure.slots.free_slots); each
    slot's outcome on stderr with --json, else stdout."""
    _say_lines(args, await free_slots(list(zip(slots, lifecycles, strict=True))))


def _say_lines(args: argparse.Namespace, lines: list[str]) -> None:
    for line in lines:
        if args.json:
            print(line, file=sys.stderr)
        else:
            say(line)


async def _left_slots(host: Host, profile: Profile, resume: Any, used: int) -> list[Slot]:
    """The slots a resumed run ran on before and this run does not use (it was on `--slots 4`, this one on 2 or 1)
    whose server still runs: a run killed mid-launch leaves one there. Each is killed and its GPUs confirmed free at
    the end, as the run's own other slots are, so only the winner holds GPUs when the tune ends. Not on a slurm:
    profile, where such a slot was an allocation of its own (its time limit ends it)."""
    if resume is None or isinstance(host, SlurmHost):
        return []
    found = {slot.index: slot for ln in resume.launches
             if (slot := Slot.from_json(ln.slot)) is not None and slot.index >= used}
    return [slot for _, slot in sorted(found.items())
            if await jobs.load_job(host, slot_profile(profile, slot)) is not None]


def _report(args: argparse.Namespace, spec: TuneSpec, runner: TuneRunner) -> None:
    data = tune_results(spec, runner.state, runner.decision or runner.decide(), status=runner.status,
                        run_id=runner.run_id, note=runner.note, ended_on=runner.ended_on)
    slots = runner.slots_json() if runner.parallel else None
    if args.json:
        out = data.to_json()
        if slots is not None:
            out["slots"] = slots
        say(json.dumps(out, indent=2))
        return
    say("")
    say(results_text(data))
    for line in slot_lines(slots) if slots is not None else []:
        say(line)
    say(f"history: run #{runner.run_id} (`tunedash export {runner.run_id} --format md|csv|json|svg`)")


def register(sub: Any, with_overrides: Any) -> None:
    """Add `tune` to the `tunedash` subparsers."""
    p = sub.add_parser("tune", help="race the profile's [tune] candidates over request shapes, launches as the unit")
    p.add_argument("profile")
    with_overrides(p)
    p.add_argument("--dry-run", action="store_true", help="list the candidates and the budget; launch nothing")
    p.add_argument("--resume", type=int, metavar="ID", help="go on with the stored tune run ID")
    p.add_argument("--launches", type=int, metavar="N", help="at most N launches (default: [tune] max_launches, "
                   "else twice the candidates)")
    p.add_argument("--time-budget", type=float, metavar="S", help="stop starting launches after S seconds")
    p.add_argument("--slots", type=int, default=1, metavar="N",
                   help="run up to N candidates at once on disjoint GPU sets of the host (each its own port)")
    p.add_argument("--grant-deadline", type=float, default=60.0, metavar="S",
                   help="slurm: profiles: seconds each slot's own allocation may wait to be granted (salloc "
                   "--immediate); one not granted by then is left out")
    p.add_argument("--restore", action="store_true", help="end on the starting config instead of the winner")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for each launch")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for free GPUs between launches")
    p.add_argument("--grace", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL")
    with_take_over(p)
    p.add_argument("--json", action="store_true", help="only the results JSON on stdout")
    p.set_defaults(func=cmd_tune)
