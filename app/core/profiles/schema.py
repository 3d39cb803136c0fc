"""Validation of a profile's parsed TOML (the schema is in app.core.profiles.loading's docstring)."""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from app.core.data import BACKENDS, Backend, FlagValue, one_of
from app.core.flags.catalog import FlagSpec
from app.core.flags.toggles import Toggle, default_toggles, flip, merge_toggles
from app.core.flags.values import CUSTOM, FlagError, check_value, lookup_flag, unknown_flag_message
from app.core.hosts.slurm_request import SlurmRequest, read_slurm_table, slurm_login
from app.core.profiles.tune_table import TuneReader
from app.core.profiles.types import BenchSettings, CustomDaemon, Profile, ProfileError

DEFAULT_MODULES = {
    ("sim", "sglang"): "app.sim.sglang",
    ("", "sglang"): "sglang.launch_server",
    ("", "vllm"): "vllm.entrypoints.openai.api_server",  # not `vllm serve`: docs/servers.md#vllm-command-line
}
DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000}
# Flags that are top-level profile keys instead.
RESERVED_FLAGS = {"model-path": "model", "model": "model", "port": "port"}
ENDPOINTS = ("completions", "chat")
# The placeholders a custom profile's command (and health_url) may use; anything else in {braces} is an error.
PLACEHOLDERS = ("port", "model", "python", "profile_dir")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
CUSTOM_KEYS = ("command", "ready_regex", "health_url")
WARM_KEYS = ("daemon", "ready_regex", "ready_file", "client_args")  # a custom profile's [warm] table
T = TypeVar("T")
_MISSING: Any = object()  # a value that did not read (its problem is kept)


class ProfileReader:
    """Validates the parsed TOML of one file; every error names `source`. `read` goes on past a problem (each key,
    flag, toggle, env entry and bench key on its own) and raises one ProfileError listing them all; only a missing
    or unknown backend stops it early, since every flag is read against the backend."""

    TOP_KEYS = ("name", "description", "host", "backend", "python", "module", "model", "port", "gpus", "env",
                "sim_state", "sim_version", "sim_gpus", "ready_timeout", "flags", "toggles", "bench", "script",
                "extra_args", "warm", "tune", "slurm", *CUSTOM_KEYS)
    TOGGLE_KEYS = ("label", "cycle", "flip", "set", "values", "value", "names", "default", "requires", "help")

    def __init__(self, source: Path) -> None:
        self.source = source
        self.problems: list[str] = []  # "key: problem", in the order found

    def fail(self, key: str, problem: str) -> ProfileError:
        return ProfileError(f"{self.source}: {key}: {problem}", (f"{key}: {problem}",))

    def attempt(self, default: T, read: Callable[..., T], *args: Any) -> T:
        """`read(*args)`, or `default` with its problems kept for the one error `read` raises at the end."""
        try:
            return read(*args)
        except ProfileError as exc:
            self.problems.extend(exc.problems)
            return default

    def collected(self) -> ProfileError:
        """One error for every problem found: the first alone reads as before; several are listed, one a line."""
        if len(self.problems) == 1:
            return ProfileError(f"{self.source}: {self.problems[0]}", tuple(self.problems))
        listed = "\n".join(f"  {problem}" for problem in self.problems)
        return ProfileError(f"{self.source}: {len(self.problems)} problems:\n{listed}", tuple(self.problems))

    def unknown_keys(self, table: Mapping[str, Any], allowed: Sequence[str], prefix: str) -> None:
        unknown = []
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=2)
                hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close
                        else f"allowed keys: {', '.join(allowed)}")
                unknown.append(f"{prefix + key}: unknown key; {hint}")
        if unknown:
            raise ProfileError(f"{self.source}: {unknown[0]}", tuple(unknown))

    def typed(self, table: Mapping[str, Any], key: str, kind: type, prefix: str = "") -> Any:
        value = table[key]
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
        raise self.fail(prefix + key, f"expected {_KIND_NAMES[kind]}, got {_describe(value)}")

    def read(self, data: dict[str, Any]) -> Profile:
        """The Profile, or one ProfileError naming every problem of the file (the class docstring)."""
        nul_at = _nul_key(data)
        if nul_at is not None:
            raise self.fail(nul_at, "contains a NUL character (\\u0000); remove it")
        self.attempt(None, self.unknown_keys, data, self.TOP_KEYS, "")
        backend = self.attempt(None, self.backend, data)
        if backend is None:  # every flag and toggle is read against the backend: nothing more can be checked
            raise self.collected()
        if "model" not in data and backend != CUSTOM:
            self.problems.append("model: missing; every profile needs backend and model")
        got: dict[str, Any] = {}
        for key, kind in _TOP_TYPES.items():
            if key in data:
                got[key] = self.attempt(_MISSING, self.typed, data, key, kind)
        got = {key: value for key, value in got.items() if value is not _MISSING}
        host = self.attempt("local", self.host, got.get("host", "local"))
        slurm = self.slurm(host, got.get("slurm"))
        flags = self.flags(got.get("flags", {}), backend)
        no_custom: dict[str, Any] = {}
        custom = self.attempt(no_custom, self.custom, got, backend)
        module = "" if backend == CUSTOM else got.get("module") or _default_module(host, backend)
        if not module and backend != CUSTOM:
            self.problems.append("module: the simulated host only runs sglang; use backend = \"sglang\" or set "
                                 "module to a simulator module")
        port = got.get("port", DEFAULT_PORTS.get(backend, 0))
        if not 0 < port < 65536 and (backend != CUSTOM or "port" in got):
            self.problems.append(f"port: expected 1-65535, got {port}")
        python = got.get("python") or (sys.executable if host == "sim" else "python3")
        model = got.get("model", "")
        if host in ("local", "sim"):  # paths on this machine: ${VAR}, ${VAR:-default} and ~ expanded
            python = self.attempt(python, self.expand_local, "python", python)
            model = self.attempt(model, self.expand_local, "model", model)
        sim_state = got.get("sim_state")
        own_toggles = self.toggles(got.get("toggles", {}), backend)
        ready_timeout = got.get("ready_timeout", 600)
        not_warm: tuple[bool, CustomDaemon | None] = (False, None)
        warm, daemon = self.attempt(not_warm, self.warm, data, got, backend)
        if ready_timeout < 1:
            self.problems.append(f"ready_timeout: expected seconds to wait for READY (1 or more), got {ready_timeout}")
        name = self.attempt("", self.name, got)
        none: tuple[Any, ...] = ()
        gpus = self.attempt(none, self.gpus, got["gpus"]) if "gpus" in got else _default_gpus(flags)
        env = self.env(got.get("env", {}))
        bench = self.bench(got.get("bench", {}))
        script = self.attempt(none, self.strings, got, "script", backend)
        extra_args = self.attempt(none, self.strings, got, "extra_args", backend)
        toggles = merge_toggles(default_toggles(backend), own_toggles)
        tune = TuneReader(self, backend, toggles, bench).read(got["tune"]) if "tune" in got else None
        if self.problems:
            raise self.collected()
        return Profile(
            name=name,
            source=self.source,
            host=host,
            backend=backend,
            python=python,
            model=model,
            port=port,
            gpus=gpus,
            env=env,
            flags=flags,
            toggles=toggles,
            own_toggles=own_toggles,
            ready_timeout_s=float(ready_timeout),
            bench=bench,
            module=module,
            sim_state=self.sim_state(sim_state) if sim_state is not None else None,
            sim_version=got.get("sim_version", ""),
            sim_gpus=got.get("sim_gpus", ""),
            description=got.get("description", ""),
            script=script,
            extra_args=extra_args,
            warm=warm,
            daemon=daemon,
            tune=tune,
            slurm=slurm,
            **custom,
        )

    def backend(self, data: Mapping[str, Any]) -> Backend:
        if "backend" not in data:
            raise self.fail("backend", "missing; every profile needs backend and model")
        named = self.typed(data, "backend", str)
        backend = one_of(named, BACKENDS)
        if backend is None:
            raise self.fail("backend", f"expected one of {', '.join(BACKENDS)}, got {named!r}")
        return backend

    def custom(self, got: Mapping[str, Any], backend: str) -> dict[str, Any]:
        """command, ready_regex and health_url of a custom profile (errors for the other backends)."""
        if backend != CUSTOM:
            for key in CUSTOM_KEYS:
                if key in got:
                    raise self.fail(key, f"only a backend = \"custom\" profile runs its own command; remove "
                                    f"{key} or set backend = \"custom\"")
            return {}
        if "module" in got:
            raise self.fail("module", "a custom profile runs `command`, not a module; remove module")
        if "command" not in got:
            raise self.fail("command", "missing; a custom profile needs command = [\"program\", \"arg\", ...] "
                            "(an argv list; {port} and {model} are substituted)")
        command = got["command"]
        if not command:
            raise self.fail("command", "empty; give the program and its arguments, e.g. [\"python3\", \"serve.py\"]")
        for i, item in enumerate(command):
            if not isinstance(item, str):
                raise self.fail(f"command[{i}]", f"expected a string (quote it), got {_describe(item)}")
        ready_regex = got.get("ready_regex", "")
        health_url = got.get("health_url", "")
        if not ready_regex and not health_url:
            raise self.fail("ready_regex", "a custom profile needs a ready signal: ready_regex (a log line, e.g. "
                            "\"listening on\") and/or health_url (e.g. \"http://127.0.0.1:{port}/health\")")
        if ready_regex:
            self.check_regex("ready_regex", ready_regex)
        if health_url and not health_url.startswith(("http://", "https://")):
            raise self.fail("health_url", f"expected an http:// or https:// URL, got {health_url!r}")
        if health_url and not _port_ok(health_url.replace("{port}", "1")):
            raise self.fail("health_url", f"the port in {health_url!r} is not 1-65535")
        templates = [(f"command[{i}]", item) for i, item in enumerate(command)] + [("health_url", health_url)]
        for where, text in templates:
            for name in PLACEHOLDER.findall(text):
                if name not in PLACEHOLDERS:
                    raise self.fail(where, f"unknown placeholder {{{name}}}; only "
                                    f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)} are substituted")
                if name in ("port", "model") and name not in got:
                    raise self.fail(where, f"uses {{{name}}} but the profile sets no {name}; add {name} = ...")
        return {"command": tuple(command), "ready_regex": ready_regex, "health_url": health_url}

    def warm(self, data: Mapping[str, Any], got: Mapping[str, Any], backend: str) -> tuple[bool, CustomDaemon | None]:
        """`warm = true` (sglang, vllm: tunedash knows their daemon) or a custom profile's [warm] table naming its
        daemon's command and readiness: (warm, the custom daemon or None)."""
        if "warm" not in data:
            return False, None
        value = data["warm"]
        if isinstance(value, bool):
            if value and backend == CUSTOM:
                raise self.fail("warm", "a custom profile names its daemon: replace warm = true with a [warm] table, "
                                "daemon = [\"program\", \"arg\", ...] and ready_regex = \"...\" or ready_file = "
                                "\"/path\"")
            return value, None
        if not isinstance(value, dict):
            raise self.fail("warm", f"expected true or false, got {_describe(value)} (backend = \"custom\": a [warm] "
                            "table naming its daemon)")
        if backend != CUSTOM:
            raise self.fail("warm", f"a [warm] table names a custom profile's daemon; the {backend} backend's daemon "
                            "is known: write warm = true")
        self.unknown_keys(value, WARM_KEYS, "warm.")
        if "daemon" not in value:
            raise self.fail("warm.daemon", "missing; name the daemon's command, daemon = [\"program\", \"arg\", ...]")
        command = self.argv_list(value, "daemon", "warm.")
        client_args = self.argv_list(value, "client_args", "warm.") if "client_args" in value else ()
        ready_regex = self.typed(value, "ready_regex", str, "warm.") if "ready_regex" in value else ""
        ready_file = self.typed(value, "ready_file", str, "warm.") if "ready_file" in value else ""
        if not ready_regex and not ready_file:
            raise self.fail("warm.ready_regex", "the daemon needs a ready signal: ready_regex (a line of its log) "
                            "and/or ready_file (a file it writes once ready, e.g. \"/tmp/daemon.ready\")")
        if ready_regex:
            self.check_regex("warm.ready_regex", ready_regex)
        if ready_file and not ready_file.startswith(("/", "{profile_dir}")):
            raise self.fail("warm.ready_file", f"expected an absolute path on the host (or one under "
                            f"{{profile_dir}}), got {ready_file!r}")
        items = [*(("warm.daemon", i, item) for i, item in enumerate(command)),
                 *(("warm.client_args", i, item) for i, item in enumerate(client_args)), ("warm.ready_file", None,
                                                                                           ready_file)]
        for key, i, text in items:
            where = key if i is None else f"{key}[{i}]"
            for name in PLACEHOLDER.findall(text):
                if name not in PLACEHOLDERS:
                    raise self.fail(where, f"unknown placeholder {{{name}}}; only "
                                    f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)} are substituted")
                if name in ("port", "model") and name not in got:
                    raise self.fail(where, f"uses {{{name}}} but the profile sets no {name}; add {name} = ...")
        return True, CustomDaemon(command, ready_regex, ready_file, client_args)

    def check_regex(self, key: str, text: str) -> None:
        """`text` compiles as a regular expression, else the error naming `key`."""
        try:
            re.compile(text)
        except re.error as exc:
            raise self.fail(key, f"not a valid regular expression: {exc}") from None

    def argv_list(self, table: Mapping[str, Any], key: str, prefix: str) -> tuple[str, ...]:
        """A non-empty list of strings (an argv), or its error naming `prefix + key`."""
        items = self.typed(table, key, list, prefix)
        if not items and key != "client_args":
            raise self.fail(prefix + key, "empty; give the program and its arguments, e.g. [\"python3\", \"d.py\"]")
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise self.fail(f"{prefix}{key}[{i}]", f"expected a string (quote it), got {_describe(item)}")
        return tuple(items)

    def strings(self, got: Mapping[str, Any], key: str, backend: str) -> tuple[str, ...]:
        """`script` or `extra_args`: a list of strings, for the sglang and vllm backends (a custom profile's
        `command` holds its whole argv)."""
        if key not in got:
            return ()
        if backend == CUSTOM:
            raise self.fail(key, "a custom profile's `command` holds its whole command line; remove " + key)
        items = got[key]
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise self.fail(f"{key}[{i}]", f"expected a string (quote it), got {_describe(item)}")
        if key == "script" and not items:
            raise self.fail(key, "empty; give the console script and its subcommand, e.g. "
                            "[\"/venv/bin/vllm\", \"serve\"], or remove script to run `python -m module`")
        return tuple(items)

    def expand_local(self, key: str, text: str) -> str:
        """`${VAR}` / `${VAR:-default}` from this process's environment, then a leading `~` (local hosts only:
        on an SSH host the remote's home and environment would be meant, so nothing is expanded there)."""

        def var(match: re.Match[str]) -> str:
            value = os.environ.get(match[1])
            if value:
                return value
            if match[2] is not None:
                return match[2]
            raise self.fail(key, f"the environment variable {match[1]} is not set; set it, or write "
                            f"${{{match[1]}:-DEFAULT}} in the profile")

        expanded = _ENV_VAR.sub(var, text)
        return os.path.expanduser(expanded) if expanded.startswith("~") else expanded

    def name(self, got: Mapping[str, Any]) -> str:
        """The profile's name (default: the file name): a simple identifier, since job and log files are named
        after it."""
        if "name" in got:
            name = got["name"]
            if not SIMPLE_NAME.fullmatch(name):
                raise self.fail("name", f"expected a simple name (letters, digits, '.', '_', '-'; 64 at most, not "
                                f"starting with '.', '_' or '-'), got {name!r}")
            return str(name)
        stem = self.source.stem
        if not SIMPLE_NAME.fullmatch(stem):
            raise self.fail("name", f"the file name {stem!r} is not a simple name (letters, digits, '.', '_', '-'; "
                            "64 at most); rename the file or set name = \"...\"")
        return stem

    def host(self, host: str) -> str:
        if host in ("sim", "local"):
            return host
        if host.startswith("slurm:"):
            try:
                slurm_login(host)
            except ValueError as exc:
                raise self.fail("host", str(exc)) from None
            return host
        if host.startswith("ssh://"):
            try:
                parts = urlsplit(host)
            except ValueError:  # e.g. an unclosed [IPv6 address
                parts = None
            if parts and parts.hostname and _port_ok(host) and parts.path in ("", "/") and not parts.query:
                return host
            raise self.fail("host", f"cannot read {host!r}; write ssh://user@host:port (user and port optional)")
        if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", host):
            return host  # an ssh config alias
        raise self.fail("host", f"expected \"sim\", \"local\", \"ssh://user@host:port\", an ssh config alias or "
                        "\"slurm:local\" / \"slurm://LOGIN\", "
                        f"got {host!r}")

    def slurm(self, host: str, table: dict[str, Any] | None) -> SlurmRequest | None:
        """The [slurm] table of a `slurm:` host (app.core.hosts.slurm_request); a problem on any other host."""
        login = slurm_login(host) if host.startswith("slurm:") else None
        if login is None:
            if table is not None:
                self.problems.append("slurm: only a host = \"slurm:local\" or \"slurm://LOGIN\" profile reads a "
                                     "[slurm] table; remove it or change host")
            return None
        request, problems = read_slurm_table(login, table or {})
        self.problems.extend(problems)
        return request

    def gpus(self, gpus: list[Any]) -> tuple[int, ...]:
        for i, index in enumerate(gpus):
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise self.fail(f"gpus[{i}]", f"expected a GPU index (integer >= 0), got {_describe(index)}")
        if len(set(gpus)) != len(gpus):
            raise self.fail("gpus", f"a GPU is listed twice: {gpus}")
        return tuple(gpus)

    def env(self, env: dict[str, Any]) -> dict[str, str]:
        """The [env] table; each bad entry is a problem of its own."""
        for key, value in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                self.problems.append(f"env.{key}: not a valid environment variable name")
            elif not isinstance(value, str):
                self.problems.append(f"env.{key}: expected a string (quote it: \"{value}\"), got {_describe(value)}")
        return dict(env)

    def sim_state(self, raw: str) -> Path:
        path = Path(raw).expanduser()
        return path if path.is_absolute() else self.source.parent / path

    def flags(self, table: dict[str, Any], backend: str) -> dict[str, FlagValue]:
        """The [flags] table; each bad flag is a problem of its own."""
        flags: dict[str, FlagValue] = {}
        for key, raw in table.items():
            spec = self.attempt(None, self.flag_spec, backend, key, f"flags.{key}")
            if spec is None:
                continue
            if spec.name in flags:
                self.problems.append(f"flags.{key}: --{spec.name} is set twice (under two spellings)")
                continue
            try:
                value = check_value(spec, raw)
            except FlagError as exc:
                self.problems.append(f"flags.{key}: {exc}")
                continue
            if value is not False or spec.negatable:
                flags[spec.name] = value
        return flags

    def flag_spec(self, backend: str, name: str, key: str) -> FlagSpec:
        bare = name.lstrip("-")
        if bare in RESERVED_FLAGS or bare.replace("_", "-") in RESERVED_FLAGS:
            top = RESERVED_FLAGS[bare.replace("_", "-")]
            raise self.fail(key, f"--{bare} comes from the top-level key `{top}`; set it there")
        spec = lookup_flag(backend, bare)
        if spec is None:
            raise self.fail(key, unknown_flag_message(backend, bare))
        return spec

    def toggles(self, table: dict[str, Any], backend: str) -> tuple[tuple[str, Toggle | None], ...]:
        """The profile's own [toggles] entries, in order: (key, toggle), or (key, None) for `key = false`."""
        own: list[tuple[str, Toggle | None]] = []
        for key, entry in table.items():
            where = f"toggles.{key}"
            if len(key) != 1 or not key.isprintable() or key.isspace():
                self.problems.append(f"{where}: a toggle's key is one character, e.g. [toggles.s]")
                continue
            if entry is False:
                own.append((key, None))
                continue
            if not isinstance(entry, dict):
                self.problems.append(f"{where}: expected a table (or false to remove it), got {_describe(entry)}")
                continue
            made = self.attempt(None, self.toggle, key, entry, backend)
            if made is not None:
                own.append((key, made))
        return tuple(own)

    def toggle(self, key: str, entry: dict[str, Any], backend: str) -> Toggle:
        where = f"toggles.{key}"
        self.unknown_keys(entry, self.TOGGLE_KEYS, where + ".")
        kinds = [kind for kind in ("cycle", "flip", "set") if kind in entry]
        if len(kinds) != 1:
            raise self.fail(where, "needs exactly one of cycle = ..., flip = ... or set = ...")
        kind = kinds[0]
        opt = {k: self.typed(entry, k, str, where + ".") for k in ("label", "requires", "help") if k in entry}
        if kind == "flip":
            name = self.typed(entry, "flip", str, where + ".")
            spec = self.flag_spec(backend, name, where + ".flip")
            if spec.kind != "bool":
                raise self.fail(where + ".flip", f"--{spec.name} is not a boolean flag; use cycle or set")
            made = flip(key, opt.get("label", spec.name), backend, spec.name, opt.get("help", ""))
            return replace(made, requires=opt.get("requires", ""))
        raw_flags = entry[kind]
        names = [raw_flags] if isinstance(raw_flags, str) else raw_flags
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise self.fail(f"{where}.{kind}", "expected a flag name or a list of flag names")
        targets = [self.toggle_target(backend, n, f"{where}.{kind}") for n in names]
        if kind == "set":
            if "value" not in entry:
                raise self.fail(where, "a set toggle needs value = ...")
            states = [self.state(targets, entry["value"], f"{where}.value")]
        else:
            values = self.typed(entry, "values", list, where + ".") if "values" in entry else None
            if not values:
                raise self.fail(where, "a cycle toggle needs values = [...] (two or more)")
            states = [self.state(targets, v, f"{where}.values[{i}]") for i, v in enumerate(values)]
        state_names = self.typed(entry, "names", list, where + ".") if "names" in entry else []
        if state_names and (len(state_names) != len(states) or not all(isinstance(n, str) for n in state_names)):
            raise self.fail(where + ".names", f"expected {len(states)} strings, one per value")
        defaults = self.state(targets, entry["default"], where + ".default") if "default" in entry else ()
        label = str(opt.get("label", names[0]))
        return Toggle(key, label, kind, tuple(t[0] for t in targets), tuple(states),
                      names=tuple(state_names), defaults=defaults, requires=opt.get("requires", ""),
                      help=opt.get("help", ""))

    def toggle_target(self, backend: str, name: str, where: str) -> tuple[str, FlagSpec | None]:
        head, dot, sub = name.partition(".")
        spec = self.flag_spec(backend, head, where)
        if not dot:
            return spec.name, spec
        if spec.kind != "json" or not sub:
            raise self.fail(where, f"--{spec.name} is not a JSON flag, so it has no key {sub!r}")
        return f"{spec.name}.{sub}", None

    def state(self, targets: list[tuple[str, FlagSpec | None]], raw: Any, where: str) -> tuple[Any, ...]:
        items = raw if len(targets) > 1 else [raw]
        if not isinstance(items, list) or len(items) != len(targets):
            raise self.fail(where, f"expected a list of {len(targets)} values, one per flag")
        state: list[FlagValue | None] = []
        for (name, spec), item in zip(targets, items, strict=True):
            if spec is None:
                state.append(item)
                continue
            try:
                value = check_value(spec, item)
            except FlagError as exc:
                raise self.fail(where, f"--{name}: {exc}") from None
            state.append(None if value is False and not spec.negatable else value)
        return tuple(state)

    def bench(self, table: dict[str, Any]) -> BenchSettings:
        """The [bench] table; each bad key is a problem of its own."""
        names = [f.name for f in fields(BenchSettings)]
        self.attempt(None, self.unknown_keys, table, names, "bench.")
        values: dict[str, Any] = {}
        for key in table:
            if key not in names:
                continue
            value = self.attempt(_MISSING, self.bench_value, table, key)
            if value is not _MISSING:
                values[key] = value
        return BenchSettings(**values)

    def bench_value(self, table: Mapping[str, Any], key: str) -> Any:
        """One [bench] key's value, checked."""
        if key == "endpoint":
            endpoint = self.typed(table, key, str, "bench.")
            if endpoint not in ENDPOINTS:
                raise self.fail("bench.endpoint", f"expected one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
            return endpoint
        if key in ("slo_ttft_ms", "slo_tpot_ms"):
            slo = table[key]
            if isinstance(slo, bool) or not isinstance(slo, int | float) or not 0 < slo < math.inf:
                raise self.fail(f"bench.{key}", f"expected a number of milliseconds above 0, got {_describe(slo)}")
            return float(slo)
        number = self.typed(table, key, int, "bench.")
        least = 0 if key in ("warmup", "seed") else 1
        if number < least:
            raise self.fail(f"bench.{key}", f"expected an integer >= {least}, got {number}")
        return number


SIMPLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""What a profile's name may be: it names the job record and log files on the host."""


def _port_ok(url: str) -> bool:
    """Whether `url` has no port or a port 1-65535."""
    try:
        port = urlsplit(url).port
    except ValueError:  # not a number, or out of 0-65535
        return False
    return port is None or port > 0


def _nul_key(value: Any, where: str = "") -> str | None:
    """The dotted key of the first key or string value that holds a NUL (TOML allows \\u0000), else None."""
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{where}.{key}" if where else str(key)
            if "\0" in key:
                return here.replace("\0", "\\0")
            found = _nul_key(item, here)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _nul_key(item, f"{where}[{i}]")
            if found is not None:
                return found
    elif isinstance(value, str) and "\0" in value:
        return where
    return None


_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_TOP_TYPES: dict[str, type] = {"name": str, "description": str, "host": str, "python": str, "module": str,
                               "model": str, "port": int, "gpus": list, "env": dict, "sim_state": str, "slurm": dict,
                               "sim_version": str, "sim_gpus": str, "ready_timeout": int,
                               "flags": dict, "toggles": dict, "bench": dict, "command": list,
                               "ready_regex": str, "health_url": str, "script": list, "extra_args": list,
                               "tune": dict}
_KIND_NAMES = {str: "a string", int: "an integer", list: "an array", dict: "a table", bool: "true or false"}


def _describe(value: object) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)
    return f"{kind} {value!r}"


def _default_module(host: str, backend: str) -> str:
    if host == "sim":
        return DEFAULT_MODULES.get(("sim", backend), "")
    return DEFAULT_MODULES[("", backend)]


def _default_gpus(flags: Mapping[str, FlagValue]) -> tuple[int, ...]:
    tp = flags.get("tp-size", flags.get("tensor-parallel-size", 1))
    return tuple(range(tp)) if isinstance(tp, int) and tp > 0 else (0,)
