"""Profiles: the shipped ones load, bad ones fail with a message naming file and key, lookup by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.core.profiles.loading import find_profiles, load_profile, parse_profile, profile_dirs, resolve_profile
from app.core.profiles.render import launch_argv
from app.core.profiles.types import BenchSettings, ProfileError
from tests.helpers import REPO

SHIPPED = REPO / "profiles"
BAD = REPO / "tests" / "data" / "profiles"


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_profile_loads(path: Path) -> None:
    profile = load_profile(path)
    assert profile.name == path.stem
    assert profile.source == path
    assert path.read_text().startswith("#"), "each shipped profile opens with a comment header"
    argv = launch_argv(profile)
    assert all(isinstance(item, str) for item in argv)


def test_the_expected_profiles_are_shipped() -> None:
    names = {path.stem for path in SHIPPED.glob("*.toml")}
    assert {"demo", "qwen3.6-27b-2xa6000", "local-sglang", "local-vllm"} <= names


def test_demo_is_the_slow_starting_point() -> None:
    demo = load_profile(SHIPPED / "demo.toml")
    assert (demo.host, demo.backend, demo.model, demo.port, demo.gpus) == (
        "sim", "sglang", "sim/qwen3.6-27b", 30000, (0, 1))
    assert demo.python == sys.executable
    assert demo.module == "app.sim.sglang"
    flags = demo.flags
    assert flags["tp-size"] == 2
    assert flags["speculative-algorithm"] == "NEXTN"
    assert (flags["speculative-num-steps"], flags["speculative-eagle-topk"],
            flags["speculative-num-draft-tokens"]) == (1, 1, 2)
    assert flags["context-length"] == 131072
    assert flags["mem-fraction-static"] == 0.88
    assert "max-mamba-cache-size" in flags
    assert flags["enable-metrics"] is True
    assert "enforce-piecewise-cuda-graph" not in flags
    assert [t.key for t in demo.toggles] == ["s", "g", "o"]
    assert demo.bench.requests <= 32


def test_proven_profile_is_three_steps_four_draft_tokens() -> None:
    proven = load_profile(SHIPPED / "qwen3.6-27b-2xa6000.toml")
    assert proven.model == "Qwen/Qwen3.6-27B"
    assert proven.module == "sglang.launch_server"
    assert (proven.flags["speculative-num-steps"], proven.flags["speculative-num-draft-tokens"]) == (3, 4)
    assert proven.flags["enforce-piecewise-cuda-graph"] is True
    assert "ssh://" in (SHIPPED / "qwen3.6-27b-2xa6000.toml").read_text()


def test_launch_argv_sglang() -> None:
    demo = load_profile(SHIPPED / "demo.toml")
    argv = launch_argv(demo)
    assert argv[:7] == [sys.executable, "-m", "app.sim.sglang", "--model-path", "sim/qwen3.6-27b",
                        "--port", "30000"]
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert "--enable-metrics" in argv
    i = argv.index("--enable-metrics")
    assert argv[i + 1].startswith("--")  # a true boolean has no value


def test_launch_argv_vllm_uses_model_and_compact_json() -> None:
    vllm = load_profile(SHIPPED / "local-vllm.toml")
    argv = launch_argv(vllm)
    assert argv[1:7] == ["-m", "vllm.entrypoints.openai.api_server", "--model", vllm.model, "--port", "8000"]
    spec = argv[argv.index("--speculative-config") + 1]
    assert spec == '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}'
    assert vllm.env == {"VLLM_TARGET_DEVICE": "cpu"}
    assert vllm.gpus == ()


def test_argv_order_does_not_depend_on_file_order(tmp_path: Path) -> None:
    a = parse_profile('backend="sglang"\nmodel="m"\n[flags]\ntp-size=2\nenable-metrics=true\n', tmp_path / "a.toml")
    b = parse_profile('backend="sglang"\nmodel="m"\n[flags]\nenable-metrics=true\ntp-size=2\n', tmp_path / "b.toml")
    assert launch_argv(a) == launch_argv(b)


def test_defaults(tmp_path: Path) -> None:
    profile = parse_profile('backend = "vllm"\nmodel = "m"\n[flags]\ntensor-parallel-size = 2\n',
                            tmp_path / "mine.toml")
    assert profile.name == "mine"
    assert (profile.host, profile.python, profile.port) == ("local", "python3", 8000)
    assert profile.gpus == (0, 1)
    assert profile.bench == BenchSettings()
    assert profile.sim_state is None


def test_aliases_and_false_booleans_are_normalised(tmp_path: Path) -> None:
    profile = parse_profile('backend="sglang"\nmodel="m"\n[flags]\ntp=2\nenable-metrics=false\n', tmp_path / "x.toml")
    assert profile.flags == {"tp-size": 2}


def test_ssh_hosts_and_sim_state(tmp_path: Path) -> None:
    text = 'backend="sglang"\nmodel="m"\nhost="{}"\nsim_state="state"\n'
    assert parse_profile(text.format("ssh://me@gpu-box:2222"), tmp_path / "a.toml").host == "ssh://me@gpu-box:2222"
    assert parse_profile(text.format("gpu-box"), tmp_path / "a.toml").host == "gpu-box"
    assert parse_profile(text.format("sim"), tmp_path / "a.toml").sim_state == tmp_path / "state"


BAD_CASES = {
    "misspelt_flag": ("flags.speculative-num-step", "did you mean --speculative-num-steps?"),
    "wrong_type": ("flags.tp-size", "expected an integer, got string '2'"),
    "bad_choice": ("flags.speculative-algorithm", "expected one of EAGLE"),
    "unknown_key": ("modle", "'model'"),
    "syntax_error": ("syntax_error.toml:4:", "line 4, column"),
    "bad_port_type": ("port", "expected an integer, got string '30000'"),
    "bad_backend": ("backend", "sglang, vllm"),
    "missing_model": ("model", "missing"),
    "bad_bench": ("bench.concurency", "did you mean 'concurrency'"),
    "bad_toggle": ("toggles.m.flip", "not a boolean flag"),
    "reserved_flag": ("flags.model-path", "top-level key `model`"),
    "bad_host": ("host", "ssh://user@host:port"),
    "bad_env": ("env.SGLANG_ENABLE_SPEC_V2", "expected a string"),
    "sim_vllm": ("module", "only runs sglang"),
    "bad_json_flag": ("flags.speculative-config", "expected a table"),
}


@pytest.mark.parametrize("stem", sorted(BAD_CASES))
def test_bad_profile_errors_name_the_file_and_key(stem: str) -> None:
    key, problem = BAD_CASES[stem]
    with pytest.raises(ProfileError) as caught:
        load_profile(BAD / f"{stem}.toml")
    message = str(caught.value)
    assert f"{stem}.toml" in message
    assert key in message
    assert problem in message


def test_every_bad_fixture_is_covered() -> None:
    assert {p.stem for p in BAD.glob("*.toml")} == set(BAD_CASES)


def test_missing_file() -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(BAD / "nope.toml")


def test_find_and_resolve_by_name(tmp_path: Path) -> None:
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    user.mkdir()
    shipped.mkdir()
    (shipped / "demo.toml").write_text('backend="sglang"\nmodel="shipped"\n')
    (shipped / "other.toml").write_text('backend="sglang"\nmodel="other"\n')
    (user / "demo.toml").write_text('backend="sglang"\nmodel="mine"\n')
    dirs = [user, shipped]
    assert find_profiles(dirs) == [("demo", user / "demo.toml"), ("other", shipped / "other.toml")]
    assert resolve_profile("demo", dirs).model == "mine"
    assert resolve_profile(str(shipped / "demo.toml"), dirs).model == "shipped"
    with pytest.raises(ProfileError, match=r"no profile named 'dmeo'; did you mean 'demo'\? available: demo, other"):
        resolve_profile("dmeo", dirs)
    with pytest.raises(ProfileError, match="no such profile file"):
        resolve_profile(str(tmp_path / "absent.toml"), dirs)


def test_default_search_finds_the_shipped_demo() -> None:
    assert profile_dirs()[-1] == SHIPPED  # after the user's config dir, which may shadow it
    assert "demo" in dict(find_profiles())
    assert resolve_profile("demo", [SHIPPED]).source == SHIPPED / "demo.toml"
