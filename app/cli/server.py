"""The server commands: `gpus`, `launch`, `status`, `kill`, `free`, `relaunch`, `log`, `flags`.

`flags` asks the profile's interpreter which flags the installed server accepts (`python -m MODULE --help`,
cached: app.core.flags.discovery); `launch` and `relaunch` refuse a flag it rejects before anything is killed.
Registered by app.cli.main through `register`; exit codes come from app.cli.common.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import sys
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_GPUS_HELD,
    EXIT_OK,
    EXIT_START_FAILED,
    EXIT_UNREADABLE,
    LIVE_LINES,
    CliError,
    drive,
    lifecycle_for,
    load_profile,
    open_host,
    say,
    with_adopted_ok,
    with_take_over,
)
from app.core.data import ServerState
from app.core.flags.discovery import discover_flags, rejection_message, spec_accepted
from app.core.flags.toggles import apply_toggle
from app.core.flags.values import FlagError, catalog
from app.core.hosts.base import Host
from app.core.hosts.local import LocalHost
from app.core.hosts.window import HEAD_BYTES, TAIL_BYTES
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import for_server_version
from app.core.profiles.render import launch_argv, launch_env
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.lifecycle import ServerLifecycle
from app.core.server.progress import PlainProgress
from app.core.server.status import inspect_job, status_to_json
from app.core.server.warm import WeightCacheJob
from app.core.telemetry.pagecache import page_cache_to_json, read_page_cache
from app.core.telemetry.smi import snapshot_to_json, telemetry_for


def _phase_line(times: dict[str, float]) -> str:
    order = ["kill", "release", "start", "load", "capture", "warmup", "ready"]
    return "  ".join(f"{name} {times[name]:.2f}s" for name in order if name in times)


def _crash_report(lifecycle: ServerLifecycle) -> str:
    lines = ["server failed to start"]
    if lifecycle.fatal is not None:
        lines.append(f"fatal: {lifecycle.fatal.text}")
        lines.extend(f"  {line}" for line in lifecycle.fatal.context[-12:])
    else:
        lines.append("last log lines:")
        lines.extend(f"  {line}" for line in list(lifecycle.last_lines)[-12:])
    if lifecycle.record:
        lines.append(f"full log: {lifecycle.record.log_path}")
    return "\n".join(lines)


# ---- commands ------------------------------------------------------------------------------------
async def cmd_gpus(args: argparse.Namespace) -> int:
    profile = load_profile(args) if args.profile else None
    host: Host = open_host(profile) if profile else LocalHost("local")
    source = args.source or ("nvml" if getattr(host, "is_local", False) and host.name == "local" else "smi")
    gpus = tuple(profile.gpus) if profile else None
    try:
        telemetry = telemetry_for(host, source, gpus)
    except ValueError as exc:  # --source nvml for a remote host
        raise CliError(str(exc)) from None
    snapshot = await telemetry.sample()
    data = snapshot_to_json(snapshot)
    data["host"] = host.name
    data["source"] = source
    if args.json:
        say(json.dumps(data, indent=2))
    else:
        if snapshot.error is not None:
            message = snapshot.error.message.strip()
            say(message if message.startswith(f"{host.name}:") else f"{host.name}: {message}")
            if snapshot.error.hint:
                say(f"  {snapshot.error.hint}")
        for gpu in data.get("gpus", []):
            used = gpu.get("memory_used_mib")
            total = gpu.get("memory_total_mib")
            say(
                f"GPU{gpu['index']} {gpu.get('name') or '?'}: "
                f"{'n/a' if used is None else used} / {'n/a' if total is None else total} MiB"
            )
            for proc in gpu.get("processes") or []:
                say(f"    pid {proc['pid']} {proc['name']} {proc.get('used_mib')} MiB")
    return EXIT_OK if snapshot.error is None else EXIT_UNREADABLE


async def _prepared(args: argparse.Namespace) -> tuple[Profile, ServerLifecycle]:
    """The profile as it would launch, for the server version installed on its host: discovery first (cached),
    the built-in toggles rendered for that version, then each --toggle KEY pressed as the dashboard's key
    would; the lifecycle refuses a flag the version rejects before anything is killed or launched."""
    profile = load_profile(args)
    host = open_host(profile)
    found = await discover_flags(host, profile.backend, profile.python, profile.module, launch_env(profile))
    if found.known:
        profile = for_server_version(profile, found.version)
    profile = press_toggles(profile, getattr(args, "toggle", None) or [])
    lifecycle = lifecycle_for(profile, host, args)
    lifecycle.server_flags = found
    return profile, lifecycle


def press_toggles(profile: Profile, keys: list[str]) -> Profile:
    """The profile after pressing each toggle key in turn (as the dashboard's keys do to the pending flags)."""
    flags = dict(profile.flags)
    for key in keys:
        toggle = profile.toggle(key)
        if toggle is None:
            known = " ".join(t.key for t in profile.toggles) or "none"
            raise CliError(f"--toggle {key}: {profile.name} has no toggle {key!r} (its toggles: {known})")
        try:
            flags = apply_toggle(flags, toggle)
        except FlagError as exc:
            raise CliError(f"--toggle {key}: {exc}") from None
    return replace(profile, flags=flags)


def _dry_run(profile: Profile, lifecycle: ServerLifecycle, args: argparse.Namespace) -> int:
    """Print what would run (argv and environment) and touch nothing; exit 2 when the server would refuse it."""
    argv, env = launch_argv(profile), launch_env(profile)
    found = lifecycle.server_flags
    refusal = rejection_message(found, profile.flags, str(profile.source)) if found is not None else None
    if args.json:
        say(json.dumps({"argv": argv, "env": env, "server": found.describe() if found and found.known else None,
                        "refused": refusal}, indent=2))
    else:
        say(shlex.join(argv))
        for name, value in sorted(env.items()):
            say(f"  env {name}={value}")
        if found is not None and found.known:
            say(f"  for {found.describe()}")
        if refusal:
            print(f"tunedash: {refusal}", file=sys.stderr)
    return EXIT_BAD_INPUT if refusal else EXIT_OK


async def cmd_launch(args: argparse.Namespace) -> int:
    profile, lifecycle = await _prepared(args)
    if args.dry_run:
        return _dry_run(profile, lifecycle, args)
    await drive(lifecycle, args, "launch")
    if not args.wait:
        record = await lifecycle.launch()
        if args.json:
            say(json.dumps({"pid": record.pid, "pgid": record.pgid, "log": record.log_path}))
        await lifecycle.close()
        return EXIT_OK

    async def launch_and_wait() -> ServerState:
        await lifecycle.launch()
        return await lifecycle.wait_ready(args.timeout)

    state = await _with_progress(lifecycle, args, launch_and_wait())
    await lifecycle.close()
    return _report_start(lifecycle, state, args, args.timeout)


async def _with_progress(lifecycle: ServerLifecycle, args: argparse.Namespace,
                         run: Coroutine[Any, Any, ServerState]) -> ServerState:
    """`run` (a launch and its wait, or a relaunch) with its progress printed (app.core.server.progress): on a
    terminal one line rewritten in place, piped a line per phase; none with --json. The phase times go to the
    history (the next run's ETA)."""
    lifecycle.phases.store_factory = HistoryStore
    if args.json:
        return await run
    printer = PlainProgress(lifecycle.phases, sys.stdout)
    LIVE_LINES.append(printer.clear)
    ticker = asyncio.create_task(printer.run())
    try:
        return await run
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        LIVE_LINES.remove(printer.clear)
        await lifecycle.phases.close()  # the run's record and its saved line land before the report
        printer.finish()


def _report_start(lifecycle: ServerLifecycle, state: ServerState, args: argparse.Namespace,
                  ready_timeout_s: float) -> int:
    times = lifecycle.phase_times
    if args.json:
        pid = lifecycle.record.pid if lifecycle.record else None
        say(json.dumps({"state": state.value, "phase_times": times, "pid": pid}))
    if state == ServerState.READY:
        if not args.json:
            say(f"ready: {_phase_line(times)}")
        return EXIT_OK
    if state == ServerState.CRASHED:
        print(_crash_report(lifecycle), file=sys.stderr)
        return EXIT_START_FAILED
    print(f"server not ready after {ready_timeout_s:g} s (state {state.value}); it keeps starting", file=sys.stderr)
    return EXIT_START_FAILED


async def cmd_status(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    host = open_host(profile)
    report = await inspect_job(host, profile)
    data = status_to_json(report)
    cache = await read_page_cache(host, profile.model)
    data["page_cache"] = page_cache_to_json(cache)
    if profile.warm:  # the daemon outlives an engine kill: STOPPED alone would hide the GPU memory it holds
        daemon = WeightCacheJob(host, profile, lambda text, level: None)
        record = await daemon.current()
        pids = sorted(await daemon.pids(record)) if record is not None else []
        data["weight_cache"] = {"running": record is not None, "pid": record.pid if record else None, "pids": pids}
    if args.json:
        say(json.dumps(data, indent=2))
    else:
        say(f"{profile.name} on {host.name}: {data['state']}")
        for key in ("pid", "pgid", "port", "backend", "model", "since", "launched_by"):
            if data.get(key) is not None:
                say(f"  {key}: {data[key]}")
        if data.get("phase_times"):
            say(f"  phases: {_phase_line(data['phase_times'])}")
        if "weight_cache" in data:
            wc = data["weight_cache"]
            say(f"  weight cache daemon: running, pids {', '.join(map(str, wc['pids']))} (`tunedash kill "
                f"{profile.name} --all` stops it)" if wc["running"] else "  weight cache daemon: not running")
        if cache.fraction is not None or cache.model.startswith(("/", "~", ".")):  # not for a hub id
            say(f"  weights: {cache.describe()}")
        for name, value in sorted((data.get("flags") or {}).items()):
            say(f"  --{name} {value}")
        for notice in data.get("notices") or []:
            say(f"  notice: {notice}")
        if data.get("fatal"):
            say(f"  fatal: {data['fatal']}")
            say(f"  log: {data.get('log_path')}")
        if report.log_skipped:
            say(f"  log: read its first {HEAD_BYTES >> 20} MiB and last {TAIL_BYTES >> 20} MiB "
                f"({report.log_skipped / 2**20:.0f} MiB between them not read)")
    return EXIT_OK


async def cmd_kill(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    host = open_host(profile)
    lifecycle = lifecycle_for(profile, host, args)
    await drive(lifecycle, args, "kill")
    if args.all:  # the weight cache daemon too: ends FREE at 0 MiB
        verdict = await lifecycle.kill_all()
    else:
        verdict = await lifecycle.kill(confirm_free=args.confirm_free)
    if verdict is not None and not verdict.confirmed and lifecycle.state != ServerState.WARM:
        return EXIT_GPUS_HELD
    return EXIT_OK


async def cmd_free(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    host = open_host(profile)
    lifecycle = lifecycle_for(profile, host, args)
    record = await jobs.load_job(host, profile)
    verdict = await lifecycle.confirm_free(record)
    if args.json:
        say(json.dumps({"free": verdict.confirmed, "used_mib": verdict.used_mib,
                        "holders": [h.__dict__ for h in verdict.holders]}))
    return EXIT_OK if verdict.confirmed else EXIT_GPUS_HELD


async def cmd_relaunch(args: argparse.Namespace) -> int:
    profile, lifecycle = await _prepared(args)
    if args.dry_run:
        return _dry_run(profile, lifecycle, args)
    await drive(lifecycle, args, "relaunch")
    state = await _with_progress(lifecycle, args, lifecycle.relaunch(profile, ready_timeout_s=args.ready_timeout))
    await lifecycle.close()
    return _report_start(lifecycle, state, args, args.ready_timeout)


def cmd_log(args: argparse.Namespace) -> int:
    """A server log as a readable table (phases, memory, ready time, decode tok/s, notices); `--json` the same
    summary as JSON; `--events` every parsed event as one JSON line."""
    from app.core.logs.parser import event_to_json, parse_lines, read_log_lines, summary_to_json
    from app.core.logs.summary_table import summary_table

    path = Path(args.file)
    try:
        parsed = parse_lines(read_log_lines(path), args.backend)
    except OSError as exc:
        raise CliError(f"{path}: cannot read the log ({exc.strerror or exc})") from None
    if args.events:
        for event in parsed.events:
            say(json.dumps(event_to_json(event)))
        return EXIT_OK
    if args.json:
        say(json.dumps(summary_to_json(parsed.summary()), indent=2))
        return EXIT_OK
    for line in summary_table(parsed.summary(), str(path)):
        say(line)
    return EXIT_OK


# ---- flags ---------------------------------------------------------------------------------------
async def cmd_flags(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    host = open_host(profile)
    found = await discover_flags(host, profile.backend, profile.python, profile.module, launch_env(profile),
                                 refresh=args.refresh)
    specs = catalog(profile.backend)
    offered = [name for name, spec in specs.items() if spec_accepted(spec, found.flags) is not False]
    rejected = [name for name in specs if name not in offered]
    in_profile = [name for name in profile.flags if name in rejected]
    data: dict[str, Any] = {
        "backend": profile.backend, "python": found.python, "module": found.module, "version": found.version,
        "known": found.known, "reason": found.reason or None, "cached": found.cached,
        "server_flags": len(found.flags) if found.flags is not None else None,
        "offered": offered, "rejected": rejected, "rejected_in_profile": in_profile,
    }
    if args.json:
        say(json.dumps(data, indent=2))
    elif not found.known:
        say(f"{profile.name}: the installed server's flags are unknown: {found.reason}")
        say(f"  the whole {profile.backend} catalog is offered ({len(specs)} flags)")
    else:
        say(f"{profile.name}: {found.describe()}: {len(found.flags or ())} flags in its --help"
               f"{' (cached)' if found.cached else ''}")
        say(f"  catalog: {len(offered)} offered, {len(rejected)} not accepted by this version"
               + (": " + ", ".join(f"--{n}" for n in rejected) if rejected else ""))
        for name in in_profile:
            say(f"  {profile.source}: flags.{name}: not accepted by this version; remove it")
    return EXIT_BAD_INPUT if in_profile else EXIT_OK


# ---- registration --------------------------------------------------------------------------------
def _launch_options(p: argparse.ArgumentParser, with_overrides: Any) -> None:
    """What `launch` and `relaunch` share: --take-over, --set/--unset, --toggle, --dry-run."""
    with_take_over(p)
    with_overrides(p)
    p.add_argument("--toggle", action="append", metavar="KEY",
                   help="press a toggle key (s, g, o, ...) as the dashboard would, for the installed version")
    p.add_argument("--dry-run", action="store_true", help="print the argv and env that would run; touch nothing")


def register(sub: Any, with_overrides: Any) -> None:
    """Add the server commands to the `tunedash` subparsers (app.cli.main calls this)."""
    p = sub.add_parser("gpus", help="one GPU snapshot (this machine, or a profile's host)")
    p.add_argument("profile", nargs="?")
    p.add_argument("--source", choices=["nvml", "smi"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gpus)

    p = sub.add_parser("launch", help="launch the profile's server detached")
    p.add_argument("profile")
    _launch_options(p, with_overrides)
    p.add_argument("--wait", action="store_true", help="wait until ready (exit 4 if it crashes)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for ready")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("status", help="state of the profile's server")
    p.add_argument("profile")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("kill", help="SIGTERM, grace, SIGKILL the server's process group")
    p.add_argument("profile")
    with_take_over(p)
    with_adopted_ok(p)
    p.add_argument("--confirm-free", action="store_true", help="then wait until the GPUs are free (exit 3 if not; "
                   "a warm profile's weight cache daemon may hold them: WARM)")
    p.add_argument("--all", action="store_true", help="the weight cache daemon too (warm profiles), then confirm "
                   "the GPUs free at 0 MiB")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for free GPUs")
    p.add_argument("--grace", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL")
    p.set_defaults(func=cmd_kill)

    p = sub.add_parser("free", help="wait until the profile's GPUs are free (exit 3 if not)")
    p.add_argument("profile")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_free)

    p = sub.add_parser("relaunch", help="kill -> confirm free -> launch -> ready, timing each phase")
    p.add_argument("profile")
    _launch_options(p, with_overrides)
    with_adopted_ok(p)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for free GPUs")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for ready")
    p.add_argument("--grace", type=float, default=15.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_relaunch)

    p = sub.add_parser("log", help="summarize a server log: startup phases, memory, ready time, tok/s, notices")
    p.add_argument("file")
    p.add_argument("--backend", choices=["sglang", "vllm"])
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="the summary as one JSON object")
    shape.add_argument("--events", action="store_true", help="every parsed event, one JSON object per line")
    p.set_defaults(func=cmd_log)

    p = sub.add_parser("flags", help="which catalog flags the installed server accepts (from its --help)")
    p.add_argument("profile")
    p.add_argument("--refresh", action="store_true", help="ask the server again instead of the cache")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_flags)
