"""Telemetry over one persistent SSH connection vs a fresh `ssh HOST nvidia-smi ...` per sample, and how fast
a lost connection shows as stale and comes back live. Both against the same loopback sshd (started here, as in
the tests) and the simulated host's nvidia-smi, in the same run.

    .venv/bin/python bench/bench_ssh.py [--samples 40]

Needs /usr/sbin/sshd (apt-get install openssh-server); as root it logs in the `tdtest` user like the tests.
Prints medians, p95 and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.core.hosts.ssh import SshHost
from app.core.smi import GPU_LOOP_FIELDS, gpu_query_argv
from app.core.telemetry import SmiTelemetry
from app.sim.host_env import reset_state, sim_environment
from tests.integration.sshd import Sshd, running_sshd, sshd_available


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fresh_ssh(server: Sshd, env: dict[str, str], samples: int) -> tuple[list[float], float]:
    """The habit: one OpenSSH client connection per sample."""
    remote = shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *gpu_query_argv(GPU_LOOP_FIELDS)])
    argv = ["ssh", "-q", "-p", str(server.port), "-i", str(server.client_key), "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-F", "/dev/null", f"{server.user}@127.0.0.1", remote]
    times = []
    cpu0 = children_cpu()
    for _ in range(samples):
        started = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
        assert "," in out.stdout
    return times, (children_cpu() - cpu0) / samples


async def persistent(host: SshHost, samples: int) -> tuple[list[float], float]:
    """The same query as one exec on the already open connection."""
    argv = gpu_query_argv(GPU_LOOP_FIELDS)
    await host.run(argv)  # connect once, outside the measurement
    times = []
    cpu0 = time.process_time()
    for _ in range(samples):
        started = time.perf_counter()
        result = await host.run(argv)
        times.append(time.perf_counter() - started)
        assert result.returncode == 0
    return times, (time.process_time() - cpu0) / samples


async def stream_rate(host: SshHost, seconds: float, period_ms: int) -> tuple[float, list[float], float]:
    """Snapshots per second from the -lms stream, their gaps, and our CPU per snapshot."""
    telemetry = SmiTelemetry(host)
    gaps: list[float] = []
    count = 0
    cpu0 = time.process_time()
    started = last = time.perf_counter()
    async for snapshot in telemetry.stream(period_ms):
        now = time.perf_counter()
        if snapshot.error is None and count:
            gaps.append(now - last)
        last = now
        count += 1
        if now - started >= seconds:
            break
    await telemetry.close()
    return count / (time.perf_counter() - started), gaps, (time.process_time() - cpu0) / max(count, 1)


async def loss_and_back(host: SshHost, server: Sshd, period_ms: int) -> tuple[float, float]:
    """Seconds from killing the connection to the first error snapshot, and from then to live data again."""
    telemetry = SmiTelemetry(host)
    killed_at = stale_at = None
    good = 0
    async for snapshot in telemetry.stream(period_ms):
        now = time.perf_counter()
        if killed_at is None:
            good += snapshot.error is None
            if good >= 5:
                server.drop_connections()
                killed_at = time.perf_counter()
        elif stale_at is None:
            if snapshot.error is not None:
                stale_at = now
        elif snapshot.error is None and snapshot.gpus:
            await telemetry.close()
            return stale_at - killed_at, now - stale_at
    raise RuntimeError("stream ended")


def shared_sim_state(folder: Path) -> Path:
    """A simulated host state the SSH test user can use."""
    folder.chmod(0o777)
    state = reset_state(folder / "sim")
    for root, dirs, files in os.walk(state):
        for name in [*dirs, *files]:
            Path(root, name).chmod(0o777)
    return state


async def main_async(samples: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="tunedash-bench-ssh-"))
    try:
        env = sim_environment(shared_sim_state(folder))
        with running_sshd() as server:
            host = SshHost(server.spec, extra_env=env, options=server.options(), backoff_s=(0.5, 4.0))
            fresh, fresh_cpu = fresh_ssh(server, env, samples)
            kept, kept_cpu = await persistent(host, samples * 2)
            rate, gaps, stream_cpu = await stream_rate(host, 5.0, 100)
            stale_s, back_s = await loss_and_back(host, server, 100)
            await host.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ms = 1000
    print(f"per-sample latency, fresh `ssh HOST nvidia-smi` ({samples} samples): "
          f"median {statistics.median(fresh)*ms:.1f} ms, p95 {p95(fresh)*ms:.1f} ms; "
          f"client CPU {fresh_cpu*ms:.1f} ms/sample")
    print(f"per-sample latency, one exec on the persistent connection ({samples*2} samples): median "
          f"{statistics.median(kept)*ms:.1f} ms, p95 {p95(kept)*ms:.1f} ms; client CPU {kept_cpu*ms:.1f} ms/sample")
    print(f"ratio fresh/persistent exec: median {statistics.median(fresh)/statistics.median(kept):.1f}x, "
          f"CPU {fresh_cpu/max(kept_cpu, 1e-9):.1f}x")
    print(f"stream (nvidia-smi -lms 100 on the persistent connection, 5 s): {rate:.1f} samples/s, gap median "
          f"{statistics.median(gaps)*ms:.0f} ms p95 {p95(gaps)*ms:.0f} ms; client CPU {stream_cpu*ms:.2f} ms/sample")
    print(f"ratio client CPU per sample, fresh / stream: {fresh_cpu/max(stream_cpu, 1e-9):.0f}x")
    print(f"connection killed -> first stale (error) snapshot: {stale_s*ms:.0f} ms; "
          f"stale -> live again: {back_s*ms:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    if not sshd_available():
        sys.exit("bench_ssh: /usr/sbin/sshd not found; apt-get install openssh-server")
    asyncio.run(main_async(args.samples))


if __name__ == "__main__":
    main()
