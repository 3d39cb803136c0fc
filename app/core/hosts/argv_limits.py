"""The argument limits a detached launch must fit (Linux's ARG_MAX and MAX_ARG_STRLEN), checked before a relaunch
kills anything: a 200 KB flag value is refused naming the flag instead of ending in E2BIG with the server gone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

MAX_ARG_STRLEN = 131072  # Linux: the most bytes one argument or environment string may hold, its NUL included
ARG_MAX_FALLBACK = 2 * 1024 * 1024  # Linux's usual ARG_MAX (a quarter of an 8 MiB stack) where sysconf is silent
DETACH_SCRIPT_ROOM = "x" * 160  # what the detach script (app.core.hosts.detach) and its words add
PROGRAM_SCRIPT = 'case "$1" in */*) [ -f "$1" ] && [ -x "$1" ];; *) command -v -- "$1" >/dev/null 2>&1;; esac'
"""$1 exists as an executable (a path) or is found on PATH (a name): exit 0; else non-zero."""


def _flag_of(argv: Sequence[str], index: int) -> str:
    """The flag argument `index` belongs to: "--name" for a value after it or for `--name=value`, else "argument N"."""
    item = argv[index]
    if item.startswith("--"):
        return item.split("=", 1)[0]
    if index > 0 and argv[index - 1].startswith("--"):
        return argv[index - 1]
    return f"argument {index}"


def argv_size_problem(
    argv: Sequence[str], log_path: str, env: Mapping[str, str], *, arg_max: int, where: str
) -> str:
    """Why the detached launch of `argv` would fail with E2BIG ("" when it fits): an argument or an environment
    value over MAX_ARG_STRLEN, or everything together over `arg_max` (the host's ARG_MAX less what its own
    environment takes). Over SSH too the command reaches exec(2) as separate arguments (the script goes to
    /bin/sh on stdin: docs/decisions.md#ssh-commands-through-a-fixed-binsh), so the same limits hold. Said
    before anything is killed, naming the flag."""
    limit = MAX_ARG_STRLEN - 1
    for index, item in enumerate(argv):
        size = len(item.encode())
        if size > limit:
            return (f"{where}: {_flag_of(argv, index)} is {size} bytes; Linux takes at most {limit} bytes in one "
                    "argument (MAX_ARG_STRLEN), so the launch would fail: shorten it (a long JSON value can often "
                    "go in a file the server reads); nothing was stopped or started")
    for name, value in env.items():
        if len(f"{name}={value}".encode()) > limit:
            return (f"{where}: the environment variable {name} is {len(value.encode())} bytes; Linux takes at most "
                    f"{limit} bytes in one (MAX_ARG_STRLEN): shorten it; nothing was stopped or started")
    words = ["sh", "-c", DETACH_SCRIPT_ROOM, "sh", log_path, "env", *(f"{k}={v}" for k, v in env.items()), *argv]
    total = sum(len(word.encode()) + 1 + 8 for word in words)  # each string, its NUL and its pointer
    if total > arg_max:
        return (f"{where}: the launch command is {total} bytes, over the host's limit of {arg_max} (ARG_MAX less its "
                "environment): shorten the flag values; nothing was stopped or started")
    return ""
