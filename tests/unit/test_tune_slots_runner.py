"""The tune runner on parallel slots without a server: fake owners (one per slot) and a fake bench. Launches run side
by side, never two on one slot, every observation carries its slot, a candidate's launches spread over slots, the
budget counts launches in flight, and a launch refused on one slot stops the tune as TuneFailed (not an exception
group) with the other slot's launch cancelled."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.core.data import ServerState
from app.core.errors import Reason
from app.core.measure.slots import Slot
from app.core.profiles.loading import parse_profile
from app.core.server.events import LifecycleView
from app.core.server.preflight import LaunchRefused
from app.core.tune import run as run_module
from app.core.tune.model import TuneFailed, TuneSpec
from app.core.tune.run import TuneRunner
from app.core.tune.space import build_space

PROFILE = """backend = "sglang"\nmodel = "m"\nhost = "local"\nport = 9000\ngpus = [0, 1]
[flags]
tp-size = 2
speculative-algorithm = "NEXTN"
speculative-num-steps = 1
speculative-eagle-topk = 1
speculative-num-draft-tokens = 2
[tune]
shapes = [{ concurrency = 1 }, { concurrency = 4 }]
[tune.flags]
speculative-num-steps = [1, 2, 3, 4]
"""


class Host:
    name = "fake"

    async def http_base(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"


class Owner:
    """One slot's server owner: relaunch takes a few loop turns; records who overlapped whom."""

    def __init__(self, slot: int, log: dict[str, Any], refuse: bool = False) -> None:
        self.slot = slot
        self.log = log
        self.host = Host()
        self.refuse = refuse
        self.profile: Any = None
        self.cancelled = False

    async def relaunch(self, profile: Any, *, ready_timeout_s: float | None = None,
                       change: str | None = None) -> ServerState:
        busy = self.log["busy"]
        if self.slot in busy:
            self.log["problems"].append(f"slot {self.slot} relaunched while busy")
        if self.refuse and self.log["launches"] >= 1:
            raise LaunchRefused("GPU 2 held by someone else", Reason.GPUS_HELD)
        busy.add(self.slot)
        self.log["most"] = max(self.log["most"], len(busy))
        self.log["launches"] += 1
        self.log["profiles"].append((self.slot, profile.name, tuple(profile.gpus), profile.port))
        self.profile = profile
        try:
            for _ in range(3):
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return ServerState.READY

    def subscribe(self, listener: Any) -> Any:
        return lambda: None

    def view(self) -> LifecycleView:
        return LifecycleView(state=ServerState.READY, since=0.0, record=None, profile=self.profile,
                             phase_times={}, notices=(), fatal=None, last_lines=(), holders=(), health_ok=None,
                             last_decode=None)


def _spec(launches: int = 8) -> TuneSpec:
    profile = parse_profile(PROFILE, Path("p.toml"))
    assert profile.tune is not None
    space = build_space(profile, profile.tune, running=profile.flags)
    return TuneSpec(replace(profile, bench=replace(profile.bench, warmup=0)), space.candidates, profile.tune.shapes,
                    profile.tune, launches)


@pytest.fixture
def fake_bench(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    log: dict[str, Any] = {"busy": set(), "most": 0, "launches": 0, "problems": [], "profiles": []}

    async def server_info(url: str, backend: str) -> dict[str, Any]:
        return {}

    async def run_bench(url: str, model: str, bench: Any, energy: Any = None) -> Any:
        port = int(url.rsplit(":", 1)[1])
        await asyncio.sleep(0)
        log["busy"].discard(port - 9000)  # the launch's last shape ends its hold on the slot
        summary = SimpleNamespace(output_tok_s=100.0 + port % 7, goodput_rps=None, energy=None, errors=0,
                                  accept_len=None, accept_source="", to_json=lambda: {})
        return SimpleNamespace(summary=summary, results=[])

    monkeypatch.setattr(run_module, "server_info", server_info)
    monkeypatch.setattr(run_module, "run_bench", run_bench)
    return log


def _slots(log: dict[str, Any], n: int, refuse: int | None = None) -> list[tuple[Slot, Any]]:
    return [(Slot(i, (2 * i, 2 * i + 1), 9000 + i), Owner(i, log, refuse == i)) for i in range(n)]


async def test_launches_run_side_by_side_one_per_slot_each_candidate_on_two_slots(fake_bench: dict[str, Any]) -> None:
    slots = _slots(fake_bench, 4)
    runner = TuneRunner(_spec(8), slots[0][1], slots=slots)
    await runner.run()
    assert not fake_bench["problems"] and fake_bench["most"] >= 2
    assert len(runner.state.launches) == 8  # the budget, launches in flight counted: not one more
    assert all(ln.slot is not None for ln in runner.state.launches)
    _, obs, _ = runner.observations()
    assert obs and all(o.slot is not None for o in obs)
    per: dict[int, set[int]] = {}
    for ln in runner.state.launches:
        per.setdefault(ln.candidate, set()).add(ln.slot or 0)
    for c, used in per.items():
        if sum(1 for ln in runner.state.launches if ln.candidate == c) >= 2:
            assert len(used) >= 2, (c, used)
    names = {name for _, name, _, _ in fake_bench["profiles"]}
    assert {slot: (gpus, port) for slot, _, gpus, port in fake_bench["profiles"]} == {
        i: ((2 * i, 2 * i + 1), 9000 + i) for i in range(4)}
    assert any(n.endswith("@slot1") for n in names) and "p" in names  # slot 0 keeps the profile's name
    numbers = [(ln.candidate, ln.launch) for ln in runner.state.launches]
    assert len(numbers) == len(set(numbers))
    assert runner.slots_json()["slots"][3]["gpus"] == [6, 7]


async def test_a_launch_refused_on_one_slot_stops_the_tune_as_tune_failed(fake_bench: dict[str, Any]) -> None:
    slots = _slots(fake_bench, 2, refuse=1)
    runner = TuneRunner(_spec(8), slots[0][1], slots=slots)
    with pytest.raises(TuneFailed, match="on slot 1: GPU 2 held"):
        await runner.run()
    assert runner.status == "failed"


class EndingHost(Host):
    """A slot's allocation with `left_s` seconds left (check_fits reads time_left_s)."""

    def __init__(self, left_s: float) -> None:
        self.left_s = left_s

    async def time_left_s(self) -> float:
        return self.left_s


async def test_a_slot_whose_allocation_ends_takes_no_more_launches_and_the_others_go_on(
        fake_bench: dict[str, Any]) -> None:
    slots = _slots(fake_bench, 2)
    slots[1][1].host = EndingHost(10.0)  # under FIRST_LAUNCH_MIN_S: slot 1 cannot hold a launch
    runner = TuneRunner(_spec(4), slots[0][1], slots=slots)
    await runner.run()
    assert runner.status == "done"
    assert {entry[0] for entry in fake_bench["profiles"]} == {0}  # every launch on slot 0
    assert runner.state.spent() == 4  # the budget, all on slot 0 (and the winner relaunched there at the end)


async def test_the_run_stops_allocation_ending_only_when_no_slot_can_hold_a_launch(
        fake_bench: dict[str, Any]) -> None:
    slots = _slots(fake_bench, 2)
    for _, owner in slots:
        owner.host = EndingHost(10.0)
    runner = TuneRunner(_spec(4), slots[0][1], slots=slots)
    with pytest.raises(TuneFailed, match="stopped: allocation ending"):
        await runner.run()
    assert runner.status == "stopped" and fake_bench["launches"] == 0


@pytest.mark.parametrize(("first", "then"), [(2, 1), (1, 2)])
async def test_a_run_resumed_with_another_slot_count_blocks_every_launch_on_its_slot(
        fake_bench: dict[str, Any], tmp_path: Path, first: int, then: int) -> None:
    """A slotted run resumed with `--slots 1` stores its new launches as slot 0's (the profile's own GPUs and port),
    and an unslotted run resumed with `--slots 2` reads its old launches back as slot 0's: no launch is left without
    a slot beside slotted ones (the rule would take it as the average slot), live or recomputed from the store."""
    from app.core.measure.store import HistoryStore
    from app.core.tune.model import state_from_run
    from app.core.tune.results import run_results, tune_results

    with HistoryStore(tmp_path / "h.sqlite3") as store:
        slots = _slots(fake_bench, first)
        runner = TuneRunner(_spec(4), slots[0][1], store, slots=slots if first > 1 else None)
        await runner.run()
        assert runner.run_id is not None
        run = store.run(runner.run_id)
        assert run is not None
        stored_first = [(ln.arm_idx, ln.launch_idx, ln.slot) for ln in run.launches]
        assert all((s is None) == (first == 1) for *_, s in stored_first)
        slots = _slots(fake_bench, then)
        again = TuneRunner(_spec(8), slots[0][1], store, resume=run, slots=slots if then > 1 else None)
        assert all(ln.slot is not None for ln in again.state.launches)  # the kept launches, slot 0 if unslotted
        await again.run()
        run = store.run(runner.run_id)
        assert run is not None
        new = [ln for ln in run.launches if (ln.arm_idx, ln.launch_idx, ln.slot) not in stored_first]
        assert new and len(new) <= 4  # the race may settle before the budget
        if then == 1:
            assert all(ln.slot is not None and ln.slot["index"] == 0 and ln.slot["gpus"] == [0, 1]
                       and ln.slot["port"] == 9000 for ln in new)
        _, obs, _ = again.observations()
        assert len({o.slot for o in obs}) == 2 and None not in {o.slot for o in obs}
        live = again.decide()
        assert live.slots is not None and {e.slot for e in live.slots.effects} == {0, 1}
        read_back = {(ln.candidate, ln.launch): ln.slot for ln in state_from_run(run, 2).launches}
        assert read_back == {(ln.candidate, ln.launch): ln.slot for ln in again.state.launches}
        live_json = tune_results(again.spec, again.state, live, status="done", run_id=run.id).to_json()
        assert run_results(run).to_json()["shapes"] == live_json["shapes"]  # the boards, recomputed the same


class HangingOwner(Owner):
    """A slot whose launches never come up (a relaunch that waits forever) until cancelled."""

    async def relaunch(self, profile: Any, *, ready_timeout_s: float | None = None,
                       change: str | None = None) -> ServerState:
        self.log["profiles"].append((self.slot, profile.name, tuple(profile.gpus), profile.port))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


async def test_launches_in_flight_are_cancelled_once_the_run_is_done_not_waited_for(
        fake_bench: dict[str, Any]) -> None:
    """The time budget runs out while slot 1's launch is still coming up: the run ends when slot 0's launch is in,
    cancelling slot 1's (not counted), as one slot would stop there; without the cancel it would wait forever."""
    slots = _slots(fake_bench, 2)
    hanging = HangingOwner(1, fake_bench)
    slots[1] = (slots[1][0], hanging)
    spec = _spec(8)
    seen: list[str] = []
    runner = TuneRunner(spec, slots[0][1], slots=slots, on_progress=lambda p: seen.append(p.text))
    task = asyncio.ensure_future(runner.run())
    while not hanging.log["profiles"] or not any(s == 0 for s, *_ in fake_bench["profiles"]):
        await asyncio.sleep(0)  # both slots' first launches under way
    runner.spec = replace(spec, time_budget_s=0.0001)  # now out of time: slot 0's launch ends, slot 1's hangs on
    await asyncio.wait_for(task, 10)
    assert hanging.cancelled
    assert runner.status == "done" and all(ln.slot == 0 for ln in runner.state.launches)
    assert any("in flight cancelled (not counted)" in line for line in seen), seen
