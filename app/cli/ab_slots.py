"""`tunedash ab --slots 2`: A and B side by side on two disjoint GPU sets, crossed over (app.core.measure.slot_ab).

Plans the two slots from one GPU snapshot (app.core.measure.slots.plan_on_host: GPUs anyone else holds are never
used; too few free GPUs is a SlotError, exit 2), drives one lifecycle per slot (its own record, driver lock,
kill-safety and release watch), runs the crossover, then keeps the arm that ran last on slot 0 (the profile's own
GPUs and port) and kills the other slot's server, confirming its GPUs free.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable

from app.cli.common import EXIT_GPUS_HELD, EXIT_OK, drive, exit_code, lifecycle_for, open_host, say
from app.core.flags.discovery import discover_flags
from app.core.hosts.base import HostError
from app.core.measure.experiment import ExperimentFailed, ExperimentProgress, ExperimentSpec
from app.core.measure.slot_ab import SlotExperiment
from app.core.measure.slots import Slot, plan_on_host, slot_profile
from app.core.measure.store import HistoryStore
from app.core.profiles.render import launch_env
from app.core.profiles.types import Profile
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.energy import energy_meter_for

SLOTS = 2

Report = Callable[[SlotExperiment, argparse.Namespace, HistoryStore], None]
StoreFactory = Callable[[], HistoryStore]


async def run_ab_slots(profile: Profile, spec: ExperimentSpec, args: argparse.Namespace, store_factory: StoreFactory,
                       report: Report) -> int:
    """The A/B of `cmd_ab` on two slots; the same progress, report and exit codes."""
    quiet = args.json or args.md
    host = open_host(profile)
    slots = await plan_on_host(host, profile, SLOTS)  # slot 0 the profile's GPUs and port, slot 1 the next free
    quiet_args = argparse.Namespace(**{**vars(args), "json": quiet})
    lifecycles = [lifecycle_for(slot_profile(profile, slot), host, quiet_args) for slot in slots]
    server_flags = await discover_flags(host, profile.backend, profile.python, profile.module, launch_env(profile))
    for lifecycle in lifecycles:
        lifecycle.server_flags = server_flags  # an arm the installed server rejects fails before any kill
        await drive(lifecycle, args, "ab")

    def on_progress(p: ExperimentProgress) -> None:
        if quiet or p.kind in ("request", "done"):
            return
        say(f"[{p.trials_done}/{p.trials_total}] {p.text}")

    store = store_factory()
    experiment = SlotExperiment(spec, lifecycles, slots, store, on_progress=on_progress,
                                energy_for=lambda arm_profile: energy_meter_for(host, arm_profile))
    if not quiet:
        a, b = spec.arms
        say(f"A/B on two slots of {host.name}, crossed over: {slots[0].label} and {slots[1].label}; "
            f"{spec.launches} launch rounds x {spec.trials} trials of {spec.bench.requests} requests at concurrency "
            f"{spec.bench.concurrency}, A and B at the same time (A on slot 0 in even rounds, on slot 1 in odd)")
        if spec.launches % 2:
            say(f"  {spec.launches} rounds is odd: A gets one launch more on slot 0, B on slot 1 (the slot effect "
                "is still removed, at a wider interval)")
        for arm in (a, b):
            say(f"  {arm.label}: {arm.overrides or '(the profile as is)'}")
    code = EXIT_OK
    try:
        await experiment.run()
    except ExperimentFailed as exc:
        print(f"tunedash: {exc}", file=sys.stderr)
        code = exit_code(exc)
    except asyncio.CancelledError:
        report(experiment, args, store)
        store.close()
        print(f"cancelled: the {sum(len(x.values) for x in experiment.result.arms)} finished trials are kept in "
              f"history run #{experiment.run_id}", file=sys.stderr)
        raise
    finally:
        freed = await _free_other_slot(lifecycles[1], slots[1], quiet)
        for lifecycle in lifecycles:
            await lifecycle.close()
    report(experiment, args, store)  # says which arm keeps running on slot 0
    store.close()
    if not freed and code == EXIT_OK:
        code = EXIT_GPUS_HELD
    return code


async def _free_other_slot(lifecycle: ServerLifecycle, slot: Slot, quiet: bool) -> bool:
    """Kill slot 1's server and confirm its GPUs free; say so (on stderr when the output is JSON or Markdown)."""
    try:
        verdict = await lifecycle.kill(confirm_free=True)
    except HostError as exc:
        print(f"tunedash: {slot.label}: the server could not be killed ({exc}); `tunedash kill` it", file=sys.stderr)
        return False
    if verdict is not None and not verdict.confirmed:
        held = "; ".join(h.describe() for h in verdict.holders) or verdict.unreadable
        print(f"tunedash: {slot.label}: killed, but its GPUs did not come free ({held})", file=sys.stderr)
        return False
    text = f"{slot.label}: its server killed, GPUs {','.join(map(str, slot.gpus))} confirmed free"
    if quiet:
        print(text, file=sys.stderr)
    else:
        with contextlib.suppress(BrokenPipeError):
            say(text)
    return True
