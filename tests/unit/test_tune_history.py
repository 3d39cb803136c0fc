"""A finished tune run is in the advisor's history at every request shape it measured: "slower than before?" finds
the candidate that was fastest at the asked shape (its results JSON as the runner stores it), not another shape's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core.advisor.history import best_reference
from app.core.measure.bench import BenchSpec
from app.core.measure.store import HistoryStore
from app.core.profiles.types import TuneShape
from app.core.tune.model import LaunchDone, ShapeTrial, TuneState
from app.core.tune.race import Obs, RaceRule, decide
from app.core.tune.results import RaceSetup, tune_results
from app.core.tune.space import Candidate

ONE = {"speculative-num-steps": 1, "speculative-num-draft-tokens": 2}
THREE = {"speculative-num-steps": 3, "speculative-num-draft-tokens": 4}
SHAPES = (TuneShape(1, 32, 48, 4), TuneShape(8, 32, 48, 16))
# per stream tok/s by candidate and shape, over two launches: steps 3 wins at concurrency 1, steps 1 at 8
SPEED = {(0, 0): (40.0, 41.0), (0, 1): (30.0, 31.0), (1, 0): (60.0, 61.0), (1, 1): (20.0, 21.0)}


def _bench(shape: TuneShape) -> dict[str, Any]:
    return BenchSpec(requests=shape.requests, concurrency=shape.concurrency, input_len=shape.input_len,
                     max_tokens=shape.output_len, warmup=0).to_json()


def _tune_run(store: HistoryStore) -> int:
    candidates = (Candidate("steps=1", ONE), Candidate("steps=3", THREE))
    setup = RaceSetup(candidates, SHAPES, "stream_tok_s", RaceRule(max_launches=4), ONE)
    state = TuneState()
    obs = []
    for c in range(2):
        for k in range(2):
            trials = []
            for s, shape in enumerate(SHAPES):
                v = SPEED[(c, s)][k]
                trials.append(ShapeTrial(c, k, s, v, v * shape.concurrency, v, None, None, None, None))
                obs.append(Obs(candidates[c].label, shape.label, k, (v,)))
            state.launches.append(LaunchDone(c, k, "ready", tuple(trials)))
    decision = decide([c.label for c in candidates], [s.label for s in SHAPES], obs, setup.rule)
    params = {"bench": _bench(SHAPES[0]), "shapes": [{"concurrency": s.concurrency, "input_len": s.input_len,
                                                      "output_len": s.output_len, "requests": s.requests,
                                                      "label": s.label} for s in SHAPES]}
    run = store.start_run("tune", profile="t", host="sim", backend="sglang", model="m", params=params,
                          arms=[(c.label, "", c.flags) for c in candidates])
    store.finish_run(run, "done", summary=tune_results(setup, state, decision, status="done", run_id=run).to_json())
    return run


def test_a_tune_run_is_a_reference_at_each_of_its_shapes(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        run = _tune_run(store)
        low, _ = best_reference(store, model="m", backend="sglang", hosts={"sim"}, bench=_bench(SHAPES[0]))
        high, _ = best_reference(store, model="m", backend="sglang", hosts={"sim"}, bench=_bench(SHAPES[1]))
        other, _ = best_reference(store, model="m", backend="sglang", hosts={"sim"},
                                  bench=_bench(TuneShape(64, 32, 48, 64)))
    assert low is not None and low.run_id == run and low.kind == "tune" and low.arm == "steps=3"
    assert low.flags == THREE and low.per_stream == 60.5  # the launches' mean at concurrency 1
    assert high is not None and high.arm == "steps=1" and high.flags == ONE and high.per_stream == 30.5
    assert high.output_tok_s == 244.0 and high.concurrency == 8
    assert other is None  # a shape the tune did not measure has no reference from it
