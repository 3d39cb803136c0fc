"""Fleet benchmark: CPU of `tunedash fleet` per minute over 16 simulated hosts x 8 GPUs at 1 Hz, against one
dashboard measured in the same run.

Run: .venv/bin/python bench/bench_fleet.py [--hosts 16] [--ssh-hosts 4] [--seconds 60]

Each host is its own simulated GPU host (a state folder with 8 GPUs) with one READY server (tp 2, /metrics on);
`--ssh-hosts` of them are reached through a real OpenSSH sshd on loopback (tests/integration/sshd.py), each with
its own connection, the rest as `host = "sim"`. The fleet runs headless (FleetApp.run_test, 120x40) on the real
FleetPoller: GPU memory at 1 Hz per host, records and liveness every 2 s, driver locks every 5 s, /metrics every
5 s, every log followed. No load is sent. Two windows: right after every server became READY (each row's time in
state still changes every second, so every row is redrawn each second) and steady (every server READY for over
a minute: the time in state moves once a minute). CPU is the benchmark process's own user+sys time (RUSAGE_SELF; the
nvidia-smi loops and the servers are other processes, printed apart), scaled to a minute. Then bench_dashboard's
measure_cpu runs the single dashboard (8 GPUs at 4 Hz, probe, chart) on one of the same servers: the ratio is
the fleet's CPU over the dashboard's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.connect import fleet_hosts
from app.core.data import ServerState
from app.core.fleet import FleetPoller
from app.core.hosts.base import Host
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.sim.host_env import reset_state
from app.tui.fleet import FleetApp
from bench.bench_dashboard import free_port, kill_launched, measure_cpu
from tests.integration.sshd import running_sshd, sshd_available

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")
REPO = Path(__file__).resolve().parents[1]


def write_profile(folder: Path, index: int, host: str) -> Path:
    state = folder / f"sim{index:02d}"
    reset_state(state, gpu_count=8)
    for root, dirs, files in os.walk(state):  # the SSH test user runs the commands of a host behind sshd
        for name in [*dirs, *files]:
            Path(root, name).chmod(0o777)
    state.chmod(0o777)
    path = folder / f"node{index:02d}.toml"
    path.write_text(
        f'name = "node{index:02d}"\nhost = "{host}"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\n'
        f'python = "{sys.executable}"\nmodule = "app.sim.sglang"\nport = {free_port()}\n'
        f'gpus = [0, 1, 2, 3, 4, 5, 6, 7]\nsim_state = "{state}"\nenv = {{ TUNEDASH_SIM_STARTUP_S = "0.3" }}\n'
        "[flags]\ntp-size = 2\nenable-metrics = true\nspeculative-algorithm = \"NEXTN\"\n"
        "speculative-num-steps = 1\nspeculative-eagle-topk = 1\nspeculative-num-draft-tokens = 2\n"
        "decode-log-interval = 40\n"
    )
    return path


def launch_all(paths: list[Path], env: dict[str, str]) -> None:
    """`tunedash launch --wait` for every profile, four at a time (the real CLI, as a user starts them)."""
    pending = list(paths)
    while pending:
        batch, pending = pending[:4], pending[4:]
        procs = [subprocess.Popen([sys.executable, "-m", "app", "launch", str(p), "--wait", "--timeout", "120"],
                                  cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for p in batch]
        for path, proc in zip(batch, procs, strict=True):
            out, _ = proc.communicate(timeout=180)
            if proc.returncode != 0:
                raise RuntimeError(f"launch of {path} failed:\n{out}")


def cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


async def measure_fleet(members: list[tuple[Profile, Host]], seconds: float,
                        steady: bool = False) -> tuple[float, float, int, dict[str, int]]:
    """(fleet CPU s/min, children CPU s/min, host looks in the window, rows per state at the end). `steady`: the
    window starts once every server has been READY for over a minute (its time in state then changes once a
    minute); else at once, while every row's time in state still changes each second."""
    poller = FleetPoller(members)
    app = FleetApp(poller)
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            rows = poller.rows()
            if all(r.state == ServerState.READY and r.tokens_per_s is not None and r.gpus[0].used_mib is not None
                   for r in rows):
                break
            await pilot.pause(0.5)
        while steady and any(r.since is None or time.time() - r.since < 62 for r in poller.rows()):
            await pilot.pause(0.5)
        looks0 = poller.looks
        self0, kids0 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN)
        await asyncio.sleep(seconds)
        self1, kids1 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN)
        looks = poller.looks - looks0
        states: dict[str, int] = {}
        for row in poller.rows():
            name = row.state.value if row.state else "unknown"
            states[name] = states.get(name, 0) + 1
        await poller.stop()
    scale = 60.0 / seconds
    return (self1 - self0) * scale, (kids1 - kids0) * scale, looks, states


async def run(args: argparse.Namespace, folder: Path, ssh_spec: str | None) -> None:
    paths = [write_profile(folder, i, ssh_spec if ssh_spec and i < args.ssh_hosts else "sim")
             for i in range(args.hosts)]
    try:
        launch_all(paths, dict(os.environ))
        profiles = [load_profile(p) for p in paths]
        pairs = fleet_hosts(profiles)
        members = [(p, h) for p, h in pairs if isinstance(h, Host)]
        assert len(members) == len(profiles), [h for _p, h in pairs if not isinstance(h, Host)]
        fresh = await measure_fleet(members, args.seconds)
        runs = []
        for _ in range(args.runs):
            runs.append(await measure_fleet(members, args.seconds, steady=True))
        for host in {id(h): h for _p, h in members}.values():
            await host.close()
        dash, dash_kids, _replots = await measure_cpu(profiles[-1], args.seconds, sampling=True)
        fleet = sorted(r[0] for r in runs)[len(runs) // 2]
        kids = sorted(r[1] for r in runs)[len(runs) // 2]
        ssh = min(args.ssh_hosts, args.hosts) if ssh_spec else 0
        print(f"fleet: {args.hosts} hosts x 8 GPUs ({ssh} behind the loopback sshd), 1 Hz, {args.seconds:.0f} s "
              f"windows, {args.runs} run(s)")
        print(f"  fleet CPU, servers READY < 1 min (every row's time in state changes each second): "
              f"{fresh[0]:.2f} s/min; rows {fresh[3]}")
        print(f"  fleet CPU, steady (READY > 1 min): {fleet:.2f} s/min (median; runs "
              f"{', '.join(f'{r[0]:.2f}' for r in runs)}); children {kids:.2f} s/min; {runs[-1][2]} host looks per "
              f"window; rows {runs[-1][3]}")
        print(f"  one dashboard: {dash:.2f} s/min (8 GPUs at 4 Hz + probe + chart; children {dash_kids:.2f} s/min)")
        for label, value in (("steady", fleet), ("fresh", fresh[0])):
            print(f"  ratio fleet ({label}) / dashboard: {value / dash if dash else float('inf'):.2f}x; within the "
                  f"dashboard's budget (<= 3 s/min): {'yes' if value <= 3.0 else 'NO'}")
    finally:
        for i in range(args.hosts):
            kill_launched(folder / f"sim{i:02d}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--ssh-hosts", type=int, default=4, help="how many of them behind the loopback sshd")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=1, help="fleet windows (the median is printed)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tunedash-bench-fleet-"))
    os.chmod(folder, 0o777)
    try:
        if args.ssh_hosts and sshd_available():
            with running_sshd() as server:
                home = server.make_home(folder / "home")
                os.environ["HOME"] = str(home)  # ~/.ssh with the key and known_hosts line, for us and the CLI
                os.environ.pop("SSH_AUTH_SOCK", None)
                await run(args, folder, server.spec)
        else:
            print("no sshd here: every host is `sim`")
            await run(args, folder, None)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
