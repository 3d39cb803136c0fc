"""The simulated SGLang speaks 0.5.10 and 0.5.23: each release's real flags and --help, its rejections, its
startup lines, its rules in /get_server_info, and the demo's speed story; a profile's sim_version picks one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.connect import simulated_host_environment
from app.core.data import Phase, PhaseEvent
from app.core.flags.toggles import apply_toggle
from app.core.logs.parser import parse_lines, read_log_lines, summary_to_json
from app.core.profiles.loading import for_server_version, load_profile, resolve_profile
from app.core.profiles.render import launch_argv
from app.core.profiles.types import Profile, ProfileError
from app.sim.flag_parser import build_parser
from app.sim.resolved import Resolved
from app.sim.server_args import load_models, parse, resolve
from app.sim.sglang import speed_config
from app.sim.speed import SpeedModel, load_params
from app.sim.versions import VERSION_ENV, VERSIONS, data_files, flag_table
from tests.helpers import REPO, GroupReaper, wait_until

from .test_sglang_server import Server

FIXTURE_0523 = REPO / "tests" / "data" / "logs" / "sglang_0523_startup.log"
DEMO = load_models()["sim/qwen3.6-27b"]
# The flag that keeps the prefill-side graph on where SGLang would turn it off (the `g` key), per release.
KEEP_PREFILL_GRAPH = {"0.5.10": ["--enforce-piecewise-cuda-graph"],
                      "0.5.23": ["--cuda-graph-backend-prefill", "breakable"]}
SPEC = ["--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "1"]


def real_flags(version: str) -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, dict[str, Any]]] = json.loads(data_files(version)[0].read_text())
    return data["flags"]


def usage_prog(version: str) -> str:
    return str(json.loads(data_files(version)[0].read_text())["usage_prog"])


def run_sim(version: str, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.sim.sglang", *argv], env={**env, VERSION_ENV: version},
                          capture_output=True, text=True, timeout=30, check=False)


# ---------------------------------------------------------------------------------------------- flags


@pytest.mark.parametrize("version", VERSIONS)
def test_the_parser_has_exactly_the_real_flags(version: str) -> None:
    parser = build_parser(flag_table(version))
    flags = real_flags(version)
    assert set(parser._option_string_actions) == {o for row in flags.values() for o in row["option_strings"]}
    for name, row in flags.items():
        action = parser._option_string_actions[row["option_strings"][0]]
        if row["action"] in ("help", "boolean_optional"):
            continue
        assert action.dest == row["dest"], name
        assert action.nargs == row["nargs"], name
        assert (list(action.choices) if action.choices is not None else None) == row["choices"], name


@pytest.mark.parametrize(("version", "rejected"), [
    ("0.5.23", ["--enforce-piecewise-cuda-graph"]),
    ("0.5.23", ["--mamba-scheduler-strategy", "extra_buffer"]),
    ("0.5.10", ["--cuda-graph-backend-prefill", "breakable"]),
])
def test_a_flag_the_release_lacks_exits_2_with_argparses_message(version: str, rejected: list[str],
                                                                 sim_env: dict[str, str]) -> None:
    done = run_sim(version, "--model-path", "sim/qwen3.6-27b", *rejected, env=sim_env)
    assert done.returncode == 2
    assert done.stderr.endswith(f"{usage_prog(version)}: error: unrecognized arguments: {' '.join(rejected)}\n")
    assert flag_table(version).usage in done.stderr  # the real usage block above the message
    assert done.stdout == ""


def test_0523_refuses_the_retired_prefill_backend_by_name(sim_env: dict[str, str]) -> None:
    done = run_sim("0.5.23", "--model-path", "sim/qwen3.6-27b", "--cuda-graph-backend-prefill", "tc_piecewise",
                   env=sim_env)
    assert done.returncode == 2
    assert done.stderr.endswith("sglang serve: error: argument --cuda-graph-backend-prefill: tc_piecewise was "
                                "removed; select breakable, full, or disabled\n")


@pytest.mark.parametrize("version", VERSIONS)
def test_help_is_the_real_help_text_and_version_is_the_release(version: str, sim_env: dict[str, str]) -> None:
    done = run_sim(version, "--help", env=sim_env)
    assert done.returncode == 0
    assert done.stdout == data_files(version)[1].read_text()
    probe = subprocess.run([sys.executable, "-c", "import app.sim.sglang as m; print(m.__version__)"],
                           env={**sim_env, VERSION_ENV: version}, capture_output=True, text=True, timeout=30,
                           check=True)
    assert probe.stdout.strip() == version


def test_an_unknown_release_is_refused(sim_env: dict[str, str]) -> None:
    done = run_sim("0.5.99", "--model-path", "sim/qwen3.6-27b", env=sim_env)
    assert done.returncode == 2
    assert "TUNEDASH_SIM_SGLANG_VERSION='0.5.99'" in done.stderr and "0.5.10, 0.5.23" in done.stderr


# ---------------------------------------------------------------------------------------------- rules


def test_0510_rules_are_unchanged() -> None:
    start = resolve(parse(["--model-path", "sim/qwen3.6-27b", "--tp-size", "2", *SPEC, "--speculative-num-steps",
                           "1"], "0.5.10"), DEMO, 49140, "0.5.10")
    assert start.args["disable_piecewise_cuda_graph"] is True and start.args["disable_overlap_schedule"] is True
    assert any(m.startswith("Overlap scheduler is disabled when spec v2 is off") for m in start.msgs)
    kept = resolve(parse(["--model-path", "sim/qwen3.6-27b", *SPEC, *KEEP_PREFILL_GRAPH["0.5.10"]], "0.5.10"),
                   DEMO, 49140, "0.5.10")
    assert kept.args["disable_piecewise_cuda_graph"] is False and kept.running.prefill_graph


def test_0523_rules_multimodal_prefill_graph_and_overlap() -> None:
    def resolved(*flags: str) -> Resolved:
        return resolve(parse(["--model-path", "sim/qwen3.6-27b", "--tp-size", "2", *SPEC, *flags], "0.5.23"),
                       DEMO, 49140, "0.5.23")

    start = resolved("--speculative-num-steps", "1")
    assert start.args["cuda_graph_backend_prefill"] == "disabled"
    assert start.args["disable_overlap_schedule"] is False
    assert "Breakable CUDA graph is incompatible with multimodal model; disabling prefill CUDA graph." \
        in start.msgs
    assert not any("spec v2" in m for m in start.msgs)
    kept = resolved(*KEEP_PREFILL_GRAPH["0.5.23"])
    assert kept.args["cuda_graph_backend_prefill"] == "breakable" and kept.running.prefill_graph
    assert not any("Breakable" in m for m in kept.msgs)
    synchronous = resolved("--disable-overlap-schedule", "--enable-single-batch-overlap")
    assert not synchronous.running.overlap_schedule and synchronous.running.single_batch_overlap
    text_only = resolve(parse(["--model-path", "sim/llama-3.1-8b"], "0.5.23"), load_models()["sim/llama-3.1-8b"],
                        49140, "0.5.23")
    assert text_only.args["cuda_graph_backend_prefill"] == "breakable"  # on by default for a text-only model


# ---------------------------------------------------------------------------------------------- the server


def shape(message: str) -> str:
    """A log message with its figures and lists blanked: two lines of one format string have one shape."""
    message = re.sub(r"\[[\d, ]*\]", "[L]", message)
    message = re.sub(r"\d+(?:\.\d+)?", "N", message)
    return message.rstrip()


def messages(path: Path) -> list[str]:
    prefix = re.compile(r"^\[[\d: -]+(?: TP\d+)?\] ")
    return [prefix.sub("", line) for line in read_log_lines(path) if prefix.match(line)]


STARTUP_WORDS = ("Init parallel", "Memory baseline", "Load weight", "Mamba Cache", "KV Cache", "Memory pool",
                 "Capture ", "max_total_num_tokens", "Prefill batch", "Decode batch")


def test_0523_server_lines_info_and_capture_phases(sim_env: dict[str, str], tmp_path: Path,
                                                   reaper: GroupReaper) -> None:
    env = {**sim_env, VERSION_ENV: "0.5.23"}
    flags = (*SPEC, "--speculative-num-steps", "3", "--mamba-radix-cache-strategy", "extra_buffer",
             "--decode-log-interval", "5", "--context-length", "128Ki")
    srv = Server(reaper, env, tmp_path / "kept.log", *flags, *KEEP_PREFILL_GRAPH["0.5.23"])
    srv.wait_ready()
    status, body = srv.get("/get_server_info")
    assert status == 200
    info = json.loads(body)
    assert info["version"] == "0.5.23" and info["cuda_graph_backend_prefill"] == "breakable"
    assert info["context_length"] == 131072 and info["max_req_input_len"] == 131071  # a human_readable_int
    assert info["disable_overlap_schedule"] is False and info["speculative_num_steps"] == 3
    assert info["mamba_radix_cache_strategy"] == "extra_buffer" and "mamba_scheduler_strategy" not in info
    srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 60})
    wait_until(lambda: "Decode batch" in srv.text(), 5, "a decode line")

    # The sim's lines have the shapes of the fixture rendered from 0.5.23's own format strings.
    known = {shape(m) for m in messages(FIXTURE_0523)}
    ours = [m for m in messages(srv.log) if m.startswith(STARTUP_WORDS)]
    assert ours and [m for m in ours if shape(m) not in known] == []
    assert "Overlap scheduler is disabled" not in srv.text()

    # tunedash's parser reads them into one phase per capture, with its seconds and GiB.
    parsed = parse_lines(list(read_log_lines(srv.log)))
    captures = [p for p in summary_to_json(parsed.summary())["phases"] if p["phase"] == Phase.CUDA_GRAPH]
    assert [p["capture"] for p in captures] == ["target prefill", "target verify", "draft decode", "draft extend"]
    assert all(p["seconds"] > 0 and p["gib"] > 0 for p in captures)
    assert any(isinstance(e, PhaseEvent) and e.phase == Phase.WEIGHTS for e in parsed.events)


def test_0523_server_turns_the_prefill_graph_off_for_the_multimodal_model(sim_env: dict[str, str], tmp_path: Path,
                                                                        reaper: GroupReaper) -> None:
    env = {**sim_env, VERSION_ENV: "0.5.23"}
    srv = Server(reaper, env, tmp_path / "start.log", *SPEC, "--speculative-num-steps", "1")
    srv.wait_ready()
    info = json.loads(srv.get("/get_server_info")[1])
    assert info["version"] == "0.5.23" and info["cuda_graph_backend_prefill"] == "disabled"
    text = srv.text()
    assert "Breakable CUDA graph is incompatible with multimodal model; disabling prefill CUDA graph." in text
    assert "Capture target prefill CUDA graph" not in text and "Capture draft decode" not in text  # 1 step
    parsed = parse_lines(list(read_log_lines(srv.log)))
    notices = summary_to_json(parsed.summary())["notices"]
    assert any(n.get("feature") == "prefill_cuda_graph" for n in notices)


# ---------------------------------------------------------------------------------------------- speed


@pytest.mark.parametrize("version", VERSIONS)
def test_the_demo_story_on_both_releases(version: str) -> None:
    params = load_params()

    def tok_s(*flags: str) -> float:
        ns = parse(["--model-path", "sim/qwen3.6-27b", "--tp-size", "2", *SPEC, *flags], version)
        return SpeedModel(speed_config(resolve(ns, DEMO, 49140, version), DEMO), params, seed=1).mean_stream_tok_s()

    one = tok_s("--speculative-num-steps", "1")
    three = tok_s("--speculative-num-steps", "3")
    tuned = tok_s("--speculative-num-steps", "3", *KEEP_PREFILL_GRAPH[version], "--enable-single-batch-overlap")
    assert 35 <= one <= 40
    assert 50 <= three <= 57
    assert 66 <= tuned <= 74


# ---------------------------------------------------------------------------------------------- profiles


def test_sim_version_reaches_the_simulated_host() -> None:
    demo, demo_0523 = resolve_profile("demo"), resolve_profile("demo-0.5.23")
    assert simulated_host_environment(demo)[VERSION_ENV] == "0.5.10"  # the default
    assert simulated_host_environment(demo_0523)[VERSION_ENV] == "0.5.23"
    assert demo_0523.port != demo.port and demo_0523.sim_state != demo.sim_state
    assert demo_0523.model == demo.model and demo_0523.flags["speculative-num-steps"] == 1


@pytest.mark.parametrize(("profile", "version", "parses"), [
    ("demo", "0.5.10", True), ("demo-0.5.23", "0.5.23", True), ("demo", "0.5.23", False)])
def test_the_demo_profiles_parse_under_their_release(profile: str, version: str, parses: bool) -> None:
    flags = sim_flags(resolve_profile(profile))
    if parses:
        parse(flags, version)
    else:
        with pytest.raises(SystemExit) as stop:
            parse(flags, version)
        assert stop.value.code == 2


def sim_flags(profile: Profile) -> list[str]:
    argv = launch_argv(profile)
    return argv[argv.index("app.sim.sglang") + 1:]


@pytest.mark.parametrize(("profile", "version"), [("demo", "0.5.10"), ("demo-0.5.23", "0.5.23")])
def test_every_key_renders_flags_the_release_accepts_and_tells_the_story(profile: str, version: str) -> None:
    demo = for_server_version(resolve_profile(profile), version)
    for toggle in demo.toggles:  # every state of every built-in toggle parses under the release's real flags
        flags = dict(demo.flags)
        for _ in toggle.states:
            flags = apply_toggle(flags, toggle)
            parse(sim_flags(replace(demo, flags=flags)), version)
    flags = dict(demo.flags)
    for key in "goss":  # prefill graph kept, single-batch overlap, 3 steps
        pressed = demo.toggle(key)
        assert pressed is not None
        flags = apply_toggle(flags, pressed)
    ns = parse(sim_flags(replace(demo, flags=flags)), version)
    tuned = SpeedModel(speed_config(resolve(ns, DEMO, 49140, version), DEMO), load_params(), seed=1)
    assert 66 <= tuned.mean_stream_tok_s() <= 74


def test_an_unknown_sim_version_names_the_file_and_the_versions(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('host = "sim"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\nsim_version = "0.6.0"\n')
    with pytest.raises(ProfileError, match=rf"{re.escape(str(path))}: sim_version: .*'0\.6\.0'.*0\.5\.10, 0\.5\.23"):
        simulated_host_environment(load_profile(path))
