"""The real argparse parser of the installed SGLang, built by SGLang's own `prepare_server_args`.

Used by scripts/sglang_flags_dump.py and scripts/sglang_parse_check.py, run with the python of one of the
venvs that scripts/sglang-cli-env builds (never tunedash's own). `python -m sglang.launch_server ARGV`
imports sglang.launch_server, then (0.5.23) loads plugins, then calls
`sglang.srt.server_args.prepare_server_args(ARGV)`, which makes `argparse.ArgumentParser(prog="sglang
serve")`, lets `ServerArgs.add_cli_args` fill it, merges `--config FILE` when given and calls
`parser.parse_args(ARGV)`; after that it builds ServerArgs (its __post_init__ probes the GPU). These
functions run exactly that path and stop inside `parse_args`: nothing after the parse runs, nothing
launches. All four releases 0.5.10-0.5.23 have that shape.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass


class _StopAtParse(Exception):
    """Raised from inside prepare_server_args's parse_args call, carrying the parser (and the parse)."""

    def __init__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace | None) -> None:
        super().__init__("stopped at parse_args")
        self.parser = parser
        self.namespace = namespace


def _prepare_server_args() -> object:
    """SGLang's own prepare_server_args, after the imports `python -m sglang.launch_server` makes first."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        importlib.import_module("sglang.launch_server")
        try:
            plugins = importlib.import_module("sglang.srt.plugins")
        except ImportError:
            plugins = None
        load_plugins = getattr(plugins, "load_plugins", None)
        if load_plugins is not None:
            load_plugins()
        return importlib.import_module("sglang.srt.server_args").prepare_server_args


def sglang_version() -> str:
    """The installed SGLang's own version string (`sglang.__version__`)."""
    return str(importlib.import_module("sglang").__version__)


def build_parser() -> argparse.ArgumentParser:
    """The parser `prepare_server_args` builds, captured at its parse_args call (which does not run)."""
    prepare = _prepare_server_args()

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> argparse.Namespace:
        raise _StopAtParse(self, None)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture  # type: ignore[assignment,method-assign]
    try:
        prepare([])  # type: ignore[operator]
    except _StopAtParse as stop:
        return stop.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise RuntimeError("sglang's prepare_server_args returned without calling parse_args")


@dataclass(frozen=True)
class ParseResult:
    """What SGLang's parser made of one argv: ok, argparse's error line, the exit code and its output."""

    ok: bool
    error: str
    exit_code: int
    stdout: str
    stderr: str  # what SGLang wrote before argparse's usage block (deprecation warnings), not the usage


def parse_argv(argv: Sequence[str]) -> ParseResult:
    """Run SGLang's real prepare_server_args on `argv` up to and including parse_args, and no further."""
    prepare = _prepare_server_args()
    original = argparse.ArgumentParser.parse_args
    progs: list[str] = []

    def parse_then_stop(self: argparse.ArgumentParser, args: Sequence[str] | None = None) -> argparse.Namespace:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        progs.append(self.prog)
        raise _StopAtParse(self, original(self, args))

    out, err = io.StringIO(), io.StringIO()
    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[assignment,method-assign]
    exit_code = 1
    error = ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            prepare(list(argv))  # type: ignore[operator]
        error = "prepare_server_args returned without calling parse_args"
    except _StopAtParse:
        exit_code = 0
    except SystemExit as stop:
        exit_code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except Exception as failure:  # reported, as the uncaught exception would be (exit 1)
        error = f"{type(failure).__name__}: {failure}"
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    stderr = err.getvalue()
    if exit_code != 0 and not error:
        # argparse's error(): the usage, then "PROG: error: MESSAGE" (a message may span lines).
        start = stderr.rfind(f"{progs[-1]}: error: ") if progs else -1
        error = stderr[start:].strip() if start >= 0 else stderr.strip()
    usage = stderr.find("usage: ")
    return ParseResult(ok=exit_code == 0 and not error, error=error, exit_code=exit_code,
                       stdout=out.getvalue(), stderr=stderr[:usage] if usage >= 0 else stderr)
