"""The simulated host's GPU type (a profile's sim_gpus) and what its nvidia-smi says of it: compute_cap and
`topo -m` in the real layout, read back by tunedash's own parser (app.core.telemetry.topology)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.connect import host_for
from app.core.hosts.local import LocalHost
from app.core.profiles.loading import load_profile
from app.core.profiles.types import ProfileError
from app.core.telemetry.topology import NVLINK, GpuLink, parse_compute_caps, parse_topology, read_gpu_facts
from app.sim import gpu_state
from app.sim.gpu_models import gpus_for_spec
from app.sim.host_env import GPUS_ENV, STATE_ENV, default_state_dir, reset_state, set_faults, sim_environment
from tests.helpers import DATA, GroupReaper, smi

REAL_H200_MATRIX = DATA / "smi" / "topo_h200_1gpu.txt"


def as_h200_host(sim_env: dict[str, str], sim_state: Path) -> dict[str, str]:
    reset_state(sim_state, gpus_for_spec("2xH200"))
    return sim_env


def test_the_default_host_is_two_pcie_a6000s_at_sm86(sim_env: dict[str, str]) -> None:
    out = smi(sim_env, "--query-gpu=index,name,compute_cap,memory.total", "--format=csv,noheader,nounits")
    assert out.stdout == "0, NVIDIA RTX A6000, 8.6, 49140\n1, NVIDIA RTX A6000, 8.6, 49140\n"
    caps, skipped = parse_compute_caps(smi(sim_env, "--query-gpu=index,compute_cap", "--format=csv,noheader").stdout)
    assert [(cap.gpu, cap.sm) for cap in caps] == [(0, 86), (1, 86)] and skipped == 0
    topo = smi(sim_env, "topo", "-m")
    assert topo.returncode == 0
    topology = parse_topology(topo.stdout)
    assert topology.links == (GpuLink(0, 1, "PHB"),)
    assert topology.skipped == 0


def test_compute_cap_header_has_no_unit_like_the_real_tool(sim_env: dict[str, str]) -> None:
    assert smi(sim_env, "--query-gpu=compute_cap", "--format=csv").stdout == "compute_cap\n8.6\n8.6\n"
    assert smi(sim_env, "--query-gpu=compute_cap", "--format=csv,noheader", "-i", "1").stdout == "8.6\n"


def test_an_h200_host_is_sm90_with_nv18(sim_env: dict[str, str], sim_state: Path) -> None:
    env = as_h200_host(sim_env, sim_state)
    out = smi(env, "--query-gpu=index,name,compute_cap,memory.total", "--format=csv,noheader,nounits")
    assert out.stdout == "0, NVIDIA H200, 9.0, 143771\n1, NVIDIA H200, 9.0, 143771\n"
    topology = parse_topology(smi(env, "topo", "-m").stdout)
    assert topology.links == (GpuLink(0, 1, NVLINK, 18),)


def test_topo_matrix_has_the_real_layout(sim_env: dict[str, str], sim_state: Path) -> None:
    env = as_h200_host(sim_env, sim_state)
    lines = smi(env, "topo", "-m").stdout.split("\n")
    real = REAL_H200_MATRIX.read_text().split("\n")
    assert lines[0] == "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    assert lines[1].split("\t")[:3] == ["GPU0", " X ", "NV18"]
    assert lines[1].split("\t")[-3:] == ["0", "", "N/A"]  # NUMA Affinity, an empty cell, GPU NUMA ID as real
    assert real[1].split("\t")[-3:] == ["0", "", "N/A"]
    assert lines[2].split("\t")[:3] == ["GPU1", "NV18", " X "]
    assert lines[3:] == real[2:]  # a blank line, then the Legend block byte for byte


def test_topo_other_options_and_faults_answer_like_nvidia_smi(sim_env: dict[str, str], sim_state: Path) -> None:
    out = smi(sim_env, "topo", "-m", "-i", "0")
    assert out.stdout == "The -i command line argument must be used in conjunction with -n or -p.\n"
    assert smi(sim_env, "topo", "--bogus").returncode == 2
    set_faults(sim_state, lost_gpus=[1])
    lost = smi(sim_env, "topo", "-m")
    assert lost.returncode == 15 and "GPU is lost" in lost.stdout
    set_faults(sim_state, lost_gpus=[], driver_mismatch=True)
    assert smi(sim_env, "topo", "-m").returncode == 18


def test_read_gpu_facts_over_the_simulated_host(sim_env: dict[str, str], sim_state: Path, tmp_path: Path) -> None:
    env = sim_environment(reset_state(sim_state, gpus_for_spec("2xH200")))
    facts = asyncio.run(read_gpu_facts(LocalHost("sim", extra_env=env, state_dir=str(tmp_path / "td")), [0, 1]))
    assert (facts.compute_cap, facts.interconnect) == ("9.0", "nvlink")
    assert facts.capability_error is None and facts.topology_error is None


def write_profile(tmp_path: Path, extra: str, name: str = "p") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nhost = "sim"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\n{extra}\n')
    return path


def test_a_profiles_sim_gpus_reaches_the_host(tmp_path: Path, sim_state: Path) -> None:
    profile = load_profile(write_profile(tmp_path, f'sim_gpus = "2 x h200"\nsim_state = "{sim_state}"'))
    host = host_for(profile)
    assert isinstance(host, LocalHost)
    facts = asyncio.run(read_gpu_facts(host, [0, 1]))
    assert (facts.compute_cap, facts.interconnect) == ("9.0", "nvlink")
    config = gpu_state.read_host_config(sim_state)
    assert [g.name for g in config.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert config.startup_s == 0.4  # the folder's other settings stay
    env = sim_environment(sim_state, "2xH200")
    assert env[GPUS_ENV] == "2xH200"


def test_no_sim_gpus_leaves_the_host_as_it_was(tmp_path: Path, sim_state: Path) -> None:
    before = json.loads((sim_state / gpu_state.HOST_FILE).read_text())
    host_for(load_profile(write_profile(tmp_path, f'sim_state = "{sim_state}"')))
    assert json.loads((sim_state / gpu_state.HOST_FILE).read_text()) == before
    assert GPUS_ENV not in sim_environment(sim_state)


def test_another_gpu_type_without_sim_state_is_another_machine(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "cache" / "sim"))
    assert default_state_dir() == tmp_path / "cache" / "sim"
    assert default_state_dir("2xA6000") == tmp_path / "cache" / "sim"
    assert default_state_dir("2xH200") == tmp_path / "cache" / "sim-2xh200"


def test_bad_specs_and_busy_hosts_are_profile_errors(tmp_path: Path, sim_state: Path, sim_env: dict[str, str],
                                                     reaper: GroupReaper) -> None:
    with pytest.raises(ProfileError, match=r"p\.toml: sim_gpus: expected COUNTxMODEL .*A6000, H200.*'2xB200'"):
        host_for(load_profile(write_profile(tmp_path, f'sim_gpus = "2xB200"\nsim_state = "{sim_state}"')))
    holder = reaper.start(["sleep", "60"], sim_env)
    gpu_state.allocate(sim_state, 0, 1024, "sglang::scheduler_TP0", "weights", pid=holder.pid)
    with pytest.raises(ProfileError, match=rf"sim_gpus: .*memory is held on them \(pid {holder.pid}\)"):
        host_for(load_profile(write_profile(tmp_path, f'sim_gpus = "2xH200"\nsim_state = "{sim_state}"')))
    real = tmp_path / "real.toml"
    real.write_text('name = "real"\nhost = "local"\nbackend = "sglang"\nmodel = "m"\nsim_gpus = "2xH200"\n')
    with pytest.raises(ProfileError, match=r"real\.toml: sim_gpus: only a simulated host has one"):
        host_for(load_profile(real))
