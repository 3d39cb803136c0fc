#!/usr/bin/env python3
"""sglang_flags_dump: every flag of the installed SGLang's real argparse parser, as JSON on stdout.

    "$(scripts/sglang-cli-env --python 0.5.23)" scripts/sglang_flags_dump.py > app/sim/sglang_versions/0.5.23.json

Run with the python of a venv from scripts/sglang-cli-env. The parser is the one SGLang's own
prepare_server_args builds for `python -m sglang.launch_server` (scripts/sglang_real_parser.py); nothing
is parsed or launched. Output: {"version", "command" (the command line above, for that version),
"usage_prog", "flags": {NAME: {...}}} where NAME is the long option that spells the dest, without its dashes
("tp-size"; else the first long option), and each flag has:
  option_strings, dest; action (argparse's kind, "store_true", or SGLang's action class);
  takes_value, nargs; choices (a list or null; a set's sorted); default (a JSON value, else its repr);
  type ("bool" for a flag that takes no value, else "str", "int", "float", "json" or the converter's name);
  required; hidden (help=SUPPRESS: absent from --help); help (its first line, as --help expands it);
  deprecated (a Deprecated* action class, or a help text that opens by saying it is deprecated);
  replaced_by (the new flag a deprecated action names, else null); error_message (what a retired flag's
  action stops the parse with, else null).
Stable: two runs of one venv give the same bytes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from sglang_real_parser import build_parser, sglang_version

COMMAND = '"$(scripts/sglang-cli-env --python {version})" scripts/sglang_flags_dump.py'
# A help text that opens by saying so: "[Deprecated] ...", "Deprecated alias ...", "(Deprecated, use ...)",
# "Note: --x is deprecated now." (not "Replaces the deprecated --y", which describes the new flag).
_DEPRECATED_HELP = re.compile(r"^\W*(deprecated\b|note: --[\w-]+ is deprecated\b)", re.IGNORECASE)
_ARGPARSE_KINDS = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._CountAction: "count",
    argparse._HelpAction: "help",
    argparse._VersionAction: "version",
    argparse._ExtendAction: "extend",
    argparse.BooleanOptionalAction: "boolean_optional",
}


def _jsonable(value: Any) -> Any:
    """The value itself when JSON can hold it exactly, else its repr."""
    try:
        if json.loads(json.dumps(value)) == value:
            return value
    except (TypeError, ValueError):
        pass
    return repr(value)


def _type_name(action: argparse.Action, takes_value: bool) -> str:
    if not takes_value:
        return "bool"
    kind = action.type
    if kind is None:
        return "str"
    if kind is json.loads:
        return "json"
    return str(getattr(kind, "__name__", repr(kind)))


def _choices(action: argparse.Action) -> list[Any] | None:
    """The choices in the parser's order; a set (its order changes from run to run) sorted."""
    if action.choices is None:
        return None
    choices = list(action.choices)
    if isinstance(action.choices, (set, frozenset)):
        choices.sort(key=str)
    return [_jsonable(choice) for choice in choices]


def _help_first_line(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    try:
        text = parser._get_formatter()._expand_help(action)
    except (KeyError, TypeError, ValueError):
        text = action.help
    return text.strip().splitlines()[0] if text.strip() else ""


def flag_record(parser: argparse.ArgumentParser, action: argparse.Action) -> dict[str, Any]:
    """One flag as the JSON describes it."""
    takes_value = action.nargs != 0
    kind = _ARGPARSE_KINDS.get(type(action), type(action).__name__)
    help_text = action.help if isinstance(action.help, str) else ""
    deprecated = type(action).__name__.startswith("Deprecated") or bool(_DEPRECATED_HELP.match(help_text))
    new_flag = getattr(action, "new_flag", None)
    error_message = getattr(action, "error_message", None)
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "action": kind,
        "takes_value": takes_value,
        "nargs": _jsonable(action.nargs),
        "choices": _choices(action),
        "default": _jsonable(action.default),
        "type": _type_name(action, takes_value),
        "required": bool(action.required),
        "hidden": action.help == argparse.SUPPRESS,
        "help": _help_first_line(parser, action),
        "deprecated": deprecated,
        "replaced_by": new_flag if isinstance(new_flag, str) else None,
        "error_message": error_message if isinstance(error_message, str) else None,
    }


def flag_name(action: argparse.Action) -> str:
    """The flag's name without dashes: the long option that spells its dest (`tp_size` -> `tp-size`, even
    where 0.5.10 lists `--tensor-parallel-size` first), else the first long option (a deprecated alias
    storing into another flag's dest keeps its own name), else the first option."""
    longs = [option for option in action.option_strings if option.startswith("--")]
    own = "--" + action.dest.replace("_", "-")
    return (own if own in longs else (longs or action.option_strings)[0]).lstrip("-")


def dump() -> dict[str, Any]:
    parser = build_parser()
    version = sglang_version()
    flags = {flag_name(action): flag_record(parser, action) for action in parser._actions if action.option_strings}
    return {"version": version, "command": COMMAND.format(version=version), "usage_prog": parser.prog,
            "flags": flags}


def main() -> int:
    sys.stdout.write(json.dumps(dump(), indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
