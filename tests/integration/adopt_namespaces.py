"""Run with a real server's python: each argv (JSON on stdin: [backend, [[flags...], ...]]) through that server's
own argparse parser; prints one JSON object per argv: {"ok", "error", "namespace"} (values as JSON, else str).

sglang: SGLang's prepare_server_args stopped at its parse_args (scripts/sglang_real_parser.py, on sys.path from
the caller's PYTHONPATH); vllm: `python -m vllm.entrypoints.openai.api_server`'s parser (make_arg_parser on a
FlexibleArgumentParser, as its main() builds it). Nothing launches.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def sglang_namespaces(argvs: list[list[str]]) -> list[dict[str, Any]]:
    import sglang_real_parser as real

    prepare = real._prepare_server_args()
    out = []
    for argv in argvs:
        original = argparse.ArgumentParser.parse_args

        def stop(self: argparse.ArgumentParser, args: Any = None, _original: Any = original) -> Any:
            argparse.ArgumentParser.parse_args = _original  # type: ignore[method-assign]
            raise real._StopAtParse(self, _original(self, args))

        argparse.ArgumentParser.parse_args = stop  # type: ignore[assignment,method-assign]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                prepare(list(argv))
            out.append({"ok": False, "error": "no parse", "namespace": None})
        except real._StopAtParse as parsed:
            space = vars(parsed.namespace) if parsed.namespace is not None else {}
            out.append({"ok": True, "error": "", "namespace": {k: _jsonable(v) for k, v in space.items()}})
        except SystemExit:
            out.append({"ok": False, "error": err.getvalue()[-500:], "namespace": None})
        finally:
            argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    return out


def vllm_namespaces(argvs: list[list[str]]) -> list[dict[str, Any]]:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    out = []
    for argv in argvs:
        parser = make_arg_parser(FlexibleArgumentParser(description="vLLM"))
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                space = vars(parser.parse_args(list(argv)))
            out.append({"ok": True, "error": "", "namespace": {k: _jsonable(v) for k, v in space.items()}})
        except SystemExit:
            out.append({"ok": False, "error": err.getvalue()[-500:], "namespace": None})
    return out


def main() -> int:
    backend, argvs = json.loads(sys.stdin.read())
    results = sglang_namespaces(argvs) if backend == "sglang" else vllm_namespaces(argvs)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
