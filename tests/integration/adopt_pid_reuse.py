"""Run as pid 1 of a fresh pid namespace (`unshare -pf --mount-proc`): a real PID reuse between the adopt proof and
the signal. A server-like process (the fake `sglang.launch_server` in the folder given) is adopted, then it exits
and another process with the very same command line is started at the very same pid (ns_last_pid); the takeover's
kill must refuse it and signal nothing. Prints one JSON object: what happened."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from app.core.adopt.takeover import Adoption
from app.core.hosts.local import LocalHost


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def tick(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


async def adopt(pid: int, folder: Path) -> Adoption:
    from app.core.adopt.details import find_servers
    from app.core.adopt.profile_text import build_profile
    from app.core.adopt.takeover import adoption_for
    host = LocalHost("local")
    (server,) = await find_servers(host, [pid])
    profile = build_profile(server, "local", folder / "reuse.toml").profile
    return adoption_for(host, server, profile)


async def kill(adoption: Adoption) -> str:
    from app.core.adopt.takeover import TakeoverRefused

    try:
        await adoption.terminate(1.0, lambda text, level: None)
    except TakeoverRefused as exc:
        return str(exc)
    return ""


def main(folder: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": f"{folder}:{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", "m", "--port", "30999"]
    first = start(argv, env)
    time.sleep(0.5)
    adoption = asyncio.run(adopt(first.pid, folder))
    adoption.confirmed = True  # the user said yes; the process changes after that
    first.kill()
    first.wait()
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(first.pid - 1))
    second = start(argv, env)
    time.sleep(0.5)
    result: dict[str, object] = {"first": first.pid, "second": second.pid,
                                 "ticks": [adoption.proof.start_time, tick(second.pid)]}
    adoption.host = LocalHost("local")  # a host of this event loop
    result["refused"] = asyncio.run(kill(adoption))
    result["second_alive"] = second.poll() is None
    result["signalled"] = adoption.signalled
    second.kill()
    second.wait()
    return result


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
