"""SlotServers: the servers of a tune's other slots (1..) beside the owner of slot 0, one lifecycle and lock each.

The dashboard's tune on slots (app.tui.tune) runs slot 0 on the dashboard's own Session and each other slot on a
lifecycle of its own here: the slot's profile (app.core.measure.slots.slot_profile: `NAME@sloti` on the slot's GPUs
and port, so its own job record, log and release watch) and its own driver lock, held with a heartbeat while the
tune runs and checked right before every signal and launch, as the Session's is. `close` ends them: each server
killed and its GPUs confirmed free (free_slots' lines), the lifecycles closed, the locks given back. The CLI builds
the same per slot with its own lifecycle_for and drive (app/cli/tune.py; docs/architecture.md, "Tune on slots from
the dashboard").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from app.core.flags.discovery import ServerFlags
from app.core.hosts.base import Host
from app.core.measure.experiment import ServerOwner
from app.core.measure.slots import Slot, free_slots, slot_profile
from app.core.profiles.types import Profile
from app.core.server.driver import DrivenElsewhere, DriverLock, keep_alive
from app.core.server.lifecycle import ServerLifecycle
from app.core.tasks import TaskOwner
from app.core.telemetry.smi import telemetry_for


class SlotServers:
    """Slots 1.. of a plan (slot 0 first in `slots`, owned elsewhere): a lifecycle and a driver lock each."""

    def __init__(self, host: Host, profile: Profile, slots: Sequence[Slot], *,
                 server_flags: ServerFlags | None = None) -> None:
        self.profile = profile
        self.slots = list(slots)
        self.lifecycles: list[ServerLifecycle] = []
        for slot in self.slots[1:]:
            lifecycle = ServerLifecycle(host, slot_profile(profile, slot), telemetry_for(host, "smi", slot.gpus))
            lifecycle.server_flags = server_flags  # a candidate the installed server rejects fails before a kill
            self.lifecycles.append(lifecycle)
        self._locks = [DriverLock(host, each.profile, "dashboard") for each in self.lifecycles]
        self._beats = TaskOwner(f"{profile.name} tune slots")
        self.driving = False
        self._closing: asyncio.Future[list[str]] | None = None

    async def drive(self, *, take_over: bool = False) -> None:
        """Take every slot's driver lock. DrivenElsewhere when another live session drives one (naming the slot's
        profile and who drives it): the locks taken so far are given back, and nothing was signalled."""
        try:
            for lifecycle, lock in zip(self.lifecycles, self._locks, strict=True):
                verdict = await lock.acquire(take_over=take_over, command="tune")
                if verdict.readonly:
                    who = verdict.message.removeprefix("read-only: ").split("; `tunedash ", 1)[0]
                    raise DrivenElsewhere(f"tune on slots refused: {who}; wait until it ends, or run "
                                          f"`tunedash tune {self.profile.name} --slots {len(self.slots)} --take-over`")
                lifecycle.before_act = lock.check
                self._beats.spawn(keep_alive(lock), f"{lock.profile} driver heartbeat")
        except BaseException:
            await self._let_go()
            raise
        self.driving = True

    def owners(self, slot0: ServerOwner) -> list[tuple[Slot, ServerOwner]]:
        """The runner's slots (TuneRunner(slots=...)): slot 0 on `slot0`, the others on their lifecycles."""
        return [(self.slots[0], slot0), *zip(self.slots[1:], self.lifecycles, strict=True)]

    async def close(self) -> list[str]:
        """Kill each slot's server and confirm its GPUs free (while driving them), close the lifecycles and give
        the locks back: free_slots' line per slot. Once: a second call returns the same lines. The clean-up runs on
        even when the caller is cancelled meanwhile (it is shielded)."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        return await asyncio.shield(self._closing)

    async def _close(self) -> list[str]:
        try:
            if not self.driving:
                return []
            return await free_slots(list(zip(self.slots[1:], self.lifecycles, strict=True)))
        finally:
            for lifecycle in self.lifecycles:
                await lifecycle.close()
            await self._let_go()

    async def _let_go(self) -> None:
        await self._beats.close()
        for lock in self._locks:
            await lock.release()  # never raises: a claim it cannot remove expires by itself
