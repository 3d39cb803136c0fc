"""FreeCheck: decides when a host's GPUs are back to idle after a kill, from successive GPU snapshots.

A GPU counts as free when the snapshot read it (no error, memory.used a number), it lists no compute
process, and memory.used is at or under its idle baseline plus a tolerance (64 MiB by default:
well under the ~500 MiB any CUDA context costs, well over the 0-26 MiB idle readings seen in the wild;
docs/gpus.md#the-free-rule). All GPUs of the profile must be free on `needed` consecutive
snapshots (2 by default), because memory release is not atomic with the process leaving the list.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.core.data import GpuSnapshot, Holder

DEFAULT_TOLERANCE_MIB = 64
BASELINE_CAP_MIB = 1024


@dataclass(frozen=True)
class FreeVerdict:
    """The outcome of one snapshot: free on all GPUs or not, who holds what, used MiB per GPU."""

    all_free: bool
    confirmed: bool  # free on `needed` consecutive snapshots
    used_mib: dict[int, int | None]
    holders: tuple[Holder, ...]
    unreadable: str = ""  # why the snapshot could not decide


@dataclass
class FreeCheck:
    """Feed snapshots in order; `confirmed` turns True after `needed` consecutive all-free snapshots."""

    gpus: tuple[int, ...]
    baseline_mib: dict[int, int] = field(default_factory=dict)
    tolerance_mib: int = DEFAULT_TOLERANCE_MIB
    needed: int = 2
    streak: int = 0
    not_before: float | None = None  # process lists read before this monotonic time do not count

    def limit(self, gpu: int) -> int:
        return min(self.baseline_mib.get(gpu, 0), BASELINE_CAP_MIB) + self.tolerance_mib

    def feed(self, snapshot: GpuSnapshot) -> FreeVerdict:
        if snapshot.error is not None:
            self.streak = 0
            return FreeVerdict(False, False, {}, (), unreadable=snapshot.error.message)
        by_index = {gpu.index: gpu for gpu in snapshot.gpus}
        used: dict[int, int | None] = {}
        holders: list[Holder] = []
        unreadable = ""
        for index in self.gpus:
            gpu = by_index.get(index)
            if gpu is None:
                unreadable = f"GPU{index} missing from the reading"
                used[index] = None
                continue
            used[index] = gpu.memory_used_mib
            if gpu.memory_used_mib is None:
                reason = gpu.unavailable.get("memory_used_mib", "unreadable")
                unreadable = f"GPU{index} memory.used {reason}"
            if gpu.processes is None:
                unreadable = unreadable or f"GPU{index} process list not read"
            elif (
                self.not_before is not None
                and gpu.processes_taken_at is not None
                and gpu.processes_taken_at < self.not_before
                and not gpu.processes
            ):
                unreadable = unreadable or f"GPU{index} process list older than the kill"
            for proc in gpu.processes or ():
                holders.append(Holder(index, proc.pid, proc.name, proc.used_mib))
            over = gpu.memory_used_mib is not None and gpu.memory_used_mib > self.limit(index)
            if over and not gpu.processes:
                holders.append(Holder(index, None, "", gpu.memory_used_mib))
        all_free = not holders and not unreadable
        self.streak = self.streak + 1 if all_free else 0
        return FreeVerdict(all_free, self.streak >= self.needed, used, tuple(holders), unreadable)


def learn_baseline(snapshot: GpuSnapshot, gpus: tuple[int, ...]) -> dict[int, int]:
    """Idle baseline per GPU from a snapshot taken while nothing runs (capped, 0 when unreadable)."""
    baseline: dict[int, int] = {}
    for gpu in snapshot.gpus:
        if gpu.index in gpus and not gpu.processes and gpu.memory_used_mib is not None:
            baseline[gpu.index] = min(gpu.memory_used_mib, BASELINE_CAP_MIB)
    return baseline
