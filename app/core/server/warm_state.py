"""WARM: the state after an engine kill when only the profile's weight cache daemon holds GPU memory (pure).

`warm_share` reads a free check's verdict: every holder is one of the daemon's pids and each GPU less the
daemon's MiB is within its idle limit. Two such verdicts in a row (like FREE's two free ones) are WARM
(`WarmTracker`); anything else stays with the free check (FREE, or STUCK on its timeout). FREE means 0 MiB and
comes only once the daemon is stopped too (`kill --all`). docs/architecture.md#server-states.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from app.core.telemetry.freecheck import FreeVerdict

WARM_NEEDED = 2  # consecutive verdicts, as FreeCheck's `needed`


@dataclass(frozen=True)
class WarmShare:
    """What the weight cache holds once the engine is gone: MiB per GPU, and the daemon's pids that hold it."""

    mib: dict[int, int]
    pids: tuple[int, ...]

    def describe(self) -> str:
        per_gpu = max(self.mib.values(), default=0) / 1024
        pids = ", ".join(str(p) for p in self.pids)
        return f"engine gone; {per_gpu:.1f} GiB per GPU held by the weight cache, pids {pids}"


def warm_share(verdict: FreeVerdict, daemon_pids: AbstractSet[int], limit: Callable[[int], int]) -> WarmShare | None:
    """WARM when every holder is one of the daemon's pids and each GPU less the daemon's MiB is within its idle
    limit; None otherwise (FREE: no holders; anything else stays for the free check: STUCK on its timeout)."""
    if verdict.unreadable or not verdict.holders:
        return None
    if any(h.pid is None or h.pid not in daemon_pids for h in verdict.holders):
        return None
    held: dict[int, int] = {}
    for holder in verdict.holders:
        held[holder.gpu] = held.get(holder.gpu, 0) + (holder.used_mib or 0)
    for gpu, used in verdict.used_mib.items():
        if used is None or used - held.get(gpu, 0) > limit(gpu):
            return None
    return WarmShare(held, tuple(sorted({h.pid for h in verdict.holders if h.pid is not None})))


class WarmTracker:
    """Feed verdicts in order; `share` is set once WARM_NEEDED consecutive ones were warm."""

    def __init__(self, daemon_pids: AbstractSet[int], limit: Callable[[int], int]) -> None:
        self.daemon_pids = frozenset(daemon_pids)
        self.limit = limit
        self.streak = 0
        self.share: WarmShare | None = None

    def feed(self, verdict: FreeVerdict) -> WarmShare | None:
        share = warm_share(verdict, self.daemon_pids, self.limit) if self.daemon_pids else None
        self.streak = self.streak + 1 if share else 0
        if share is not None and self.streak >= WARM_NEEDED:
            self.share = share
        return self.share
