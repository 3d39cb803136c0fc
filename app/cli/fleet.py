"""`tunedash fleet [PROFILE ...]`: every server of many profiles on one screen (app.tui.fleet, app.core.fleet).

No PROFILE: every profile `tunedash profiles` lists. A profile that cannot be read, or whose host cannot be made,
is named under the table with its error; the others still show.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from app.cli.common import EXIT_OK, CliError
from app.connect import fleet_hosts
from app.core.hosts.base import Host
from app.core.profiles.loading import find_profiles, resolve_profile
from app.core.profiles.types import Profile, ProfileError


def fleet_profiles(names: list[str]) -> tuple[list[Profile], list[str]]:
    """The profiles named (or every one found) and, for those that could not be read, "NAME: error" lines."""
    wanted = names or [str(path) for _name, path in find_profiles()]
    profiles: list[Profile] = []
    broken: list[str] = []
    seen: set[str] = set()
    for name in wanted:
        try:
            profile = resolve_profile(name)
        except ProfileError as exc:
            if names:  # named on the command line: a typo is an error, as in every command
                raise
            broken.append(f"{name}: {exc}")
            continue
        if str(profile.source) not in seen:
            seen.add(str(profile.source))
            profiles.append(profile)
    return profiles, broken


def cmd_fleet(args: argparse.Namespace) -> int:
    from app.tui.fleet import run_fleet

    profiles, broken = fleet_profiles(list(args.profiles))
    members: list[tuple[Profile, Host]] = []
    for profile, host in fleet_hosts(profiles):
        if isinstance(host, ProfileError):
            broken.append(f"{profile.name}: {host}")
        else:
            members.append((profile, host))
    if not members:
        raise CliError("no profile to show: " + ("; ".join(broken) if broken else
                                                  "`tunedash profiles` finds none; name profile files"))
    asyncio.run(run_fleet(members, broken))
    return EXIT_OK


def register(sub: Any) -> None:
    """Add `fleet` to the `tunedash` subparsers (app.cli.main calls this)."""
    p = sub.add_parser("fleet", help="every server of many profiles at once (Enter: its dashboard, Escape: back)")
    p.add_argument("profiles", nargs="*", metavar="PROFILE", help="profiles to show (default: every one found)")
    p.set_defaults(func=cmd_fleet)
