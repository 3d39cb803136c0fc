"""Through a real Slurm against the same simulated host launched locally, in the same run (issue 22):

    scripts/slurm-local start && SLURM_CONF=/tmp/tunedash-slurm/etc/slurm.conf \
        .venv/bin/python bench/bench_slurm.py [--cycles 5] [--samples 30]

1. `r` -> READY: the relaunch (kill -> confirm free -> launch -> READY) of the demo profile on the simulated host,
   once on `host = "sim"` (LocalHost) and once on `host = "slurm:local"` (every command a job step, the server a
   step of its own, the kill `scancel J.STEP`); median of `--cycles` each and the difference (the issue's budget:
   overhead <= 1 s).
2. Telemetry: one kept-open `srun --overlap nvidia-smi ... -lms 100` step, a sample's latency = its arrival here
   minus its own `timestamp` field (client and node share the clock: one machine), against a fresh
   `srun ... nvidia-smi --query-gpu=...` per sample (request to answer, which is what a user waits for). Client
   CPU per sample: this process and its children (srun) for both.
Prints medians and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.connect import host_for
from app.core.data import ServerState
from app.core.hosts.base import Host
from app.core.hosts.slurm import SlurmHost
from app.core.hosts.slurm_request import SlurmRequest
from app.core.profiles.loading import resolve_profile
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.smi import telemetry_for
from app.core.telemetry.smi_parse import GPU_FIELDS, GPU_LOOP_FIELDS, gpu_query_argv
from app.sim.host_env import reset_state, sim_environment


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_now() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


async def relaunch_times(host: Host, profile: object, cycles: int) -> list[float]:
    lifecycle = ServerLifecycle(host, profile, telemetry_for(host, "smi", profile.gpus))  # type: ignore[attr-defined]
    await lifecycle.launch()
    assert await lifecycle.wait_ready(60) == ServerState.READY
    walls = []
    for _ in range(cycles):
        started = time.monotonic()
        assert await lifecycle.relaunch(profile, ready_timeout_s=60) == ServerState.READY  # type: ignore[arg-type]
        walls.append(time.monotonic() - started)
    await lifecycle.kill()
    await lifecycle.close()
    return walls


def sample_time(stamp: str) -> float:
    whole, _, millis = stamp.strip().partition(".")
    return time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S")) + int(millis or 0) / 1000


async def stream_samples(host: SlurmHost, samples: int, env: dict[str, str]) -> tuple[list[float], float]:
    """The kept-open step: per-tick latency (last row of a tick minus its timestamp) and CPU per tick."""
    argv = gpu_query_argv(("timestamp", *GPU_FIELDS), loop_ms=100)
    latencies: list[float] = []
    stamp, arrived = "", 0.0
    cpu_start = 0.0
    async with contextlib.aclosing(host.stream_lines(argv, env=env)) as lines:
        async for line in lines:
            if line.startswith("\x00"):
                continue
            this = line.split(",", 1)[0]
            if this != stamp:
                if stamp and cpu_start:
                    latencies.append(arrived - sample_time(stamp))
                    if len(latencies) >= samples:
                        break
                elif stamp:
                    cpu_start = cpu_now()  # skip the first tick (the step's start)
                stamp = this
            arrived = time.time()
    return latencies, (cpu_now() - cpu_start) / max(1, len(latencies))


async def fresh_samples(host: SlurmHost, samples: int, env: dict[str, str]) -> tuple[list[float], float]:
    argv = gpu_query_argv(GPU_LOOP_FIELDS)
    times = []
    cpu_start = cpu_now()
    for _ in range(samples):
        started = time.monotonic()
        result = await host.run(argv, env=env)
        assert result.returncode == 0, result.stderr
        times.append(time.monotonic() - started)
    return times, (cpu_now() - cpu_start) / samples


async def main(cycles: int, samples: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "sim"
        reset_state(state)
        base = resolve_profile("demo")
        local = dataclasses.replace(base, port=free_port(), sim_state=state, env={"TUNEDASH_SIM_STARTUP_S": "1.0"})
        slurm = dataclasses.replace(local, host="slurm:local", python=sys.executable, module="app.sim.sglang",
                                    slurm=SlurmRequest(time="30"))
        local_host, slurm_host = host_for(local), host_for(slurm)
        assert isinstance(slurm_host, SlurmHost)
        try:
            on_local = await relaunch_times(local_host, local, cycles)
            on_slurm = await relaunch_times(slurm_host, slurm, cycles)
            env = sim_environment(state)
            stream, stream_cpu = await stream_samples(slurm_host, samples, env)
            fresh, fresh_cpu = await fresh_samples(slurm_host, samples, env)
        finally:
            await slurm_host.release()
            await slurm_host.close()
            await local_host.close()
    m_local, m_slurm = statistics.median(on_local), statistics.median(on_slurm)
    print(f"r -> READY (relaunch), median of {cycles}: local {m_local:.2f} s, through Slurm {m_slurm:.2f} s; "
          f"overhead {m_slurm - m_local:+.2f} s ({m_slurm / m_local:.2f}x)")
    m_stream, m_fresh = statistics.median(stream), statistics.median(fresh)
    print(f"telemetry, median of {samples}: kept-open srun step {m_stream * 1000:.1f} ms a sample "
          f"(age at arrival), fresh srun per sample {m_fresh * 1000:.1f} ms (request to answer): "
          f"{m_fresh / m_stream:.1f}x")
    print(f"client CPU per sample: stream {stream_cpu * 1000:.2f} ms, fresh srun {fresh_cpu * 1000:.2f} ms: "
          f"{fresh_cpu / max(stream_cpu, 1e-6):.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    asyncio.run(main(args.cycles, args.samples))
