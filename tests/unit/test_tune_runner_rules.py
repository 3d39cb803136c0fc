"""The tune runner's own rules, without a server: a warm profile's next launch keeps the weight cache's key where
the racing rule allows; a launch over a constraint gives no value at that shape (it cannot win there) and a
candidate over it at every shape leaves with the figures; a stored launch without all its trials is re-done under
a new number, never counted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from app.core.measure.store import HistoryStore
from app.core.profiles.loading import parse_profile
from app.core.profiles.types import Profile
from app.core.tune.model import LaunchDone, ShapeTrial, TuneFailed, TuneSpec, spec_from_run, state_from_run
from app.core.tune.race import Decision
from app.core.tune.run import TuneRunner
from app.core.tune.space import build_space

PROFILE = """backend = "sglang"\nmodel = "m"\nhost = "local"\nwarm = true
[flags]
tp-size = 1
speculative-algorithm = "NEXTN"
speculative-num-steps = 1
speculative-eagle-topk = 1
speculative-num-draft-tokens = 2
[tune]
shapes = [{ concurrency = 1 }, { concurrency = 4 }]
[tune.flags]
tp-size = [1, 2]
speculative-num-steps = [1, 3]
[tune.constraints]
ttft_p95_ms = 100
"""


def _spec(text: str = PROFILE) -> TuneSpec:
    profile: Profile = parse_profile(text, Path("p.toml"))
    assert profile.tune is not None
    space = build_space(profile, profile.tune, running=profile.flags)
    return TuneSpec(profile, space.candidates, profile.tune.shapes, profile.tune, 8)


def _decision(names: list[str]) -> Decision:
    return Decision((), {}, tuple(names), False, "")


def test_a_warm_profile_keeps_the_cache_key_among_the_rule_s_next_with_the_fewest_launches() -> None:
    spec = _spec()
    runner = TuneRunner(spec, owner=None)  # type: ignore[arg-type]  # _pick never reaches the owner
    labels = [c.label for c in spec.candidates]
    assert labels == ["tp-size=1 steps=1", "tp-size=1 steps=3", "tp-size=2 steps=1", "tp-size=2 steps=3"]
    runner._current = labels.index("tp-size=2 steps=1")  # the server runs TP 2: its daemon holds TP 2 weights
    order = ["tp-size=1 steps=1", "tp-size=1 steps=3", "tp-size=2 steps=3"]
    assert labels[runner._pick(_decision(order))] == "tp-size=2 steps=3"  # same key: the daemon stays
    # one with fewer launches comes first all the same: the rule's interleaving is never overridden
    runner.state.launches.append(LaunchDone(labels.index("tp-size=2 steps=3"), 0, "ready"))
    assert labels[runner._pick(_decision(order))] == "tp-size=1 steps=1"
    # a profile without the weight cache takes the rule's first
    cold = TuneRunner(replace(spec, profile=replace(spec.profile, warm=False)), owner=None)  # type: ignore[arg-type]
    cold._current = runner._current
    assert labels[cold._pick(_decision(order))] == "tp-size=1 steps=1"


def _trial(c: int, k: int, s: int, value: float, ttft: float) -> ShapeTrial:
    over = f"TTFT p95 {ttft:.0f} ms > 100 ms" if ttft > 100 else ""
    return ShapeTrial(c, k, s, value, value, value, None, None, ttft, None, 0, over)


def test_a_constraint_breaks_values_per_shape_and_removes_a_candidate_over_it_everywhere() -> None:
    spec = _spec()
    runner = TuneRunner(spec, owner=None)  # type: ignore[arg-type]
    launches = runner.state.launches
    launches.append(LaunchDone(0, 0, "ready", (_trial(0, 0, 0, 50, 80), _trial(0, 0, 1, 40, 90))))
    launches.append(LaunchDone(1, 0, "ready", (_trial(1, 0, 0, 70, 150), _trial(1, 0, 1, 60, 90))))  # over at c1
    launches.append(LaunchDone(2, 0, "ready", (_trial(2, 0, 0, 90, 300), _trial(2, 0, 1, 80, 250))))  # over at both
    launches.append(LaunchDone(3, 0, "crashed"))
    racing, obs, out = runner.observations()
    names = [c.label for c in spec.candidates]
    assert racing == [names[0], names[1], names[3]] and list(out) == [names[2]]
    assert out[names[2]] == ("over a constraint at every shape: c1 512/256: TTFT p95 300 ms > 100 ms; "
                             "c4 512/256: TTFT p95 250 ms > 100 ms")
    values = {(o.candidate, o.shape): o.values for o in obs}
    assert values[(names[1], "c1 512/256")] == () and values[(names[1], "c4 512/256")] == (60,)
    assert values[(names[3], "c1 512/256")] == ()  # a launch that did not come up is spent, with no value
    decision = runner.decide()
    assert decision.eliminated[names[2]] == out[names[2]]
    assert names[2] not in [row.candidate for board in decision.boards for row in board.rows]


def test_a_stored_launch_without_all_its_trials_is_partial_and_its_number_is_not_reused(tmp_path: Path) -> None:
    spec = _spec()
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        run_id = store.start_run("tune", profile="p", host="local", backend="sglang", model="m",
                                 params=spec.params_json(), arms=[(c.label, "", c.flags) for c in spec.candidates])
        for c, k in ((0, 0), (1, 0)):
            store.add_launch(run_id=run_id, arm_idx=c, profile="p", host="local", argv=[], flags={},
                             server_flags=None, phase_times={}, outcome="ready", launch_idx=k)
        for c, s in ((0, 0), (0, 1), (1, 0)):  # candidate 1's launch measured one of the two shapes
            trial = _trial(c, 0, s, 50.0, 50.0)
            store.add_trial(run_id, c, s, value=50.0, summary={"tune": trial.to_json()}, accept_len=None,
                            accept_source="", requests=[], launch_idx=0)
        run = store.run(run_id)
    assert run is not None
    state = state_from_run(run, len(spec.shapes))
    assert state.partial == 1
    assert [(ln.candidate, ln.launch, ln.outcome) for ln in state.launches] == [(0, 0, "ready"), (1, 0, "partial")]
    assert state.next_launch(1) == 1 and state.next_launch(0) == 1 and state.next_launch(2) == 0
    runner = TuneRunner(spec, owner=None, resume=run)  # type: ignore[arg-type]
    # the budget counts what the rule counts: the partial launch is done again, not spent twice
    assert [ln.candidate for ln in runner.counted()] == [0] and runner.state.spent() == 1


def test_resume_refuses_another_kind_another_profile_a_finished_run_and_unreadable_params(tmp_path: Path) -> None:
    spec = _spec()
    profile = replace(spec.profile, name="p")
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        arms = [(c.label, "", c.flags) for c in spec.candidates]
        tune = store.start_run("tune", profile="p", host="local", backend="sglang", model="m",
                               params=spec.params_json(), arms=arms)
        ab = store.start_run("ab", profile="p", host="local", backend="sglang", model="m", params={}, arms=arms)
        other = store.start_run("tune", profile="q", host="local", backend="sglang", model="m",
                                params=spec.params_json(), arms=arms)
        done = store.start_run("tune", profile="p", host="local", backend="sglang", model="m",
                               params=spec.params_json(), arms=arms)
        store.finish_run(done, "done", note="every shape separated")
        torn = store.start_run("tune", profile="p", host="local", backend="sglang", model="m",
                               params={"shapes": "?"}, arms=arms)
        rows = {name: store.run(rid) for name, rid in
                (("tune", tune), ("ab", ab), ("other", other), ("done", done), ("torn", torn))}
    expected = {"ab": f"run #{ab} is not a tune run (kind ab)", "other": f"run #{other} tuned profile 'q', not 'p'",
                "done": f"run #{done} is finished (every shape separated)",
                "torn": f"run #{torn}: its stored parameters are unreadable"}
    for name, start in expected.items():
        row = rows[name]
        assert row is not None
        with pytest.raises(TuneFailed) as caught:
            spec_from_run(profile, row)
        assert str(caught.value).startswith(start), (name, caught.value)
    row = rows["tune"]
    assert row is not None
    again = spec_from_run(profile, row, max_launches=5)
    # what was stored comes back, whatever the profile's [tune] says now; a budget given again replaces it
    assert [c.label for c in again.candidates] == [c.label for c in spec.candidates]
    assert [c.flags for c in again.candidates] == [c.flags for c in spec.candidates]
    assert again.shapes == spec.shapes and again.max_launches == 5
    assert again.settings.ttft_p95_ms == 100.0 and again.settings.objective == "stream_tok_s"
