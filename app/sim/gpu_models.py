"""The GPU types a simulated host can have, and the `sim_gpus` spec that picks them ("2xA6000", "2xH200").

A spec is COUNTxMODEL (case and spaces around the "x" do not matter; canonical_gpu_spec gives the one
spelling). gpus_for_spec builds the GPUs with the same UUIDs and PCI bus ids as gpu_state.default_gpus, so the
default spec gives exactly today's host: 2 x "NVIDIA RTX A6000", 49140 MiB, SM 8.6, PCIe.
"""

from __future__ import annotations

from app.sim.gpu_state import (
    DEFAULT_COMPUTE_CAP,
    DEFAULT_GPU_NAME,
    DEFAULT_RESERVED_MIB,
    DEFAULT_TOTAL_MIB,
    SimGpu,
    default_gpus,
)


class GpuModel:
    """One GPU type: what nvidia-smi reports of it (nvlinks 0: PCIe only)."""

    __slots__ = ("compute_cap", "memory_total_mib", "name", "nvlinks", "power_limit_w", "reserved_mib")

    def __init__(
        self, name: str, memory_total_mib: int, compute_cap: str, nvlinks: int, power_limit_w: float, reserved_mib: int
    ) -> None:
        self.name = name
        self.memory_total_mib = memory_total_mib
        self.compute_cap = compute_cap
        self.nvlinks = nvlinks
        self.power_limit_w = power_limit_w
        self.reserved_mib = reserved_mib


# sim_gpus model name -> the GPU. A6000: the seed's host (PCIe cards). H200: the real captures in tests/data/h200/
# (143771 MiB, 616 MiB reserved, compute_cap 9.0); an SXM H200 has 18 NVLinks (NV18 in topo -m).
GPU_MODELS: dict[str, GpuModel] = {
    "A6000": GpuModel(DEFAULT_GPU_NAME, DEFAULT_TOTAL_MIB, DEFAULT_COMPUTE_CAP, 0, 300.0, DEFAULT_RESERVED_MIB),
    "H200": GpuModel("NVIDIA H200", 143771, "9.0", 18, 700.0, 616),
}
DEFAULT_GPU_SPEC = "2xA6000"
MAX_SIM_GPUS = 8


def parse_gpu_spec(spec: str) -> tuple[int, str]:
    """"2xH200" (or "2 x h200") -> (2, "H200"). ValueError, with the known models, for anything else."""
    count_text, sep, model_text = spec.strip().lower().partition("x")
    model = model_text.strip().upper()
    if not sep or model not in GPU_MODELS or not count_text.strip().isdigit():
        examples = ", ".join(f"2x{m}" for m in GPU_MODELS)
        raise ValueError(f"expected COUNTxMODEL with a model of {', '.join(GPU_MODELS)} (e.g. {examples}), "
                         f"got {spec!r}")
    count = int(count_text)
    if not 1 <= count <= MAX_SIM_GPUS:
        raise ValueError(f"expected 1 to {MAX_SIM_GPUS} GPUs, got {count} in {spec!r}")
    return count, model


def canonical_gpu_spec(spec: str) -> str:
    """The one spelling of a spec ("2 x h200" -> "2xH200"); ValueError as parse_gpu_spec."""
    count, model = parse_gpu_spec(spec)
    return f"{count}x{model}"


def gpus_for_spec(spec: str) -> list[SimGpu]:
    """The GPUs a spec names."""
    count, model_name = parse_gpu_spec(spec)
    model = GPU_MODELS[model_name]
    return [
        SimGpu(**{
            **gpu.to_dict(),
            "reserved_mib": model.reserved_mib,
            "power_limit_w": model.power_limit_w,
            "compute_cap": model.compute_cap,
            "nvlinks": model.nvlinks,
        })
        for gpu in default_gpus(count, model.name, model.memory_total_mib)
    ]


def same_hardware(have: tuple[SimGpu, ...], want: list[SimGpu]) -> bool:
    """Whether a host's GPUs are the ones a spec names (idle memory, reserved memory and power limit aside)."""

    def kind(gpu: SimGpu) -> tuple[object, ...]:
        return (gpu.index, gpu.name, gpu.memory_total_mib, gpu.compute_cap, gpu.nvlinks)

    return [kind(g) for g in have] == [kind(g) for g in want]
