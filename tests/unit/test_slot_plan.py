"""Slot planning (app/core/measure/slots.py): disjoint GPUs and ports, busy GPUs never used, errors that say why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from app.core.data import GpuProcess, GpuSample, GpuSnapshot, TelemetryError
from app.core.measure.slots import Slot, SlotError, busy_gpus, plan_slots, slot_profile
from app.core.profiles.loading import load_profile
from app.core.profiles.types import Profile
from app.core.server import jobs


@pytest.fixture
def profile(make_profile: Callable[..., Path]) -> Profile:
    return replace(load_profile(str(make_profile())), gpus=(0, 1), port=30300)


def test_four_slots_on_eight_gpus_share_no_gpu_and_no_port(profile: Profile) -> None:
    slots = plan_slots(profile, 4, range(8), {})
    assert [s.gpus for s in slots] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [s.port for s in slots] == [30300, 30301, 30302, 30303]
    gpus = [g for s in slots for g in s.gpus]
    assert len(gpus) == len(set(gpus)) and len({s.port for s in slots}) == 4
    assert slots[2].label == "slot 2 (GPUs 4,5, port 30302)"


def test_busy_gpus_are_skipped_and_a_slot_takes_adjacent_gpus_only(profile: Profile) -> None:
    # GPU 3 busy: 2 cannot pair with 4 (not adjacent), so the next slots are 4-5 and 6-7
    slots = plan_slots(profile, 3, range(8), {3: "pid 9 python 500 MiB (not tunedash's)"})
    assert [s.gpus for s in slots] == [(0, 1), (4, 5), (6, 7)]


def test_slot_zero_is_the_profiles_own_gpus_even_when_they_are_not_the_lowest(profile: Profile) -> None:
    slots = plan_slots(replace(profile, gpus=(4, 5)), 3, range(8), {})
    assert [s.gpus for s in slots] == [(4, 5), (0, 1), (2, 3)]


def test_too_few_free_gpus_says_how_many_fit_and_who_holds_the_rest(profile: Profile) -> None:
    with pytest.raises(SlotError) as err:
        plan_slots(profile, 4, range(8), {6: "pid 77 trainer 40000 MiB (not tunedash's (no tag))"})
    text = str(err.value)
    assert "--slots 4" in text and "3 fit" in text and "GPU6: pid 77 trainer" in text and "--slots 3" in text


@pytest.mark.parametrize(("change", "busy", "words"), [
    ({"gpus": ()}, {}, "names no GPUs"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0,1"}}, {}, "CUDA_VISIBLE_DEVICES"),
    ({"gpus": (8, 9)}, {}, "not on the host"),
    ({}, {1: "pid 5 x 100 MiB"}, "its own GPUs are in use"),
    ({"port": 65534}, {}, "past 65535"),
])
def test_what_cannot_be_placed_is_refused_with_the_reason(profile: Profile, change: dict[str, object],
                                                          busy: dict[int, str], words: str) -> None:
    with pytest.raises(SlotError, match=words):
        plan_slots(replace(profile, **change), 4, range(8), busy)  # type: ignore[arg-type]


def test_a_slot_profile_has_its_own_name_gpus_and_port_so_its_own_record(profile: Profile) -> None:
    first, other = slot_profile(profile, Slot(0, (0, 1), 30300)), slot_profile(profile, Slot(2, (4, 5), 30302))
    assert first.name == profile.name and other.name == f"{profile.name}@slot2"
    assert other.gpus == (4, 5) and other.port == 30302 and other.flags == profile.flags
    assert jobs.record_name(first.name, "f") != jobs.record_name(other.name, "f")


class _Host:
    name = "box"

    def __init__(self, tags: dict[int, str | None]) -> None:
        self.tags = tags

    async def environ_value(self, pid: int, key: str) -> str | None:
        assert key == jobs.TAG_ENV
        return self.tags.get(pid)


def _gpu(index: int, used: int, pids: tuple[int, ...] = ()) -> GpuSample:
    return GpuSample(index, f"GPU-{index}", "H200", used, 143771,
                     processes=tuple(GpuProcess(p, "python", 1000) for p in pids))


async def test_busy_gpus_names_other_holders_and_ignores_our_own_slots() -> None:
    ours = replace(_record(), tag="ours-tag")
    snapshot = GpuSnapshot((_gpu(0, 0), _gpu(1, 1000, (11,)), _gpu(2, 1000, (22,)), _gpu(3, 900)), 0.0)
    host = _Host({11: "ours-tag", 22: ""})
    busy = await busy_gpus(host, snapshot, [ours])  # type: ignore[arg-type]
    assert set(busy) == {2, 3}
    assert "pid 22" in busy[2] and "not tunedash's" in busy[2] and "no visible process" in busy[3]
    assert set(await busy_gpus(host, snapshot)) == {1, 2, 3}  # type: ignore[arg-type]


async def test_an_unreadable_snapshot_uses_no_gpu() -> None:
    snapshot = GpuSnapshot((), 0.0, TelemetryError("driver", "NVIDIA-SMI has failed"))
    with pytest.raises(SlotError, match="could not be read"):
        await busy_gpus(_Host({}), snapshot)  # type: ignore[arg-type]


def _record() -> jobs.JobRecord:
    return jobs.JobRecord(profile="t", host="sim", backend="sglang", model="m", port=1, argv=["x"], flags={},
                          pid=1, pgid=1, start_time="1", log_path="/tmp/x", launched_by="me", launched_at=1.0,
                          gpus=[0])


@pytest.mark.parametrize("row", [None, "slot 1", {"index": True, "gpus": [2, 3], "port": 9001},
                                 {"index": -1, "gpus": [2, 3], "port": 9001}, {"index": 1, "gpus": "2,3", "port": 9001},
                                 {"index": 1, "gpus": [2, "3"], "port": 9001}, {"index": 1, "gpus": [2, 3]},
                                 {"index": 1.0, "gpus": [2, 3], "port": 9001}])
def test_a_stored_slot_that_is_not_one_reads_back_as_none(row: object) -> None:
    assert Slot.from_json(row) is None


def test_a_stored_slot_reads_back_as_it_was_written() -> None:
    slot = Slot(2, (4, 5), 30002)
    assert Slot.from_json(slot.to_json()) == slot
