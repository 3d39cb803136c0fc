"""The `tunedash` command: the parser and the dispatch; the commands live beside it.

app.cli.server has the server commands (gpus, launch, status, kill, free, relaunch, log, flags),
app.cli.measure the measuring ones (bench, ab, history, export, probe), app.cli.remote `trust`, app.cli.adopt
`adopt`; this module adds `profiles`, `ui` and `demo`. Exit codes come from app.cli.common, the one place errors
become codes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence

from app.cli import adopt, fleet, measure, prewarm, remote, serve, server, tune
from app.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CliError,
    Terminated,
    exit_code,
    load_profile,
    run_command,
    say,
    with_take_over,
)
from app.core.errors import TunedashError
from app.core.flags.catalog import is_tuning_flag
from app.core.flags.values import lookup_flag
from app.core.hosts.base import HostError
from app.core.profiles.loading import find_profiles, resolve_profile
from app.core.profiles.types import ProfileError
from app.core.telemetry.steady import GPU_SOURCES


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
        say(json.dumps(rows, indent=2))
        return EXIT_OK
    for row in rows:
        if row["error"]:
            say(f"{row['name']:28} {row['path']}\n    invalid: {row['error']}")
        else:
            say(f"{row['name']:28} {row['host']:8} {row['backend']:7} {row['model']:28} {row['path']}")
    return EXIT_OK


def _untuned_overrides(args: argparse.Namespace, backend: str) -> str | None:
    """The first `--set`/`--unset` flag outside the catalog's tuning flags, as the refusal (ui --tuning-flags-only)."""
    from app.tui.commands import untuned_flag_message

    for item in [*(getattr(args, "set", None) or []), *(getattr(args, "unset", None) or [])]:
        head, dot, key = item.partition("=")[0].strip().lstrip("-").partition(".")
        spec = lookup_flag(backend, head)
        name = (spec.name if spec is not None else head) + (f".{key}" if dot else "")
        if not is_tuning_flag(backend, name):
            return untuned_flag_message(name)
    return None


def cmd_ui(args: argparse.Namespace) -> int:
    from app.tui.app import create_app

    watching = getattr(args, "watch", False)
    if args.probe and (args.readonly or watching):
        raise CliError("--probe loads the server, which a dashboard opened with --readonly or --watch never does; "
                       "leave --probe out (a --watch dashboard turns the probe on with p once T took over)")
    profile = load_profile(args)
    tuning_flags_only = getattr(args, "tuning_flags_only", False)
    refused = _untuned_overrides(args, profile.backend) if tuning_flags_only else None
    if refused:
        raise CliError(refused)
    app = create_app(profile, readonly=args.readonly, probe=args.probe, autolaunch=getattr(args, "autolaunch", False),
                     take_over=getattr(args, "take_over", False), watching=watching,
                     tuning_flags_only=tuning_flags_only, gpu_source=getattr(args, "gpu_source", "auto"))
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
def _with_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", metavar="FLAG=VALUE", help="override a launch flag")
    p.add_argument("--unset", action="append", metavar="FLAG", help="remove a launch flag")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunedash", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="open the dashboard on the built-in simulated GPU host")
    p.add_argument("profile", nargs="?", help="a demo-like profile instead of `demo` (own port and sim_state)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("ui", help="open the dashboard for a profile")
    p.add_argument("profile")
    p.add_argument("--readonly", action="store_true", help="watch only: no key signals or launches")
    p.add_argument("--probe", action="store_true", help="start with the probe load on")
    with_take_over(p, "drive a server someone else drives (their dashboard turns read-only)")
    p.add_argument("--watch", action="store_true",
                   help="start read-only without taking the driver lock; T takes it over (each `serve` tab)")
    p.add_argument("--tuning-flags-only", action="store_true",
                   help="offer only the catalog's tuning flags (serve's tabs)")
    p.add_argument("--gpu-source", choices=GPU_SOURCES, default="auto",
                   help="how the GPUs are read: auto (NVML in-process on this machine's driver, else nvidia-smi), "
                   "nvml (also the simulated host's NVML-like reader) or smi")
    _with_overrides(p)
    p.set_defaults(func=cmd_ui)

    server.register(sub, _with_overrides)
    prewarm.register(sub)
    measure.register(sub, _with_overrides)
    tune.register(sub, _with_overrides)

    p = sub.add_parser("profiles", help="list the profiles tunedash finds")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profiles)

    remote.register(sub)
    serve.register(sub)
    fleet.register(sub)
    adopt.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.func(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(run_command(result))
        return int(result)
    except (TunedashError, ProfileError, HostError) as exc:
        print(f"tunedash: {exc}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Terminated as exc:
        print(f"tunedash: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `tunedash status | head`: the reader left early; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
