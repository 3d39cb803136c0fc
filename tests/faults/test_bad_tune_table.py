"""A bad [tune] table is one error naming the file and every bad key at once (never a traceback, never only the
first problem); a good one reads into the axes, shapes, exclusions and constraints the runner races."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.profiles.loading import load_profile
from app.core.profiles.types import ProfileError
from app.core.tune.space import build_space

BASE = ('backend = "sglang"\nmodel = "m"\nhost = "local"\n[flags]\nspeculative-algorithm = "NEXTN"\n'
        "speculative-num-steps = 1\nspeculative-eagle-topk = 1\nspeculative-num-draft-tokens = 2\n"
        "[bench]\nconcurrency = 4\nrequests = 8\ninput_len = 64\noutput_len = 32\n")


def _load(tmp_path: Path, tune: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "p.toml"
    path.write_text(BASE + tune, encoding="utf-8")
    return load_profile(path)


def _fails(tmp_path: Path, tune: str) -> ProfileError:
    with pytest.raises(ProfileError) as caught:
        _load(tmp_path, tune)
    assert str(caught.value).startswith(str(tmp_path / "p.toml")), caught.value
    return caught.value


def test_every_problem_of_the_table_is_named_at_once(tmp_path: Path) -> None:
    error = _fails(tmp_path, """
[tune]
shapes = [{ concurrency = 0 }, 3, { concurrency = 2, output = 5 }]
objective = "fast"
exclude = [{ nope = 1 }, { speculative-num-steps = 9 }]
max_launches = 0
confidence = 2
bogus = 1
[tune.flags]
speculative-num-stepz = [1]
speculative-num-steps = [1, 2, 2]
mem-fraction-static = ["x"]
[tune.toggles]
o = ["sched", "fast"]
z = "all"
[tune.constraints]
ttft_p95_ms = -1
p99 = 3
""")
    problems = error.problems
    expected = [
        "tune.bogus: unknown key",
        "tune.flags.speculative-num-stepz: unknown SGLang flag --speculative-num-stepz; did you mean "
        "--speculative-num-steps?",
        "tune.flags.speculative-num-steps[2]: 2 is listed twice",
        "tune.flags.mem-fraction-static[0]: expected a number",
        "tune.toggles.o[1]: overlap has no state 'fast'; its states: sched, sched+sbo, sbo, off",
        "tune.toggles.z: no toggle has the key 'z'",
        "tune.shapes[0].concurrency: expected an integer >= 1, got integer 0",
        "tune.shapes[1]: expected a table",
        "tune.shapes[2].output: unknown key; allowed keys: concurrency, input_len, output_len, requests",
        "tune.exclude[0].nope: unknown SGLang flag --nope",
        "tune.exclude[1].speculative-num-steps: not tuned",  # its axis did not read (the duplicate above)
        "tune.objective: expected one of stream_tok_s, total_tok_s, goodput, j_per_token",
        "tune.constraints.ttft_p95_ms: expected a number of milliseconds above 0",
        "tune.constraints.p99: unknown constraint",
        "tune.max_launches: expected an integer >= 1, got integer 0",
        "tune.confidence: expected a number 0.5-0.999",
    ]
    for start in expected:
        assert any(p.startswith(start) for p in problems), (start, problems)
    assert len(problems) == len(expected), problems
    assert f"{len(expected)} problems" in str(error)


def test_goodput_needs_an_slo_and_the_space_cannot_be_empty(tmp_path: Path) -> None:
    problems = _fails(tmp_path, '[tune]\nobjective = "goodput"\n').problems
    assert any(p.startswith("tune.objective: goodput needs an SLO") for p in problems), problems
    assert any(p.startswith("tune.flags: the space is empty") for p in problems), problems


def test_a_good_table_reads_into_candidates_with_exclusions_and_default_shapes(tmp_path: Path) -> None:
    profile = _load(tmp_path, """
[tune]
exclude = [{ speculative-num-steps = 3, o = "off" }]
[tune.flags]
speculative-num-steps = [1, 2, 3]
[tune.toggles]
o = ["sched", "off"]
[tune.constraints]
ttft_p95_ms = 500
""")
    tune = profile.tune
    assert tune is not None and tune.ttft_p95_ms == 500.0 and tune.objective == "stream_tok_s"
    # default shapes: the [bench] shape, concurrency 1 and 4x, each with at least twice its concurrency requests
    assert [(s.concurrency, s.input_len, s.output_len, s.requests) for s in tune.shapes] == [
        (4, 64, 32, 8), (1, 64, 32, 8), (16, 64, 32, 32)]
    space = build_space(profile, tune)
    labels = [c.label for c in space.candidates]
    assert labels == ["steps=1 overlap=sched", "steps=1 overlap=off", "steps=2 overlap=sched",
                      "steps=2 overlap=off", "steps=3 overlap=sched"]
    assert space.candidates[0].source == "running = space"  # the profile as it is is a point of the space
    assert [d.label for d in space.dropped] == ["steps=3 overlap=off"]
    assert "excluded by [tune] exclude" in space.dropped[0].why
    steps3 = space.candidates[-1]
    assert steps3.flags["speculative-num-draft-tokens"] == 4  # draft tokens follow the steps (topk 1)
    assert steps3.overrides(profile.flags) == "speculative-num-steps=3 speculative-num-draft-tokens=4"
