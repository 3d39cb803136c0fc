"""The fake nvidia-smi answers like the real one (formats in docs/gpus.md)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from app.sim import gpu_state
from app.sim.host_env import set_faults
from tests.helpers import GroupReaper, smi, wait_until

BRACKETED = re.compile(r"^\[.*\]$")


def hold(reaper: GroupReaper, env: dict[str, str], state: Path, gpu: int, mib: int, name: str) -> subprocess.Popen[str]:
    """A real process that owns `mib` on `gpu`."""
    proc = reaper.start(["sleep", "60"], env)
    gpu_state.allocate(state, gpu, mib, name, "weights", pid=proc.pid)
    return proc


def test_query_gpu_csv_with_units_and_header(sim_env: dict[str, str]) -> None:
    out = smi(sim_env, "--query-gpu=index,uuid,name,memory.used,memory.total,power.draw,clocks.sm", "--format=csv")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    # Header echoes the canonical name of an alias (clocks.sm -> clocks.current.sm) and keeps the units.
    assert lines[0] == (
        "index, uuid, name, memory.used [MiB], memory.total [MiB], power.draw [W], clocks.current.sm [MHz]"
    )
    assert len(lines) == 3
    first = lines[1].split(", ")
    assert first[0] == "0"
    assert first[1].startswith("GPU-")
    assert first[2] == "NVIDIA RTX A6000"
    assert first[3] == "0 MiB"
    assert first[4] == "49140 MiB"
    assert re.fullmatch(r"\d+\.\d\d W", first[5])
    assert re.fullmatch(r"\d+ MHz", first[6])


def test_nounits_strips_values_but_header_keeps_units(sim_env: dict[str, str]) -> None:
    out = smi(sim_env, "--query-gpu=index,memory.used,memory.total", "--format=csv,nounits")
    assert out.stdout.splitlines() == [
        "index, memory.used [MiB], memory.total [MiB]",
        "0, 0, 49140",
        "1, 0, 49140",
    ]
    out = smi(sim_env, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert out.stdout == "0, 0\n1, 0\n"


def test_bracketed_values_and_id_selection(sim_env: dict[str, str]) -> None:
    out = smi(sim_env, "--query-gpu=index,mig.mode.current", "--format=csv,noheader", "-i", "1")
    assert out.returncode == 0
    index, mig = out.stdout.strip().split(", ")
    assert index == "1"
    assert BRACKETED.match(mig)


def test_unknown_field_fails_the_whole_query(sim_env: dict[str, str]) -> None:
    out = smi(sim_env, "--query-gpu=index,bogus.field", "--format=csv")
    assert out.returncode == 2
    assert out.stdout == 'Field "bogus.field" is not a valid field to query.\n\n'


def test_unknown_id_means_no_devices(sim_env: dict[str, str]) -> None:
    out = smi(sim_env, "--query-gpu=index", "--format=csv", "-i", "7")
    assert (out.returncode, out.stdout.strip()) == (6, "No devices were found")


def test_compute_apps_empty_and_with_processes(sim_env: dict[str, str], sim_state: Path, reaper: GroupReaper) -> None:
    query = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
    empty = smi(sim_env, query, "--format=csv,noheader")
    assert (empty.returncode, empty.stdout) == (0, "")
    header_only = smi(sim_env, query, "--format=csv")
    assert header_only.stdout == "gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"

    a = hold(reaper, sim_env, sim_state, 0, 20000, "sglang::scheduler_TP0")
    gpu_state.allocate(sim_state, 0, 1000, "sglang::scheduler_TP0", "kv_cache", pid=a.pid)
    b = hold(reaper, sim_env, sim_state, 1, 5000, "sglang::scheduler_TP1")
    out = smi(sim_env, query, "--format=csv,noheader,nounits")
    uuids = [g.uuid for g in gpu_state.read_host_config(sim_state).gpus]
    assert out.stdout.splitlines() == [
        f"{uuids[0]}, {a.pid}, sglang::scheduler_TP0, 21000",
        f"{uuids[1]}, {b.pid}, sglang::scheduler_TP1, 5000",
    ]
    used = smi(sim_env, "--query-gpu=index,memory.used,memory.free", "--format=csv,noheader,nounits")
    assert used.stdout.splitlines() == ["0, 21000, 27669", "1, 5000, 43669"]


def test_loop_mode_prints_header_once_and_sees_changes(
    sim_env: dict[str, str], sim_state: Path, reaper: GroupReaper
) -> None:
    loop = reaper.start(
        ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,nounits", "-lms", "50"],
        sim_env,
        stdout=subprocess.PIPE,
    )
    assert loop.stdout is not None
    assert loop.stdout.readline() == "index, memory.used [MiB]\n"
    hold(reaper, sim_env, sim_state, 1, 1234, "sglang::scheduler_TP1")
    seen = []
    for _ in range(200):
        line = loop.stdout.readline()
        seen.append(line)
        if line == "1, 1234\n":
            break
    assert "1, 1234\n" in seen
    assert not any(line.startswith("index") for line in seen)


def test_fault_driver_mismatch(sim_env: dict[str, str], sim_state: Path) -> None:
    set_faults(sim_state, driver_mismatch=True)
    out = smi(sim_env, "--query-gpu=index,memory.used", "--format=csv,noheader")
    assert out.returncode == 18
    assert out.stdout.splitlines()[0] == "Failed to initialize NVML: Driver/library version mismatch"
    assert out.stdout.splitlines()[1].startswith("NVML library version: ")
    set_faults(sim_state, driver_mismatch=False)
    assert smi(sim_env, "--query-gpu=index", "--format=csv").returncode == 0


def test_fault_no_devices_and_driver_not_loaded(sim_env: dict[str, str], sim_state: Path) -> None:
    set_faults(sim_state, no_devices=True)
    out = smi(sim_env, "--query-gpu=index", "--format=csv")
    assert (out.returncode, out.stdout) == (6, "No devices were found\n")
    set_faults(sim_state, no_devices=False, driver_not_loaded=True)
    out = smi(sim_env, "--query-gpu=index", "--format=csv")
    assert out.returncode == 9
    assert out.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_fault_gpu_lost_one_shot_and_loop(sim_env: dict[str, str], sim_state: Path, reaper: GroupReaper) -> None:
    set_faults(sim_state, lost_gpus=[1])
    bus = gpu_state.read_host_config(sim_state).gpus[1].pci_bus_id
    out = smi(sim_env, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert out.returncode == 15
    assert out.stdout.splitlines() == [
        "0, 0",
        f"Unable to determine the device handle for GPU {bus}: GPU is lost. Reboot the system to recover this GPU",
    ]
    loop = reaper.start(
        ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader", "-lms", "100"],
        sim_env,
        stdout=subprocess.PIPE,
    )
    assert loop.stdout is not None
    assert [loop.stdout.readline(), loop.stdout.readline()] == ["0, 0 MiB\n", "[GPU is lost], [GPU is lost]\n"]


def test_release_waits_for_death_plus_delay(sim_env: dict[str, str], sim_state: Path, reaper: GroupReaper) -> None:
    proc = hold(reaper, sim_env, sim_state, 0, 4000, "sglang::scheduler_TP0")
    time.sleep(0.5)  # alive: never released, however long
    assert gpu_state.snapshot(sim_state).used_mib(gpu_state.read_host_config(sim_state).gpus[0]) == 4000
    proc.kill()
    proc.wait()  # reaped; a zombie would count as dead too
    t_dead = time.time()
    first = smi(sim_env, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", "0")
    if time.time() < t_dead + 0.3:
        assert first.stdout == "0, 4000\n"  # still within the release delay
    wait_until(
        lambda: smi(sim_env, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0").stdout == "0\n",
        10, "GPU 0 to read 0 MiB used"
    )
    [entry] = gpu_state.released_log(sim_state)
    assert entry["pid"] == proc.pid
    assert entry["released_at"] >= entry["dead_since"] + 0.3 - 1e-6
    assert entry["dead_since"] >= t_dead - 0.05


def test_reused_pid_does_not_keep_memory(sim_state: Path, reaper: GroupReaper, sim_env: dict[str, str]) -> None:
    proc = reaper.start(["sleep", "60"], sim_env)
    rec = gpu_state.allocate(sim_state, 0, 100, "x", "weights", pid=proc.pid)
    # Pretend the record was made by an earlier process that had the same pid.
    with gpu_state.StateLock(sim_state):
        recs = gpu_state._read_records(sim_state)
        recs[0].start_time = rec.start_time - 1
        gpu_state._write_records(sim_state, recs)
    assert gpu_state.snapshot(sim_state).records[0].dead_since is not None


def test_leaked_records_stay_after_owner_death(sim_env: dict[str, str], sim_state: Path, reaper: GroupReaper) -> None:
    proc = hold(reaper, sim_env, sim_state, 1, 3000, "sglang::scheduler_TP1")
    gpu_state.mark_leaked(sim_state, proc.pid)
    proc.kill()
    proc.wait()
    time.sleep(0.5)
    out = smi(sim_env, "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits")
    assert out.stdout == f"{proc.pid}, sglang::scheduler_TP1, 3000\n"


def test_out_of_memory(sim_state: Path, reaper: GroupReaper, sim_env: dict[str, str]) -> None:
    proc = reaper.start(["sleep", "60"], sim_env)
    with pytest.raises(gpu_state.OutOfMemory) as info:
        gpu_state.allocate(sim_state, 0, 60000, "x", "weights", pid=proc.pid)
    assert info.value.free_mib == 49140 - 471
