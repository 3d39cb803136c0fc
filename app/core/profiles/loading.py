"""Profiles: TOML files -> validated, frozen Profile; finding them by name or path; --set/--unset overrides.

Profile TOML schema (every key; anything else is an error naming the file and the key):

    name        str        display name                      default: the file name without .toml
    description str        one line shown in lists           default: ""
    host        str        "sim" | "local" | "ssh://[user@]host[:port]" | an ssh config alias
                                                             default: "local"
    backend     str        "sglang" | "vllm" | "custom"      required
    python      str        interpreter on the host           default: "python3"; host "sim": this Python
    module      str        module run with `python -m`       default: host "sim" + sglang: app.sim.sglang;
                                                             sglang: sglang.launch_server;
                                                             vllm: vllm.entrypoints.openai.api_server
    model       str        weights (HF id or folder)         required (custom: optional); rendered as
                                                             --model-path (sglang) or --model (vllm)
    port        int        server port                       default: 30000 (sglang), 8000 (vllm);
                                                             custom: none (no port check, no probes)
    gpus        [int]      GPU indices the server uses       default: 0..tp-1 (tp-size/tensor-parallel-size)
    env         {str=str}  extra environment of the server   default: {}
    sim_state   str        state folder of the simulated host (relative: to the profile's folder)
                                                             default: unset (the simulator decides)
    ready_timeout int      seconds a relaunch waits for READY  default: 600 (the CLI's --ready-timeout)
    sim_version str        SGLang release the simulated host plays: "0.5.10" (default) or "0.5.23"
    sim_gpus    str        the simulated host's GPUs: "2xA6000" (default: SM 8.6, PCIe) or "2xH200" (SM 9.0, NVLink)
    script      [str]      a console-script launch instead of `python -m module`, e.g.
                           ["/venv/bin/vllm", "serve"]: argv = python SCRIPT... then the model (vllm: as
                           the positional MODEL, `vllm serve MODEL`; sglang: --model-path) and the flags;
                           module still names the server module that discovery asks (`--help`)
                                                             default: unset (python -m module)
    warm        bool       keep the weights in the backend's weight cache daemon across relaunches (SGLang
                           0.5.23+ `--weight-cache-mode client`, vLLM `ipc_cache` + `vllm preload`;
                           app.core.server.warm); for custom, a [warm] table instead   default: false
    [warm]      backend = "custom" only: the daemon tunedash starts first and keeps across relaunches
                daemon = [argv] (placeholders as in command), ready_regex = "a line of its log" and/or
                ready_file = "/abs/path it writes once ready" (newer than its start), client_args = [argv
                items after command when warm]; its cache key is the daemon's rendered argv
    extra_args  [str]      argv items passed verbatim after the flags (flags the catalog does not know;
                           `tunedash adopt` writes them and lists them in a comment)   default: []
    [flags]     flag = value, full flag names without "--" (aliases accepted and normalised); values
                typed by the catalog (app.core.flags.catalog); JSON flags as inline tables, e.g.
                speculative-config = { method = "ngram", num_speculative_tokens = 3 }.
                model-path/model and port are top-level keys, not flags.
    [toggles]   merged over the backend's built-in toggles (app.core.flags.toggles), keyed by the key character:
                [toggles.s] label = "steps", cycle = "speculative-num-steps", values = [1, 2, 3]
                [toggles.g] label = "pcg", flip = "enforce-piecewise-cuda-graph"
                [toggles.m] label = "mem", set = "mem-fraction-static", value = 0.85
                [toggles.o] cycle = ["disable-overlap-schedule", "enable-single-batch-overlap"],
                            values = [[false, false], [false, true]], names = ["sched", "sched+sbo"]
                optional in each: label (default: the flag), names, default (the value(s) the server
                uses when the flag is unset), requires (a flag that must be set), help.
                `g = false` removes a built-in toggle.
    [bench]     concurrency (4), requests (32), input_len (512), output_len (256), warmup (2 requests),
                trials (3, per launch), launches (2, per A/B arm), endpoint ("completions" | "chat",
                "completions"), seed (0),
                slo_ttft_ms, slo_tpot_ms (numbers of ms, unset: no goodput): a request meets the SLOs
                when its TTFT and its time per output token are at most these; goodput = such requests/s
    [tune]      what `tunedash tune` races: [tune.flags] (flag = [values]), [tune.toggles] (key = [state names]),
                shapes, exclude, objective, constraints, budget; every key in app.core.profiles.tune_table

backend = "custom" (any server: TGI, llama.cpp, your own; or a stand-in such as scripts/gpu_hog.py):

    command     [str]      the argv to run, required     {port}, {model}, {python} (the profile's python)
                                                         and {profile_dir} (the profile file's folder) are
                                                         substituted in each item; other {names} are errors
    ready_regex str        a regex searched in each log line; the first match is READY
    health_url  str        an http(s) URL ({port} substituted) polled until it answers 200
                           At least one of the two. Both: the log line is READY, the URL confirms it (like
                           /health for SGLang). Only health_url: READY when it first answers 200.
    module is an error; model and port are optional (then {model}/{port} cannot be used). There is no flag
    catalog and no toggle: [flags] are free-form (app.core.flags.values: any name, a bool/number/string value,
    rendered as --name value after the command, in the file's order; false renders nothing), and
    `--set name=value` adds or changes one. The log keeps the generic fatal detection (tracebacks, OOM,
    "address already in use"); SGLang/vLLM phases and throughput lines are not read.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import platformdirs

import app
from app.core.flags.catalog import FlagSpec
from app.core.flags.toggles import default_toggles, merge_toggles, sync_draft_tokens
from app.core.flags.values import FlagError, lookup_flag, parse_json_scalar, parse_value, set_flag, unknown_flag_message
from app.core.profiles.schema import RESERVED_FLAGS, ProfileReader
from app.core.profiles.types import Profile, ProfileError

# ---------------------------------------------------------------- loading


def load_profile(path: Path) -> Profile:
    """Read and validate one profile file. Raises ProfileError naming the file, the key and the fix."""
    try:
        raw = Path(path).read_bytes()
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ProfileError(f"{path}: cannot read the profile: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ProfileError(f"{path}:{line}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); "
                           "save the profile as UTF-8") from None
    return parse_profile(text, Path(path))


def parse_profile(text: str, source: Path) -> Profile:
    """Validate TOML `text` as the profile file `source`."""
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise ProfileError(f"{source}:{line}: a NUL byte; a profile is TOML text, remove it")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        where = re.search(r"\(at line (\d+), column (\d+)\)", message)
        if where:
            detail = message[: where.start()].strip()
            raise ProfileError(f"{source}:{where[1]}:{where[2]}: invalid TOML: {detail} "
                               f"(line {where[1]}, column {where[2]})") from None
        raise ProfileError(f"{source}: invalid TOML: {message}") from None
    except RecursionError:
        raise ProfileError(f"{source}: invalid TOML: arrays or tables nested too deeply") from None
    return ProfileReader(source).read(data)


# ---------------------------------------------------------------- finding


def profile_dirs() -> list[Path]:
    """Where profiles are looked up, first match wins: the user's config dir, then the shipped ones."""
    user = Path(platformdirs.user_config_dir("tunedash")) / "profiles"
    package = Path(app.__file__).parent
    shipped = package.parent / "profiles"
    if not shipped.is_dir():
        shipped = package / "_profiles"  # wheel install: pyproject force-includes profiles/ here
    return [user, shipped]


def find_profiles(dirs: Sequence[Path] | None = None) -> list[tuple[str, Path]]:
    """(name, path) of every *.toml profile, sorted by name; a user's file shadows a shipped one."""
    found: dict[str, Path] = {}
    for folder in profile_dirs() if dirs is None else dirs:
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                found.setdefault(path.stem, path)
    return sorted(found.items())


def resolve_profile(name_or_path: str, dirs: Sequence[Path] | None = None) -> Profile:
    """Load a profile from a path ("./my.toml") or by name ("demo"); an unknown name lists the known ones."""
    if "://" in name_or_path:  # `tunedash ui ssh://host`: a host, where a profile (which names one) belongs
        raise ProfileError(
            f"{name_or_path!r} is a host, not a profile: write a profile (see `tunedash profiles`) with "
            f'host = "{name_or_path}" and pass its name or path'
        )
    path = Path(name_or_path).expanduser()
    if path.suffix == ".toml" or "/" in name_or_path or path.is_file():
        if not path.is_file():
            raise ProfileError(f"{path}: no such profile file")
        return load_profile(path)
    available = find_profiles(dirs)
    for name, found in available:
        if name == name_or_path:
            return load_profile(found)
    names = [name for name, _ in available]
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    searched = ", ".join(str(d) for d in (profile_dirs() if dirs is None else dirs))
    raise ProfileError(f"no profile named {name_or_path!r}; {hint}available: {', '.join(names) or 'none'} "
                       f"(searched {searched})")


# ---------------------------------------------------------------- overrides


def apply_overrides(profile: Profile, sets: Sequence[str], unsets: Sequence[str]) -> Profile:
    """The profile with `--set FLAG=VALUE` and `--unset FLAG` applied (sets first, then unsets).

    FLAG is a full flag name or alias, with or without the leading "--". VALUE is typed by the catalog:
    booleans take true or false, numbers and choices as written, JSON flags take JSON text
    (`speculative-config={"method":"ngram","num_speculative_tokens":3}`), and one key of a JSON flag is set
    with a dotted name (`speculative-config.num_speculative_tokens=3`; the value is read as JSON when it
    parses, else as text). `port=N` and `model-path=X` (vLLM: `model=X`) set the profile's port and model.
    Setting --speculative-num-steps alone keeps --speculative-num-draft-tokens at steps + 1 when topk is 1
    (what SGLang forces anyway). Unsetting an absent flag is not an error. Bad input raises ProfileError
    naming the flag.
    """
    flags = dict(profile.flags)
    top: dict[str, Any] = {}
    set_names: set[str] = set()
    for item in sets:
        name, sep, text = item.partition("=")
        bare = name.strip().lstrip("-")
        if not sep or not bare:
            raise ProfileError(f"--set {item!r}: expected FLAG=VALUE, e.g. --set speculative-num-steps=3")
        head, dot, sub = bare.partition(".")
        spec = _override_spec(profile.backend, head, f"--set {bare}")
        if spec.name in RESERVED_FLAGS:
            top[RESERVED_FLAGS[spec.name]] = _reserved_value(spec, text, bare)
            continue
        try:
            if dot:
                if spec.kind != "json" or not sub:
                    raise FlagError(f"--{spec.name} is not a JSON flag, so it has no key {sub!r}")
                flags = set_flag(flags, f"{spec.name}.{sub}", parse_json_scalar(text))
            else:
                value = parse_value(spec, text)
                flags = set_flag(flags, spec.name, None if value is False and not spec.negatable else value)
        except FlagError as exc:
            raise ProfileError(f"--set {bare}: {exc}") from None
        set_names.add(spec.name)
    if "speculative-num-steps" in set_names and "speculative-num-draft-tokens" not in set_names:
        flags = sync_draft_tokens(flags)
    for item in unsets:
        bare = item.strip().lstrip("-")
        head, dot, sub = bare.partition(".")
        spec = _override_spec(profile.backend, head, f"--unset {bare}")
        if spec.name in RESERVED_FLAGS:
            raise ProfileError(f"--unset {bare}: the {RESERVED_FLAGS[spec.name]} cannot be unset; --set it instead")
        if spec.name in set_names:
            raise ProfileError(f"--unset {bare}: --{spec.name} is also given to --set; keep one of the two")
        flags = set_flag(flags, f"{spec.name}.{sub}" if dot else spec.name, None)
    return replace(profile, flags=flags, **top)


def _override_spec(backend: str, name: str, where: str) -> FlagSpec:
    spec = lookup_flag(backend, name)
    if spec is None:
        raise ProfileError(f"{where}: {unknown_flag_message(backend, name)}")
    return spec


def _reserved_value(spec: FlagSpec, text: str, where: str) -> Any:
    try:
        value = parse_value(spec, text)
    except FlagError as exc:
        raise ProfileError(f"--set {where}: {exc}") from None
    if spec.name == "port" and not 0 < int(value) < 65536:  # type: ignore[arg-type]
        raise ProfileError(f"--set {where}: expected a port 1-65535, got {text!r}")
    if spec.name != "port" and not str(value).strip():
        raise ProfileError(f"--set {where}: the model cannot be empty")
    return value


def for_server_version(profile: Profile, version: str | None) -> Profile:
    """The profile with its built-in toggles rendered for the server `version` in front of it (discovery found
    it); the profile's own [toggles] entries stay as written, and its flags are never rewritten."""
    toggles = merge_toggles(default_toggles(profile.backend, version), profile.own_toggles)
    return profile if toggles == profile.toggles else replace(profile, toggles=toggles)
