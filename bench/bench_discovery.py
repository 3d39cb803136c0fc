"""Discovery cost: reading the installed server's version and flags, cold and warm, locally and over SSH.

Cold: no cache (the server's `--help` runs). Warm: a new tunedash process with the cache on the host, i.e. the
in-memory cache cleared, so what runs is the one fingerprint script (version + package folder mtime) and a
read of the cache file. Target: warm under 100 ms, so opening a dashboard never waits on it (it runs in the
background anyway). Servers: the simulated SGLang (this tree, app.sim.sglang), the real SGLang 0.5.23 CLI
(scripts/sglang-cli-env builds it; skipped when absent) and, over a loopback sshd, the simulated SGLang behind
SSH (skipped without /usr/sbin/sshd). Prints medians of --reps runs.

    .venv/bin/python bench/bench_discovery.py --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core.flags import discovery  # noqa: E402
from app.core.hosts.base import Host  # noqa: E402
from app.core.hosts.local import LocalHost  # noqa: E402
from app.sim.host_env import reset_state, sim_environment  # noqa: E402


async def _once(host: Host, python: str, module: str, cold: bool) -> tuple[float, str]:
    discovery._memory.clear()
    if cold:
        await host.run(["rm", "-rf", f"{host.state_dir}/discovery"])
    started = time.perf_counter()
    found = await discovery.discover_flags(host, "sglang", python, module, {})
    elapsed = time.perf_counter() - started
    assert found.known, found.reason
    return elapsed, f"{found.describe()}, {len(found.flags or ())} flags"


async def measure(name: str, host: Host, python: str, module: str, reps: int) -> None:
    cold = [await _once(host, python, module, True) for _ in range(reps)]
    warm = [await _once(host, python, module, False) for _ in range(reps)]
    cold_ms = statistics.median(c[0] for c in cold) * 1000
    warm_ms = statistics.median(w[0] for w in warm) * 1000
    print(f"{name:34} cold {cold_ms:8.1f} ms   warm {warm_ms:6.1f} ms   ratio {cold_ms / warm_ms:5.1f}x   "
          f"({cold[0][1]}); warm target < 100 ms: {'met' if warm_ms < 100 else 'NOT met'}")


async def run_all(state: Path, tmp: Path, reps: int, real_python: str | None, server: object | None) -> None:
    for version in ("0.5.10", "0.5.23"):
        env = sim_environment(state) | {"TUNEDASH_SIM_SGLANG_VERSION": version}
        host = LocalHost("sim", extra_env=env, state_dir=str(state / "host"))
        await measure(f"simulated SGLang {version}, local", host, sys.executable, "app.sim.sglang", reps)
    if real_python:
        host = LocalHost("local", state_dir=str(tmp / "local-state"))
        await measure("real SGLang 0.5.23 CLI, local", host, real_python, "sglang.launch_server", reps)
    else:
        print("real SGLang 0.5.23 CLI: skipped (scripts/sglang-cli-env builds it)")
    if server is None:
        print("over SSH: skipped (no /usr/sbin/sshd)")
        return
    from app.core.hosts.ssh import SshHost

    env = sim_environment(state) | {"TUNEDASH_SIM_SGLANG_VERSION": "0.5.23"}
    remote_state = tmp / "ssh-state"  # the sshd's test user writes the discovery cache there
    ssh = SshHost(server.spec, extra_env=env, options=server.options(), state_dir=str(remote_state))  # type: ignore[attr-defined]
    try:
        await measure("simulated SGLang 0.5.23, over SSH", ssh, sys.executable, "app.sim.sglang", reps)
    finally:
        await ssh.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        tmp.chmod(0o755)
        (tmp / "ssh-state").mkdir(mode=0o777)
        (tmp / "ssh-state").chmod(0o777)
        state = reset_state(tmp / "sim")
        real = subprocess.run([str(REPO / "scripts" / "sglang-cli-env"), "--python", "0.5.23"], capture_output=True,
                              text=True, check=False)
        real_python = real.stdout.strip() if real.returncode == 0 else None
        if shutil.which("sshd") or Path("/usr/sbin/sshd").exists():
            from tests.integration.sshd import running_sshd

            with running_sshd() as server:
                asyncio.run(run_all(state, tmp, args.reps, real_python, server))
        else:
            asyncio.run(run_all(state, tmp, args.reps, real_python, None))


if __name__ == "__main__":
    main()
