"""The SGLang releases the simulated server speaks, which one this process speaks, and each one's real flags.

A simulated host speaks one release, named by TUNEDASH_SIM_SGLANG_VERSION in its environment (app.connect
sets it from a profile's `sim_version`; unset: DEFAULT_VERSION, the seed's server). Every command on the host
sees the same value: the server, its `--help` and `python -c 'import app.sim.sglang as m; print(m.__version__)'`.

The flags of each release are data produced from the real SGLang wheels (app/sim/sglang_versions/README.md
names the commands): `<version>.json`, the real parser's every flag (option strings, dest, action,
takes_value, nargs, choices, type, default, ...), and `<version>.help.txt`, the real `--help` text. The sim
builds its argparse parser from the JSON (app.sim.flag_parser) and prints the help text as it is.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION_ENV = "TUNEDASH_SIM_SGLANG_VERSION"
DEFAULT_VERSION = "0.5.10"
VERSIONS = ("0.5.10", "0.5.23")
DATA_DIR = Path(__file__).with_name("sglang_versions")


class UnknownVersion(ValueError):
    """TUNEDASH_SIM_SGLANG_VERSION names a release the simulator does not speak."""


def version_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The release this process speaks: $TUNEDASH_SIM_SGLANG_VERSION, else DEFAULT_VERSION (unchecked)."""
    env = os.environ if environ is None else environ
    return env.get(VERSION_ENV) or DEFAULT_VERSION


def current_version(environ: Mapping[str, str] | None = None) -> str:
    """version_from_env, checked against VERSIONS."""
    version = version_from_env(environ)
    if version not in VERSIONS:
        raise UnknownVersion(f"{VERSION_ENV}={version!r}: the simulated SGLang speaks {', '.join(VERSIONS)}")
    return version


@dataclass(frozen=True)
class FlagRow:
    """One flag of a real SGLang parser, as scripts/sglang_flags_dump.py wrote it."""

    name: str  # the first long option without its dashes: "tp-size"
    option_strings: tuple[str, ...]
    dest: str
    action: str  # "store", "store_true", ..., or SGLang's own action class ("DeprecatedStoreTrueAction")
    takes_value: bool
    nargs: int | str | None
    choices: tuple[Any, ...] | None
    default: Any  # a JSON value, else the real default's repr
    type: str  # "bool" (takes no value), "str", "int", "float", "json" or the converter's name
    required: bool
    hidden: bool  # help=SUPPRESS: absent from --help
    deprecated: bool
    replaced_by: str | None

    @classmethod
    def from_json(cls, name: str, row: Mapping[str, Any]) -> FlagRow:
        choices = row.get("choices")
        return cls(
            name=name,
            option_strings=tuple(row["option_strings"]),
            dest=str(row.get("dest") or name.replace("-", "_")),
            action=str(row.get("action", "store" if row["takes_value"] else "store_true")),
            takes_value=bool(row["takes_value"]),
            nargs=row.get("nargs"),
            choices=tuple(choices) if choices is not None else None,
            default=row.get("default"),
            type=str(row.get("type", "str")),
            required=bool(row.get("required", False)),
            hidden=bool(row.get("hidden", False)),
            deprecated=bool(row.get("deprecated", False)),
            replaced_by=row.get("replaced_by"),
        )


@dataclass(frozen=True)
class FlagTable:
    """One release's real command line: its flags, its prog name and its `--help` text."""

    version: str
    usage_prog: str
    flags: tuple[FlagRow, ...]
    help_text: str

    @property
    def usage(self) -> str:
        """The help text's usage block (what argparse prints above an error), ending in a newline."""
        head, _, _ = self.help_text.partition("\n\n")
        return head.rstrip("\n") + "\n"

    def option_strings(self) -> frozenset[str]:
        return frozenset(option for row in self.flags for option in row.option_strings)


def data_files(version: str) -> tuple[Path, Path]:
    """The JSON and the help text of a release."""
    return DATA_DIR / f"{version}.json", DATA_DIR / f"{version}.help.txt"


@functools.cache
def flag_table(version: str) -> FlagTable:
    """The committed flags and help text of `version` (one of VERSIONS)."""
    if version not in VERSIONS:
        raise UnknownVersion(f"SGLang {version!r}: the simulated SGLang speaks {', '.join(VERSIONS)}")
    json_file, help_file = data_files(version)
    data = json.loads(json_file.read_text(encoding="utf-8"))
    rows = tuple(FlagRow.from_json(name, row) for name, row in data["flags"].items())
    return FlagTable(version=str(data["version"]), usage_prog=str(data["usage_prog"]), flags=rows,
                     help_text=help_file.read_text(encoding="utf-8"))
