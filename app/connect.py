"""Turns a profile's `host` into a Host: the simulated host, this machine, or (later) an SSH host.

This is glue above the core: it may import app.sim (the core never does).
"""

from __future__ import annotations

from pathlib import Path

from app.core.hosts.base import Host, HostError
from app.core.hosts.local import LocalHost
from app.core.profile import Profile


def host_for(profile: Profile) -> Host:
    """The host a profile names."""
    spec = profile.host
    if spec == "sim":
        from app.sim.host_env import sim_environment

        env = sim_environment(Path(profile.sim_state) if profile.sim_state else None)
        return LocalHost("sim", extra_env=env, state_dir=str(Path(env["TUNEDASH_SIM_STATE"]) / "host"))
    if spec == "local":
        return LocalHost("local")
    raise HostError(
        f"{profile.source}: host {spec!r} is an SSH host; SSH hosts are not supported in this version yet. "
        "Use host = \"local\" on the GPU machine itself, or host = \"sim\" for the simulated host"
    )
