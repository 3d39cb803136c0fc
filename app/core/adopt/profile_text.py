"""A profile's TOML written from a running server (`tunedash adopt --pid N --write FILE`), checked by loading it.

What goes in: host, python, module (or `script` for the console form), model, port, gpus (CUDA_VISIBLE_DEVICES
when the environment can be read, else the GPUs holding its memory, with a note), the environment that matters
(SGLANG_*, VLLM_*, CUDA_*, NCCL_*, HF_*, OMP_*, and PYTHONPATH, which decides what `-m MODULE` imports; names
that look like secrets, HF_TOKEN, are left out and named), every flag under [flags] typed by the catalog, and
what the catalog does not know verbatim in `extra_args`, named in a comment. A header says where, from which
process and when. The text is loaded back (the same reader as every profile) and its argv compared with the
server's before anything is written.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from app.core.adopt.command import classify, parse_server_args
from app.core.adopt.scan import PROFILE_ENV_PREFIXES, SECRET, AdoptableServer, visible_indices
from app.core.errors import Reason, TunedashError
from app.core.profiles.render import launch_argv
from app.core.profiles.schema import SIMPLE_NAME, ProfileReader
from app.core.profiles.types import Profile, ProfileError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SIM_ENV = {"TUNEDASH_SIM_STATE": "sim_state", "TUNEDASH_SIM_SGLANG_VERSION": "sim_version",
            "TUNEDASH_SIM_GPUS": "sim_gpus"}


class AdoptError(TunedashError):
    """A server that cannot be adopted or written as asked; the message names the host, pid or file."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Reason.BAD_INPUT)


@dataclass(frozen=True)
class WrittenProfile:
    """The TOML text and what loading it gave."""

    text: str
    profile: Profile
    unknown_flags: list[str]
    notes: list[str]


def toml_value(value: object) -> str:
    """One TOML value: strings as basic strings, numbers, booleans, inline tables and arrays."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
            raise AdoptError(f"the value {value!r} holds bytes that are not UTF-8; a profile cannot hold it")
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise AdoptError(f"a profile cannot hold the value {value!r}")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_value(key)


def _comment(text: str) -> list[str]:
    """Comment lines for any text (control characters shown escaped: a TOML comment cannot hold them)."""
    clean = "".join(ch if ch.isprintable() or ch in "\t\n" else repr(ch)[1:-1] for ch in text)
    return [f"# {line}".rstrip() for line in clean.splitlines() or [""]]


def _stamp(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if at is not None else "(unknown)"


def profile_name(path: Path) -> str:
    """The profile's name: the file's stem when it is a simple name, else "adopted"."""
    return path.stem if SIMPLE_NAME.fullmatch(path.stem) else "adopted"


def profile_text(server: AdoptableServer, host_spec: str, path: Path, *, now: float | None = None,
                 custom: tuple[str, str] = ("", "")) -> tuple[str, list[str], list[str]]:
    """The TOML of a profile for `server` on `host_spec` (what the profile's `host` says), the unknown flags
    kept verbatim and the notes said in it. `custom` is the (ready_regex, health_url) of the custom profile
    whose command it runs."""
    command, parsed = server.command, server.parsed
    notes: list[str] = list(parsed.notes)
    if server.python_note:
        notes.append(server.python_note)
    if command.python_options:
        notes.append(f"python options {' '.join(command.python_options)} are not kept (a profile runs python -m)")
    environ = server.environ
    env: dict[str, str] = {}
    secrets: list[str] = []
    sim: dict[str, str] = {}
    gpus: list[int] | None
    if environ is None:
        notes.append(f"/proc/{server.pid}/environ could not be read (another user's process?): no [env], and gpus "
                     "are the GPUs holding its memory")
        gpus = sorted(server.gpus.mib) if server.gpus.mib else None
        if gpus is None:
            notes.append(f"its GPUs could not be read either ({server.gpus.reason}): gpus left to the default")
    else:
        for name, value in sorted(environ.items()):
            if name in _SIM_ENV and command.simulated:
                sim[_SIM_ENV[name]] = value
            elif name.startswith(PROFILE_ENV_PREFIXES) or (name == "PYTHONPATH" and not command.simulated):
                if SECRET.search(name):
                    secrets.append(name)
                else:
                    env[name] = value
        visible = visible_indices(environ.get("CUDA_VISIBLE_DEVICES"))
        if visible is not None:
            env.pop("CUDA_VISIBLE_DEVICES")
            gpus = visible
        else:
            gpus = []  # it sees every GPU (or CUDA_VISIBLE_DEVICES names UUIDs: kept in [env])
            if "CUDA_VISIBLE_DEVICES" not in environ and server.gpus.mib:
                notes.append(f"no CUDA_VISIBLE_DEVICES: it sees every GPU (it holds memory on "
                             f"{', '.join(map(str, sorted(server.gpus.mib)))}); gpus = [] keeps it so")
    if secrets:
        notes.append(f"left out (secrets; set them in the environment): {', '.join(secrets)}")
    if server.shares_gpus_with:
        notes.append(f"pid {', '.join(map(str, server.shares_gpus_with))} uses some of the same GPUs")
    host = host_spec
    if command.simulated and "sim_state" in sim and host_spec in ("local", "sim"):
        host = "sim"
    lines = [
        f"# {path.name}: written by `tunedash adopt` at {_stamp(now if now is not None else time.time())} from pid "
        f"{server.pid} on {host_spec},",
        f"# user {server.user}, started {_stamp(server.started_at)}, {server.command.label} "
        f"{server.version or '(version unknown)'}. Its command line:",
        *_comment("  " + shlex.join(command.argv)),
    ]
    if parsed.unknown:
        lines += _comment(f"Not in the flag catalog, kept verbatim in extra_args: {', '.join(parsed.unknown)}")
    for note in notes:
        lines += _comment(f"Note: {note}")
    lines += ["", f"name = {toml_value(profile_name(path))}", f"host = {toml_value(host)}",
              f"backend = {toml_value(command.backend)}"]
    if command.backend == "custom":
        lines.append(f"command = {toml_value(list(command.argv))}")
        ready_regex, health = custom
        if ready_regex:
            lines.append(f"ready_regex = {toml_value(ready_regex)}")
        if health:
            lines.append(f"health_url = {toml_value(health)}")
    else:
        lines.append(f"python = {toml_value(server.python)}")
        if command.script:
            lines.append(f"script = {toml_value(list(command.script))}")
        else:
            lines.append(f"module = {toml_value(command.module)}")
        lines.append(f"model = {toml_value(parsed.model)}")
        if parsed.port is not None:
            lines.append(f"port = {parsed.port}")
    if gpus is not None:
        lines.append(f"gpus = {toml_value(gpus)}")
    for key, value in sim.items():
        lines.append(f"{key} = {toml_value(value)}")
    if parsed.extra:
        lines.append(f"extra_args = {toml_value(parsed.extra)}")
    if env:
        lines += ["", "[env]", *(f"{toml_key(k)} = {toml_value(v)}" for k, v in env.items())]
    if parsed.flags:
        lines += ["", "[flags]", *(f"{toml_key(k)} = {toml_value(v)}" for k, v in parsed.flags.items())]
    return "\n".join(lines) + "\n", list(parsed.unknown), notes


def build_profile(server: AdoptableServer, host_spec: str, path: Path, *, now: float | None = None,
                  custom: tuple[str, str] = ("", "")) -> WrittenProfile:
    """profile_text, loaded back, its argv checked against the server's (flags in any order); AdoptError when
    the written profile would not load or would launch another command line (nothing is written then)."""
    text, unknown, notes = profile_text(server, host_spec, path, now=now, custom=custom)
    try:
        profile = ProfileReader(path).read(tomllib.loads(text))
        rendered = launch_argv(profile)
    except (ProfileError, tomllib.TOMLDecodeError) as exc:
        raise AdoptError(f"the profile written for pid {server.pid} does not load ({exc}); nothing was written. "
                         "Please report this with the server's command line") from None
    difference = argv_difference(server.command.argv, rendered, server)
    if difference:
        raise AdoptError(f"the profile written for pid {server.pid} would launch another command line ({difference}); "
                         "nothing was written. Please report this with the server's command line")
    return WrittenProfile(text, profile, unknown, notes)


def argv_difference(original: tuple[str, ...], rendered: list[str], server: AdoptableServer) -> str:
    """What differs between the server's argv and a profile's rendered argv, order of flags aside ("" if none)."""
    if server.command.backend == "custom":
        return "" if list(original) == rendered else f"{shlex.join(rendered)!r}"
    again = classify(rendered)
    if again is None:
        return f"{shlex.join(rendered)!r} is not a server command line"
    if (again.module, again.script[1:]) != (server.command.module, server.command.script[1:]):
        return f"launched as {again.label} {again.module or ' '.join(again.script)}"
    if rendered[0] != server.python:
        return f"python {rendered[0]!r}"
    before, after = server.parsed, parse_server_args(again)
    for what, a, b in (("model", before.model, after.model), ("port", before.port, after.port),
                       ("flags", before.flags, after.flags), ("verbatim arguments", before.extra, after.extra)):
        if a != b:
            return f"{what}: {a!r} -> {b!r}"
    return ""

