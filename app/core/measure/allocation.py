"""Whether a launch fits in the host's allocation: the one check A/B and tune ask before every launch.

A Slurm job's time limit ends the server with the allocation; a launch it would cut short is a wasted launch.
`check_fits` asks the host for its time left (`Host.time_left_s`: squeue's `%L` on a Slurm host, None elsewhere)
and raises AllocationEnding when less than FIT_MARGIN x the longest launch so far is left, or less than
FIRST_LAUNCH_MIN_S before any launch finished (docs/decisions.md#a-launch-must-fit-in-the-allocation). Each caller
maps the error to its own end: the A/B fails (ExperimentFailed), tune stops resumable (app.core.tune.run).
"""

from __future__ import annotations

from typing import Any

from app.core.errors import Reason, TunedashError

FIT_MARGIN = 1.25  # a launch starts only when the allocation has this many times the longest launch so far left
FIRST_LAUNCH_MIN_S = 60.0  # ... and at least this much before any launch of the run finished


class AllocationEnding(TunedashError):
    """The host's allocation ends before the next launch could finish: it was not started."""

    title = "Allocation ending"
    default_reason = Reason.START_FAILED

    def __init__(self, message: str, *, left_s: float, need_s: float) -> None:
        super().__init__(message)
        self.left_s = left_s
        self.need_s = need_s


async def check_fits(host: Any, longest_s: float, what: str) -> None:
    """Raise AllocationEnding when the allocation of `host` cannot hold one more launch of `what` (a caller's
    words: "arm B", "candidate c3"), `longest_s` being the longest launch of the run so far (0 before any).
    A host without an end (time_left_s None) passes at once."""
    # getattr: owners in tests hand in duck-typed hosts with only http_base; every Host has time_left_s
    time_left = getattr(host, "time_left_s", None)
    left = await time_left() if time_left is not None else None
    if left is None:
        return
    need = max(FIRST_LAUNCH_MIN_S, FIT_MARGIN * longest_s)
    if left < need:
        raise AllocationEnding(
            f"{what}: the allocation on {host.name} ends in {left:.0f} s, a launch needs about {need:.0f} s "
            f"(the longest so far {longest_s:.0f} s x {FIT_MARGIN}); not started, the finished launches are kept. "
            "Ask for a longer allocation ([slurm] time)", left_s=left, need_s=need)
