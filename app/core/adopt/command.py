"""A server's command line read back: which server it is, how it was launched, its model, port and flags.

Found by argv, never by process name: `python -m sglang.launch_server`, `python -m
vllm.entrypoints.openai.api_server`, the console forms `sglang serve` / `vllm serve` (a console script runs as
`PYTHON /venv/bin/vllm serve ...`), the simulated SGLang (`python -m app.sim.sglang`, labelled as such), and the
command of a custom profile. Flags are typed by the backend's catalog; what it does not know (or a value it
cannot type) is kept verbatim, in order, as extra argv items.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.core.data import FlagValue
from app.core.flags.values import CUSTOM, FlagError, lookup_flag, parse_value
from app.core.profiles.schema import DEFAULT_PORTS, PLACEHOLDER

SIM_MODULE = "app.sim.sglang"
SERVER_MODULES = {
    "sglang.launch_server": "sglang",
    "vllm.entrypoints.openai.api_server": "vllm",
    SIM_MODULE: "sglang",
}
CONSOLE_SCRIPTS = {"sglang": "sglang", "vllm": "vllm"}  # script name -> backend; subcommand "serve"
# Python options that take a value (`python -X dev -m ...`); any other option before -m takes none.
_PY_VALUE_OPTIONS = ("-X", "-W", "--check-hash-based-pycs")
_PYTHON = re.compile(r"python[0-9.]*")
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass(frozen=True)
class ServerCommand:
    """A command line recognised as a server's main process."""

    argv: tuple[str, ...]
    backend: str  # "sglang", "vllm" or "custom"
    label: str  # for people: "SGLang", "vLLM", "SGLang (simulated)", "custom (profile NAME)"
    interpreter: str  # argv[0] as started ("" for a console script exec'd without one)
    module: str = ""  # the -m module ("" for a console script or a custom command)
    script: tuple[str, ...] = ()  # console form: (SCRIPT, "serve")
    args: tuple[str, ...] = ()  # the server's own arguments
    python_options: tuple[str, ...] = ()  # options between python and -m (a profile cannot hold them)
    custom_profile: str = ""  # the custom profile whose command this is

    @property
    def simulated(self) -> bool:
        return self.module == SIM_MODULE


@dataclass
class ParsedArgs:
    """A server's arguments typed by the catalog (extra: verbatim argv items it does not know)."""

    model: str = ""
    port: int | None = None
    flags: dict[str, FlagValue] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # the flag names in extra, for the profile's comment
    notes: list[str] = field(default_factory=list)


def classify(argv: Sequence[str], custom_commands: Sequence[tuple[str, Sequence[str]]] = ()) -> ServerCommand | None:
    """The server a command line starts, or None when it is not one (its scheduler children, a shell, ...).

    `custom_commands` are (profile name, command template) of the custom profiles known: a command line that
    starts with one (placeholders matching any one item) is that profile's server."""
    words = tuple(argv)
    if not words:
        return None
    base = os.path.basename(words[0])
    if base in CONSOLE_SCRIPTS and words[1:2] == ("serve",):
        return _console(words, "", 0)
    if _PYTHON.fullmatch(base):
        found = _python_form(words)
        if found is not None:
            return found
    for name, command in custom_commands:
        if _matches_template(words, command):
            return ServerCommand(words, CUSTOM, f"custom (profile {name})", "", args=words[len(command):],
                                 custom_profile=name)
    return None


def _python_form(words: tuple[str, ...]) -> ServerCommand | None:
    options: list[str] = []
    i = 1
    while i < len(words):
        word = words[i]
        if word == "-m" or (word.startswith("-m") and not word.startswith("--")):
            module = words[i + 1] if word == "-m" and i + 1 < len(words) else word[2:]
            rest = words[i + 2:] if word == "-m" else words[i + 1:]
            backend = SERVER_MODULES.get(module)
            if backend is None:
                return None
            label = "SGLang (simulated)" if module == SIM_MODULE else {"sglang": "SGLang", "vllm": "vLLM"}[backend]
            return ServerCommand(words, backend, label, words[0], module=module, args=rest,
                                 python_options=tuple(options))
        if not word.startswith("-") or word == "-" or word.startswith("-c"):
            break  # a script path or `-c CODE`
        options.append(word)
        if word in _PY_VALUE_OPTIONS and i + 1 < len(words):
            options.append(words[i + 1])
            i += 1
        i += 1
    if len(words) > 2 and not options and os.path.basename(words[1]) in CONSOLE_SCRIPTS and words[2] == "serve":
        return _console(words, words[0], 1)
    return None


def _console(words: tuple[str, ...], interpreter: str, at: int) -> ServerCommand:
    backend = CONSOLE_SCRIPTS[os.path.basename(words[at])]
    label = {"sglang": "SGLang", "vllm": "vLLM"}[backend] + " (serve)"
    return ServerCommand(words, backend, label, interpreter, script=(words[at], "serve"), args=words[at + 2:])


def _matches_template(words: tuple[str, ...], command: Sequence[str]) -> bool:
    if not command or len(words) < len(command):
        return False
    for word, template in zip(words, command, strict=False):
        if PLACEHOLDER.search(template):
            pattern = re.escape(template)
            pattern = re.sub(r"\\\{[A-Za-z_][A-Za-z0-9_]*\\\}", ".+", pattern)
            if not re.fullmatch(pattern, word):
                return False
        elif word != template and os.path.basename(word) != os.path.basename(template):
            return False
    return True


def _is_option(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not _NUMBER.fullmatch(word)


def parse_server_args(command: ServerCommand) -> ParsedArgs:
    """The model, port and flags of a recognised sglang/vllm command line (module docstring)."""
    parsed = ParsedArgs()
    backend = command.backend
    words = list(command.args)
    i = 0
    if command.script and backend == "vllm" and words and not _is_option(words[0]):
        parsed.model = words[0]  # `vllm serve MODEL`
        i = 1
    while i < len(words):
        word = words[i]
        if not _is_option(word):
            parsed.extra.append(word)
            parsed.notes.append(f"the stray argument {word!r} is kept verbatim")
            i += 1
            continue
        name, eq, inline = word.partition("=")
        values: list[str] = [inline] if eq else []
        j = i + 1
        bare = name.lstrip("-")
        spec = lookup_flag(backend, bare)
        negated = False
        if spec is None and backend == "vllm" and bare.startswith("no-"):
            spec = lookup_flag(backend, bare[3:])
            negated = spec is not None and spec.negatable
            if not negated:
                spec = None
        wants = 0 if spec is not None and spec.kind == "bool" else -1 if spec is None or spec.kind == "ints" else 1
        if not eq:
            while j < len(words) and not _is_option(words[j]) and (wants == -1 or len(values) < wants):
                values.append(words[j])
                j += 1
        verbatim = words[i:j]
        i = j
        if spec is None:
            _keep(parsed, verbatim, bare)
            continue
        if spec.name in ("model-path", "model"):
            if len(values) == 1:
                parsed.model = values[0]
            else:
                _keep(parsed, verbatim, bare)
            continue
        if spec.name == "port":
            if len(values) == 1 and values[0].isdigit() and 0 < int(values[0]) < 65536:
                parsed.port = int(values[0])
            else:
                _keep(parsed, verbatim, bare)
            continue
        value = _typed(spec.kind, spec, values, negated)
        if value is None:
            _keep(parsed, verbatim, bare, typed=False)
            continue
        if spec.name in parsed.flags:
            parsed.notes.append(f"--{spec.name} is given twice; the last one counts, as for the server")
        if value is False and not spec.negatable:
            parsed.flags.pop(spec.name, None)
            continue
        parsed.flags[spec.name] = value
    if parsed.port is None:
        parsed.port = DEFAULT_PORTS.get(backend)
    return parsed


def _typed(kind: str, spec: object, values: list[str], negated: bool) -> FlagValue | None:
    """One flag's value from its argv items, or None when the catalog's kind cannot hold it as written."""
    from app.core.flags.catalog import FlagSpec

    assert isinstance(spec, FlagSpec)
    if kind == "bool":
        if values:
            return None  # `--flag=x` on a store_true flag: the server would refuse it; keep it as written
        return not negated
    if kind == "ints":
        if values and all(re.fullmatch(r"-?\d+", v) for v in values):
            return " ".join(values)
        return None
    if len(values) != 1:
        return None
    try:
        value = parse_value(spec, values[0])
    except FlagError:
        return None
    if kind == "json" and not _toml_safe(value):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _toml_safe(value: object) -> bool:
    """A JSON value TOML can hold (no null; lists of one kind are fine either way in TOML 1.0)."""
    if value is None:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and _toml_safe(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_toml_safe(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str | int | bool)


def _keep(parsed: ParsedArgs, verbatim: list[str], name: str, *, typed: bool = True) -> None:
    parsed.extra.extend(verbatim)
    label = f"--{name}" if typed else f"--{name} (value not typed by the catalog: {' '.join(verbatim[1:])!r})"
    parsed.unknown.append(label)


def json_text(value: object) -> str:
    """Compact JSON, as the server gets a JSON flag."""
    return json.dumps(value, separators=(",", ":"))
