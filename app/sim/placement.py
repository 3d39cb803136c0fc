"""Which host GPUs a simulated server's ranks run on, and how fast those GPUs are.

A real server's rank r runs on the (base_gpu_id + r)-th GPU that CUDA_VISIBLE_DEVICES shows it; the sim does the
same: with CUDA_VISIBLE_DEVICES = "2,3" and base 0 the ranks hold memory on host GPUs 2 and 3 (unset, or naming
GPUs by UUID: the host's own order). TUNEDASH_SIM_GPU_SPEED gives GPUs a speed factor ("6=0.96,7=0.96": GPUs 6
and 7 sit behind a slower link and run 4% slower); a server runs at the slowest of its GPUs (tensor-parallel ranks
wait for each other), and the factor divides every step time like the launch factor (app/sim/speed.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

GPU_SPEED_ENV = "TUNEDASH_SIM_GPU_SPEED"


class InvalidDeviceOrdinal(Exception):
    """A rank would run on a GPU the process cannot see (CUDA's "invalid device ordinal")."""


def rank_gpus(tp: int, base: int, host_gpus: int, environ: Mapping[str, str] | None = None) -> list[int]:
    """The host GPU index of each rank 0..tp-1. InvalidDeviceOrdinal when one is out of range."""
    env = os.environ if environ is None else environ
    text = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    entries = [e.strip() for e in text.split(",") if e.strip()] if text else []
    visible = [int(e) for e in entries] if entries and all(e.isdigit() for e in entries) else list(range(host_gpus))
    if base < 0 or base + tp > len(visible):
        raise InvalidDeviceOrdinal(f"ranks {base}..{base + tp - 1} of {len(visible)} visible GPUs")
    chosen = visible[base:base + tp]
    if any(g >= host_gpus for g in chosen):
        raise InvalidDeviceOrdinal(f"GPUs {chosen} on a host of {host_gpus}")
    return chosen


def gpu_speed_factors(environ: Mapping[str, str] | None = None) -> dict[int, float]:
    """TUNEDASH_SIM_GPU_SPEED as {gpu: factor}; ValueError naming the variable for anything malformed."""
    env = os.environ if environ is None else environ
    text = env.get(GPU_SPEED_ENV, "").strip()
    out: dict[int, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        gpu, sep, value = part.partition("=")
        try:
            index, factor = int(gpu), float(value)
        except ValueError:
            index, factor = -1, 0.0
        if not sep or index < 0 or not 0.1 <= factor <= 10.0:
            raise ValueError(f"${GPU_SPEED_ENV}: expected GPU=FACTOR pairs such as '6=0.96,7=0.96' (factor 0.1-10), "
                             f"got {part!r}")
        out[index] = factor
    return out


def server_speed_factor(gpus: list[int], factors: Mapping[int, float]) -> float:
    """The speed factor of a server on `gpus`: its slowest GPU's (1.0 for GPUs not named)."""
    return min((factors.get(g, 1.0) for g in gpus), default=1.0)
