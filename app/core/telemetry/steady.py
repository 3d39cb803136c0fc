"""NvmlFirstTelemetry: the dashboard's steady GPU sampler on this machine, NVML in-process with nvidia-smi behind it.

nvidia-smi costs a process per question: the dashboard's `--query-gpu -lms` loop plus a one-shot
`--query-compute-apps` every second (SmiTelemetry) cost more CPU than the dashboard's own drawing (figures:
docs/decisions.md#the-dashboards-gpu-sampler-on-this-machine). On this machine NVML answers the same questions
in-process (~13 us a GPU on the H200), as nvitop does. `dashboard_telemetry(host, gpus, source)` picks:

- "auto" (the Session's default): this class on a LocalHost reading the real driver (no injected reader:
  `host.nvml is None`); nvidia-smi anywhere else (an SSH host; the simulated host, whose fault knobs live in its
  fake nvidia-smi);
- "nvml": this class through the host's reader (the simulated host's too: this path measured without a GPU);
- "smi": nvidia-smi (telemetry_for).

Its first sample decides for the rest of its life:

- NVML read every GPU with v2 memory (nvidia-smi's semantics, 0 MiB on an idle H200): NVML from then on;
- anything else (no libnvidia-ml, no permission, a driver with only v1 memory, which counts the 615 MiB reserve):
  nvidia-smi from then on (SmiTelemetry, as before), and NVML is shut down.

The release watch is unchanged: release_sampler_for treats this sampler as its nvidia-smi one (NVML at 5 ms on this
machine with nvidia-smi behind it). `active` says which source reads now ("nvml", "smi", "" before the first).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence

from app.core.data import GpuSnapshot
from app.core.hosts.base import Host
from app.core.telemetry.nvml import NvmlTelemetry
from app.core.telemetry.smi import SmiTelemetry, Telemetry, telemetry_for

GPU_SOURCES = ("auto", "nvml", "smi")  # `tunedash ui --gpu-source`


def dashboard_telemetry(host: Host, indices: Sequence[int] | None, source: str = "auto") -> Telemetry:
    """The dashboard's GPU sampler for `source` (GPU_SOURCES; module docstring); ValueError for another name, or
    for "nvml" on a remote host (telemetry_for's words)."""
    if source == "auto":
        real_local = getattr(host, "is_local", False) and getattr(host, "nvml", None) is None
        return NvmlFirstTelemetry(host, indices) if real_local else SmiTelemetry(host, indices)
    if source == "nvml" and getattr(host, "is_local", False):
        return NvmlFirstTelemetry(host, indices)
    return telemetry_for(host, source, indices)


def nvml_readable(snapshot: GpuSnapshot) -> bool:
    """Whether an NVML sample can stand for nvidia-smi's: every GPU read, with v2 memory."""
    return snapshot.error is None and bool(snapshot.gpus) and all(g.memory_api == "nvml_v2" for g in snapshot.gpus)


class NvmlFirstTelemetry:
    """NVML while its first sample was readable, else nvidia-smi (module docstring). The Telemetry protocol."""

    def __init__(self, host: Host, indices: Sequence[int] | None = None, *, nvml: NvmlTelemetry | None = None,
                 smi: SmiTelemetry | None = None) -> None:
        self.nvml = nvml or NvmlTelemetry(indices, nvml=getattr(host, "nvml", None))
        self.smi = smi or SmiTelemetry(host, indices)
        self.active = ""  # "nvml" | "smi" once the first sample decided

    @property
    def source(self) -> str:
        return self.active or "nvml"

    async def _decide(self) -> GpuSnapshot:
        first = await self.nvml.sample()
        if nvml_readable(first):
            self.active = "nvml"
            return first
        self.active = "smi"
        with contextlib.suppress(Exception):  # NVML that did not start has nothing to shut down
            await self.nvml.close()
        return await self.smi.sample()

    async def sample(self) -> GpuSnapshot:
        if not self.active:
            return await self._decide()
        return await (self.nvml if self.active == "nvml" else self.smi).sample()

    async def stream(self, period_ms: int = 1000) -> AsyncGenerator[GpuSnapshot, None]:
        if not self.active:
            await self._decide()
        source = self.nvml if self.active == "nvml" else self.smi
        async with contextlib.aclosing(source.stream(period_ms)) as snapshots:
            async for snapshot in snapshots:
                yield snapshot

    async def close(self) -> None:
        if self.active != "smi":
            await self.nvml.close()
        await self.smi.close()
