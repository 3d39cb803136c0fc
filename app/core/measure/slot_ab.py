"""A/B on two slots (`tunedash ab --slots 2`): A and B side by side on two disjoint GPU sets, crossed over.

Each slot (app.core.measure.slots) has its own owner (a ServerLifecycle on the slot's profile: its own record,
driver lock, kill-safety and release watch) and its own port. In launch round r, A runs on slot r % 2 and B on
the other (app.core.measure.crossover.crossover_rounds): both are relaunched at once, then both run their trials at
the same time. The trials of the two arms share the host (its CPU, here the load generator's too); the crossover
makes a constant slot difference cancel from B/A and measures it (docs/decisions.md, "A/B on two slots: a
crossover"). A launch row stores its slot in its flags under "slot" (app.core.measure.crossover.slot_flags).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from app.core.measure.allocation import AllocationEnding, check_fits
from app.core.measure.crossover import crossover_rounds, slot_flags
from app.core.measure.experiment import (
    EnergyFor,
    Experiment,
    ExperimentFailed,
    ExperimentProgress,
    ExperimentSpec,
    ServerOwner,
    Step,
)
from app.core.measure.slots import Slot, slot_profile
from app.core.measure.store import HistoryStore
from app.core.profiles.types import Profile


def slot_of_round(arm_idx: int, launch_idx: int) -> int:
    """The slot an arm's launch runs on (arm 0 = A, 1 = B)."""
    return crossover_rounds(launch_idx + 1)[launch_idx][arm_idx]


class SlotExperiment(Experiment):
    """Two arms on two slots at once; otherwise an Experiment (its store rows, progress and statistics)."""

    def __init__(self, spec: ExperimentSpec, owners: Sequence[ServerOwner], slots: Sequence[Slot],
                 store: HistoryStore | None = None, *,
                 on_progress: Callable[[ExperimentProgress], None] | None = None,
                 energy_for: EnergyFor | None = None) -> None:
        if len(spec.arms) != 2 or len(owners) != 2 or len(slots) != 2:
            raise ValueError("an A/B on slots has two arms, two slots and an owner per slot")
        super().__init__(spec, owners[0], store, on_progress=on_progress, energy_for=energy_for)
        self.owners = list(owners)
        self.slots = list(slots)
        self.result.slot_labels = [s.label for s in slots]
        self._profiles = [[slot_profile(arm.profile, slot) for slot in slots] for arm in spec.arms]
        self._done = 0

    def _owners(self) -> list[ServerOwner]:
        return list(self.owners)

    def _placed(self, arm_idx: int, launch_idx: int) -> tuple[ServerOwner, Profile, str]:
        s = slot_of_round(arm_idx, launch_idx)
        return self.owners[s], self._profiles[arm_idx][s], f" on slot {s}"

    def _launch_flags(self, arm_idx: int, launch_idx: int, profile: Profile) -> dict[str, Any]:
        slot = self.slots[slot_of_round(arm_idx, launch_idx)]
        return slot_flags(dict(profile.flags), slot.index, slot.gpus, slot.port)

    def last_on_slot0(self) -> int:
        """The arm that runs on slot 0 (the profile's own GPUs and port) in the last round."""
        return crossover_rounds(self.spec.launches)[-1].index(0)

    async def _run_schedule(self) -> None:
        spec = self.spec
        total = len(spec.schedule())
        longest = 0.0
        for r in range(spec.launches):
            try:
                await check_fits(self.owner.host, longest, f"round {r + 1} (A and B)")
            except AllocationEnding as ending:
                raise ExperimentFailed(str(ending), ending.reason) from None
            started = time.monotonic()
            await _together([self._relaunch(arm, r, self._done, total) for arm in (0, 1)])
            for arm in (0, 1):
                self.result.arms[arm].launches.append([])
                self.result.arms[arm].slots.append(slot_of_round(arm, r))
            await _together([self._arm_trials(arm, r, total) for arm in (0, 1)])
            longest = max(longest, time.monotonic() - started)

    async def _arm_trials(self, arm: int, launch: int, total: int) -> None:
        for t in range(self.spec.trials):
            await self._trial(Step(arm, launch, t), self._done, total)
            self._done += 1


async def _together(coros: list[Coroutine[Any, Any, None]]) -> None:
    """Run the coroutines at once; the first failure (an ExperimentFailed before anything else) cancels the rest
    and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            for coro in coros:
                group.create_task(coro)
    except BaseExceptionGroup as eg:
        errors: list[BaseException] = list(eg.exceptions)
        failed = [e for e in errors if isinstance(e, ExperimentFailed)]
        raise (failed[0] if failed else errors[0]) from None

