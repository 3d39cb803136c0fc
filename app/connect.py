"""Turns a profile's `host` into a Host: the simulated host, this machine, or an SSH host.

This is glue above the core: it may import app.sim (the core never does).

A simulated host (`host = "sim"`) speaks the SGLang release the profile's `sim_version` names ("0.5.10", the
default, or "0.5.23"; app.sim.versions lists them): it reaches every command on that host through
TUNEDASH_SIM_SGLANG_VERSION in the host's environment, so the server, its `--help` and a version probe all
see the same release. An unknown version is a ProfileError naming the file and `sim_version`.

SSH hosts (`ssh://user@host:port` or a ~/.ssh/config alias) get one SshHost each. A profile that names an
SSH host *and* `sim_state` is the simulated host behind sshd (tests, demos on a shared machine): every remote
command then gets the simulated host's environment (PATH with the fake nvidia-smi, TUNEDASH_SIM_STATE,
PYTHONPATH, TUNEDASH_SIM_SGLANG_VERSION), as `env K=V ...` in front of the command, and job records live in
`<sim_state>/host` as they do for `host = "sim"`. That folder is a path on the SSH host, so this only makes
sense where the SSH host sees this machine's files (loopback). Without sim_state, job records and logs go to
~/.local/state/tunedash on the SSH host, and the profile's `env` reaches the server as for a local launch.
"""

from __future__ import annotations

from pathlib import Path

from app.core.hosts.base import Host
from app.core.hosts.local import LocalHost
from app.core.profiles.types import Profile, ProfileError


def host_for(profile: Profile) -> Host:
    """The host a profile names."""
    spec = profile.host
    if spec == "sim":
        env = simulated_host_environment(profile)
        return LocalHost("sim", extra_env=env, state_dir=str(Path(env["TUNEDASH_SIM_STATE"]) / "host"))
    if spec == "local":
        check_no_sim_version(profile)
        return LocalHost("local")
    return ssh_host_for(profile)


def ssh_host_for(profile: Profile) -> Host:
    """The SshHost of a profile whose host is `ssh://...` or an ssh config alias."""
    from app.core.hosts.ssh import SshHost

    if profile.sim_state is None:
        check_no_sim_version(profile)
        return SshHost(profile.host)
    from app.sim.host_env import STATE_ENV

    env = simulated_host_environment(profile)
    return SshHost(profile.host, extra_env=env, state_dir=str(Path(env[STATE_ENV]) / "host"))


def simulated_host_environment(profile: Profile) -> dict[str, str]:
    """The variables every command on the profile's simulated host gets (state folder, PATH, SGLang version)."""
    from app.sim.host_env import sim_environment
    from app.sim.versions import VERSION_ENV

    version = sim_sglang_version(profile)
    env = sim_environment(Path(profile.sim_state) if profile.sim_state else None)
    env[VERSION_ENV] = version
    return env


def sim_sglang_version(profile: Profile) -> str:
    """The SGLang release the profile's simulated host speaks: `sim_version`, else the simulator's default."""
    from app.sim.versions import DEFAULT_VERSION, VERSIONS

    version = profile.sim_version or DEFAULT_VERSION
    if version not in VERSIONS:
        raise ProfileError(f"{profile.source}: sim_version: unknown version {version!r}; the simulated SGLang "
                           f"speaks {', '.join(VERSIONS)}")
    return version


def check_no_sim_version(profile: Profile) -> None:
    """A profile for a real host names no simulated version (it would be silently ignored)."""
    if profile.sim_version:
        raise ProfileError(f"{profile.source}: sim_version: only a simulated host has one (host = \"sim\", or an "
                           "SSH host with sim_state); remove sim_version")
