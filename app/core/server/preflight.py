"""Before a launch: refuse a running job of the profile, a taken port, unreadable or held GPUs; then claim the
job record (claim_launch) before anything is spawned.

LaunchRefused carries a Reason (app.core.errors); only app/cli/common.py turns it into an exit code. On success
the GPUs' idle baseline (MiB per GPU) is returned: confirm-free later compares against it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from app.core.data import GpuSnapshot, Holder
from app.core.errors import Reason, TunedashError
from app.core.hosts.base import Host
from app.core.profiles.render import launch_argv, launch_env
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.warm_state import warm_share
from app.core.telemetry.freecheck import FreeCheck, learn_baseline
from app.core.telemetry.smi import Telemetry


class LaunchRefused(TunedashError):
    """Launch did not start a server; the message says why and what to do, the reason says which case."""

    title = "Launch refused"

    def __init__(self, message: str, reason: Reason, holders: tuple[Holder, ...] = ()) -> None:
        super().__init__(message, reason)
        self.holders = holders


LAUNCH_CLAIM_S = 30.0  # a "launching" record younger than this, with no process yet, is a launch in progress
FRESH_SAMPLE_S = 0.5  # a release watch's sample younger than this stands for the launch's own GPU read


async def _refuse_live(host: Host, profile: Profile, record: jobs.JobRecord | None) -> None:
    """LaunchRefused when `record` names a server that runs, or comes from another host (a shared home folder:
    its server may run there, and replacing the record would lose it)."""
    if record is None:
        return
    check = await jobs.check_job(host, record)
    if check.members:
        raise LaunchRefused(
            f"{profile.name} is already running on {host.name} (pid {record.pid}, port {record.port}); "
            "use `tunedash relaunch` or `tunedash kill` first",
            Reason.ALREADY_RUNNING,
        )
    if check.foreign == "host":
        raise LaunchRefused(
            f"{check.refusal}. Launch it from {record.hostname}, or remove {jobs.job_path(host, profile)} "
            "once that server is gone",
            Reason.ALREADY_RUNNING,
        )


async def refuse_unspawnable(host: Host, profile: Profile) -> None:
    """LaunchRefused (bad input) when the host could not spawn the profile's launch: the command over its argument
    limits (a flag value over 128 KiB) or its program missing. Called before a relaunch kills anything."""
    log_path = jobs.log_path_for(host, profile)
    env = {**launch_env(profile), jobs.TAG_ENV: "0" * 16}
    problem = await host.spawn_problem(launch_argv(profile), log_path=log_path, env=env)
    if problem:
        raise LaunchRefused(f"{profile.source}: {problem}", Reason.BAD_INPUT)


async def claim_launch(host: Host, profile: Profile, record: jobs.JobRecord) -> None:
    """Write `record` as "launching" (a fresh tag, this host's boot id and hostname, no pid) before the spawn, so
    no server runs without a record. LaunchRefused when a live job holds the record, another launch of the
    profile is starting, or someone else wrote the record since it was read (the compare-and-swap)."""
    identity = await host.boot_identity()
    record.boot_id, record.hostname = identity.boot_id, identity.hostname
    record.tag, record.outcome, record.pid, record.pgid = jobs.new_tag(), "launching", None, None
    read = await jobs.read_job(host, profile)
    current = read.record
    await _refuse_live(host, profile, current)
    if current is not None and current.outcome == "launching" and current.pid is None:
        age = time.time() - current.launched_at
        if current.boot_id == identity.boot_id and age < LAUNCH_CLAIM_S:
            raise LaunchRefused(
                f"another launch of {profile.name} on {host.name} is starting ({current.launched_by}, {age:.0f} s "
                f"ago); wait for it, or `tunedash kill {profile.name}`",
                Reason.ALREADY_RUNNING,
            )
    try:
        await jobs.save_job(host, record, expect_generation=read.generation)
    except jobs.StaleRecord as exc:
        raise LaunchRefused(f"{exc}; nothing was launched", Reason.ALREADY_RUNNING) from None


def fresh_sample(snapshot: GpuSnapshot | None, gpus: Sequence[int], now: float | None = None) -> GpuSnapshot | None:
    """`snapshot` when it can stand for a new GPU read before a launch: no error, every GPU of the profile read,
    memory and process lists taken within FRESH_SAMPLE_S (time.monotonic()); else None."""
    if snapshot is None or snapshot.error is not None:
        return None
    now = time.monotonic() if now is None else now
    read = {g.index: g for g in snapshot.gpus}
    if any(i not in read for i in gpus):
        return None
    for i in gpus:
        gpu = read[i]
        oldest = min(gpu.taken_at, gpu.processes_taken_at if gpu.processes_taken_at is not None else gpu.taken_at)
        if now - oldest > FRESH_SAMPLE_S:
            return None
    return snapshot


async def preflight(host: Host, profile: Profile, telemetry: Telemetry,
                    own_pids: AbstractSet[int] = frozenset(), recent: GpuSnapshot | None = None) -> dict[int, int]:
    """Refuse to launch onto a running job, a taken port or GPUs that hold memory; returns the idle baseline.

    `own_pids` (the profile's weight cache daemon) may hold memory: the GPUs count as idle when only they do
    (app.core.server.warm_state), and the baseline is what is left beside them. `recent`: the release watch's
    last sample when it is fresh (fresh_sample: a relaunch's kill has just read the GPUs, at NVML's pace where
    the host has it), read instead of a new one; the new one cost a whole nvidia-smi run (~22 ms on an H200,
    ~75 ms for the simulator's), most of a relaunch's own overhead (docs/decisions.md#relaunch-overhead)."""
    await _refuse_live(host, profile, await jobs.load_job(host, profile))
    if profile.port and await host.port_in_use(profile.port):
        raise LaunchRefused(
            f"port {profile.port} on {host.name} is already in use by another process; stop it or "
            f"set another `port` in {profile.source}",
            Reason.PORT_IN_USE,
        )
    if not profile.gpus:
        return {}
    snapshot = recent if recent is not None else await telemetry.sample()
    if snapshot.error is not None:
        raise LaunchRefused(
            f"cannot read the GPUs of {host.name}: {snapshot.error.message.strip()}"
            + (f" ({snapshot.error.hint})" if snapshot.error.hint else ""),
            Reason.GPUS_UNREADABLE,
        )
    check = FreeCheck(tuple(profile.gpus), needed=1)
    verdict = check.feed(snapshot)
    share = warm_share(verdict, own_pids, check.limit) if own_pids and not verdict.all_free else None
    if share is not None:
        return {gpu: max(0, (verdict.used_mib.get(gpu) or 0) - share.mib.get(gpu, 0)) for gpu in profile.gpus}
    if not verdict.all_free:
        detail = "; ".join(h.describe() for h in verdict.holders) or verdict.unreadable
        raise LaunchRefused(
            f"GPUs of {profile.name} on {host.name} are not free: {detail}. "
            "Kill the holders (or `tunedash free` to wait) before launching",
            Reason.GPUS_HELD,
            verdict.holders,
        )
    return learn_baseline(snapshot, tuple(profile.gpus))
