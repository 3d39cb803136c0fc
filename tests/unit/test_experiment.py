"""A/B experiments on a fake lifecycle and a scripted server: arms, order, relaunches, history as trials
finish, cancel keeps finished trials, a crashed arm fails with the crash, export reproduces the table."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from app.core.data import ServerState
from app.core.errors import Reason
from app.core.measure.bench import BenchSpec
from app.core.measure.experiment import (
    Experiment,
    ExperimentFailed,
    ExperimentProgress,
    ExperimentSpec,
    Step,
    parse_arm,
)
from app.core.measure.report import experiment_text, export_run, run_json, run_report
from app.core.measure.stats import launch_ratio_stats, launch_verdict
from app.core.measure.store import HistoryStore
from app.core.profiles.loading import load_profile
from app.core.profiles.types import ProfileError
from app.core.server.events import LifecycleView
from tests.helpers import REPO, serving


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

    async def time_left_s(self) -> float | None:
        return None  # no scheduler ends this host (a Slurm allocation's fit check: tests/integration/test_slurm_cli)


class FakeLifecycle:
    """A duck-typed ServerOwner: relaunch switches the fake server's speed; may crash an arm.

    launch_speed: a factor per launch (in relaunch order), like the simulator's launch-to-launch variance."""

    def __init__(self, server: FakeServer, crash_steps: int | None = None,
                 launch_speed: list[float] | None = None) -> None:
        self.server = server
        self.launch_speed = launch_speed
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
            factor = self.launch_speed[len(self.relaunched) - 1] if self.launch_speed else 1.0
            self.server.steps = steps * factor  # type: ignore[assignment]
        return self.state


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeServer, int]]:
    server = FakeServer()
    app = web.Application()
    app[SERVER] = server
    app.router.add_post("/v1/completions", _complete)
    async with serving(app) as port:
        yield server, port


def _spec(port: int, a: str, b: str, trials: int = 2, interleave: bool = True, launches: int = 2) -> ExperimentSpec:
    profile = load_profile(REPO / "profiles" / "demo.toml")
    profile = parse_arm(profile, f"port={port}", "base").profile
    return ExperimentSpec([parse_arm(profile, a, "A"), parse_arm(profile, b, "B")], trials,
                          BenchSpec(requests=4, concurrency=2, max_tokens=16, warmup=1, input_len=8),
                          interleave=interleave, ready_timeout_s=5, launches=launches)


async def test_each_arm_runs_its_launches_and_every_launch_lands_in_the_history(fake, tmp_path):
    server, port = fake
    life = FakeLifecycle(server)
    progress: list[ExperimentProgress] = []
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        spec = _spec(port, "speculative-num-steps=1", "speculative-num-steps=3")
        result = await Experiment(spec, life, store, on_progress=progress.append).run()  # type: ignore[arg-type]
        assert life.relaunched == [1, 3, 3, 1]  # A B B A: a relaunch before every launch, B's second included
        assert [len(a.values) for a in result.arms] == [4, 4]
        assert [[len(v) for v in a.launches] for a in result.arms] == [[2, 2], [2, 2]]
        assert all(a.output_tokens == 2 * 2 * 4 * 16 for a in result.arms)  # warm-ups excluded
        assert result.ratio() == launch_ratio_stats(result.arms[0].launches, result.arms[1].launches)
        assert result.verdict.startswith(launch_verdict(result.arms[0].launches, result.arms[1].launches))
        assert result.verdict.endswith("; energy not measured (no energy meter)")  # none given to the experiment
        kinds = [p.kind for p in progress]
        assert kinds.count("relaunch") == 4 and kinds.count("trial") == 8 and kinds[-1] == "done"
        assert [(p.arm, p.launch) for p in progress if p.kind == "relaunch"] == [(0, 0), (1, 0), (1, 1), (0, 1)]
        stored = store.run(result.run_id or 0)
        assert stored is not None and stored.status == "done" and len(stored.trials) == 8
        assert [(t.arm_idx, t.launch_idx, t.trial_idx) for t in stored.trials] == [
            (0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1), (0, 1, 0), (0, 1, 1)]
        assert [(ln.arm_idx, ln.launch_idx, ln.outcome) for ln in stored.launches] == [
            (0, 0, "ready"), (1, 0, "ready"), (1, 1, "ready"), (0, 1, "ready")]
        assert stored.params["launches"] == 2 and stored.params["trials"] == 2
        assert len(store.request_rows(stored.id)) == 32
        # the export recomputes the same JSON and table from the stored trials
        live = result.to_json()
        exported = run_json(stored)
        for key in ("ratio", "ratio_ci", "verdict"):
            assert exported[key] == live[key]
        assert [a["launch_values"] for a in exported["arms"]] == [a["launch_values"] for a in live["arms"]]
        assert experiment_text(run_report(stored).experiment) == experiment_text(result.report())
        assert run_report(stored).experiment.to_json() == {**live, "run_id": stored.id}
        md = export_run(stored, "md")
        assert "`--speculative-num-steps`: `1` -> `3`" in md and f"**Verdict:** {result.verdict}" in md
        assert "2 launch(es) per arm of 2 trial(s)" in md
        csv_lines = export_run(stored, "csv").splitlines()
        assert len(csv_lines) == 9 and csv_lines[0].split(",")[4:6] == ["launch", "trial"]
        assert [line.split(",")[4] for line in csv_lines[1:]] == ["1", "1", "1", "1", "2", "2", "2", "2"]


async def test_launch_values_are_the_means_of_each_launch(fake):
    """A launch that runs slower moves its launch value, and the JSON keeps every launch and trial."""
    server, port = fake
    life = FakeLifecycle(server, launch_speed=[1.0, 1.0, 0.4, 1.0])  # B's second launch is an unlucky one
    result = await Experiment(_spec(port, "speculative-num-steps=2", "speculative-num-steps=2"),  # type: ignore[arg-type]
                              life).run()
    data = result.to_json()
    b = data["arms"][1]
    assert b["launches"] == 2 and b["trials_per_launch"] == [2, 2] and len(b["launch_trials"]) == 2
    assert b["launch_values"] == pytest.approx([sum(t) / len(t) for t in b["launch_trials"]], abs=1e-3)
    assert b["launch_values"][1] < 0.8 * b["launch_values"][0]
    assert b["launch_cv"] > b["trial_cv"]  # the launch-to-launch spread shows next to the trial-to-trial one


def test_the_schedule_interleaves_launches():
    spec = _spec(1, "speculative-num-steps=1", "speculative-num-steps=2", trials=2, launches=2)
    assert spec.launch_order() == [(0, 0), (1, 0), (1, 1), (0, 1)]
    assert spec.schedule() == [Step(0, 0, 0), Step(0, 0, 1), Step(1, 0, 0), Step(1, 0, 1),
                               Step(1, 1, 0), Step(1, 1, 1), Step(0, 1, 0), Step(0, 1, 1)]
    four = _spec(1, "speculative-num-steps=1", "speculative-num-steps=2", trials=1, launches=4)
    assert "".join("AB"[a] for a, _ in four.launch_order()) == "ABBAABBA"
    three = _spec(1, "speculative-num-steps=1", "speculative-num-steps=2", trials=1, launches=3)
    assert three.launch_order() == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2)]
    blocked = _spec(1, "speculative-num-steps=1", "speculative-num-steps=2", trials=1, interleave=False)
    assert blocked.launch_order() == [(0, 0), (0, 1), (1, 0), (1, 1)]


async def test_every_launch_is_a_relaunch(fake):
    server, port = fake
    life = FakeLifecycle(server)
    spec = _spec(port, "speculative-num-steps=1", "speculative-num-steps=2", trials=1, launches=3)
    await Experiment(spec, life).run()  # type: ignore[arg-type]
    assert life.relaunched == [1, 2, 2, 1, 1, 2]


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
        assert [(t.arm_idx, t.launch_idx) for t in run.trials] == [(0, 0), (0, 0), (1, 0)]
        assert run.summary is not None and run.summary["arms"][1]["n"] == 1
        assert run.summary["arms"][0]["launch_values"] and run.summary["ratio_ci"] is None  # one launch each
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


def test_the_profile_sets_launches_per_arm(tmp_path):
    text = (REPO / "profiles" / "demo.toml").read_text()
    assert load_profile(REPO / "profiles" / "demo.toml").bench.launches == 2  # the default
    path = tmp_path / "p.toml"
    path.write_text(text.replace("trials = 3", "trials = 3\nlaunches = 4"))
    assert load_profile(path).bench.launches == 4
    path.write_text(text.replace("trials = 3", "trials = 3\nlaunches = 0"))
    with pytest.raises(ProfileError, match=r"bench\.launches") as info:
        load_profile(path)
    assert str(path) in str(info.value)


class FakeEnergy:
    """An energy meter whose window always holds `joules` per GPU on two GPUs (app.core.telemetry.energy API)."""

    method = "fake_counter"

    def __init__(self, joules: float) -> None:
        self.joules = joules

    async def start(self) -> None:
        return None

    async def stop(self) -> Any:
        from app.core.telemetry.energy import EnergyReading

        return EnergyReading(self.method, (0, 1), 1.0, (self.joules, self.joules))


async def test_energy_per_trial_gives_j_per_token_per_arm_and_the_verdict_gives_both(fake, tmp_path):
    server, port = fake
    life = FakeLifecycle(server)

    def energy_for(profile: Any) -> FakeEnergy:  # B (3 steps) spends half the joules of A for the same tokens
        return FakeEnergy(4.0 if profile.flags["speculative-num-steps"] == 1 else 2.0)

    with HistoryStore(tmp_path / "h.sqlite3") as store:
        spec = _spec(port, "speculative-num-steps=1", "speculative-num-steps=3")
        result = await Experiment(spec, life, store, energy_for=energy_for).run()  # type: ignore[arg-type]
        data = result.to_json()
        a, b = (arm["energy"] for arm in data["arms"])
        assert a["measured"] and a["joules"] == 4 * 2 * 4.0 and a["output_tokens"] == 4 * 4 * 16
        assert a["j_per_token"] == pytest.approx(32 / 256) and b["j_per_token"] == pytest.approx(16 / 256)
        assert a["launch_j_per_token"] == [0.125, 0.125] and a["mean_w_per_gpu"] == [4.0, 4.0]
        assert data["comparisons"][0]["energy_ratio"] == 0.5
        assert ", and uses 50% less energy per token" in result.verdict
        stored = store.run(result.run_id or 0)
        assert stored is not None and run_json(stored)["verdict"] == result.verdict  # the export agrees
        assert export_run(stored, "csv").splitlines()[1].endswith(",8.0,0.125,fake_counter")
