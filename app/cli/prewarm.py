"""`tunedash prewarm PROFILE`: read the model's safetensors files into the host's page cache, with progress.

The residency before and after comes from app.core.telemetry.pagecache (mincore). On a terminal the progress is
one line redrawn in place; into a pipe it is a plain line per file. Where the installed SGLang offers
`--weight-loader-prefetch-checkpoints` (0.5.12 and later, 0.5.23 included), it says so: the server can fill the
page cache itself at launch (each rank a share of the shards; meant for network storage). A profile that sets
`--weight-loader-drop-cache-after-load` empties the cache again after every load, and that is said too.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from app.cli.common import EXIT_BAD_INPUT, EXIT_OK, load_profile, open_host, say
from app.core.flags.discovery import discover_flags
from app.core.profiles.render import launch_env
from app.core.profiles.types import Profile
from app.core.telemetry.pagecache import GIB, PrewarmProgress, prewarm, read_page_cache, size_text

PREFETCH_FLAG = "weight-loader-prefetch-checkpoints"
DROP_FLAG = "weight-loader-drop-cache-after-load"
BAR_WIDTH = 30


def progress_printer(terminal: bool, files: int) -> Any:
    """The progress callback: a bar redrawn in place on a terminal, a line per finished file into a pipe."""
    finished = 0

    def show(update: PrewarmProgress) -> None:
        nonlocal finished
        share = update.done_bytes / update.total_bytes if update.total_bytes else 1.0
        rate = update.done_bytes / GIB / update.elapsed_s if update.elapsed_s > 0 else 0.0
        finished += update.file_done
        if terminal:
            filled = int(share * BAR_WIDTH)
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            sys.stdout.write(f"\r[{bar}] {share:4.0%} {size_text(update.done_bytes, update.total_bytes)} of "
                             f"{size_text(update.total_bytes)}, {rate:.2f} GiB/s, file {min(finished + 1, files)}/"
                             f"{files}\x1b[K")
            sys.stdout.flush()
        elif update.file_done:
            name = update.path.rsplit("/", 1)[-1]
            say(f"read {name}: {finished}/{files} files, {size_text(update.done_bytes, update.total_bytes)} of "
                f"{size_text(update.total_bytes)} ({share:.0%}), {rate:.2f} GiB/s")

    return show


async def prefetch_note(profile: Profile, host: Any) -> list[str]:
    """What to say about the server's own prefetch flag, where the installed SGLang has it."""
    if profile.backend != "sglang":
        return []
    found = await discover_flags(host, profile.backend, profile.python, profile.module, launch_env(profile))
    notes = []
    if found.flags is not None and PREFETCH_FLAG in found.flags and not profile.flags.get(PREFETCH_FLAG):
        notes.append(f"note: SGLang {found.version or ''} on {host.name} can prefetch the checkpoint into the page "
                     f"cache itself at launch: --{PREFETCH_FLAG} (each rank reads a share of the shards; meant for "
                     f"network storage), e.g. `tunedash launch {profile.name} --set {PREFETCH_FLAG}=true`")
    if profile.flags.get(DROP_FLAG):
        notes.append(f"note: the profile sets --{DROP_FLAG}: the server empties the page cache of each shard after "
                     "loading it, so the next launch reads from disk again")
    return notes


async def cmd_prewarm(args: argparse.Namespace) -> int:
    profile = load_profile(args)
    host = open_host(profile)
    before = await read_page_cache(host, profile.model)
    if before.fraction is None:
        say(f"prewarm {profile.name}: the page cache cannot be read: {before.reason}")
        say("  prewarm reads a model that is a folder of .safetensors files on the host (the profile's `model`)")
        return EXIT_BAD_INPUT
    say(f"before: {before.describe()} on {host.name}")
    if args.check:
        for note in await prefetch_note(profile, host):
            say(note)
        return EXIT_OK
    terminal = sys.stdout.isatty()
    seconds = await prewarm(host, before, progress_printer(terminal, len(before.files)))
    if terminal:
        sys.stdout.write("\n")
    after = await read_page_cache(host, profile.model)
    rate = (before.total_bytes or 0) / GIB / seconds if seconds > 0 else 0.0
    say(f"after: {after.describe()}; read in {seconds:.1f} s ({rate:.2f} GiB/s)")
    if after.fraction is not None and after.fraction < 0.99:
        say("  not all of it stayed: the host's free memory is smaller than the model, or something else evicts it")
    for note in await prefetch_note(profile, host):
        say(note)
    return EXIT_OK


def register(sub: Any) -> None:
    """Add `prewarm` to the `tunedash` subparsers (app.cli.main calls this)."""
    p = sub.add_parser("prewarm", help="read the model's safetensors files into the host's page cache")
    p.add_argument("profile")
    p.add_argument("--check", action="store_true", help="only say how much is in the page cache now")
    p.set_defaults(func=cmd_prewarm)
