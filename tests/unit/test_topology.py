"""Compute capability and GPU topology from nvidia-smi: real-format outputs, junk, [N/A] and failures.

topo_h200_1gpu.txt is a real capture (`nvidia-smi topo -m`, driver 580.159.04, one H200, 2026-12-01; the same
machine answered `--query-gpu=compute_cap` with a `compute_cap` header and `9.0`). The other topo_*.txt files
follow the real layout: tab-separated cells, the header underlined with ANSI escapes, NIC rows without affinity
cells, a terminal copy with spaces.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest

from app.core.hosts.base import CommandResult, HostError
from app.core.telemetry.topology import (
    NVLINK,
    ComputeCapability,
    GpuLink,
    parse_compute_caps,
    parse_topology,
    read_gpu_facts,
)
from tests.fakes import CommandOnlyHost
from tests.helpers import DATA as TEST_DATA

DATA = TEST_DATA / "smi"


def fixture(name: str) -> str:
    return (DATA / name).read_bytes().decode()


def test_the_real_h200_matrix_has_one_gpu_and_no_pair() -> None:
    topology = parse_topology(fixture("topo_h200_1gpu.txt"))
    assert topology.gpus == (0,)
    assert topology.links == ()
    assert topology.skipped == 0
    assert topology.all_nvlink([0]) is None  # one GPU: no pair to judge


def test_two_pcie_cards_behind_a_host_bridge() -> None:
    topology = parse_topology(fixture("topo_2gpu_pcie_phb.txt"))
    assert topology.links == (GpuLink(0, 1, "PHB"),)
    assert topology.link(1, 0) == GpuLink(0, 1, "PHB")
    assert topology.all_nvlink([0, 1]) is False
    assert topology.skipped == 0


def test_eight_nvswitch_gpus_with_nics_give_gpu_pairs_only() -> None:
    topology = parse_topology(fixture("topo_8gpu_nv18_nics.txt"))
    assert topology.gpus == tuple(range(8))
    assert len(topology.links) == 28  # 8 choose 2; NIC rows and columns are no GPU links
    assert {(link.kind, link.nvlinks) for link in topology.links} == {(NVLINK, 18)}
    assert topology.all_nvlink([2, 5]) is True
    assert topology.skipped == 0


def test_a_terminal_copy_with_spaces_reads_the_same_paths() -> None:
    topology = parse_topology(fixture("topo_4gpu_pcie_spaces.txt"))
    kinds = {(link.a, link.b): link.kind for link in topology.links}
    assert kinds == {(0, 1): "PIX", (0, 2): "NODE", (0, 3): "SYS", (1, 2): "PXB", (1, 3): "SYS", (2, 3): "SYS"}
    assert topology.skipped == 0


def test_junk_is_skipped_and_counted_never_guessed() -> None:
    topology = parse_topology(fixture("topo_junk.txt"))
    # counted: the warning before the header, "??", the short GPU1 row, "ZZZ", "NV0", the repeated GPU0 row,
    # the Xid line
    assert topology.skipped == 7
    assert topology.gpus == (0, 2, 3)
    assert topology.link(0, 1) == GpuLink(0, 1, NVLINK, 4)
    assert topology.link(0, 3) == GpuLink(0, 3, "SYS")  # SOC, the older drivers' SYS
    assert topology.link(1, 2) == GpuLink(1, 2, "PHB")
    assert topology.link(0, 2) is None  # both rows said nothing readable about this pair
    assert topology.all_nvlink([0, 1, 2]) is None


@pytest.mark.parametrize("text", ["", "\n\n", "Failed to initialize NVML: Unknown Error\n", "GPU0\tX\n", "\x00\x1b[",
                                  "\tGPU0\tGPU1\n", "\tGPU0\nGPU0\n", "Legend:\n\tGPU0\tGPU1\nGPU0\t X \tNV4\n"])
def test_parse_topology_never_raises(text: str) -> None:
    topology = parse_topology(text)
    assert topology.links == ()


def test_compute_caps_of_two_a6000s() -> None:
    caps, skipped = parse_compute_caps(fixture("topo_compute_cap_2xa6000.csv"))
    assert caps == [ComputeCapability(0, 8, 6), ComputeCapability(1, 8, 6)]
    assert [cap.sm for cap in caps] == [86, 86]
    assert str(caps[0]) == "8.6"
    assert skipped == 0


def test_compute_caps_na_and_junk_are_none_with_the_reason() -> None:
    caps, skipped = parse_compute_caps(fixture("topo_compute_cap_mixed.csv"))
    by_gpu = {cap.gpu: cap for cap in caps}
    assert by_gpu[0] == ComputeCapability(0, 9, 0)
    assert by_gpu[1] == ComputeCapability(1, None, None, "[N/A]")
    assert by_gpu[1].sm is None
    assert by_gpu[2].reason == "unreadable: '9.O'"
    assert by_gpu[4].reason == "empty"
    assert 3 not in by_gpu  # three cells: not a row of this query
    assert skipped == 2  # the infoROM warning and the three-cell line; header and blank line are not counted


class ScriptedSmiHost(CommandOnlyHost):
    """Answers nvidia-smi queries from a table keyed by the first argument after the executable."""

    def __init__(self, answers: Mapping[str, CommandResult | Exception]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        self.calls.append(tuple(argv))
        answer = self.answers[argv[1]]
        if isinstance(answer, Exception):
            raise answer
        return answer


def answer(argv: str, stdout: str, returncode: int = 0) -> CommandResult:
    return CommandResult(tuple(argv.split()), returncode, stdout, "")


def test_read_gpu_facts_on_two_a6000s() -> None:
    host = ScriptedSmiHost({
        "--query-gpu=index,compute_cap": answer("nvidia-smi", fixture("topo_compute_cap_2xa6000.csv")),
        "topo": answer("nvidia-smi topo -m", fixture("topo_2gpu_pcie_phb.txt")),
    })
    facts = asyncio.run(read_gpu_facts(host, [0, 1]))
    assert facts.compute_cap == "8.6"
    assert facts.interconnect == "pcie"
    assert facts.capability_error is None and facts.topology_error is None
    assert ("nvidia-smi", "--query-gpu=index,compute_cap", "--format=csv,noheader", "-i", "0,1") in host.calls
    assert ("nvidia-smi", "topo", "-m") in host.calls


def test_read_gpu_facts_keeps_to_the_profiles_gpus() -> None:
    host = ScriptedSmiHost({
        "--query-gpu=index,compute_cap": answer("nvidia-smi", "0, 9.0\n1, 9.0\n"),
        "topo": answer("nvidia-smi topo -m", fixture("topo_8gpu_nv18_nics.txt")),
    })
    facts = asyncio.run(read_gpu_facts(host, [0, 1]))
    assert facts.topology is not None
    assert facts.topology.gpus == (0, 1)
    assert facts.topology.links == (GpuLink(0, 1, NVLINK, 18),)
    assert (facts.compute_cap, facts.interconnect) == ("9.0", "nvlink")


def test_read_gpu_facts_an_old_driver_and_a_lost_host_are_reasons_not_raises() -> None:
    host = ScriptedSmiHost({
        "--query-gpu=index,compute_cap": answer("nvidia-smi", fixture("topo_compute_cap_unknown_field.txt"), 2),
        "topo": HostError("gpu-box: connection lost; reconnecting"),
    })
    facts = asyncio.run(read_gpu_facts(host, [0, 1]))
    assert facts.capabilities == ()
    assert facts.capability_error is not None
    assert 'Field "compute_cap" is not a valid field to query.' in facts.capability_error
    assert facts.topology is None
    assert facts.topology_error == "gpu-box: connection lost; reconnecting"
    assert (facts.compute_cap, facts.interconnect) == (None, None)


def test_one_gpu_without_a_capability_makes_the_host_capability_unknown() -> None:
    host = ScriptedSmiHost({
        "--query-gpu=index,compute_cap": answer("nvidia-smi", "0, 9.0\n1, [N/A]\n"),
        "topo": answer("nvidia-smi topo -m", "", 0),
    })
    facts = asyncio.run(read_gpu_facts(host, None))
    assert facts.capability(0) == ComputeCapability(0, 9, 0)
    assert facts.compute_cap is None  # never the one that was read, standing in for both
    assert facts.interconnect is None  # an empty matrix says nothing
