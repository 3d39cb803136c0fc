"""`tunedash trust HOST`: show an SSH host's key fingerprint and add it to known_hosts (asks y/N; --yes).

HOST is a profile (name or file) whose host is SSH, `ssh://user@host:port`, or an ~/.ssh/config alias. The
host is reached as the connection reaches it (HostName, Port, User, ProxyJump from ~/.ssh/config), and the
line is written for the name OpenSSH looks up (HostKeyAlias, else the HostName; `[name]:port` off port 22)
into the first UserKnownHostsFile (default ~/.ssh/known_hosts). A jump host that is not trusted yet is
refused with its own fingerprint and `tunedash trust JUMPHOST`. A key that differs from the one known_hosts
holds is refused: remove the old line first (the message names the file and line and says how).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from app.cli.common import EXIT_BAD_INPUT, EXIT_OK
from app.core.hosts.base import HostError
from app.core.hosts.ssh_options import ALIAS, SshTarget, settings_for
from app.core.hosts.ssh_trust import add_known_host, changed_message, inspect_host_key
from app.core.profiles.loading import resolve_profile
from app.core.profiles.types import ProfileError


def _spec(name: str) -> str:
    if name.startswith("ssh://"):
        return name
    try:
        host = resolve_profile(name).host
    except ProfileError:
        if ALIAS.fullmatch(name):
            return name  # an ssh config alias
        raise
    if host in ("sim", "local"):
        raise HostError(f"profile {name} runs on host {host!r}, not over SSH: there is no host key to trust")
    return host


async def cmd_trust(args: argparse.Namespace) -> int:
    spec = _spec(args.host)
    settings = await asyncio.to_thread(settings_for, SshTarget.parse(spec), {})
    request = await inspect_host_key(settings)
    print(f"{request.host} presents the host key {request.fingerprint}", flush=True)
    if request.status == "trusted":
        print(f"already trusted in {request.known_hosts_file}")
        return EXIT_OK
    if request.status in ("changed", "revoked"):
        print(f"tunedash: {changed_message(request)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args.yes:
        if not sys.stdin.isatty():
            print("tunedash: not asking without a terminal; compare the fingerprint with the host's own key, then "
                  f"run `tunedash trust {args.host} --yes`", file=sys.stderr)
            return EXIT_BAD_INPUT
        answer = await asyncio.to_thread(input, f"Add it to {request.known_hosts_file}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not trusted; nothing changed")
            return EXIT_BAD_INPUT
    add_known_host(request)
    print(f"added {request.host} to {request.known_hosts_file}")
    return EXIT_OK


def register(sub: Any) -> None:
    """Add the `trust` command to the CLI's subparsers."""
    p = sub.add_parser("trust", help="show an SSH host's key fingerprint and add it to known_hosts")
    p.add_argument("host", help="a profile with an SSH host, ssh://user@host:port, or an ~/.ssh/config alias")
    p.add_argument("--yes", action="store_true", help="trust without asking (scripts; check the fingerprint first)")
    p.set_defaults(func=cmd_trust)
