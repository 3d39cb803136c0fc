"""`ab --slots 2` (app.core.measure.slot_ab) on two fake slot owners and two scripted servers: A and B run at the
same time, crossed over the slots, each slot's launches under its own profile name, GPUs and port; the launch rows
name their slot and the stored run's report gives the same crossover as the live one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from app.core.data import ServerState
from app.core.measure.bench import BenchSpec
from app.core.measure.experiment import ExperimentSpec, parse_arm
from app.core.measure.report import run_report
from app.core.measure.slot_ab import SlotExperiment
from app.core.measure.slots import Slot
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import load_profile
from app.core.server.events import LifecycleView
from tests.helpers import REPO, serving

ROUND_WAIT_S = 20.0  # a request waits at most this long for the other slot's first request of the same round


class SlotServer:
    """Streams tokens at `pace` (slot 1 at a quarter of slot 0's); a request of launch k waits until the other
    slot's server has had a request of launch k too: run one slot after the other and the first request times out."""

    def __init__(self, pace: float) -> None:
        self.pace = pace
        self.launch = -1
        self.seen: dict[int, asyncio.Event] = {}
        self.other: SlotServer | None = None

    def seen_in(self, launch: int) -> asyncio.Event:
        return self.seen.setdefault(launch, asyncio.Event())


KEY: web.AppKey[SlotServer] = web.AppKey("server", SlotServer)


async def _complete(request: web.Request) -> web.StreamResponse:
    srv = request.app[KEY]
    body = await request.json()
    srv.seen_in(srv.launch).set()
    assert srv.other is not None
    await asyncio.wait_for(srv.other.seen_in(srv.launch).wait(), ROUND_WAIT_S)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    n = int(body["max_tokens"])
    for _ in range(0, n, 2):
        await asyncio.sleep(0.004 / srv.pace)
        await resp.write(b'data: {"choices": [{"index": 0, "text": " a b"}]}\n\n')
    usage = {"completion_tokens": n, "prompt_tokens": 3, "total_tokens": n + 3}
    await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    return resp


class FakeHost:
    async def http_base(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"

    async def time_left_s(self) -> float | None:
        return None


class SlotOwner:
    """A duck-typed ServerOwner of one slot: remembers the profiles it was relaunched with."""

    def __init__(self, server: SlotServer) -> None:
        self.server = server
        self.host = FakeHost()
        self.profiles: list[Any] = []

    def subscribe(self, listener: Any) -> Any:
        return lambda: None

    def view(self) -> LifecycleView:
        return LifecycleView(state=ServerState.READY, since=0.0, record=None, profile=None,
                             phase_times={"ready": 0.1}, notices=(), fatal=None, last_lines=(), holders=(),
                             health_ok=None, last_decode=None)

    async def relaunch(self, profile: Any, *, ready_timeout_s: float | None = None,
                       change: str | None = None) -> ServerState:
        self.profiles.append(profile)
        self.server.launch += 1
        return ServerState.READY


@pytest.fixture
async def two_slots() -> AsyncIterator[tuple[list[SlotServer], list[int]]]:
    servers = [SlotServer(1.0), SlotServer(0.25)]
    servers[0].other, servers[1].other = servers[1], servers[0]
    apps = []
    for server in servers:
        app = web.Application()
        app[KEY] = server
        app.router.add_post("/v1/completions", _complete)
        apps.append(app)
    async with serving(apps[0]) as port0, serving(apps[1]) as port1:
        yield servers, [port0, port1]


async def test_a_and_b_run_side_by_side_crossed_over_and_the_store_names_each_launchs_slot(two_slots, tmp_path):
    servers, ports = two_slots
    profile = load_profile(REPO / "profiles" / "demo.toml")
    arms = [parse_arm(profile, "", "A"), parse_arm(profile, "", "B")]
    spec = ExperimentSpec(arms, 2, BenchSpec(requests=4, concurrency=2, max_tokens=16, warmup=1, input_len=8),
                          ready_timeout_s=5, launches=4, slots=2)
    slots = [Slot(0, (0, 1), ports[0]), Slot(1, (2, 3), ports[1])]
    owners = [SlotOwner(s) for s in servers]
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        experiment = SlotExperiment(spec, owners, slots, store)  # type: ignore[arg-type]
        result = await experiment.run()
        # round r: A on slot r % 2, B on the other; slot 1's launches under its own name, GPUs and port
        assert [p.flags == arms[0].profile.flags for p in owners[0].profiles] == [True] * 4
        assert [(p.name, p.gpus, p.port) for p in owners[0].profiles] == [(profile.name, (0, 1), ports[0])] * 4
        assert [(p.name, p.gpus, p.port) for p in owners[1].profiles] == [
            (f"{profile.name}@slot1", (2, 3), ports[1])] * 4
        assert [a.slots for a in result.arms] == [[0, 1, 0, 1], [1, 0, 1, 0]]
        assert experiment.last_on_slot0() == 1  # round 3: B on slot 0, so B keeps the profile's own server
        report = result.report()
        cross = report.crossover
        assert cross is not None and cross.launch_slots == ((0, 1, 0, 1), (1, 0, 1, 0))
        # slot 1 streams at a quarter of the pace (timing on a loaded machine: only the direction is asserted)
        assert cross.slot_ratio is not None and cross.slot_ratio < 0.9
        assert cross.ratio is not None and 0.67 < cross.ratio < 1.5  # A == B once the slot is taken out
        verdict = report.verdict or ""
        assert report.comparisons[0].ratio == cross.ratio and "slot removed" in verdict  # the verdict says both
        assert "slot 1 runs" in verdict or "no slot difference detectable" in verdict
        stored = store.run(result.run_id or 0)
        assert stored is not None and stored.params["design"] == "crossover"
        assert [(ln.arm_idx, ln.launch_idx, ln.flags["slot"]) for ln in stored.launches][:2] == [
            (0, 0, {"index": 0, "gpus": [0, 1], "port": ports[0]}),
            (1, 0, {"index": 1, "gpus": [2, 3], "port": ports[1]})]
        assert run_report(stored).experiment.crossover == cross  # history and export read the same crossover
