"""Shared by bench_ab.py and bench_aa_live.py: a copy of the demo profile on the simulated host, on its own port
and sim state, a lifecycle for it, the cleanup, and the share-with-interval line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
from pathlib import Path

from app.connect import host_for
from app.core.measure.bench import BenchSpec
from app.core.measure.stats import wilson_interval
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.smi import telemetry_for
from app.sim.host_env import reset_state

REPO = Path(__file__).resolve().parents[1]


def design_options(ap: argparse.ArgumentParser, *, port: int) -> None:
    """The A/B design and the request set (small by default so that 40 experiments finish in well under an hour)."""
    ap.add_argument("--port", type=int, default=port, help="port of the simulated server (one nobody else uses)")
    ap.add_argument("--launches", type=int, default=2, help="launches per arm (the default design: 2)")
    ap.add_argument("--trials", type=int, default=3, help="trials per launch (the demo profile's 3)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--startup-s", type=float, default=0.3, help="the simulated server's startup time")
    ap.add_argument("--state", type=Path, help="a folder for the sim state (default: a fresh temp folder)")


def bench_spec(args: argparse.Namespace, seed: int) -> BenchSpec:
    return BenchSpec(requests=args.requests, concurrency=args.concurrency, input_len=args.input_len,
                     max_tokens=args.max_tokens, warmup=1, seed=seed)


def demo_copy(args: argparse.Namespace) -> tuple[Profile, Path]:
    """profiles/demo.toml with another name, port, a private sim state and a short startup; its sim state."""
    tmp = args.state or Path(tempfile.mkdtemp(prefix="tunedash-bench-ab-"))
    tmp.mkdir(parents=True, exist_ok=True)
    state = reset_state(tmp / "sim")
    text = (REPO / "profiles" / "demo.toml").read_text()
    lines = []
    for line in text.splitlines():
        if line.startswith("name = "):
            line = 'name = "benchab"'
        elif line.startswith("port = "):
            line = f"port = {args.port}"
        elif line.startswith("gpus = "):
            line += f'\nsim_state = "{state}"\nenv = {{ TUNEDASH_SIM_STARTUP_S = "{args.startup_s}" }}'
        lines.append(line)
    path = tmp / "benchab.toml"
    path.write_text("\n".join(lines) + "\n")
    return load_profile(path), state


def lifecycle(profile: Profile) -> ServerLifecycle:
    host = host_for(profile)
    return ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus), grace_s=3)


async def close(life: ServerLifecycle, state: Path) -> None:
    """Kill the server and, to be sure, every process group a job record of this sim state names."""
    try:
        await life.kill(confirm_free=False)
        await life.close()
    finally:
        for record in (state / "host" / "jobs").glob("*.json"):
            try:
                os.killpg(json.loads(record.read_text())["pgid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError, KeyError, ValueError, OSError):
                pass


def share(k: int, n: int) -> str:
    low, high = wilson_interval(k, n)
    return f"{k}/{n} = {100 * k / n:.1f}% (Wilson 95% CI {100 * low:.1f}-{100 * high:.1f}%)"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
