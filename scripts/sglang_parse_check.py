#!/usr/bin/env python3
"""sglang_parse_check: does the installed SGLang's real argparse parser accept an argv? (nothing launches)

    "$(scripts/sglang-cli-env --python 0.5.23)" scripts/sglang_parse_check.py [--] FLAG ...
    PY="$(scripts/sglang-cli-env --python 0.5.23)"
    echo '["--model-path", "m", "--tp-size", "2"]' | "$PY" scripts/sglang_parse_check.py
    echo '[["--model-path", "m"], ["--model-path", "m", "--bogus"]]' | "$PY" scripts/sglang_parse_check.py

Run with the python of a venv from scripts/sglang-cli-env. The argv is the flags after the module (what
`python -m sglang.launch_server` would get), from the arguments, or as a JSON list of strings on stdin
when there are none; a JSON list of such lists checks each (one import of SGLang for all). Prints
{"ok": bool, "error": "<argparse's message, e.g. 'sglang serve: error: unrecognized arguments: --x'>",
"exit_code": N (2 for argparse's errors, 0 when it parses), "stdout": ..., "stderr": ...}, one object per
argv (a JSON list of them for a list of argvs). Exits 0 when it could check, whatever the verdict.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from sglang_real_parser import parse_argv


def _argvs_from_stdin() -> tuple[list[list[str]], bool]:
    """The argv(s) on stdin and whether a list of argvs was given."""
    given = json.loads(sys.stdin.read())
    if isinstance(given, list) and all(isinstance(word, str) for word in given):
        return [given], False
    if isinstance(given, list) and all(isinstance(argv, list) and all(isinstance(w, str) for w in argv)
                                       for argv in given):
        return given, True
    raise SystemExit("sglang_parse_check: stdin must be a JSON list of strings, or a list of such lists")


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    argvs, many = _argvs_from_stdin() if not sys.argv[1:] else ([args], False)
    results = [dataclasses.asdict(parse_argv(argv)) for argv in argvs]
    print(json.dumps(results if many else results[0], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
