"""The `serve` command: the dashboard in a browser, one read-only dashboard process per tab (app.web).

Each tab runs `tunedash ui PROFILE --watch --tuning-flags-only` (`--readonly` too under `serve --readonly`; no
`--tuning-flags-only` under `serve --allow-all-flags`): it starts read-only, the header says who drives, T takes
the driver lock over unless serving read-only, and a relaunch from a tab takes only the catalog's tuning flags
(none that fetch or run code). Registered by app.cli.main through `register`; exit codes come from
app.cli.common.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import secrets
import signal
import socket
import sys
from typing import Any

from app.cli.common import EXIT_OK, CliError, load_profile, say
from app.core.errors import Reason
from app.web import DEFAULT_MAX_TABS, PATH_PREFIX, AccessGate, DashboardServer, listen, serve

DEFAULT_PORT = 8765
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def tab_argv(profile_file: str, *, readonly: bool, all_flags: bool = False) -> list[str]:
    """The command each browser tab runs: this interpreter's tunedash, watching the profile's server, offering
    only the catalog's tuning flags unless `all_flags`."""
    argv = [sys.executable, "-m", "app", "ui", profile_file, "--watch"]
    if not all_flags:
        argv.append("--tuning-flags-only")
    return [*argv, "--readonly"] if readonly else argv


def page_url(host: str, port: int, token: str) -> str:
    """The URL to open: the host as the browser must name it (this machine's name for a wildcard bind)."""
    shown = socket.gethostname() if host in WILDCARD_HOSTS else host
    if ":" in shown:
        shown = f"[{shown}]"  # an IPv6 address
    return f"http://{shown}:{port}{PATH_PREFIX}{token}/"


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or a CliError naming the port or host and what to do (before any URL is printed)."""
    try:
        return listen(host, port)
    except socket.gaierror as exc:
        raise CliError(f"--host {host}: not an address of this machine ({exc.strerror}); "
                       "use 127.0.0.1 (the default) or one of this machine's addresses") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CliError(f"port {port} on {host} is taken (another `tunedash serve`, or another program, listens "
                           f"there): stop it, or serve on another port with --port N (--port 0 picks a free one)",
                           Reason.PORT_IN_USE) from None
        if exc.errno == errno.EACCES:
            raise CliError(f"port {port} on {host}: permission denied (ports under 1024 need root); "
                           "pick another with --port N") from None
        raise CliError(f"--host {host} --port {port}: cannot listen there ({exc.strerror}); "
                       "use 127.0.0.1 (the default) or one of this machine's addresses") from None


async def cmd_serve(args: argparse.Namespace) -> int:
    profile = load_profile(args)  # a bad profile is refused here, not in every tab
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port}: a port is 0 (any free one) to 65535")
    if not 1 <= args.max_tabs <= 1000:
        raise CliError(f"--max-tabs {args.max_tabs}: the number of tabs open at once is 1 to 1000 "
                       f"(default {DEFAULT_MAX_TABS}); each tab runs its own dashboard process")
    sock = bind(args.host, args.port)
    port = int(sock.getsockname()[1])
    token = secrets.token_urlsafe(24)
    argv = tab_argv(str(profile.source), readonly=args.readonly, all_flags=args.allow_all_flags)
    server = DashboardServer(argv, AccessGate(token), title=f"tunedash · {profile.name}", max_tabs=args.max_tabs)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    def started() -> None:
        mode = "read-only (no tab may take over)" if args.readonly else "read-only until T takes the driver lock"
        flags = "every flag" if args.allow_all_flags else "tuning flags only"
        say(f"tunedash serve: {profile.name}'s dashboard, one process per browser tab (at most {args.max_tabs}), "
            f"each {mode}, {flags}")
        say(f"  open {page_url(args.host, port, token)}")
        if args.host in ("127.0.0.1", "localhost", "::1"):
            say(f"  from another machine: ssh -N -L {port}:127.0.0.1:{port} {socket.gethostname()}, then open the "
                f"URL with 127.0.0.1 there")
        else:
            say(f"  listening on {args.host}: anyone who can reach it and has the URL can watch"
                f"{'' if args.readonly else ' and take over'}")
        say("  Ctrl+C stops serving; the server keeps running")

    try:
        await serve(server, sock, stop, started)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):  # only a loop already closed raises here: nothing to undo
                loop.remove_signal_handler(signum)
    return EXIT_OK


def register(sub: Any) -> None:
    """Add the `serve` command to the CLI's subparsers."""
    p = sub.add_parser("serve", help="the dashboard in a browser (textual-serve), behind an access token")
    p.add_argument("profile", help="a profile name (`tunedash profiles`) or a profile file")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: share it with an SSH port forward)")
    p.add_argument("--readonly", action="store_true", help="every tab only watches: none may take over")
    p.add_argument("--max-tabs", type=int, default=DEFAULT_MAX_TABS, metavar="N",
                   help=f"browser tabs open at once, each its own dashboard process (default {DEFAULT_MAX_TABS}); "
                        "one more is answered 503")
    p.add_argument("--allow-all-flags", action="store_true",
                   help="let tabs set every flag, also those that fetch or run code (trust-remote-code, "
                        "model/tokenizer paths, loaders); by default a tab offers only the catalog's tuning flags")
    p.set_defaults(func=cmd_serve)
