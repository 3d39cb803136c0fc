"""Plain helpers shared by the tests (never fixtures: those are in the conftest files): the CLI in a subprocess, the
simulated nvidia-smi, a free port, a demo-like simulated profile, killing what it launched, the one polling helper."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
"""The repository's root: the one constant every test that runs the CLI or reads shipped files uses."""
DATA = REPO / "tests" / "data"
"""The test fixtures' folder (captures, logs, broken profiles, nvidia-smi outputs)."""

MakeProfile = Callable[..., Path]
"""The `make_profile` fixture (tests/conftest.py): keyword arguments of `sim_profile_text`, returns the file."""


def tunedash(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def smi(env: dict[str, str], *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """Run the fake nvidia-smi found on the simulated host's PATH (`env`: the sim_env fixture)."""
    return subprocess.run(["nvidia-smi", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sim_profile_text(
    *,
    name: str,
    port: int,
    sim_state: Path,
    startup_s: float = 0.6,
    fault: str = "",
    steps: int = 1,
    decode_log_interval: int = 40,
    extra: str = "",
) -> str:
    """A demo-like SGLang profile on the simulated host: 2 GPUs, NEXTN with `steps` speculative steps.

    `extra` goes before the [flags] table: top-level keys, or whole tables such as [bench].
    """
    env = {"TUNEDASH_SIM_STARTUP_S": str(startup_s)}
    if fault:
        env["TUNEDASH_SIM_FAULT"] = fault
    env_toml = ", ".join(f'{key} = "{value}"' for key, value in env.items())
    return (
        f'name = "{name}"\nhost = "sim"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\n'
        f'port = {port}\ngpus = [0, 1]\nsim_state = "{sim_state}"\nenv = {{ {env_toml} }}\n{extra}\n'
        '[flags]\ntp-size = 2\nmem-fraction-static = 0.88\nspeculative-algorithm = "NEXTN"\n'
        f"speculative-num-steps = {steps}\nspeculative-eagle-topk = 1\n"
        f"speculative-num-draft-tokens = {steps + 1}\ndecode-log-interval = {decode_log_interval}\n"
    )


def kill_launched(sim_state: Path) -> None:
    """SIGKILL every process group the simulated host's job records name (what a test launched)."""
    jobs_dir = sim_state / "host" / "jobs"
    for record_file in jobs_dir.glob("*.json") if jobs_dir.exists() else []:
        try:
            os.killpg(json.loads(record_file.read_text())["pgid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError, KeyError, ValueError, TypeError):  # TypeError: no pgid yet
            pass


async def until(check: Callable[[], object], timeout: float = 30.0, what: str = "the condition",
                detail: Callable[[], str] | None = None, *, interval: float = 0.05) -> None:
    """Wait on the event loop (polling every `interval` s) until `check()` is true; fail naming `what` (and
    `detail()`) after `timeout` s. The one polling helper of async tests; `wait_until` is its blocking twin for
    tests without a loop, and `pilot_until` the one for a Textual app under `run_test`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            more = f": {detail()}" if detail else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{more}")
        await asyncio.sleep(interval)


def wait_until(check: Callable[[], Any], timeout: float = 30.0, what: str = "the condition",
               detail: Callable[[], str] | None = None, *, interval: float = 0.05) -> Any:
    """`until` for tests without an event loop (subprocesses, threads): blocks, and returns check()'s value."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() >= deadline:
            more = f": {detail()}" if detail else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{more}")
        time.sleep(interval)
    return value


@asynccontextmanager
async def serving(app: web.Application, **runner_options: Any) -> AsyncIterator[int]:
    """Serve an aiohttp app on a free loopback port for the block; yields the port."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def pilot_until(pilot: Any, check: Callable[[], bool], timeout: float = 60.0, what: str = "",
                      detail: Callable[[], str] | None = None) -> None:
    """Let a Textual app under `run_test` run until `check()` holds; fail naming `what` (and `detail()`, e.g. the
    event log) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}" + (
            f": {detail()}" if detail else "")
        await pilot.pause(0.05)


class GroupReaper:
    """Starts processes in their own process group and kills every group at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, argv: list[str], env: dict[str, str], **kw: object) -> subprocess.Popen[str]:
        proc: subprocess.Popen[str] = subprocess.Popen(  # type: ignore[call-overload]
            argv, env=env, start_new_session=True, text=True, **kw
        )
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
