"""Turns a profile's `host` into a Host: the simulated host, this machine, or an SSH host.

This is glue above the core: it may import app.sim (the core never does).

SSH hosts (`ssh://user@host:port` or a ~/.ssh/config alias) get one SshHost each. A profile that names an
SSH host *and* `sim_state` is the simulated host behind sshd (tests, demos on a shared machine): every remote
command then gets the simulated host's environment (PATH with the fake nvidia-smi, TUNEDASH_SIM_STATE,
PYTHONPATH), as `env K=V ...` in front of the command, and job records live in `<sim_state>/host` as they do
for `host = "sim"`. That folder is a path on the SSH host, so this only makes sense where the SSH host sees
this machine's files (loopback). Without sim_state, job records and logs go to ~/.local/state/tunedash on
the SSH host, and the profile's `env` reaches the server as for a local launch.
"""

from __future__ import annotations

from pathlib import Path

from app.core.hosts.base import Host
from app.core.hosts.local import LocalHost
from app.core.profiles.types import Profile


def host_for(profile: Profile) -> Host:
    """The host a profile names."""
    spec = profile.host
    if spec == "sim":
        from app.sim.host_env import sim_environment

        env = sim_environment(Path(profile.sim_state) if profile.sim_state else None)
        return LocalHost("sim", extra_env=env, state_dir=str(Path(env["TUNEDASH_SIM_STATE"]) / "host"))
    if spec == "local":
        return LocalHost("local")
    return ssh_host_for(profile)


def ssh_host_for(profile: Profile) -> Host:
    """The SshHost of a profile whose host is `ssh://...` or an ssh config alias."""
    from app.core.hosts.ssh import SshHost

    if profile.sim_state is None:
        return SshHost(profile.host)
    from app.sim.host_env import STATE_ENV, sim_environment

    env = sim_environment(Path(profile.sim_state))
    return SshHost(profile.host, extra_env=env, state_dir=str(Path(env[STATE_ENV]) / "host"))
