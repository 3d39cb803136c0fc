"""The dashboard's GPU sampler (app.core.telemetry.steady): NVML in-process when its first sample is readable with
v2 memory, nvidia-smi for good otherwise; which source each host gets; the release watch unchanged."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

from app.connect import host_for
from app.core.hosts.local import LocalHost
from app.core.profiles.loading import load_profile
from app.core.server.release import release_sampler_for
from app.core.telemetry.nvml import NvmlTelemetry
from app.core.telemetry.smi import SmiTelemetry
from app.core.telemetry.steady import NvmlFirstTelemetry, dashboard_telemetry
from app.sim import gpu_state
from tests.unit.test_nvml import FakeNvml


@pytest.fixture
def sim_host(tmp_path: Path, sim_state: Path) -> LocalHost:
    path = tmp_path / "p.toml"
    path.write_text(f'backend = "custom"\nhost = "sim"\nsim_state = "{sim_state}"\ngpus = [0, 1]\n'
                    f'command = ["{sys.executable}"]\nready_regex = "up"\n')
    host = host_for(load_profile(path))
    assert isinstance(host, LocalHost)
    return host


async def first_of(telemetry: NvmlFirstTelemetry, period_ms: int = 100) -> list[str]:
    sources = []
    async with contextlib.aclosing(telemetry.stream(period_ms)) as snapshots:
        async for snapshot in snapshots:
            assert snapshot.error is None, snapshot.error
            sources.append(snapshot.gpus[0].source)
            if len(sources) == 3:
                break
    return sources


async def test_readable_nvml_serves_the_dashboard_and_nvidia_smi_never_runs(sim_host: LocalHost, sim_state: Path,
                                                                            tmp_path: Path) -> None:
    gpu_state.allocate(sim_state, 0, 4096, "python3", "test")  # this test process holds 4 GiB on GPU 0
    assert isinstance(dashboard_telemetry(sim_host, [0, 1], "nvml"), NvmlFirstTelemetry)
    ran = tmp_path / "nvidia-smi-ran"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ntouch {ran}\n")
    smi.chmod(0o755)
    telemetry = NvmlFirstTelemetry(sim_host, [0, 1], smi=SmiTelemetry(sim_host, [0, 1], executable=str(smi)))
    assert await first_of(telemetry) == ["nvml", "nvml", "nvml"]  # the simulated host's NVML-like reader
    snapshot = await telemetry.sample()
    assert telemetry.active == "nvml"
    assert [g.memory_used_mib for g in snapshot.gpus] == [4096, 0]
    assert snapshot.gpus[0].processes is not None and snapshot.gpus[0].processes[0].used_mib == 4096
    await telemetry.close()
    assert not ran.exists()


@pytest.mark.parametrize("fake", [FakeNvml(2, has_v2_memory=False), FakeNvml(2)], ids=["v1 memory", "no library"])
async def test_unreadable_nvml_gives_way_to_nvidia_smi_for_good(sim_host: LocalHost, fake: FakeNvml) -> None:
    import pynvml

    if fake.has_v2_memory:
        fake.init_error = pynvml.NVMLError_LibraryNotFound()
    nvml = NvmlTelemetry([0, 1], nvml=fake)
    telemetry = NvmlFirstTelemetry(sim_host, [0, 1], nvml=nvml, smi=SmiTelemetry(sim_host, [0, 1]))
    assert await first_of(telemetry, 250) == ["smi", "smi", "smi"]
    assert telemetry.active == "smi"
    inits = fake.calls.get("nvmlInit", 0)
    await telemetry.sample()
    assert fake.calls.get("nvmlInit", 0) == inits  # NVML is not asked again
    await telemetry.close()


def test_each_host_gets_its_source(sim_host: LocalHost) -> None:
    real = LocalHost()
    assert isinstance(dashboard_telemetry(real, [0]), NvmlFirstTelemetry)  # this machine's driver
    assert isinstance(dashboard_telemetry(sim_host, [0]), SmiTelemetry)  # the fake nvidia-smi keeps its knobs
    assert isinstance(dashboard_telemetry(real, [0], "smi"), SmiTelemetry)
    remote = LocalHost(name="h200-box")
    remote.is_local = False
    assert isinstance(dashboard_telemetry(remote, [0]), SmiTelemetry)
    with pytest.raises(ValueError, match="h200-box"):
        dashboard_telemetry(remote, [0], "nvml")


def test_the_release_watch_reads_as_it_did(sim_host: LocalHost) -> None:
    sampler = release_sampler_for(sim_host, [0, 1], dashboard_telemetry(sim_host, [0, 1], "nvml"))
    plain = release_sampler_for(sim_host, [0, 1], SmiTelemetry(sim_host, [0, 1]))
    assert (sampler.source, sampler.period_ms) == (plain.source, plain.period_ms) == ("nvml", 5)
    assert sampler.fallback is not None and sampler.fallback.source == "smi"


def test_ui_gpu_source_reaches_the_session(sim_host: LocalHost, tmp_path: Path) -> None:
    from app.cli.main import build_parser
    from app.tui.app import create_app

    assert build_parser().parse_args(["ui", "p.toml"]).gpu_source == "auto"
    args = build_parser().parse_args(["ui", "p.toml", "--gpu-source", "nvml"])
    profile = load_profile(tmp_path / "p.toml")
    app = create_app(profile, readonly=True, host=sim_host, gpu_source=args.gpu_source, keymap_file=None,
                     theme_file=None)
    assert isinstance(app.session.telemetry, NvmlFirstTelemetry)
    assert isinstance(create_app(profile, readonly=True, host=sim_host, keymap_file=None,
                                 theme_file=None).session.telemetry, SmiTelemetry)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ui", "p.toml", "--gpu-source", "dcgm"])
