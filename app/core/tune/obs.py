"""One launch's measurement of one candidate at one shape: the observation the racing rule and the slot statistics
read (app.core.tune.race re-exports it; its own module so that race and slots_stats both import it, not each other)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Obs:
    """One launch's measurement of one candidate at one shape: its trial values (higher = better, > 0).

    `launch` identifies the launch among that candidate's launches; empty `values` = the launch ran but no
    trial at this shape succeeded (the launch still counts as spent). `slot`: the parallel slot (disjoint GPU set)
    the launch ran on, the same at every shape of one launch; None when the tune runs without slots."""

    candidate: str
    shape: str
    launch: int
    values: tuple[float, ...]
    slot: int | None = None
