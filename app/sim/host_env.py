"""The simulated host's environment: state folder set-up, PATH with the fake nvidia-smi, reset and fault knobs.

Public API:
    sim_environment(state_dir=None, gpus=None) -> dict[str, str]
        Initialise the state folder if needed (2 x "NVIDIA RTX A6000", 49140 MiB, idle 0 MiB) and return the
        variables to ADD to a process's environment on the simulated host: PATH (the state folder's bin/
        first, holding an executable `nvidia-smi`), TUNEDASH_SIM_STATE and PYTHONPATH (so that
        `python -m app.sim.sglang` works from any cwd). With `gpus` (a sim_gpus spec, app.sim.gpu_models:
        "2xH200"), the host has those GPUs and the variables include TUNEDASH_SIM_GPUS; without a state folder,
        a spec other than the default gets its own folder next to the default one ("sim-2xh200"): another
        GPU type is another machine.
    reset_state(state_dir, gpus=..., release_delay_s=..., startup_s=...) -> Path
        Rewrite host.json, drop every allocation, the release log and all fault knobs (for tests).
    set_faults(state_dir, **knobs)
        Set nvidia-smi fault knobs in faults.json (keys in gpu_state.FAULT_KNOBS), e.g.
        set_faults(d, driver_mismatch=True), set_faults(d, lost_gpus=[1]); False/None/[] clears a knob.
    default_state_dir(gpus=None) -> Path
        $TUNEDASH_SIM_STATE, else platformdirs.user_cache_dir("tunedash")/"sim" (a non-default GPU spec: that
        folder's name + "-" + the spec). A profile may pass its own.

Environment variables of the simulated host (read by app.sim.*):
    TUNEDASH_SIM_STATE       the state folder (see gpu_state.py for its layout)
    TUNEDASH_SIM_STARTUP_S   the simulated SGLang server's total startup time in seconds (default ~6 s;
                             tests use ~0.3); host.json "startup_s" is used when the variable is unset
    TUNEDASH_SIM_FAULT       server fault knobs, comma-separated: crash_loading, oom_capture, never_release
    TUNEDASH_SIM_TIMING      "seed": the server plays the seed model's real phase times (app.sim.sglang.SEED_PHASES:
                             weights 31.1 s, graphs 12.4 + 3.9 s) instead of shares of TUNEDASH_SIM_STARTUP_S
    TUNEDASH_SIM_SPEED_FILE  a TOML file overriding keys of app/sim/speed_model.toml
    TUNEDASH_SIM_SGLANG_VERSION  the SGLang release the simulated server speaks: 0.5.10 (default) or 0.5.23
                             (app.sim.versions; app.connect sets it from a profile's sim_version)
    TUNEDASH_SIM_GPUS        the host's GPUs as a spec ("2xA6000", "2xH200"; app.sim.gpu_models); app.connect
                             sets it from a profile's sim_gpus. init_state makes host.json describe those GPUs
                             (rewriting an idle host that has others; SimGpusInUse when memory is held on them)
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

from app.sim import gpu_state
from app.sim.gpu_models import DEFAULT_GPU_SPEC, canonical_gpu_spec, gpus_for_spec, same_hardware
from app.sim.gpu_state import HostConfig, SimGpu

STATE_ENV = "TUNEDASH_SIM_STATE"
STARTUP_ENV = "TUNEDASH_SIM_STARTUP_S"
FAULT_ENV = "TUNEDASH_SIM_FAULT"
SPEED_FILE_ENV = "TUNEDASH_SIM_SPEED_FILE"
GPUS_ENV = "TUNEDASH_SIM_GPUS"


class SimGpusInUse(Exception):
    """A state folder whose GPUs differ from the spec asked for, while memory is held on them."""


def default_state_dir(gpus: str | None = None) -> Path:
    """The state folder of a simulated host without its own: one per GPU type (the default type: "sim")."""
    env = os.environ.get(STATE_ENV)
    if env:
        base = Path(env)
    else:
        import platformdirs

        base = Path(platformdirs.user_cache_dir("tunedash")) / "sim"
    spec = canonical_gpu_spec(gpus) if gpus else DEFAULT_GPU_SPEC
    return base if spec == DEFAULT_GPU_SPEC else base.with_name(f"{base.name}-{spec.lower()}")


def package_root() -> Path:
    """The folder that holds the `app` package (put on PYTHONPATH for the simulated host)."""
    return Path(__file__).resolve().parents[2]


def _write_wrapper(state_dir: Path) -> Path:
    bin_dir = state_dir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    root = str(package_root())
    # -S skips site and -c skips runpy (together ~20 ms per call); the module only needs the stdlib and `app`.
    # Bytecode is cached in the state folder even where PYTHONDONTWRITEBYTECODE is set (saves ~15 ms).
    # Same effect as `python -m app.sim.nvidia_smi "$@"`.
    script = (
        "#!/bin/sh\n"
        "# fake nvidia-smi of the tunedash simulated host\n"
        f"TUNEDASH_SIM_STATE='{state_dir}' PYTHONPATH='{root}' "
        f"PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX='{state_dir / 'pycache'}' "
        f"exec '{sys.executable}' -S -c 'import sys; from app.sim.nvidia_smi import main; sys.exit(main())' \"$@\"\n"
    )
    path = bin_dir / "nvidia-smi"
    if not path.exists() or path.read_text() != script:
        tmp = bin_dir / f".nvidia-smi.{os.getpid()}"
        tmp.write_text(script)
        tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(tmp, path)
    return path


def init_state(state_dir: Path, gpus: str | None = None) -> Path:
    """Create the state folder with the default GPUs unless it already describes a host.

    With a GPU spec (`gpus`, else $TUNEDASH_SIM_GPUS) the host has those GPUs: a new folder gets them, and a
    folder that describes other GPUs is rewritten to them when no memory is held (SimGpusInUse otherwise).
    A bad spec is a ValueError (gpu_models.parse_gpu_spec).
    """
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    spec = gpus if gpus is not None else os.environ.get(GPUS_ENV, "")
    wanted = gpus_for_spec(spec) if spec else None
    if not (state_dir / gpu_state.HOST_FILE).exists():
        chosen = wanted if wanted is not None else gpu_state.default_gpus()
        gpu_state.write_host_config(state_dir, HostConfig(gpus=tuple(chosen)))
    elif wanted is not None:
        _match_gpus(state_dir, wanted, canonical_gpu_spec(spec))
    _write_wrapper(state_dir)
    return state_dir


def _match_gpus(state_dir: Path, wanted: list[SimGpu], spec: str) -> None:
    """Make an existing host.json describe `wanted`, keeping its other settings; refused while memory is held."""
    config = gpu_state.read_host_config(state_dir)
    if same_hardware(config.gpus, wanted):
        return
    snap = gpu_state.snapshot(state_dir)  # releases what is due first
    if snap.records:
        have = config.gpus[0].name if config.gpus else "no GPU"
        pids = ", ".join(sorted({str(r.pid) for r in snap.records}))
        raise SimGpusInUse(f"{state_dir}: the simulated host has {len(config.gpus)} x {have!r}, not {spec}, and "
                           f"memory is held on them (pid {pids}); kill its server first, or give this profile "
                           "its own sim_state")
    config.gpus = tuple(wanted)
    gpu_state.write_host_config(state_dir, config)


def sim_environment(state_dir: Path | None = None, gpus: str | None = None) -> dict[str, str]:
    """Variables to add to the environment of every process of the simulated host (no `gpus`: the host's
    GPUs stay as they are, whatever $TUNEDASH_SIM_GPUS of this process says)."""
    state_dir = init_state(state_dir if state_dir is not None else default_state_dir(gpus), gpus or "")
    root = str(package_root())
    path = os.environ.get("PATH", "")
    pythonpath = os.environ.get("PYTHONPATH", "")
    env = {
        "PATH": f"{state_dir / 'bin'}{os.pathsep}{path}" if path else str(state_dir / "bin"),
        STATE_ENV: str(state_dir),
        "PYTHONPATH": f"{root}{os.pathsep}{pythonpath}" if pythonpath else root,
    }
    if gpus:
        env[GPUS_ENV] = canonical_gpu_spec(gpus)
    return env


def reset_state(
    state_dir: Path,
    gpus: list[SimGpu] | None = None,
    *,
    gpu_count: int = 2,
    release_delay_s: float = gpu_state.DEFAULT_RELEASE_DELAY_S,
    startup_s: float | None = None,
    idle_mib: int = 0,
) -> Path:
    """Start the simulated host over: fresh host.json, no allocations, no release log, no faults."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    chosen = gpus if gpus is not None else gpu_state.default_gpus(gpu_count)
    if idle_mib:
        chosen = [SimGpu(**{**g.to_dict(), "idle_mib": idle_mib}) for g in chosen]
    config = HostConfig(gpus=tuple(chosen), release_delay_s=release_delay_s, startup_s=startup_s)
    gpu_state.write_host_config(state_dir, config)
    gpu_state.clear_allocations(state_dir)
    (state_dir / gpu_state.FAULTS_FILE).unlink(missing_ok=True)
    _write_wrapper(state_dir)
    return state_dir


def set_faults(state_dir: Path, **knobs: Any) -> None:
    """Set nvidia-smi fault knobs (see gpu_state.FAULT_KNOBS)."""
    gpu_state.write_faults(state_dir, **knobs)
