"""Telemetry over one persistent SSH connection vs a fresh `ssh HOST nvidia-smi ...` per sample, and how fast
a lost connection shows as stale and comes back live. Both against the same loopback sshd (started here, as in
the tests) and the simulated host's nvidia-smi, in the same run.

    .venv/bin/python bench/bench_ssh.py [--samples 40] [--stream-seconds 20]

What is compared (issue 5: "per-sample latency ... at least 20 times lower"):
- The dashboard's way, the headline: one long-lived `nvidia-smi --query-gpu=timestamp,... -lms PERIOD` over the
  persistent connection. A sample's latency is its arrival here (the last row of its tick) minus the sample's own
  `timestamp` field (`YYYY/MM/DD HH:MM:SS.mmm`, local time, printed by the simulated nvidia-smi as by the real
  one); client and host share the clock on loopback. Run at -lms 50 and -lms 100 for `--stream-seconds` each:
  the sustained rate is ticks received over the window.
- The habit it replaces: a fresh OpenSSH `ssh HOST nvidia-smi --query-gpu=...` per sample, request to answer.
  For a fresh query the sample is taken near the end of that time, so the habit's "age at arrival" is smaller
  than its request-to-answer time; but a user who wants a number waits the whole of it, which is what is compared.
- Secondary: one exec of the same one-shot query on the persistent connection (what `tunedash gpus` does), which
  still pays a remote process start per sample.
Client CPU: this process's CPU per sample (asyncssh), vs the `ssh` client children's CPU per sample.

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
from app.core.telemetry.smi import SmiTelemetry
from app.core.telemetry.smi_parse import GPU_FIELDS, GPU_LOOP_FIELDS, gpu_query_argv
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


def sample_time(stamp: str) -> float:
    """nvidia-smi's `timestamp` field ("2026/05/01 10:00:01.123", local time) as time.time()."""
    whole, _, millis = stamp.strip().partition(".")
    return time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S")) + int(millis or 0) / 1000


async def stream_latency(host: SshHost, seconds: float, period_ms: int) -> tuple[float, list[float], float]:
    """The -lms stream with the timestamp field: (ticks per second sustained over `seconds`, per-tick latency
    = arrival of the tick's last row - the tick's timestamp, our CPU per tick)."""
    argv = gpu_query_argv(("timestamp", *GPU_FIELDS), loop_ms=period_ms)
    latencies: list[float] = []
    ticks = 0
    stamp = ""
    arrived = 0.0
    cpu0 = started = 0.0
    async for line in host.stream_lines(argv):
        now = time.time()
        if line.startswith("\x00"):
            raise RuntimeError(f"stream: {line!r}")
        this = line.split(",", 1)[0]
        if this != stamp:  # a new tick: the previous one is complete
            if stamp and started:
                latencies.append(arrived - sample_time(stamp))
                ticks += 1
            if not started:  # start measuring at a tick boundary, after the first (connection, first sample)
                if stamp:
                    started, cpu0 = time.perf_counter(), time.process_time()
            elif time.perf_counter() - started >= seconds:
                break
            stamp = this
        arrived = now
    elapsed = time.perf_counter() - started
    return ticks / elapsed, latencies, (time.process_time() - cpu0) / max(ticks, 1)


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


async def main_async(samples: int, stream_s: float) -> None:
    folder = Path(tempfile.mkdtemp(prefix="tunedash-bench-ssh-"))
    try:
        env = sim_environment(shared_sim_state(folder))
        with running_sshd() as server:
            host = SshHost(server.spec, extra_env=env, options=server.options(), backoff_s=(0.5, 4.0))
            fresh, fresh_cpu = fresh_ssh(server, env, samples)
            kept, kept_cpu = await persistent(host, samples * 2)
            streams = {period: await stream_latency(host, stream_s, period) for period in (50, 100)}
            rate, gaps, stream_cpu = await stream_rate(host, 5.0, 100)
            stale_s, back_s = await loss_and_back(host, server, 100)
            await host.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ms = 1000
    med = statistics.median
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"fresh `ssh HOST nvidia-smi` per sample ({samples} samples), request -> answer: "
          f"median {med(fresh)*ms:.1f} ms, p95 {p95(fresh)*ms:.1f} ms; client (ssh) CPU {fresh_cpu*ms:.1f} ms/sample")
    for period, (srate, lat, scpu) in streams.items():
        print(f"stream nvidia-smi -lms {period} on the persistent connection ({stream_s:.0f} s, {len(lat)} ticks): "
              f"{srate:.1f} samples/s sustained; latency (arrival - sample timestamp) median {med(lat)*ms:.1f} ms, "
              f"p95 {p95(lat)*ms:.1f} ms; client CPU {scpu*ms:.2f} ms/sample")
        print(f"    ratio fresh ssh / stream: median latency {med(fresh)/med(lat):.0f}x, "
              f"p95 {p95(fresh)/p95(lat):.0f}x, "
              f"client CPU per sample {fresh_cpu/max(scpu, 1e-9):.0f}x")
    print(f"secondary: one exec of the one-shot query on the persistent connection ({samples*2} samples): median "
          f"{med(kept)*ms:.1f} ms, p95 {p95(kept)*ms:.1f} ms; client CPU {kept_cpu*ms:.1f} ms/sample; "
          f"fresh/exec {med(fresh)/med(kept):.1f}x latency, {fresh_cpu/max(kept_cpu, 1e-9):.1f}x CPU")
    print(f"telemetry stream as the dashboard runs it (SmiTelemetry, -lms 100, 5 s): {rate:.1f} snapshots/s, "
          f"gap median "
          f"{med(gaps)*ms:.0f} ms p95 {p95(gaps)*ms:.0f} ms; client CPU {stream_cpu*ms:.2f} ms/snapshot")
    print(f"connection killed -> first stale (error) snapshot: {stale_s*ms:.0f} ms; "
          f"stale -> live again: {back_s*ms:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--stream-seconds", type=float, default=20.0, help="window per -lms stream")
    args = parser.parse_args()
    if not sshd_available():
        sys.exit("bench_ssh: /usr/sbin/sshd not found; apt-get install openssh-server")
    asyncio.run(main_async(args.samples, args.stream_seconds))


if __name__ == "__main__":
    main()
