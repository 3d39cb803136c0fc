"""The simulated server's argparse parser, built from a real SGLang release's flags (app.sim.versions).

Every flag of that release, with its real option strings, nargs, choices and type, and nothing else: an
unknown flag exits 2 with argparse's own message under the release's prog name (`sglang serve: error:
unrecognized arguments: --enforce-piecewise-cuda-graph` on 0.5.23), above the usage block of the real help
text. Prefix matching is on, as in SGLang (`--tp 2`). `-h`/`--help` prints the committed `--help` text of the
release byte for byte and exits 0, so tunedash's flag discovery reads exactly the real flags.

SGLang's deprecated actions are parsed like the flags they stand for, with SGLang's warning on stderr
(`'--disable-cuda-graph' is deprecated and will be removed in a future release. Use '...' instead.`), and
0.5.23's own converters of the CUDA-graph flags refuse what the real ones refuse (`tc_piecewise was removed;
select breakable, full, or disabled`). Checked against the real parsers (scripts/sglang_parse_check.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from app.sim.simlog import log
from app.sim.versions import FlagRow, FlagTable


def parse_cuda_graph_backend_arg(raw: str) -> str:
    """0.5.23's converter of --cuda-graph-backend-{decode,prefill}: the retired backend is refused by name."""
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError("tc_piecewise was removed; select breakable, full, or disabled")
    return raw


def parse_cuda_graph_config_arg(raw: str) -> dict[str, Any]:
    """0.5.23's converter of --cuda-graph-config (a JSON object of phases; their keys are not checked here)."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}")
    for phase, settings in parsed.items():
        if phase not in ("decode", "prefill"):
            raise argparse.ArgumentTypeError(f"--cuda-graph-config: unknown phase '{phase}', expected one of "
                                             "('decode', 'prefill')")
        if isinstance(settings, dict) and "backend" in settings:
            parse_cuda_graph_backend_arg(settings["backend"])
    return parsed


_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def human_readable_int(raw: str) -> int:
    """SGLang's integer with an optional SI (k, M, G, T: decimals allowed) or IEC (Ki, Mi, Gi, Ti) suffix."""
    text = raw.strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix) and text[: -len(suffix)]:
            number = text[: -len(suffix)]
            try:
                value = float(number) if len(suffix) == 1 else int(number)
            except ValueError:
                break
            return int(value * _SUFFIXES[suffix])
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: {raw!r}") from None


def json_list(raw: str) -> list[Any]:
    """A JSON array (SGLang's json_list_type)."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON list: {exc}") from None
    if not isinstance(parsed, list):
        raise argparse.ArgumentTypeError(f"expected a JSON list, got {type(parsed).__name__}")
    return parsed


def nullable_str(raw: str) -> str | None:
    """A string, or None for "None"/"null"/"" (SGLang's nullable_str)."""
    return None if raw.strip().lower() in ("", "none", "null") else raw


# The converters (the JSON's "type") the sim reproduces; any other converter reads the value as a string.
TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "json": json.loads,
                                          "human_readable_int": human_readable_int, "json_list_type": json_list,
                                          "nullable_str": nullable_str,
                                          "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
                                          "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg}
# Releases whose deprecation warnings go through SGLang's configured logger (`[stamp] ` in front).
STAMPED_WARNINGS = frozenset({"0.5.23"})
NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "count", "append_const", "help", "version"}


class ReleaseParser(argparse.ArgumentParser):
    """argparse with one release's usage and help text."""

    def __init__(self, table: FlagTable) -> None:
        super().__init__(prog=table.usage_prog, add_help=False)
        self.table = table

    def format_usage(self) -> str:
        return self.table.usage

    def format_help(self) -> str:
        return self.table.help_text


class PrintHelp(argparse.Action):
    """-h/--help: the release's own help text on stdout, exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        sys.stdout.write(parser.format_help())
        sys.stdout.flush()
        parser.exit(0)


class Deprecated(argparse.Action):
    """SGLang's Deprecated*Action: its warning on stderr; DeprecatedAction stores nothing, the others True or
    the value given."""

    def __init__(self, option_strings: Sequence[str], dest: str, kind: str = "DeprecatedAction",
                 replaced_by: str | None = None, stamped: bool = False, **kwargs: Any) -> None:
        self.kind = kind
        self.replaced_by = replaced_by
        self.stamped = stamped
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.kind == "DeprecatedAction":
            self.warn(f"The command line argument '{option_string}' is deprecated and will be removed in future "
                      "versions.")
            return
        replacement = f" Use '{self.replaced_by}' instead." if self.replaced_by else ""
        self.warn(f"'{option_string}' is deprecated and will be removed in a future release.{replacement}")
        setattr(namespace, self.dest, values if self.kind == "DeprecatedAliasStoreAction" else True)


    def warn(self, message: str) -> None:
        """SGLang's print_deprecated_warning: a bold yellow logger warning on stderr (0.5.10: bare, before its
        logging is set up; 0.5.23: with the log stamp)."""
        text = f"\033[1;33m{message}\033[0m"
        if self.stamped:
            log(text, fd=2)
        else:
            sys.stderr.write(text + "\n")


def add_flag(parser: argparse.ArgumentParser, row: FlagRow, stamped: bool = False) -> None:
    """One real flag on the parser (stamped: the release logs deprecation warnings with the log stamp)."""
    common: dict[str, Any] = {"dest": row.dest, "default": row.default}
    if row.required:
        common["required"] = True
    if row.action == "help":
        parser.add_argument(*row.option_strings, action=PrintHelp)
        return
    if row.action == "boolean_optional":
        positive = [o for o in row.option_strings if not o.startswith("--no-")]
        parser.add_argument(*positive, action=argparse.BooleanOptionalAction, **common)
        return
    if row.action.startswith("Deprecated"):
        valued: dict[str, Any] = {"nargs": row.nargs} if row.takes_value else {"nargs": 0}
        if row.takes_value and row.choices is not None:
            valued["choices"] = list(row.choices)
        parser.add_argument(*row.option_strings, action=Deprecated, kind=row.action, replaced_by=row.replaced_by,
                            stamped=stamped, **valued, **common)
        return
    if not row.takes_value or row.action in NO_VALUE_ACTIONS:
        kind = "store_false" if row.action == "store_false" else "count" if row.action == "count" else "store_true"
        parser.add_argument(*row.option_strings, action=kind, **common)
        return
    valued = {"nargs": row.nargs, "type": TYPES.get(row.type)}
    if row.choices is not None:
        valued["choices"] = list(row.choices)
    action = row.action if row.action in ("append", "extend") else "store"
    parser.add_argument(*row.option_strings, action=action, **valued, **common)


def build_parser(table: FlagTable) -> ReleaseParser:
    """The parser of one release: every flag of its table."""
    parser = ReleaseParser(table)
    for row in table.flags:
        add_flag(parser, row, stamped=table.version in STAMPED_WARNINGS)
    return parser
