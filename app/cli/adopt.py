"""`tunedash adopt [HOST]`: the SGLang and vLLM servers running on a host, and a profile written from one.

HOST: this machine when omitted (or `local`), `sim` (the demo's simulated host), a profile (its host: `sim`, local
or SSH), `ssh://user@host:port` or an ~/.ssh/config alias. `--pid N --write FILE` writes the profile of server N
to FILE (this machine; an existing FILE only with --force). `--pid N` alone writes it to adopted-N.toml in the
user's profiles and opens the dashboard on the running server (app.core.adopt.takeover; a server another tunedash
launched: its own profile, attached to). The listing and the writing signal nothing (docs/adopt.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from app.cli.common import EXIT_OK, CliError, say
from app.connect import host_for
from app.core.adopt.details import find_servers
from app.core.adopt.profile_text import AdoptError, build_profile
from app.core.adopt.scan import AdoptableServer, still_same
from app.core.hosts.base import Host
from app.core.hosts.local import LocalHost
from app.core.hosts.ssh_options import ALIAS
from app.core.profiles.loading import find_profiles, resolve_profile
from app.core.profiles.types import Profile, ProfileError


def adopt_host(name: str | None) -> tuple[Host, str]:
    """The Host to look at and the `host` a profile written from it names."""
    if name in (None, "", "local"):
        return LocalHost("local"), "local"
    assert name is not None
    if name == "sim":  # the simulated host the demo runs on (its default state folder)
        return host_for(resolve_profile("demo")), "sim"
    if name.startswith("ssh://"):
        from app.core.hosts.ssh import SshHost

        return SshHost(name), name
    try:
        profile = resolve_profile(name)
    except ProfileError:
        if ALIAS.fullmatch(name) and not name.endswith(".toml"):
            from app.core.hosts.ssh import SshHost

            return SshHost(name), name
        raise
    return host_for(profile), profile.host


def custom_profiles() -> list[Profile]:
    """The custom profiles tunedash finds (their commands are the custom servers adopt recognises)."""
    found = []
    for _name, path in find_profiles():
        try:
            profile = resolve_profile(str(path))
        except ProfileError:
            continue
        if profile.backend == "custom" and profile.command:
            found.append(profile)
    return found


def _stamp(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at is not None else "?"


def _gpus_text(server: AdoptableServer) -> str:
    if server.gpus.mib is None:
        return f"unreadable ({server.gpus.reason})"
    if not server.gpus.mib:
        return "none held"
    return " ".join(f"{index}:{mib}MiB" for index, mib in sorted(server.gpus.mib.items()))


def server_json(server: AdoptableServer) -> dict[str, Any]:
    """One listed server for --json."""
    return {
        "host": server.host, "pid": server.pid, "user": server.user, "uid": server.proof.uid,
        "mine": server.mine, "started_at": server.started_at, "start_ticks": server.proof.start_time,
        "server": server.command.label, "backend": server.command.backend, "simulated": server.command.simulated,
        "python": server.python, "exe": server.proof.exe, "version": server.version,
        "version_reason": server.version_reason, "model": server.parsed.model, "port": server.port,
        "port_source": server.port_source,
        "gpus_mib": {str(k): v for k, v in server.gpus.mib.items()} if server.gpus.mib is not None else None,
        "gpus_reason": server.gpus.reason, "cuda_visible_devices": server.cuda_visible,
        "environ_readable": server.environ is not None, "log": server.log_target,
        "launched_by_tunedash": server.launched_by_tunedash,
        "profile": server.record.profile if server.record else None, "record": server.record_path or None,
        "shares_gpus_with": server.shares_gpus_with, "not_adoptable": server.not_adoptable() or None,
        "argv": list(server.proof.argv),
    }


def print_servers(servers: list[AdoptableServer], host_name: str, host_arg: str) -> None:
    if not servers:
        say(f"no SGLang or vLLM server found on {host_name}")
        return
    say(f"{'PID':>7}  {'USER':10} {'STARTED':19}  {'SERVER':20} {'VERSION':12} {'PORT':>5}  MODEL")
    for s in servers:
        say(f"{s.pid:>7}  {s.user[:10]:10} {_stamp(s.started_at):19}  {s.command.label[:20]:20} "
            f"{(s.version or '?')[:12]:12} {s.port if s.port is not None else '?':>5}  {s.parsed.model or '?'}")
        say(f"{'':9}python {s.python}   GPUs {_gpus_text(s)}")
        if s.launched_by_tunedash:
            if s.record is not None:
                source = s.record.profile_file or s.record_path
                say(f"{'':9}launched by tunedash: profile {s.record.profile} ({source}); "
                    f"`tunedash ui {s.record.profile_file or s.record.profile}` attaches to it")
            else:
                say(f"{'':9}launched by tunedash (TUNEDASH_JOB={s.tunedash_tag}), but no record of it was found")
        elif not s.mine:
            say(f"{'':9}not adoptable: {s.not_adoptable()}")
        if s.environ is None:
            say(f"{'':9}its environment cannot be read: GPUs come from the memory it holds")
        if s.shares_gpus_with:
            say(f"{'':9}shares GPUs with pid {', '.join(map(str, s.shares_gpus_with))}: two servers on one GPU set")
    where = f" {host_arg}" if host_arg else ""
    say(f"\nthe dashboard on one, as it runs: tunedash adopt{where} --pid PID; only its profile: tunedash "
        f"adopt{where} --pid PID --write FILE.toml")


async def cmd_adopt(args: argparse.Namespace) -> int:
    host, host_spec = adopt_host(args.host)
    customs = custom_profiles()
    commands = [(p.name, p.command) for p in customs]
    try:
        if args.write and args.pid is None:
            raise CliError("--write FILE needs --pid N: which server's profile to write (`tunedash adopt` lists them)")
        if args.pid is None:
            servers = await find_servers(host, custom_commands=commands)
            if args.json:
                say(json.dumps([server_json(s) for s in servers], indent=2))
            else:
                print_servers(servers, host.name, args.host or "")
            return EXIT_OK
        return await _one(args, host, host_spec, customs)
    finally:
        await host.close()


async def _one(args: argparse.Namespace, host: Host, host_spec: str, customs: list[Profile]) -> int:
    from app.core.adopt.scan import read_processes

    pid = args.pid
    others: dict[int, tuple[str, ...]] = {}
    servers = await find_servers(host, [pid], custom_commands=[(p.name, p.command) for p in customs])
    if not servers:
        await read_processes(host, [pid], others=others)
        if pid in others:
            import shlex

            shown = shlex.join(others[pid]) if others[pid] else "(no command line: a kernel thread)"
            listing = ("tunedash adopt " + (args.host or "")).strip()
            raise AdoptError(f"pid {pid} on {host.name} is not an SGLang or vLLM server (its command line: "
                             f"{shown[:300]}); `{listing}` lists the servers there")
        raise AdoptError(f"pid {pid}: no such process on {host.name} (it may have exited since it was listed)")
    server = servers[0]
    if not args.write and args.json:
        say(json.dumps(server_json(server), indent=2))
        return EXIT_OK
    if server.launched_by_tunedash:
        where = (f"profile {server.record.profile} ({server.record.profile_file})" if server.record
                 else f"TUNEDASH_JOB={server.tunedash_tag}, its record not found")
        if not args.write and server.record is not None and server.record.profile_file:
            say(f"pid {pid} on {host.name} was launched by tunedash ({where}): attaching to it")
            args.open_ui = server.record.profile_file  # `tunedash ui FILE`: its own record, nothing adopted
            return EXIT_OK
        raise AdoptError(f"pid {pid} on {host.name} was launched by tunedash ({where}): it has a profile already; "
                         f"`tunedash ui {server.record.profile_file if server.record else 'PROFILE'}` attaches to it")
    if not args.write:  # who else uses its GPUs: the servers there now, as the listing finds them
        from app.core.adopt.details import attach_gpus

        around = [s for s in await read_processes(host, custom_commands=[(p.name, p.command) for p in customs])
                  if s.pid != pid]
        await attach_gpus(host, [server, *around])
    if server.shares_gpus_with and not args.write:
        say(f"note: pid {', '.join(map(str, server.shares_gpus_with))} uses some of the same GPUs: a relaunch of "
            f"pid {pid} finds them held")
    if args.write:
        path = await asyncio.to_thread(_target, args.write, args.force)
    else:  # the dashboard on it: its profile in the user's profiles, so `tunedash ui adopted-PID` opens it again
        path = adopted_profile_path(pid)
    custom = next(((p.ready_regex, p.health_url) for p in customs if p.name == server.command.custom_profile), ("", ""))
    written = build_profile(server, host_spec, path, custom=custom)
    changed = await still_same(host, server.proof)
    if changed:
        raise AdoptError(f"{changed} while its profile was read; nothing was written")
    await asyncio.to_thread(_write, path, written.text, args.force or not args.write)
    if not args.write:
        print_servers([server], host.name, args.host or "")
        say(f"wrote {path}; opening the dashboard on pid {pid} (it keeps running: r or k asks before the first "
            "signal)")
        args.open_ui = str(path)
        return EXIT_OK
    if args.json:
        say(json.dumps({"written": str(path), "profile": written.profile.name, "unknown_flags": written.unknown_flags,
                        "notes": written.notes, "server": server_json(server)}, indent=2))
        return EXIT_OK
    say(f"wrote {path} from pid {pid} on {host.name} ({server.command.label} {server.version or ''})".rstrip())
    for flag in written.unknown_flags:
        say(f"  kept verbatim (not in the catalog): {flag}")
    for note in written.notes:
        say(f"  note: {note}")
    return EXIT_OK


def adopted_profile_path(pid: int) -> Path:
    """Where `adopt --pid N` (no --write) keeps the profile it opens the dashboard on: the user's profiles."""
    from app.core.profiles.loading import profile_dirs

    return profile_dirs()[0] / f"adopted-{pid}.toml"


def adopt_entry(args: argparse.Namespace) -> int:
    """`tunedash adopt`: the listing or the writing (async, as every command), then with `--pid N` alone the dashboard
    on the server's profile (`tunedash ui FILE`, which attaches to the running server and never restarts it)."""
    from app.cli.common import run_command

    args.open_ui = None
    code = asyncio.run(run_command(cmd_adopt(args)))
    if code != EXIT_OK or not args.open_ui:
        return code
    from app.tui.app import create_app

    profile = resolve_profile(args.open_ui)
    create_app(profile, probe=args.probe).run()
    return EXIT_OK


def _target(name: str, force: bool) -> Path:
    """The file to write, refused when it exists and --force is not given."""
    path = Path(name).expanduser()
    if path.exists() and not force:
        raise AdoptError(f"{path}: exists; choose another file or pass --force to overwrite it")
    if path.suffix != ".toml":
        raise AdoptError(f"{path}: a profile file ends in .toml (tunedash finds profiles by that name)")
    return path


def _write(path: Path, text: str, force: bool) -> None:
    """Write the profile through a temporary file; without --force a file that appeared meanwhile is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    if force:
        tmp.replace(path)
        return
    try:
        os.link(tmp, path)  # fails when the file exists: never overwritten without --force
    except FileExistsError:
        raise AdoptError(f"{path}: exists; choose another file or pass --force to overwrite it") from None
    finally:
        tmp.unlink(missing_ok=True)


def register(sub: Any) -> None:
    """Add `adopt` to the `tunedash` subparsers (app.cli.main calls this)."""
    p = sub.add_parser("adopt", help="list the SGLang/vLLM servers running on a host; open the dashboard on one "
                       "or write its profile")
    p.add_argument("host", nargs="?", help="this machine when omitted; sim, a profile, ssh://user@host:port or "
                   "an ~/.ssh/config alias")
    p.add_argument("--pid", type=int, help="one server: the dashboard on it (its profile written to "
                   "adopted-PID.toml in your profiles), or with --write FILE its profile only; with --json its details")
    p.add_argument("--probe", action="store_true", help="with --pid: start the dashboard with the probe load on")
    p.add_argument("--write", metavar="FILE", help="write the profile of --pid's server to FILE (a .toml)")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=adopt_entry)
