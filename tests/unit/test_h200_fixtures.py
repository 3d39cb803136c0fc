"""Parsers and the free check on real captures from two H200s (tests/data/h200, issue 8).

Captured by scripts/device_proof.sh on an nvidia-h200-x2 machine (driver 580.159.04, nvidia-ml-py
13.610.43): idle, loaded (gpu-hog, one torch process per GPU holding 16 GiB), orphan (gpu-hog's parent
killed alone, its two children holding 4 GiB each) and after (`tunedash kill --confirm-free`). Each
label has nvidia-smi's CSV as tunedash queries it, a CSV with memory.reserved, and NVML's own values;
idle and loaded also have `tunedash gpus --json` from both sources.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from app.core.data import GpuSnapshot
from app.core.hosts.base import CommandResult
from app.core.telemetry.freecheck import FreeCheck, learn_baseline
from app.core.telemetry.smi import SmiTelemetry
from app.core.telemetry.smi_parse import parse_compute_apps_csv, parse_gpu_csv
from tests.fakes import CommandOnlyHost
from tests.helpers import DATA as TEST_DATA

DATA = TEST_DATA / "h200"
LABELS = ("idle", "loaded", "orphan", "after")
MIB = 2**20
UUIDS = ("GPU-ede1a36c-abe8-b324-037c-685d679a6eed", "GPU-5220b9b1-46be-06df-1753-10abff0615a0")
PYTHON = "/opt/torch/.venv/bin/python3"


def text(name: str) -> str:
    return (DATA / name).read_text()


def nvml(label: str) -> dict[str, Any]:
    return json.loads(text(f"{label}_nvml.json"))


class CapturedHost(CommandOnlyHost):
    """A host whose nvidia-smi prints one label's captured CSV."""

    name = "h200x2"

    def __init__(self, label: str) -> None:
        self.label = label

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        kind = "compute_apps" if argv[1].startswith("--query-compute-apps") else "query_gpu"
        return CommandResult(tuple(argv), 0, text(f"{self.label}_{kind}.csv"), "")


async def snapshot(label: str) -> GpuSnapshot:
    return await SmiTelemetry(CapturedHost(label), (0, 1)).sample()


@pytest.mark.parametrize("label", LABELS)
def test_query_gpu_rows(label: str) -> None:
    rows, skipped = parse_gpu_csv(text(f"{label}_query_gpu.csv"))
    assert skipped == 0
    assert [(r.index, r.uuid, r.name, r.memory_total_mib) for r in rows] == [
        (0, UUIDS[0], "NVIDIA H200", 143771), (1, UUIDS[1], "NVIDIA H200", 143771)]
    used = {"idle": 0, "loaded": 16911, "orphan": 4623, "after": 0}[label]
    assert [r.memory_used_mib for r in rows] == [used, used]
    assert all(r.unavailable == {} and r.power_w is not None and r.temperature_c is not None for r in rows)


def test_compute_apps_name_each_rank_on_its_own_gpu() -> None:
    assert parse_compute_apps_csv(text("idle_compute_apps.csv")) == ([], 0)
    assert parse_compute_apps_csv(text("after_compute_apps.csv")) == ([], 0)
    loaded, skipped = parse_compute_apps_csv(text("loaded_compute_apps.csv"))
    assert skipped == 0
    assert [(p.gpu_uuid, p.pid, p.used_mib, p.name) for p in loaded] == [
        (UUIDS[0], 724, 16902, PYTHON), (UUIDS[1], 725, 16902, PYTHON)]
    orphans, _ = parse_compute_apps_csv(text("orphan_compute_apps.csv"))
    assert [(p.pid, p.used_mib) for p in orphans] == [(978, 4614), (979, 4614)]


@pytest.mark.parametrize("label", LABELS)
def test_nvml_v2_used_is_nvidia_smi_memory_used_and_v1_adds_the_reserve(label: str) -> None:
    rows, _ = parse_gpu_csv(text(f"{label}_query_gpu.csv"))
    reserved_rows = [line.split(", ") for line in text(f"{label}_query_gpu_reserved.csv").splitlines()]
    apps, _ = parse_compute_apps_csv(text(f"{label}_compute_apps.csv"))
    for device, row, reserved in zip(nvml(label)["devices"], rows, reserved_rows, strict=True):
        v1, v2 = device["v1"], device["v2"]
        assert device["uuid"] == row.uuid
        assert round(v2["used"] / MIB) == row.memory_used_mib  # the v2 semantics tunedash uses
        assert v2["reserved"] == 644_939_776  # 615 MiB; nvidia-smi rounds it to 616
        assert int(reserved[2]) == 616
        assert v1["used"] == v2["used"] + v2["reserved"]  # v1 counts the reserve as used: 615 MiB when idle
        assert v1["total"] == v2["total"] == 150_754_820_096  # 143771 MiB
        smi = [(p.pid, p.used_mib) for p in apps if p.gpu_uuid == row.uuid]
        assert [(p["pid"], round(p["used_bytes"] / MIB)) for p in device["compute_processes"]] == smi


@pytest.mark.parametrize("label", ["idle", "loaded"])
def test_tunedash_gpus_nvml_and_smi_agree(label: str) -> None:
    by_nvml = json.loads(text(f"{label}_tunedash_nvml.json"))
    by_smi = json.loads(text(f"{label}_tunedash_smi.json"))
    assert by_nvml["error"] is by_smi["error"] is None
    for a, b in zip(by_nvml["gpus"], by_smi["gpus"], strict=True):
        for key in ("index", "uuid", "name", "memory_used_mib", "memory_total_mib", "utilization_pct"):
            assert a[key] == b[key], key
        assert abs(a["power_w"] - b["power_w"]) < 5  # two reads a moment apart
        def holders(gpu: dict[str, Any]) -> list[tuple[int, int]]:
            return [(p["pid"], p["used_mib"]) for p in gpu["processes"]]

        assert holders(a) == holders(b)
        # names differ by design: NVML's side reads /proc/PID/cmdline, nvidia-smi prints the executable
        for p, q in zip(a["processes"], b["processes"], strict=True):
            assert p["name"].startswith(q["name"] + " ")


async def test_free_check_on_the_captures() -> None:
    idle = await snapshot("idle")
    baseline = learn_baseline(idle, (0, 1))
    assert baseline == {0: 0, 1: 0}
    assert FreeCheck((0, 1), baseline, needed=1).feed(idle).confirmed

    loaded = FreeCheck((0, 1), baseline).feed(await snapshot("loaded"))
    assert not loaded.all_free
    assert loaded.used_mib == {0: 16911, 1: 16911}
    assert [h.describe() for h in loaded.holders] == [f"GPU0: pid 724 {PYTHON} 16902 MiB",
                                                      f"GPU1: pid 725 {PYTHON} 16902 MiB"]

    orphan = FreeCheck((0, 1), baseline).feed(await snapshot("orphan"))
    assert "; ".join(h.describe() for h in orphan.holders) == (
        f"GPU0: pid 978 {PYTHON} 4614 MiB; GPU1: pid 979 {PYTHON} 4614 MiB")

    after = FreeCheck((0, 1), baseline)
    after.feed(await snapshot("after"))
    assert after.feed(await snapshot("after")).confirmed  # two consecutive free readings


def test_release_bench_figures_are_consistent() -> None:
    """What bench/bench_release.py saw: the driver frees before tunedash says FREE, in well under a second."""
    for name in ("bench_release_1gpu.json", "bench_release_2gpu.json"):
        report = json.loads(text(name))
        assert len(report["rounds"]) == 10
        for row in report["rounds"]:
            assert row["confirmed"]
            assert 0 < row["driver_free_s"] <= row["tunedash_free_s"] < 1.0
