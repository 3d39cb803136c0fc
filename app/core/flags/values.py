"""Flag values per backend: catalog lookup, typo hints, value checks and parsing, argv rendering, dotted keys.

Custom (backend = "custom": any command, app.core.profiles.render)
- No catalog (and no toggles, app.core.flags.toggles). Flags are free-form: any name is accepted (written
  as in the profile, leading dashes dropped, no alias or typo matching), its value is a boolean, a number
  or a string (checked for type only), and it renders as `--name value` after the profile's `command`, in
  the profile's order: true as `--name`, false as nothing. A server whose flags look otherwise keeps them
  in `command`.

A flag's value in a flags dict: bool | int | float | str | dict (JSON kinds). A bool flag that is off is
absent from the dict (True or absent), except for negatable flags, where False means "--no-NAME".
A dotted name "speculative-config.num_speculative_tokens" addresses one key of a JSON flag.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from functools import cache
from typing import Any

from app.core import jsontext
from app.core.data import BACKENDS, FlagValue, first_control_character, printable
from app.core.errors import TunedashError
from app.core.flags.catalog import SGLANG_FLAGS, VLLM_FLAGS, FlagSpec

CUSTOM = "custom"


class FlagError(TunedashError, ValueError):
    """A flag name or value the catalog rejects; the message names the flag and says what to do."""

    title = "Bad flag"


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


def _short(text: str) -> str:
    """`text` as an error quotes it: its first 60 characters (a 200 KB value is not echoed whole)."""
    return repr(text) if len(text) <= 60 else repr(text[:57]) + f"... ({len(text)} characters)"


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
            try:
                jsontext.check_depth(value)
            except jsontext.JsonTooDeep as exc:
                raise FlagError(f"expected a table (JSON object): {exc}") from None
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
        parsed = jsontext.loads(text)
    except jsontext.JsonTooDeep as exc:
        raise FlagError(f"expected a JSON object, got {_short(text)}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise FlagError(f"expected a JSON object, got {_short(text)} ({exc.msg} at column {exc.colno})") from None
    if not isinstance(parsed, dict):
        raise FlagError(f"expected a JSON object, got {_short(text)}")
    return parsed


def _int_list(text: str) -> str:
    items = text.replace(",", " ").split()
    if not items or not all(item.lstrip("-").isdigit() for item in items):
        raise FlagError(f"expected integers separated by spaces or commas, got {text!r}")
    return " ".join(items)


def _refuse_control_characters(text: str) -> None:
    """Typed text (`--set`, the palette) holding a control character is refused: on screen it would be a command."""
    index = first_control_character(text)
    if index is not None:
        raise FlagError(f"the value holds a control character ({printable(text[index])} at character {index + 1}), "
                        "which a terminal would act on; type the value without it")


def parse_value(spec: FlagSpec, text: str) -> FlagValue:
    """Parse command-line text ("--set FLAG=TEXT") for `spec`: booleans take true/false, JSON takes JSON text.
    Text holding a control character is refused (a FlagError)."""
    _refuse_control_characters(text)
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
    """A JSON sub-key's value from command-line text: JSON when it parses (3, true, null, {...}), else the text.
    Text holding a control character is refused (a FlagError)."""
    _refuse_control_characters(text)
    try:
        return jsontext.loads(text)
    except jsontext.JsonTooDeep as exc:
        raise FlagError(f"{_short(text)}: {exc}") from None
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
    """A value for display: on/off for booleans, compact JSON for tables, "unset" for None; control characters
    written out visibly (`printable`), whatever file or host the value came from."""
    if value is None:
        return "unset"
    if value is True:
        return "on"
    if value is False:
        return "off"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))  # JSON writes control characters as \u escapes
    return printable(str(value))


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
