"""The command lines warm mode renders parse under the real servers: SGLang 0.5.23's weight cache daemon (its own
worker flags by parse_known_args, the rest through prepare_server_args, as its `__main__` does) and the client
(`--weight-cache-mode client`), vLLM 0.32's `vllm preload` parser and its server with `--load-format ipc_cache`.
Nothing launches (tests/integration/adopt_namespaces.py stops inside parse_args).

Skipped when a venv is missing, except under CI (the environment variable CI set), where that fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from typing import Any

import pytest

from app.core.profiles.loading import load_profile
from app.core.server.warm import client_argv, daemon_argv
from tests.helpers import REPO
from tests.integration.test_sglang_real import sglang_python
from tests.integration.test_weight_cache_key_real import vllm_python

pytestmark = pytest.mark.slow

# The daemon module imports transformers, which the CLI env lacks: its worker parser is built from the real
# WeightCacheDaemonArgs.add_cli_args, read out of the installed daemon.py (ast) and run as it is.
SGLANG = """
import argparse, ast, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import importlib.util
path = importlib.util.find_spec("sglang").submodule_search_locations[0] + "/srt/weight_cache/daemon.py"
tree = ast.parse(open(path).read())
cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WeightCacheDaemonArgs")
fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
fn.decorator_list = []
space = {"argparse": argparse}
exec(compile(ast.Module([fn], []), path, "exec"), space)
import adopt_namespaces
daemon, client = json.loads(sys.stdin.read())
worker = argparse.ArgumentParser(add_help=False)
space["add_cli_args"](worker)
_, server_argv = worker.parse_known_args(daemon)
print(json.dumps(adopt_namespaces.sglang_namespaces([server_argv, client])))
"""

VLLM = """
import contextlib, io, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from vllm.entrypoints.cli.preload import PreloadSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
import adopt_namespaces
preload, client = json.loads(sys.stdin.read())
parser = FlexibleArgumentParser(prog="vllm preload")
PreloadSubcommand.add_cli_args(parser)
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        space = vars(parser.parse_args(preload))
    first = {"ok": True, "error": "", "namespace": {k: str(v) for k, v in space.items()}}
except SystemExit:
    first = {"ok": False, "error": err.getvalue()[-500:], "namespace": None}
print(json.dumps([first, *adopt_namespaces.vllm_namespaces([client])]))
"""


def run(python: str, code: str, payload: list[list[str]]) -> list[dict[str, Any]]:
    done = subprocess.run([python, "-c", code, str(REPO / "scripts"), str(REPO / "tests" / "integration")],
                          input=json.dumps(payload), capture_output=True, text=True, timeout=400, cwd=REPO,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def test_sglang_daemon_and_client_argv_parse_under_0523() -> None:
    profile = load_profile(REPO / "profiles" / "demo-warm.toml")
    real = replace(profile, module="sglang.launch_server", python="python3", model="Qwen/Qwen3.6-27B")
    daemon, client = daemon_argv(real), client_argv(real)
    assert daemon[:3] == ["python3", "-m", "sglang.srt.weight_cache.daemon"]
    parsed_daemon, parsed_client = run(sglang_python("0.5.23"), SGLANG, [daemon[3:], client[3:]])
    assert parsed_daemon["ok"], parsed_daemon["error"]
    assert parsed_client["ok"], parsed_client["error"]
    assert parsed_daemon["namespace"]["weight_cache_mode"] == "off"
    assert parsed_client["namespace"]["weight_cache_mode"] == "client"
    for key in ("model_path", "tp_size", "dtype", "quantization", "revision", "context_length"):
        assert parsed_daemon["namespace"][key] == parsed_client["namespace"][key], key


@pytest.mark.vllm
def test_vllm_preload_and_client_argv_parse_under_032() -> None:
    profile = load_profile(REPO / "profiles" / "vllm-cpu-tiny.toml")
    warm = replace(profile, warm=True, script=())
    preload, client = daemon_argv(warm), client_argv(warm)
    assert preload[1:4] == ["-m", "vllm.entrypoints.cli.main", "preload"]
    parsed_preload, parsed_client = run(vllm_python(), VLLM, [preload[4:], client[3:]])
    assert parsed_preload["ok"], parsed_preload["error"]
    assert parsed_client["ok"], parsed_client["error"]
    assert parsed_client["namespace"]["load_format"] == "ipc_cache"
