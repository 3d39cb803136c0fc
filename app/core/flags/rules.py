"""Per-backend flag catalogs (lookup, typo hints, value checks, argv rendering) and the toggle rules.

Toggle decisions (what the dashboard's keys do by default):

SGLang
- `s` "steps": cycles --speculative-num-steps through 1..5. When --speculative-eagle-topk is 1, SGLang
  forces --speculative-num-draft-tokens to steps + 1 (servers.md section 2, "speculative_num_draft_tokens is
  adjusted ..."), so the toggle sets it too: the command line then says what the server will run.
  Needs --speculative-algorithm.
- `g` "pcg": flips --enforce-piecewise-cuda-graph. From 0.5.10 piecewise CUDA graph is on by default, so
  flipping --disable-piecewise-cuda-graph would look like the obvious choice, but SGLang silently turns PCG
  off whenever --speculative-algorithm is set or the model is multimodal (servers.md section 2,
  `_handle_piecewise_cuda_graph`); only --enforce-piecewise-cuda-graph skips that cascade. With the
  speculative profiles this dashboard is built for, "disable" would change nothing, "enforce" visibly turns
  PCG on. (On 0.5.15+ the flag is a deprecated alias of --cuda-graph-backend-prefill=tc_piecewise.)
- `o` "overlap": one key cycling the four combinations of the overlap scheduler (--disable-overlap-schedule)
  and single-batch overlap (--enable-single-batch-overlap), in Gray-code order so that every press changes
  exactly one flag (the pending diff shows one line, an A/B run compares one change):
  sched (default) -> sched+sbo -> sbo -> off -> sched. A profile that wants two separate keys can define
  two flips in its [toggles] table.

vLLM
- `s` "spec": cycles speculative-config.num_speculative_tokens through 1..5 (needs --speculative-config).
- `e` "eager": flips --enforce-eager.
- `g` "graphs": cycles compilation-config.cudagraph_mode through NONE, PIECEWISE, FULL, FULL_DECODE_ONLY,
  FULL_AND_PIECEWISE (the V1 default, assumed when unset). --enforce-eager overrides it.

Custom (backend = "custom": any command, app.core.profiles.loading)
- No catalog and no toggles. Flags are free-form: any name is accepted (written as in the profile, leading
  dashes dropped, no alias or typo matching), its value is a boolean, a number or a string (checked for
  type only), and it renders as `--name value` after the profile's `command`, in the profile's order:
  true as `--name`, false as nothing. A server whose flags look otherwise keeps them in `command`.

A flag's value in a flags dict: bool | int | float | str | dict (JSON kinds). A bool flag that is off is
absent from the dict (True or absent), except for negatable flags, where False means "--no-NAME".
A dotted name "speculative-config.num_speculative_tokens" addresses one key of a JSON flag.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from app.core.flags.catalog import SGLANG_FLAGS, VLLM_FLAGS, FlagKind, FlagSpec, FlagValue

__all__ = [
    "BACKENDS",
    "CUSTOM",
    "FlagError",
    "FlagKind",
    "FlagSpec",
    "FlagValue",
    "Toggle",
    "apply_toggle",
    "catalog",
    "check_value",
    "closest_flag",
    "default_toggles",
    "flip",
    "format_value",
    "free_flag",
    "get_flag",
    "lookup_flag",
    "parse_value",
    "render_flag",
    "set_flag",
    "sync_draft_tokens",
    "toggle_for_flag",
    "toggle_value",
    "unknown_flag_message",
]

BACKENDS = ("sglang", "vllm", "custom")
CUSTOM = "custom"
ToggleKind = Literal["cycle", "flip", "set"]


class FlagError(ValueError):
    """A flag name or value the catalog rejects; the message names the flag and says what to do."""


@cache
def _tables(backend: str) -> tuple[dict[str, FlagSpec], dict[str, str]]:
    rows = {"sglang": SGLANG_FLAGS, "vllm": VLLM_FLAGS, CUSTOM: ()}.get(backend)
    if rows is None:
        raise FlagError(f"unknown backend {backend!r}; use one of: {', '.join(BACKENDS)}")
    specs = {spec.name: spec for spec in rows}
    aliases = {alias: spec.name for spec in rows for alias in spec.aliases}
    return specs, aliases


def catalog(backend: str) -> dict[str, FlagSpec]:
    """Every known flag of `backend` ("sglang" or "vllm") by full name, in a stable display order ("custom": none)."""
    return dict(_tables(backend)[0])


def lookup_flag(backend: str, name: str) -> FlagSpec | None:
    """The spec for `name` (leading dashes, underscores and aliases accepted), or None.

    "custom" accepts any name: a free-form spec named as written (without leading dashes).
    """
    specs, aliases = _tables(backend)
    bare = name.lstrip("-")
    if backend == CUSTOM:
        return free_flag(bare) if bare else None
    for candidate in (bare, bare.replace("_", "-")):
        if candidate in specs:
            return specs[candidate]
        if candidate in aliases:
            return specs[aliases[candidate]]
    return None


def free_flag(name: str) -> FlagSpec:
    """The spec of one free-form flag of the custom backend (module docstring)."""
    return FlagSpec(name, "free", None, "free-form flag of a custom server")


def closest_flag(backend: str, name: str) -> str | None:
    """The full name of the real flag nearest to a misspelt `name` (difflib), or None if nothing is close."""
    specs, aliases = _tables(backend)
    bare = name.lstrip("-").replace("_", "-")
    words = list(specs) + list(aliases)
    match = difflib.get_close_matches(bare, words, n=1, cutoff=0.6)
    if not match:
        return None
    return aliases.get(match[0], match[0])


def unknown_flag_message(backend: str, name: str) -> str:
    """"unknown SGLang flag --x; did you mean --y?" (or a pointer to the catalog)."""
    bare = name.lstrip("-")
    nice = {"sglang": "SGLang", "vllm": "vLLM"}.get(backend, backend)
    hint = closest_flag(backend, bare)
    if hint:
        return f"unknown {nice} flag --{bare}; did you mean --{hint}?"
    return f"unknown {nice} flag --{bare}; no known flag is close (check `--help` of the server)"


def _type_name(value: object) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", dict: "table",
            list: "array"}.get(type(value), type(value).__name__)


def _choices_text(spec: FlagSpec) -> str:
    return ", ".join(spec.choices)


def check_value(spec: FlagSpec, value: object) -> FlagValue:
    """Validate a TOML value for `spec` and return it in canonical form; FlagError says expected vs got."""
    got = f"got {_type_name(value)} {value!r}"
    if spec.kind == "bool":
        if isinstance(value, bool):
            return value
        raise FlagError(f"expected true or false, {got}")
    if spec.kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise FlagError(f"expected an integer, {got}")
    if spec.kind == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise FlagError(f"expected a number, {got}")
    if spec.kind == "choice":
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value) in spec.choices:
            return str(value)
        raise FlagError(f"expected one of {_choices_text(spec)}, {got}")
    if spec.kind == "str":
        if isinstance(value, str):
            return value
        raise FlagError(f"expected a string, {got}")
    if spec.kind == "free":
        if isinstance(value, bool | int | float | str):
            return value
        raise FlagError(f"expected true/false, a number or a string (put anything else in `command`), {got}")
    if spec.kind == "json":
        if isinstance(value, dict):
            return dict(value)
        if isinstance(value, str):
            return _json_object(value)
        raise FlagError(f"expected a table (JSON object), {got}")
    # ints
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return " ".join(str(v) for v in value)
    if isinstance(value, str):
        return _int_list(value)
    raise FlagError(f"expected an array of integers, {got}")


def _json_object(text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FlagError(f"expected a JSON object, got {text!r} ({exc.msg} at column {exc.colno})") from None
    if not isinstance(parsed, dict):
        raise FlagError(f"expected a JSON object, got {text!r}")
    return parsed


def _int_list(text: str) -> str:
    items = text.replace(",", " ").split()
    if not items or not all(item.lstrip("-").isdigit() for item in items):
        raise FlagError(f"expected integers separated by spaces or commas, got {text!r}")
    return " ".join(items)


def parse_value(spec: FlagSpec, text: str) -> FlagValue:
    """Parse command-line text ("--set FLAG=TEXT") for `spec`: booleans take true/false, JSON takes JSON text."""
    if spec.kind == "bool":
        lowered = text.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise FlagError(f"expected true or false, got {text!r}")
    if spec.kind == "int":
        try:
            return int(text)
        except ValueError:
            raise FlagError(f"expected an integer, got {text!r}") from None
    if spec.kind == "float":
        try:
            return float(text)
        except ValueError:
            raise FlagError(f"expected a number, got {text!r}") from None
    if spec.kind == "json":
        return _json_object(text)
    if spec.kind == "free":
        return _free_value(text)
    return check_value(spec, text)


def _free_value(text: str) -> FlagValue:
    """A free-form flag's value from text: true/false, an integer, a number, else the text itself."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_json_scalar(text: str) -> Any:
    """A JSON sub-key's value from command-line text: JSON when it parses (3, true, null, {...}), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def render_flag(spec: FlagSpec, value: FlagValue) -> list[str]:
    """argv items for one flag: ["--x"] for true, [] for false ("--no-x" if negatable), ["--x", "v"] else."""
    if spec.kind == "bool":
        if value is True:
            return [f"--{spec.name}"]
        return [f"--no-{spec.name}"] if spec.negatable else []
    if spec.kind == "free" and isinstance(value, bool):
        return [f"--{spec.name}"] if value else []
    if isinstance(value, dict):
        return [f"--{spec.name}", json.dumps(value, separators=(",", ":"))]
    if spec.kind == "ints":
        return [f"--{spec.name}", *str(value).split()]
    return [f"--{spec.name}", str(value)]


def format_value(value: object) -> str:
    """A value for display: on/off for booleans, compact JSON for tables, "unset" for None."""
    if value is None:
        return "unset"
    if value is True:
        return "on"
    if value is False:
        return "off"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def get_flag(flags: Mapping[str, FlagValue], name: str) -> FlagValue | None:
    """The value of `name`, or of one key of a JSON flag with a dotted name ("compilation-config.cudagraph_mode")."""
    if name in flags or "." not in name:
        return flags.get(name)
    head, _, key = name.partition(".")
    table = flags.get(head)
    if isinstance(table, dict):
        value = table.get(key)
        return value if value is None or isinstance(value, bool | int | float | str | dict) else str(value)
    return None


def set_flag(flags: Mapping[str, FlagValue], name: str, value: FlagValue | None) -> dict[str, FlagValue]:
    """A copy of `flags` with `name` (dotted for a JSON key) set to `value`; None removes it.

    Removing the last key of a JSON flag removes the flag.
    """
    new = dict(flags)
    if "." not in name:
        if value is None:
            new.pop(name, None)
        else:
            new[name] = value
        return new
    head, _, key = name.partition(".")
    old = new.get(head)
    table: dict[str, Any] = dict(old) if isinstance(old, dict) else {}
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value
    if table:
        new[head] = table
    else:
        new.pop(head, None)
    return new


def sync_draft_tokens(flags: Mapping[str, FlagValue]) -> dict[str, FlagValue]:
    """SGLang: with --speculative-eagle-topk 1, set --speculative-num-draft-tokens to steps + 1.

    That is what SGLang itself forces (servers.md section 2); writing it keeps the command line honest.
    """
    new = dict(flags)
    steps = new.get("speculative-num-steps")
    if new.get("speculative-eagle-topk") == 1 and isinstance(steps, int) and not isinstance(steps, bool):
        new["speculative-num-draft-tokens"] = steps + 1
    return new


@dataclass(frozen=True)
class Toggle:
    """A key that flips, cycles or sets one or more flags.

    Every toggle is a list of `states`, each a tuple with one value per entry of `flags` (None = flag
    absent). A keypress moves to the state after the one the flags are in now (the first state when they
    match none). kind "flip" has the states (off, on); kind "set" a single state.
    """

    key: str  # one character
    label: str  # short: "steps", "pcg", "overlap"
    kind: ToggleKind
    flags: tuple[str, ...]  # flag names; "flag.key" for one key of a JSON flag
    states: tuple[tuple[FlagValue | None, ...], ...]
    names: tuple[str, ...] = ()  # a display name per state (optional)
    defaults: tuple[FlagValue | None, ...] = ()  # what the server uses when the flags are absent
    requires: str = ""  # a flag that must be set for this toggle to mean anything
    help: str = ""

    def state_index(self, flags: Mapping[str, FlagValue]) -> int | None:
        """Which state `flags` are in, or None."""
        current = self.current(flags)
        for index, state in enumerate(self.states):
            if state == current:
                return index
        return None

    def current(self, flags: Mapping[str, FlagValue]) -> tuple[FlagValue | None, ...]:
        """The toggle's flags' values in `flags` (absent ones as None)."""
        return tuple(get_flag(flags, name) for name in self.flags)


def apply_toggle(flags: Mapping[str, FlagValue], toggle: Toggle) -> dict[str, FlagValue]:
    """The flags after one press of `toggle` (a new dict; `flags` is not changed).

    Raises FlagError when the toggle `requires` a flag the profile does not set.
    """
    if toggle.requires and get_flag(flags, toggle.requires) is None:
        raise FlagError(f"{toggle.label}: the profile has no --{toggle.requires}; set it first "
                        f"(--set {toggle.requires}=...)")
    index = toggle.state_index(flags)
    target = toggle.states[0] if index is None else toggle.states[(index + 1) % len(toggle.states)]
    new = dict(flags)
    for name, value in zip(toggle.flags, target, strict=True):
        new = set_flag(new, name, value)
    if "speculative-num-steps" in toggle.flags:
        new = sync_draft_tokens(new)
    return new


def toggle_value(flags: Mapping[str, FlagValue], toggle: Toggle) -> str:
    """What the toggle's flags say now, for display: "3", "on", "sched+sbo", "FULL (default)"."""
    index = toggle.state_index(flags)
    if index is not None and toggle.names:
        return toggle.names[index]
    current = toggle.current(flags)
    if toggle.defaults and all(value is None for value in current):
        index = next((i for i, s in enumerate(toggle.states) if s == toggle.defaults), None)
        shown = toggle.names[index] if index is not None and toggle.names else "/".join(
            format_value(v) for v in toggle.defaults)
        return f"{shown} (default)"
    if toggle.kind == "flip":
        return "on" if current[0] is True else "off"
    return "/".join(format_value(value) for value in current)


def flip(key: str, label: str, backend: str, flag: str, help: str = "") -> Toggle:
    """A toggle that turns a bool flag on and off (off = absent, or False for a negatable flag)."""
    spec = lookup_flag(backend, flag)
    if spec is None or spec.kind != "bool":
        raise FlagError(f"a flip toggle needs a boolean flag; --{flag} is not one")
    off: FlagValue | None = False if spec.negatable else None
    return Toggle(key, label, "flip", (spec.name,), ((off,), (True,)), help=help or spec.help)


@cache
def default_toggles(backend: str) -> tuple[Toggle, ...]:
    """The built-in toggles of `backend`, used when a profile has no [toggles] table (module docstring)."""
    if backend == "sglang":
        return (
            Toggle("s", "steps", "cycle", ("speculative-num-steps",), tuple((n,) for n in range(1, 6)),
                   requires="speculative-algorithm",
                   help="Speculative steps 1-5 (draft tokens follow when topk is 1)"),
            flip("g", "pcg", backend, "enforce-piecewise-cuda-graph",
                 "Piecewise CUDA graph, enforced past SGLang's auto-disable rules"),
            Toggle("o", "overlap", "cycle", ("disable-overlap-schedule", "enable-single-batch-overlap"),
                   ((None, None), (None, True), (True, True), (True, None)),
                   names=("sched", "sched+sbo", "sbo", "off"),
                   help="Overlap scheduler and single-batch overlap, one change per press"),
        )
    if backend == "vllm":
        return (
            Toggle("s", "spec", "cycle", ("speculative-config.num_speculative_tokens",),
                   tuple((n,) for n in range(1, 6)), requires="speculative-config",
                   help="Speculative tokens 1-5 inside --speculative-config"),
            flip("e", "eager", backend, "enforce-eager", "Eager mode: no torch.compile, no CUDA graphs"),
            Toggle("g", "graphs", "cycle", ("compilation-config.cudagraph_mode",),
                   tuple((m,) for m in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY",
                                        "FULL_AND_PIECEWISE")),
                   defaults=("FULL_AND_PIECEWISE",), help="CUDA graph mode inside --compilation-config"),
        )
    if backend == CUSTOM:
        return ()
    raise FlagError(f"unknown backend {backend!r}; use one of: {', '.join(BACKENDS)}")


def toggle_for_flag(toggles: Sequence[Toggle], flag: str) -> Toggle | None:
    """The toggle that changes `flag` (or a key of it), if any."""
    for toggle in toggles:
        if flag in toggle.flags:
            return toggle
    return None


# ---- what the installed server accepts (app.core.flags.discovery reads it from the server's --help) ----------


def spec_accepted(spec: FlagSpec, accepted: AbstractSet[str] | None) -> bool | None:
    """Whether a server whose --help lists `accepted` (names without dashes) takes `spec`; None = unknown."""
    if accepted is None:
        return None
    return any(name in accepted for name in (spec.name, *spec.aliases))


def offered_catalog(backend: str, accepted: AbstractSet[str] | None) -> dict[str, FlagSpec]:
    """The catalog without the flags the installed server rejects (all of it when `accepted` is None)."""
    return {name: spec for name, spec in catalog(backend).items() if spec_accepted(spec, accepted) is not False}


def rejected_flags(backend: str, flags: Mapping[str, FlagValue], accepted: AbstractSet[str] | None) -> list[str]:
    """The names in `flags` that the installed server would reject at argument parsing (none when unknown)."""
    specs = catalog(backend)
    return [name for name in flags if name in specs and spec_accepted(specs[name], accepted) is False]
