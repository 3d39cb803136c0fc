"""The fit check A/B and tune share: a launch starts only when the host's allocation holds 1.25x the longest
launch so far (at least 60 s); a host nothing ends passes; the refusal names the host, the time left and the need."""

from __future__ import annotations

import pytest

from app.core.measure.allocation import AllocationEnding, check_fits


class EndingHost:
    name = "slurm:local"

    def __init__(self, left: float | None) -> None:
        self.left = left

    async def time_left_s(self) -> float | None:
        return self.left


async def test_a_launch_starts_only_when_the_allocation_holds_it() -> None:
    await check_fits(EndingHost(None), 10_000.0, "candidate c1")  # nothing ends this host
    await check_fits(EndingHost(100.0), 0.0, "candidate c1")  # the first launch needs 60 s
    await check_fits(EndingHost(100.0), 80.0, "candidate c1")  # 1.25 x 80 s = 100 s
    with pytest.raises(AllocationEnding) as caught:
        await check_fits(EndingHost(100.0), 81.0, "candidate c2")
    assert str(caught.value).startswith("candidate c2: the allocation on slurm:local ends in 100 s, a launch needs "
                                        "about 101 s")
    assert caught.value.left_s == 100.0 and caught.value.need_s == pytest.approx(101.25)
    with pytest.raises(AllocationEnding):
        await check_fits(EndingHost(59.0), 0.0, "candidate c1")
