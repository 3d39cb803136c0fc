"""The tune results' JSON (`tune --json`, the stored summary, `export --format json`) is a contract: a small known
race (4 candidates x 2 shapes, one out, one never up, failed launches, a constraint broken, energy at one shape)
gives exactly the golden file, key for key and in order, whatever the results are built from inside the process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.core.profiles.types import TuneShape
from app.core.tune.model import LaunchDone, ShapeTrial, TuneState
from app.core.tune.race import Obs, RaceRule, decide
from app.core.tune.results import RaceSetup, tune_results
from app.core.tune.space import Candidate

GOLDEN = Path(__file__).parent / "golden_tune_results.json"
BASE = {"speculative-num-steps": 1, "mem-fraction-static": 0.8}
CANDIDATES = (Candidate("profile", dict(BASE), "profile"),
              Candidate("steps=3", {"speculative-num-steps": 3, "mem-fraction-static": 0.8}),
              Candidate("mem=0.9", {"speculative-num-steps": 1, "mem-fraction-static": 0.9}, "advisor"),
              Candidate("steps=5", {"speculative-num-steps": 5, "mem-fraction-static": 0.8}))  # never came up
SHAPES = (TuneShape(1, 32, 48, 4), TuneShape(8, 32, 48, 16))
# per stream tok/s by (candidate, shape) over launches; "mem=0.9" is far behind and goes out
SPEED = {(0, 0): (40.0, 41.0, 40.5), (0, 1): (30.0, 31.0, 30.4), (1, 0): (60.0, 61.0, 60.2),
         (1, 1): (29.0, 31.5, 30.1), (2, 0): (10.0, 11.0), (2, 1): (5.0, 6.0)}


def race() -> tuple[RaceSetup, TuneState, Any]:
    setup = RaceSetup(CANDIDATES, SHAPES, "stream_tok_s", RaceRule(max_launches=12, tie_pct=2.0), dict(BASE))
    state = TuneState(partial=1)
    obs = []
    for (c, s), values in sorted(SPEED.items()):
        for k, v in enumerate(values):
            obs.append(Obs(CANDIDATES[c].label, SHAPES[s].label, k, (v,)))
    for c in range(3):
        for k in range(len(SPEED[(c, 0)])):
            trials = []
            for s, shape in enumerate(SHAPES):
                v = SPEED[(c, s)][k]
                jpt = round(0.5 / v, 6) if s == 1 else None
                over = "TTFT p95 812 ms > 500 ms" if (c, s, k) == (2, 1, 0) else ""
                trials.append(ShapeTrial(c, k, s, v, v * shape.concurrency, v, None, jpt, 100.0 + k, 12.5 + s,
                                         over=over))
            state.launches.append(LaunchDone(c, k, "ready", tuple(trials)))
    state.launches.append(LaunchDone(2, 2, "crashed"))
    state.launches.append(LaunchDone(1, 3, "partial"))
    state.launches.append(LaunchDone(3, 0, "stuck"))
    decision = decide([c.label for c in CANDIDATES], [s.label for s in SHAPES], obs, setup.rule)
    return setup, state, decision


def results_json() -> dict[str, Any]:
    setup, state, decision = race()
    data = tune_results(setup, state, decision, status="done", run_id=7, note="a note", ended_on="steps=3")
    return data if isinstance(data, dict) else data.to_json()


def test_the_results_json_is_the_golden_one() -> None:
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    got = json.loads(json.dumps(results_json()))  # tuples as lists, as `--json` and the store write them
    assert got == golden
    assert list(got) == list(golden)  # the keys in the same order, at the top ...
    assert [list(s) for s in got["shapes"]] == [list(s) for s in golden["shapes"]]
    assert [list(r) for s in got["shapes"] for r in s["rows"]] == [list(r) for s in golden["shapes"]
                                                                    for r in s["rows"]]
    assert [list(c) for c in got["candidates"]] == [list(c) for c in golden["candidates"]]
    assert list(got["pareto"]) == list(golden["pareto"])
    assert [list(p) for p in got["pareto"]["points"]] == [list(p) for p in golden["pareto"]["points"]]
    assert list(got["best_single"]) == list(golden["best_single"])


if __name__ == "__main__":  # writes the golden file (only ever from the code before a change to the types)
    GOLDEN.write_text(json.dumps(results_json(), indent=2) + "\n", encoding="utf-8")
