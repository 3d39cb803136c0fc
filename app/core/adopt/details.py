"""What a listing adds to the processes scan.py read: the python to launch with, GPU memory, records, versions.

find_servers is the whole look: scan.read_processes, then each server's interpreter (argv[0] resolved against
/proc/PID/exe), its process tree's GPU memory (the telemetry's process list) and who else shares those GPUs, the
job record holding its TUNEDASH_JOB tag, and its version (discovery's fingerprint, one ask per interpreter).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from app.core.adopt.scan import AdoptableServer, GpuUse, read_processes
from app.core.hosts.base import Host, HostError
from app.core.hosts.procfs import ProcessInfo
from app.core.server.jobs import JobRecord

RESOLVE_SCRIPT = r"""for p; do printf '%s\n' "$(readlink -f -- "$p" 2>/dev/null)"; done"""
FIND_RECORD_SCRIPT = r"""
for f in "$1"/jobs/*.json; do [ -f "$f" ] && grep -l -F -- "$2" "$f"; done 2>/dev/null
true
"""


async def resolve_pythons(host: Host, servers: Sequence[AdoptableServer]) -> None:
    """Each server's `python`: argv[0] when it resolves to /proc/PID/exe (a venv's python is a symlink to the base
    interpreter, which does not see the venv's packages), found through the process's cwd or PATH as the
    shell found it; else the exe, with a note."""
    asks: list[tuple[AdoptableServer, str]] = []
    for server in servers:
        first = server.command.interpreter
        if not first:
            server.python_note = "a console script run without an interpreter in its command line"
            continue
        if first.startswith("/"):
            candidates = [first]
        elif "/" in first:
            candidates = []  # relative to its cwd, which the script printed but a re-run may not see the same
        else:
            path = (server.environ or {}).get("PATH", "")
            candidates = [f"{folder}/{first}" for folder in path.split(":") if folder.startswith("/")]
        asks += [(server, c) for c in candidates]
    if not asks:
        return
    try:
        result = await host.run(["sh", "-c", RESOLVE_SCRIPT, "sh", *(c for _s, c in asks)], timeout=30.0)
        resolved = result.stdout.split("\n")
    except HostError:
        resolved = []
    chosen: set[int] = set()
    for (server, candidate), target in zip(asks, resolved, strict=False):
        if server.pid not in chosen and target and target == server.proof.exe:
            server.python = candidate
            chosen.add(server.pid)
    for server in servers:
        if server.pid not in chosen and server.command.interpreter and not server.python_note:
            server.python = server.proof.exe or server.command.interpreter
            server.python_note = (f"{server.command.interpreter!r} could not be resolved to {server.proof.exe or '?'}; "
                                  "the profile names the executable itself (a venv's python: check `python`)")


def descendants(processes: Sequence[ProcessInfo], pid: int) -> set[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for proc in processes:
        children.setdefault(proc.ppid, []).append(proc.pid)
    found = {pid}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


async def attach_gpus(host: Host, servers: Sequence[AdoptableServer]) -> None:
    """Each server's GPU memory: its process tree's entries in the telemetry's process list."""
    if not servers:
        return
    from app.core.telemetry.smi import SmiTelemetry

    telemetry = SmiTelemetry(host)
    try:
        snapshot = await telemetry.sample()
    finally:
        await telemetry.close()
    if snapshot.error is not None:
        for server in servers:
            server.gpus = GpuUse(None, f"on {host.name}: {snapshot.error.message}")
        return
    try:
        processes = await host.processes()
    except HostError as exc:
        for server in servers:
            server.gpus = GpuUse(None, f"process list unreadable: {exc}")
        return
    for server in servers:
        tree = descendants(processes, server.pid)
        mib: dict[int, int] = {}
        unreadable = ""
        for gpu in snapshot.gpus:
            if gpu.processes is None:
                unreadable = f"GPU {gpu.index}'s process list could not be read"
                continue
            for proc in gpu.processes:
                if proc.pid in tree:
                    mib[gpu.index] = mib.get(gpu.index, 0) + (proc.used_mib or 0)
        server.gpus = GpuUse(mib, unreadable) if mib or not unreadable else GpuUse(None, unreadable)
    for server in servers:
        mine = set(server.gpu_indices())
        server.shares_gpus_with = [other.pid for other in servers if other is not server
                                   and _machine(other) == _machine(server) and mine & set(other.gpu_indices())]


def _machine(server: AdoptableServer) -> str:
    """Whose GPUs a server's indices are: the host's, or a simulated host's (each state folder its own GPUs)."""
    return (server.environ or {}).get("TUNEDASH_SIM_STATE", "") if server.command.simulated else ""


async def attach_records(host: Host, servers: Sequence[AdoptableServer]) -> None:
    """The job record of each server tunedash launched (its TUNEDASH_JOB tag), searched in the host's state folder
    (and the simulated host's, for a simulated server)."""
    for server in servers:
        if not server.tunedash_tag:
            continue
        folders = [host.state_dir]
        sim_state = (server.environ or {}).get("TUNEDASH_SIM_STATE")
        if sim_state:
            folders.append(f"{sim_state}/host")
        needle = f'"tag": "{server.tunedash_tag}"'
        for folder in folders:
            try:
                result = await host.run(["sh", "-c", FIND_RECORD_SCRIPT, "sh", folder, needle], timeout=30.0)
            except HostError:
                continue
            for path in result.stdout.split():
                try:
                    text = await host.read_text(path)
                    record = JobRecord.from_json(text or "")
                except (HostError, OSError, ValueError, TypeError):
                    continue
                if record.tag == server.tunedash_tag:
                    server.record, server.record_path = record, path
                    break
            if server.record is not None:
                break


async def attach_versions(host: Host, servers: Sequence[AdoptableServer]) -> None:
    """Each server's version, from its interpreter's installed package (discovery's fingerprint, nothing run)."""
    from app.core.flags.discovery import server_version

    asks: dict[tuple[str, str, str, str], list[AdoptableServer]] = {}
    for server in servers:
        if server.command.backend == "custom":
            server.version_reason = "a custom server has no version to ask"
            continue
        module = server.command.module or {"sglang": "sglang.launch_server",
                                           "vllm": "vllm.entrypoints.openai.api_server"}[server.command.backend]
        pythonpath = (server.environ or {}).get("PYTHONPATH", "")
        asks.setdefault((server.command.backend, server.python, module, pythonpath), []).append(server)
    keys = list(asks)  # one ask per interpreter, all at once: each is a python start on the host
    answers = await asyncio.gather(*(server_version(host, backend, python, module,
                                                    {"PYTHONPATH": path} if path else {})
                                     for backend, python, module, path in keys))
    for key, (version, reason) in zip(keys, answers, strict=True):
        for server in asks[key]:
            server.version, server.version_reason = version, reason


async def find_servers(host: Host, pids: Sequence[int] = (),
                       custom_commands: Sequence[tuple[str, Sequence[str]]] = ()) -> list[AdoptableServer]:
    """Every server on `host` (or among `pids`) with its interpreter, version, GPUs and record filled in."""
    servers = await read_processes(host, pids, custom_commands)
    await resolve_pythons(host, servers)
    await attach_gpus(host, servers)
    await attach_records(host, servers)
    await attach_versions(host, servers)
    return servers
