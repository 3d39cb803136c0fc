"""Turns a profile's `host` into a Host: the simulated host, this machine, an SSH host, or a Slurm allocation.

This is glue above the core: it may import app.sim (the core never does).

A simulated host (`host = "sim"`) speaks the SGLang release the profile's `sim_version` names ("0.5.10", the
default, or "0.5.23"; app.sim.versions lists them): it reaches every command on that host through
TUNEDASH_SIM_SGLANG_VERSION in the host's environment, so the server, its `--help` and a version probe all
see the same release. An unknown version is a ProfileError naming the file and `sim_version`. Its GPUs are the
ones `sim_gpus` names ("2xA6000", today's default host, or "2xH200"; app.sim.gpu_models): the state folder
describes them (without sim_state, another GPU type gets its own folder) and TUNEDASH_SIM_GPUS says them to
every command on the host. An unknown spec, or GPUs of another type with memory held, is a ProfileError naming
`sim_gpus`.

The simulated host's LocalHost carries `nvml=SimNvml(state)`: the release watch reads its GPUs in-process at
NVML's pace through it, as it reads a real machine's through pynvml
(docs/decisions.md#release-watch-at-the-sources-pace).

SSH hosts (`ssh://user@host:port` or a ~/.ssh/config alias) get one SshHost each. A profile that names an
SSH host *and* `sim_state` is the simulated host behind sshd (tests, demos on a shared machine): every remote
command then gets the simulated host's environment (PATH with the fake nvidia-smi, TUNEDASH_SIM_STATE,
PYTHONPATH, TUNEDASH_SIM_SGLANG_VERSION, TUNEDASH_SIM_GPUS when sim_gpus is set), as `env K=V ...` in front of
the command, and job records live in `<sim_state>/host` as they do for `host = "sim"`. That folder is a path on
the SSH host, so this only makes sense where the SSH host sees this machine's files (loopback). Without
sim_state, job records and logs go to ~/.local/state/tunedash on the SSH host, and the profile's `env` reaches
the server as for a local launch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from app.core.hosts.base import Host
from app.core.hosts.local import LocalHost
from app.core.profiles.types import Profile, ProfileError


def host_for(profile: Profile) -> Host:
    """The host a profile names."""
    spec = profile.host
    if spec == "sim":
        from app.sim.sim_nvml import SimNvml

        env = simulated_host_environment(profile)
        state = env["TUNEDASH_SIM_STATE"]
        return LocalHost("sim", extra_env=env, state_dir=str(Path(state) / "host"), nvml=SimNvml(state))
    if spec == "local":
        check_no_sim_version(profile)
        return LocalHost("local")
    if spec.startswith("slurm:"):
        return slurm_host_for(profile)
    return ssh_host_for(profile)


def slurm_host_for(profile: Profile) -> Host:
    """The SlurmHost of a `slurm:local` / `slurm://LOGIN` profile: its login host is this machine or the SshHost
    of LOGIN. With sim_state (tests, demos on the one-node Slurm of scripts/slurm-local) every step gets the
    simulated host's environment and the records live in `<sim_state>/host`, as for an SSH host with sim_state."""
    from app.core.hosts.slurm import SlurmHost
    from app.core.hosts.slurm_request import SlurmRequest

    request = profile.slurm or SlurmRequest()
    env: dict[str, str] = {}
    state_dir = None
    if profile.sim_state is not None:
        env = simulated_host_environment(profile)
        from app.sim.host_env import STATE_ENV

        state_dir = str(Path(env[STATE_ENV]) / "host")
    else:
        check_no_sim_version(profile)
    login: Host
    if request.login == "local":
        login = LocalHost("local", state_dir=state_dir)
    else:
        from app.core.hosts.ssh import SshHost

        login = SshHost(request.login, state_dir=state_dir)
    return SlurmHost(profile.host, request, login=login, extra_env=env)


def fleet_hosts(profiles: Sequence[Profile]) -> list[tuple[Profile, Host | ProfileError]]:
    """Each profile with its host, one Host per distinct host (`tunedash fleet`): profiles naming the same SSH
    host (and the same simulated state behind it, if any) share one Host, so one connection; a profile whose
    host cannot be made gets its ProfileError instead."""
    shared: dict[tuple[str, Path | None, str, str], Host] = {}
    out: list[tuple[Profile, Host | ProfileError]] = []
    for profile in profiles:
        key = (profile.host, profile.sim_state, profile.sim_version, profile.sim_gpus)
        if key not in shared:
            try:
                shared[key] = host_for(profile)
                if hasattr(shared[key], "allocate"):  # a Slurm host: the fleet looks, it never asks for a job
                    shared[key].allocate = False  # type: ignore[attr-defined]
            except ProfileError as exc:
                out.append((profile, exc))
                continue
        out.append((profile, shared[key]))
    return out


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
    """The variables every command on the profile's simulated host gets (state folder, PATH, SGLang version,
    GPUs)."""
    from app.sim.gpu_models import canonical_gpu_spec
    from app.sim.host_env import SimGpusInUse, sim_environment
    from app.sim.versions import VERSION_ENV

    version = sim_sglang_version(profile)
    try:
        gpus = canonical_gpu_spec(profile.sim_gpus) if profile.sim_gpus else None
    except ValueError as exc:
        raise ProfileError(f"{profile.source}: sim_gpus: {exc}") from exc
    try:
        env = sim_environment(Path(profile.sim_state) if profile.sim_state else None, gpus)
    except SimGpusInUse as exc:
        raise ProfileError(f"{profile.source}: sim_gpus: {exc}") from exc
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
    """A profile for a real host names no simulated version or GPUs (they would be silently ignored)."""
    for key, value in (("sim_version", profile.sim_version), ("sim_gpus", profile.sim_gpus)):
        if value:
            raise ProfileError(f"{profile.source}: {key}: only a simulated host has one (host = \"sim\", or an "
                               f"SSH host with sim_state); remove {key}")
