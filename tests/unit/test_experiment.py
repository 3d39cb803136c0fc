"""A/B experiments on a fake lifecycle and a scripted server: arms, order, relaunches, history as trials
finish, cancel keeps finished trials, a crashed arm fails with the crash, export reproduces the table."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from app.core.data import ServerState
from app.core.errors import Reason
from app.core.measure.bench import BenchSpec
from app.core.measure.experiment import Experiment, ExperimentFailed, ExperimentProgress, ExperimentSpec, parse_arm
from app.core.measure.report import experiment_text, export_run, run_json
from app.core.measure.stats import verdict
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import load_profile
from app.core.profiles.types import ProfileError
from app.core.server.events import LifecycleView
from tests.helpers import serving

REPO = Path(__file__).resolve().parents[2]


class FakeServer:
    """Streams `max_tokens` tokens, 2 a chunk, at a pace set by the running arm's speculative steps."""

    def __init__(self) -> None:
        self.steps = 1
        self.gate: asyncio.Event | None = None  # when set, requests wait for it (to cancel mid-trial)


SERVER: web.AppKey[FakeServer] = web.AppKey("server", FakeServer)


async def _complete(request: web.Request) -> web.StreamResponse:
    srv = request.app[SERVER]
    body = await request.json()
    if srv.gate is not None:
        await srv.gate.wait()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    n = int(body["max_tokens"])
    for _ in range(0, n, 2):
        await asyncio.sleep(0.004 / srv.steps)
        await resp.write(b'data: {"choices": [{"index": 0, "text": " a b"}]}\n\n')
    usage = {"completion_tokens": n, "prompt_tokens": 3, "total_tokens": n + 3}
    await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    return resp


class FakeHost:
    async def http_base(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"


class FakeLifecycle:
    """A duck-typed ServerOwner: relaunch switches the fake server's speed; may crash an arm."""

    def __init__(self, server: FakeServer, crash_steps: int | None = None) -> None:
        self.server = server
        self.host = FakeHost()
        self.crash_steps = crash_steps
        self.relaunched: list[Any] = []
        self.listeners: list[Any] = []
        self.state = ServerState.STOPPED
        self.profile: Any = None

    def subscribe(self, listener: Any) -> Any:
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener)

    def view(self) -> LifecycleView:
        return LifecycleView(state=self.state, since=0.0, record=None, profile=self.profile,
                             phase_times={"kill": 0.1, "ready": 0.5}, notices=(), fatal=None, last_lines=("boom",),
                             holders=(), health_ok=None, last_decode=None)

    async def relaunch(self, profile: Any, *, ready_timeout_s: float | None = None,
                       change: str | None = None) -> ServerState:
        steps = int(profile.flags["speculative-num-steps"])
        self.relaunched.append(steps)
        self.profile = profile
        self.state = ServerState.CRASHED if steps == self.crash_steps else ServerState.READY
        if self.state == ServerState.READY:
            self.server.steps = steps
        return self.state


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeServer, int]]:
    server = FakeServer()
    app = web.Application()
    app[SERVER] = server
    app.router.add_post("/v1/completions", _complete)
    async with serving(app) as port:
        yield server, port


def _spec(port: int, a: str, b: str, trials: int = 2, interleave: bool = False) -> ExperimentSpec:
    profile = load_profile(REPO / "profiles" / "demo.toml")
    profile = parse_arm(profile, f"port={port}", "base").profile
    return ExperimentSpec([parse_arm(profile, a, "A"), parse_arm(profile, b, "B")], trials,
                          BenchSpec(requests=4, concurrency=2, max_tokens=16, warmup=1, input_len=8),
                          interleave=interleave, ready_timeout_s=5)


async def test_two_arms_relaunch_once_each_and_land_in_the_history(fake, tmp_path):
    server, port = fake
    life = FakeLifecycle(server)
    progress: list[ExperimentProgress] = []
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        spec = _spec(port, "speculative-num-steps=1", "speculative-num-steps=3")
        result = await Experiment(spec, life, store, on_progress=progress.append).run()  # type: ignore[arg-type]
        assert life.relaunched == [1, 3]
        assert [len(a.values) for a in result.arms] == [2, 2]
        assert all(a.output_tokens == 2 * 4 * 16 for a in result.arms)  # warm-ups excluded
        assert result.ratio().ratio == pytest.approx(result.arms[1].stats.mean / result.arms[0].stats.mean)
        assert result.verdict == verdict(result.arms[0].values, result.arms[1].values)
        kinds = [p.kind for p in progress]
        assert kinds.count("relaunch") == 2 and kinds.count("trial") == 4 and kinds[-1] == "done"
        stored = store.run(result.run_id or 0)
        assert stored is not None and stored.status == "done" and len(stored.trials) == 4
        assert len(stored.launches) == 2 and stored.launches[1].outcome == "ready"
        assert len(store.request_rows(stored.id)) == 16
        # the export recomputes the same JSON and table from the stored trials
        live = result.to_json()
        exported = run_json(stored)
        for key in ("ratio", "ratio_ci", "verdict"):
            assert exported[key] == live[key]
        assert experiment_text(exported) == experiment_text(live)
        md = export_run(stored, "md")
        assert "`--speculative-num-steps`: `1` -> `3`" in md and f"**Verdict:** {result.verdict}" in md
        assert export_run(stored, "csv").count("\n") == 5


async def test_interleaved_order_relaunches_at_every_change(fake):
    server, port = fake
    life = FakeLifecycle(server)
    spec = _spec(port, "speculative-num-steps=1", "speculative-num-steps=2", trials=3, interleave=True)
    assert spec.schedule() == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2)]
    await Experiment(spec, life).run()  # type: ignore[arg-type]
    assert life.relaunched == [1, 2, 1, 2]


async def test_cancel_keeps_the_finished_trials(fake, tmp_path):
    server, port = fake
    life = FakeLifecycle(server)
    path = tmp_path / "h.sqlite3"
    store = HistoryStore(path)
    trials_seen: list[ExperimentProgress] = []

    def on_progress(p: ExperimentProgress) -> None:
        if p.kind == "trial":
            trials_seen.append(p)
            if len(trials_seen) == 3:  # A done, B's first trial done: hold B's second trial
                server.gate = asyncio.Event()

    exp = Experiment(_spec(port, "speculative-num-steps=1", "speculative-num-steps=3"), life, store,  # type: ignore[arg-type]
                     on_progress=on_progress)
    task = asyncio.create_task(exp.run())
    while len(trials_seen) < 3:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert server.gate is not None
    server.gate.set()  # let the held request finish so the server shuts down at once
    store.close()
    with HistoryStore(path) as again:
        run = again.run(exp.run_id or 0)
        assert run is not None and run.status == "cancelled"
        assert [t.arm_idx for t in run.trials] == [0, 0, 1]
        assert run.summary is not None and run.summary["arms"][1]["n"] == 1
    assert exp.result.status == "cancelled"


async def test_crashed_arm_fails_as_start_failed_and_is_recorded(fake, tmp_path):
    server, port = fake
    life = FakeLifecycle(server, crash_steps=3)
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        exp = Experiment(_spec(port, "speculative-num-steps=1", "speculative-num-steps=3"), life, store)  # type: ignore[arg-type]
        with pytest.raises(ExperimentFailed) as info:
            await exp.run()
        assert info.value.reason == Reason.START_FAILED and "arm B" in str(info.value) and "CRASHED" in str(info.value)
        run = store.run(exp.run_id or 0)
        assert run is not None and run.status == "failed" and len(run.trials) == 2
        assert run.launches[-1].outcome == "crashed"


def test_bad_arm_names_the_arm_and_the_flag():
    profile = load_profile(REPO / "profiles" / "demo.toml")
    with pytest.raises(ProfileError, match="arm B") as info:
        parse_arm(profile, "speculative-num-stepz=3", "B")
    assert "speculative-num-stepz" in str(info.value)
    with pytest.raises(ProfileError, match="FLAG=VALUE"):
        parse_arm(profile, "speculative-num-steps='3", "A")
    arm = parse_arm(profile, "speculative-num-steps=3 !enable-metrics", "B")
    assert arm.profile.flags["speculative-num-steps"] == 3 and "enable-metrics" not in arm.profile.flags
