"""The `tunedash` command: headless commands for scripts, and the dashboard (`demo`, `ui`).

Exit codes: 0 success, 1 GPUs unreadable (`gpus`), 2 bad input (profile, flag, file, already running),
3 GPUs stay held, 4 the server failed to start (crash while loading, port taken, GPUs unreadable).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.cli.server import refuse_rejected_flags
from app.cli.server import register as register_server_commands
from app.connect import host_for
from app.core.data import ServerState
from app.core.hosts.base import Host, HostError
from app.core.hosts.local import LocalHost
from app.core.profiles.loading import Profile, ProfileError, apply_overrides, find_profiles, resolve_profile
from app.core.server import jobs
from app.core.server.lifecycle import ActionLogged, LaunchRefused, LifecycleEvent, ServerLifecycle, StateChanged
from app.core.server.status import inspect_job, status_to_json
from app.core.telemetry.smi import snapshot_to_json, telemetry_for

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_GPUS_HELD = 3
EXIT_START_FAILED = 4
EXIT_UNREADABLE = 1  # `gpus`: the GPUs could not be read (the message says why)


class CliError(Exception):
    """A user-facing error with its exit code."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


def _print(text: str) -> None:
    print(text, flush=True)


def _load(args: argparse.Namespace) -> Profile:
    profile = resolve_profile(args.profile)
    sets = getattr(args, "set", None) or []
    unsets = getattr(args, "unset", None) or []
    if sets or unsets:
        profile = apply_overrides(profile, sets, unsets)
    return profile


def _narrate(json_mode: bool) -> Any:
    started = time.monotonic()

    def listener(event: LifecycleEvent) -> None:
        if json_mode:
            return
        stamp = f"{time.monotonic() - started:6.1f}s"
        if isinstance(event, StateChanged):
            _print(f"{stamp}  {event.state.value}")
        elif isinstance(event, ActionLogged):
            _print(f"{stamp}  {event.text}")

    return listener


def _lifecycle(profile: Profile, host: Host, args: argparse.Namespace) -> ServerLifecycle:
    lifecycle = ServerLifecycle(
        host,
        profile,
        telemetry_for(host, "smi", tuple(profile.gpus)),
        grace_s=getattr(args, "grace", None) or 15.0,
        free_timeout_s=getattr(args, "timeout", None) or 60.0,
    )
    lifecycle.subscribe(_narrate(getattr(args, "json", False)))
    return lifecycle


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
    host: Host = host_for(_load(args)) if args.profile else LocalHost("local")
    source = args.source or ("nvml" if getattr(host, "is_local", False) and host.name == "local" else "smi")
    gpus = tuple(_load(args).gpus) if args.profile else None
    try:
        telemetry = telemetry_for(host, source, gpus)
    except ValueError as exc:  # --source nvml for a remote host
        raise CliError(str(exc)) from None
    snapshot = await telemetry.sample()
    data = snapshot_to_json(snapshot)
    data["host"] = host.name
    data["source"] = source
    if args.json:
        _print(json.dumps(data, indent=2))
    else:
        if snapshot.error is not None:
            message = snapshot.error.message.strip()
            _print(message if message.startswith(f"{host.name}:") else f"{host.name}: {message}")
            if snapshot.error.hint:
                _print(f"  {snapshot.error.hint}")
        for gpu in data.get("gpus", []):
            used = gpu.get("memory_used_mib")
            total = gpu.get("memory_total_mib")
            _print(
                f"GPU{gpu['index']} {gpu.get('name') or '?'}: "
                f"{'n/a' if used is None else used} / {'n/a' if total is None else total} MiB"
            )
            for proc in gpu.get("processes") or []:
                _print(f"    pid {proc['pid']} {proc['name']} {proc.get('used_mib')} MiB")
    return EXIT_OK if snapshot.error is None else EXIT_UNREADABLE


async def cmd_launch(args: argparse.Namespace) -> int:
    profile = _load(args)
    host = host_for(profile)
    await refuse_rejected_flags(profile, host)  # a flag the installed server rejects (app.core.flags.discovery)
    lifecycle = _lifecycle(profile, host, args)
    try:
        record = await lifecycle.launch()
    except LaunchRefused as refused:
        raise CliError(str(refused), refused.exit_code) from None
    if not args.wait:
        if args.json:
            _print(json.dumps({"pid": record.pid, "pgid": record.pgid, "log": record.log_path}))
        await lifecycle.close()
        return EXIT_OK
    state = await lifecycle.wait_ready(args.timeout)
    await lifecycle.close()
    return _report_start(lifecycle, state, args)


def _report_start(lifecycle: ServerLifecycle, state: ServerState, args: argparse.Namespace) -> int:
    times = lifecycle.phase_times
    if args.json:
        pid = lifecycle.record.pid if lifecycle.record else None
        _print(json.dumps({"state": state.value, "phase_times": times, "pid": pid}))
    if state == ServerState.READY:
        if not args.json:
            _print(f"ready: {_phase_line(times)}")
        return EXIT_OK
    if state == ServerState.CRASHED:
        print(_crash_report(lifecycle), file=sys.stderr)
        return EXIT_START_FAILED
    print(f"server not ready after {args.timeout} s (state {state.value}); it keeps starting", file=sys.stderr)
    return EXIT_START_FAILED


async def cmd_status(args: argparse.Namespace) -> int:
    profile = _load(args)
    host = host_for(profile)
    report = await inspect_job(host, profile)
    data = status_to_json(report)
    if args.json:
        _print(json.dumps(data, indent=2))
    else:
        _print(f"{profile.name} on {host.name}: {data['state']}")
        for key in ("pid", "pgid", "port", "backend", "model", "since", "launched_by"):
            if data.get(key) is not None:
                _print(f"  {key}: {data[key]}")
        if data.get("phase_times"):
            _print(f"  phases: {_phase_line(data['phase_times'])}")
        for name, value in sorted((data.get("flags") or {}).items()):
            _print(f"  --{name} {value}")
        for notice in data.get("notices") or []:
            _print(f"  notice: {notice}")
        if data.get("fatal"):
            _print(f"  fatal: {data['fatal']}")
            _print(f"  log: {data.get('log_path')}")
    return EXIT_OK


async def cmd_kill(args: argparse.Namespace) -> int:
    profile = _load(args)
    host = host_for(profile)
    lifecycle = _lifecycle(profile, host, args)
    verdict = await lifecycle.kill(confirm_free=args.confirm_free)
    if verdict is not None and not verdict.confirmed:
        return EXIT_GPUS_HELD
    return EXIT_OK


async def cmd_free(args: argparse.Namespace) -> int:
    profile = _load(args)
    host = host_for(profile)
    lifecycle = _lifecycle(profile, host, args)
    record = await jobs.load_job(host, profile.name)
    verdict = await lifecycle.confirm_free(record)
    if args.json:
        _print(json.dumps({"free": verdict.confirmed, "used_mib": verdict.used_mib,
                           "holders": [h.__dict__ for h in verdict.holders]}))
    return EXIT_OK if verdict.confirmed else EXIT_GPUS_HELD


async def cmd_relaunch(args: argparse.Namespace) -> int:
    profile = _load(args)
    host = host_for(profile)
    await refuse_rejected_flags(profile, host)  # before the kill: a doomed relaunch keeps the server
    lifecycle = _lifecycle(profile, host, args)
    try:
        state = await lifecycle.relaunch(profile, ready_timeout_s=args.ready_timeout)
    except LaunchRefused as refused:
        raise CliError(str(refused), refused.exit_code) from None
    await lifecycle.close()
    args.timeout = args.ready_timeout
    return _report_start(lifecycle, state, args)


def cmd_log(args: argparse.Namespace) -> int:
    from app.core.logs.parser import event_to_json, parse_lines, read_log_lines, summary_to_json

    path = Path(args.file)
    try:
        parsed = parse_lines(read_log_lines(path), args.backend)
    except OSError as exc:
        raise CliError(f"{path}: cannot read the log ({exc.strerror or exc})") from None
    if args.json:
        for event in parsed.events:
            _print(json.dumps(event_to_json(event)))
        return EXIT_OK
    _print(json.dumps(summary_to_json(parsed.summary()), indent=2))
    return EXIT_OK


def cmd_profiles(args: argparse.Namespace) -> int:
    found = find_profiles()
    rows = []
    for name, path in found:
        try:
            profile = resolve_profile(str(path))
            rows.append({"name": name, "path": str(path), "host": profile.host, "backend": profile.backend,
                         "model": profile.model, "error": None})
        except ProfileError as exc:
            rows.append({"name": name, "path": str(path), "error": str(exc)})
    if args.json:
        _print(json.dumps(rows, indent=2))
        return EXIT_OK
    for row in rows:
        if row["error"]:
            _print(f"{row['name']:28} {row['path']}\n    invalid: {row['error']}")
        else:
            _print(f"{row['name']:28} {row['host']:8} {row['backend']:7} {row['model']:28} {row['path']}")
    return EXIT_OK


def cmd_ui(args: argparse.Namespace) -> int:
    from app.tui.app import create_app

    profile = _load(args)
    app = create_app(profile, readonly=args.readonly, probe=args.probe, autolaunch=getattr(args, "autolaunch", False),
                     take_over=getattr(args, "take_over", False))
    app.run()
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """The demo profile by default; PROFILE lets a test run the same demo on a private sim state and port."""
    args.profile = args.profile or "demo"
    args.readonly = False
    args.probe = True
    args.autolaunch = True
    return cmd_ui(args)


# ---- parser --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunedash", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)

    def with_overrides(p: argparse.ArgumentParser) -> None:
        p.add_argument("--set", action="append", metavar="FLAG=VALUE", help="override a launch flag")
        p.add_argument("--unset", action="append", metavar="FLAG", help="remove a launch flag")

    p = sub.add_parser("demo", help="open the dashboard on the built-in simulated GPU host")
    p.add_argument("profile", nargs="?", help="a demo-like profile instead of `demo` (own port and sim_state)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("ui", help="open the dashboard for a profile")
    p.add_argument("profile")
    p.add_argument("--readonly", action="store_true", help="watch only: no key signals or launches")
    p.add_argument("--probe", action="store_true", help="start with the probe load on")
    p.add_argument("--take-over", action="store_true",
                   help="drive a server someone else drives (their dashboard turns read-only)")
    with_overrides(p)
    p.set_defaults(func=cmd_ui)

    p = sub.add_parser("gpus", help="one GPU snapshot (this machine, or a profile's host)")
    p.add_argument("profile", nargs="?")
    p.add_argument("--source", choices=["nvml", "smi"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gpus)

    p = sub.add_parser("launch", help="launch the profile's server detached")
    p.add_argument("profile")
    with_overrides(p)
    p.add_argument("--wait", action="store_true", help="wait until ready (exit 4 if it crashes)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for ready")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("status", help="state of the profile's server")
    p.add_argument("profile")
    with_overrides(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("kill", help="SIGTERM, grace, SIGKILL the server's process group")
    p.add_argument("profile")
    p.add_argument("--confirm-free", action="store_true", help="then wait until the GPUs are free (exit 3 if not)")
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
    with_overrides(p)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for free GPUs")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for ready")
    p.add_argument("--grace", type=float, default=15.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_relaunch)

    p = sub.add_parser("log", help="parse a server log: events as JSON lines, or a summary")
    p.add_argument("file")
    p.add_argument("--backend", choices=["sglang", "vllm"])
    p.add_argument("--json", action="store_true", help="one JSON event per line")
    p.set_defaults(func=cmd_log)

    # measuring commands (bench, ab, history, export): handlers in app/cli/measure.py
    from app.cli.measure import register as register_bench_commands

    register_bench_commands(sub, with_overrides)

    p = sub.add_parser("profiles", help="list the profiles tunedash finds")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profiles)

    register_server_commands(sub)  # `flags`, `probe` (app/cli/server.py)
    from app.cli.remote import register as register_ssh  # `trust` (SSH host keys)

    register_ssh(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.func(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result)
    except (ProfileError, CliError, HostError) as exc:
        print(f"tunedash: {exc}", file=sys.stderr)
        return exc.code if isinstance(exc, CliError) else EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tunedash status | head`: the reader left early; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
