"""Before a launch: refuse a running job of the profile, a taken port, unreadable or held GPUs.

LaunchRefused carries a Reason (app.core.errors); only app/cli/common.py turns it into an exit code. On success
the GPUs' idle baseline (MiB per GPU) is returned: confirm-free later compares against it.
"""

from __future__ import annotations

from app.core.data import Holder
from app.core.errors import Reason, TunedashError
from app.core.hosts.base import Host
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.telemetry.freecheck import FreeCheck, learn_baseline
from app.core.telemetry.smi import Telemetry


class LaunchRefused(TunedashError):
    """Launch did not start a server; the message says why and what to do, the reason says which case."""

    def __init__(self, message: str, reason: Reason, holders: tuple[Holder, ...] = ()) -> None:
        super().__init__(message, reason)
        self.holders = holders



async def preflight(host: Host, profile: Profile, telemetry: Telemetry) -> dict[int, int]:
    """Refuse to launch onto a taken port or GPUs that hold memory; returns the idle baseline."""
    record = await jobs.load_job(host, profile.name)
    if record is not None and await jobs.job_members(host, record):
        raise LaunchRefused(
            f"{profile.name} is already running on {host.name} (pid {record.pid}, port {record.port}); "
            "use `tunedash relaunch` or `tunedash kill` first",
            Reason.ALREADY_RUNNING,
        )
    if profile.port and await host.port_in_use(profile.port):
        raise LaunchRefused(
            f"port {profile.port} on {host.name} is already in use by another process; stop it or "
            f"set another `port` in {profile.source}",
            Reason.PORT_IN_USE,
        )
    if not profile.gpus:
        return {}
    snapshot = await telemetry.sample()
    if snapshot.error is not None:
        raise LaunchRefused(
            f"cannot read the GPUs of {host.name}: {snapshot.error.message.strip()}"
            + (f" ({snapshot.error.hint})" if snapshot.error.hint else ""),
            Reason.GPUS_UNREADABLE,
        )
    verdict = FreeCheck(tuple(profile.gpus), needed=1).feed(snapshot)
    if not verdict.all_free:
        detail = "; ".join(h.describe() for h in verdict.holders) or verdict.unreadable
        raise LaunchRefused(
            f"GPUs of {profile.name} on {host.name} are not free: {detail}. "
            "Kill the holders (or `tunedash free` to wait) before launching",
            Reason.GPUS_HELD,
            verdict.holders,
        )
    return learn_baseline(snapshot, tuple(profile.gpus))
