"""The real SGLang CLIs (0.5.10, 0.5.12, 0.5.15.post1, 0.5.23) against the data tunedash ships for them.

The venvs come from scripts/sglang-cli-env (.ci/run builds them): each real release's own argparse parser
and `--help`, on a CPU (serving does not work there, parsing does). Per version: the committed argparse
dump app/sim/sglang_versions/V.json is what scripts/sglang_flags_dump.py makes now, the committed
V.help.txt is what the real `--help` prints now, and the flag names read from that help text are the
dump's. The demo profile's argv parses under the real 0.5.10; under the real 0.5.23 it does not (it names
0.5.10's flags), and 0.5.23 rejects --enforce-piecewise-cuda-graph the way argparse does. What each version
accepts for the prefill (piecewise) CUDA graph is checked against its real parser.

A version whose venv is missing is skipped, saying how to build it, except under CI (the environment
variable CI set), where a missing venv is a failure: CI must not pass by testing nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any

import pytest

from app.core.profiles.loading import load_profile
from app.core.profiles.render import launch_argv
from tests.helpers import REPO

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

ENV_SCRIPT = REPO / "scripts" / "sglang-cli-env"
DATA = REPO / "app" / "sim" / "sglang_versions"
VERSIONS = ("0.5.10", "0.5.12", "0.5.15.post1", "0.5.23")
# The --help text is made with a fixed width and hash seed (choices built from sets print in hash order).
HELP_ENV = {"COLUMNS": "80", "PYTHONHASHSEED": "0"}


def sglang_python(version: str) -> str:
    """The python of `version`'s venv; skips the test when it is missing (fails under CI)."""
    done = subprocess.run([str(ENV_SCRIPT), "--python", version], capture_output=True, text=True, timeout=30)
    if done.returncode == 0:
        return done.stdout.strip()
    why = f"the SGLang {version} CLI environment is absent: {done.stderr.strip()}"
    if os.environ.get("CI"):
        pytest.fail(f"{why} (.ci/run builds it with scripts/sglang-cli-env)")
    pytest.skip(why)


def help_flag_names(help_text: str) -> set[str]:
    """The option strings a `--help` text lists: every invocation line of its option sections.

    argparse writes one per flag, indented two spaces, aliases joined by ", ", the help after two or more
    spaces (or on the next lines, indented further): `  --tp-size TP_SIZE, --tensor-parallel-size TP_SIZE`.
    The usage block and the help texts are indented further, so they never start a line with "  -".
    """
    names: set[str] = set()
    for line in help_text.splitlines():
        if not line.startswith("  -"):
            continue
        invocation = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        names.update(part.split(" ", 1)[0] for part in invocation.split(", "))
    return names


def committed_dump(version: str) -> dict[str, Any]:
    dump: dict[str, Any] = json.loads((DATA / f"{version}.json").read_text())
    return dump


def parse_under(version: str, argvs: list[list[str]]) -> list[dict[str, Any]]:
    """Each argv run through `version`'s real parser (scripts/sglang_parse_check.py, one process for all)."""
    python = sglang_python(version)
    done = subprocess.run([python, str(REPO / "scripts" / "sglang_parse_check.py")], input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def demo_flags() -> list[str]:
    """The demo profile's launch argv after `python -m MODULE`: what the SGLang server parses."""
    argv = launch_argv(load_profile(REPO / "profiles" / "demo.toml"))
    return argv[argv.index("-m") + 2:]


@pytest.mark.parametrize("version", VERSIONS)
def test_committed_flags_dump_is_what_the_real_parser_gives_now(version: str) -> None:
    python = sglang_python(version)
    done = subprocess.run([python, str(REPO / "scripts" / "sglang_flags_dump.py")], capture_output=True,
                          text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    now = json.loads(done.stdout)
    committed = committed_dump(version)
    assert now["version"] == version
    stale = sorted(set(now["flags"]) ^ set(committed["flags"]))
    stale += [name for name, flag in now["flags"].items() if committed["flags"].get(name, flag) != flag]
    assert not stale, f"app/sim/sglang_versions/{version}.json is stale for {stale[:10]}: rerun {now['command']}"
    assert now == committed


@pytest.mark.parametrize("version", VERSIONS)
def test_committed_help_text_is_what_the_real_help_prints_now(version: str) -> None:
    python = sglang_python(version)
    done = subprocess.run([python, "-m", "sglang.launch_server", "--help"], capture_output=True, text=True,
                          timeout=180, cwd=REPO, env={**os.environ, **HELP_ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == (DATA / f"{version}.help.txt").read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_flag_names_read_from_the_help_text_are_the_parsers_flags(version: str) -> None:
    dump = committed_dump(version)
    listed = {option for flag in dump["flags"].values() if not flag["hidden"] for option in flag["option_strings"]}
    assert help_flag_names((DATA / f"{version}.help.txt").read_text()) == listed
    assert dump["version"] == version and dump["usage_prog"] == "sglang serve"


def test_demo_argv_parses_under_the_real_0_5_10() -> None:
    [result] = parse_under("0.5.10", [demo_flags()])
    assert result["ok"], result["error"]


def test_real_0_5_23_rejects_the_demo_argv_and_enforce_piecewise_cuda_graph() -> None:
    demo = demo_flags()
    assert "--mamba-scheduler-strategy" in demo
    at = demo.index("--mamba-scheduler-strategy")
    without_mamba = demo[:at] + demo[at + 2:]
    as_demo, with_g = parse_under("0.5.23", [demo, [*without_mamba, "--enforce-piecewise-cuda-graph"]])
    assert (as_demo["ok"], as_demo["exit_code"]) == (False, 2)
    assert as_demo["error"] == "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer"
    assert (with_g["ok"], with_g["exit_code"]) == (False, 2)
    assert with_g["error"] == "sglang serve: error: unrecognized arguments: --enforce-piecewise-cuda-graph"


# What keeps the prefill (piecewise) CUDA graph on, per version: True = parses, False = argparse exit 2.
PREFILL_GRAPH_FLAGS: dict[str, dict[tuple[str, ...], bool]] = {
    "0.5.10": {("--enforce-piecewise-cuda-graph",): True, ("--disable-piecewise-cuda-graph",): True,
               ("--cuda-graph-backend-prefill", "breakable"): False},
    "0.5.12": {("--enforce-piecewise-cuda-graph",): True, ("--disable-piecewise-cuda-graph",): True,
               ("--enable-breakable-cuda-graph",): True, ("--cuda-graph-backend-prefill", "breakable"): False},
    "0.5.15.post1": {("--enforce-piecewise-cuda-graph",): True, ("--disable-piecewise-cuda-graph",): True,
                     ("--cuda-graph-backend-prefill", "breakable"): True,
                     ("--cuda-graph-backend-prefill", "tc_piecewise"): True},
    "0.5.23": {("--enforce-piecewise-cuda-graph",): False, ("--disable-piecewise-cuda-graph",): False,
               ("--cuda-graph-backend-prefill", "breakable"): True,
               ("--cuda-graph-backend-prefill", "tc_piecewise"): False},
}


@pytest.mark.parametrize("version", VERSIONS)
def test_prefill_graph_flags_each_version_accepts(version: str) -> None:
    cases = PREFILL_GRAPH_FLAGS[version]
    results = parse_under(version, [["--model-path", "m", *flags] for flags in cases])
    verdicts = {flags: (result["ok"], result["exit_code"]) for flags, result in zip(cases, results, strict=True)}
    assert verdicts == {flags: (True, 0) if ok else (False, 2) for flags, ok in cases.items()}


# ---- tunedash against the real parsers: discovery, every toggle state, a real launch --------------------------
def _accepted(version: str) -> frozenset[str]:
    """What tunedash's discovery reads from the committed `--help` of `version` (names without dashes)."""
    from app.core.flags.discovery import parse_help_flags

    return parse_help_flags((DATA / f"{version}.help.txt").read_text())


@pytest.mark.parametrize("version", VERSIONS)
def test_discovery_reads_the_flags_the_real_help_lists(version: str) -> None:
    dump = committed_dump(version)
    listed = {option.lstrip("-") for flag in dump["flags"].values() if not flag["hidden"]
              for option in flag["option_strings"] if option.startswith("--")}
    assert _accepted(version) == listed - {"help"}  # -h/--help is not a launch flag


def _profile_for(version: str) -> Any:
    """The demo profile of that release line (0.5.10's flags up to 0.5.12, 0.5.23's from 0.5.15), with its
    toggles rendered for `version` as discovery would."""
    from app.core.flags.catalog import release_tuple
    from app.core.profiles.loading import for_server_version

    name = "demo.toml" if (release_tuple(version) or ()) < (0, 5, 15) else "demo-0.5.23.toml"
    return for_server_version(load_profile(REPO / "profiles" / name), version)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_state_of_every_default_toggle_parses_under_the_real_version(version: str) -> None:
    """For each toggle and each of its states, the argv tunedash would launch: the real parser of that version
    accepts it (no "unrecognized arguments"), and discovery's check agrees (nothing rejected)."""
    from app.core.flags.discovery import ServerFlags, rejection_message
    from app.core.flags.toggles import sync_draft_tokens
    from app.core.flags.values import set_flag

    profile = _profile_for(version)
    found = ServerFlags("sglang", "python", "sglang.launch_server", version, _accepted(version))
    cases: list[tuple[str, dict[str, Any]]] = []
    for toggle in profile.toggles:
        for index, state in enumerate(toggle.states):
            flags = dict(profile.flags)
            for name, value in zip(toggle.flags, state, strict=True):
                flags = set_flag(flags, name, value)
            cases.append((f"{toggle.key}[{index}]", sync_draft_tokens(flags)))
    assert len(cases) >= 5 + 2 + 4
    argvs = []
    for label, flags in cases:
        assert rejection_message(found, flags, label) is None, (label, rejection_message(found, flags, label))
        argv = launch_argv(type(profile)(**{**profile.__dict__, "flags": flags}))
        argvs.append(argv[argv.index("-m") + 2:])
    results = parse_under(version, argvs)
    failed = [(label, r["error"]) for (label, _), r in zip(cases, results, strict=True) if not r["ok"]]
    assert not failed, failed


def _real_profile(tmp_path: Any, version: str, extra_flags: str = "") -> Any:
    from tests.helpers import free_port

    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    path = tmp_path / f"real-{version}.toml"
    path.write_text(
        f'name = "real-sglang-{version.replace(".", "-")}"\nhost = "local"\nbackend = "sglang"\n'
        f'python = "{sglang_python(version)}"\nmodel = "{model}"\nport = {free_port()}\ngpus = []\n'
        f'ready_timeout = 120\n'
        f"[flags]\ntp-size = 1\n{extra_flags}")
    return path


def test_the_real_0_5_23_through_tunedash_refuses_a_rejected_flag_and_crashes_plainly(tmp_path: Any) -> None:
    """A flag 0.5.23 rejects is refused before anything starts, naming the version and what replaces it; a
    launch that parses but cannot serve on a CPU ends CRASHED with the real traceback's cause, not a hang."""
    from tests.helpers import tunedash

    path = _real_profile(tmp_path, "0.5.23", "enforce-piecewise-cuda-graph = true\n")
    refused = tunedash("launch", str(path), "--wait", "--timeout", "120", timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "SGLang 0.5.23" in refused.stderr and "--enforce-piecewise-cuda-graph" in refused.stderr
    assert "--cuda-graph-backend-prefill breakable" in refused.stderr and "launched pid" not in refused.stdout
    relaunch = tunedash("relaunch", str(path), timeout=300)
    assert relaunch.returncode == 2 and "SIGTERM" not in relaunch.stdout

    path = _real_profile(tmp_path, "0.5.23")
    crashed = tunedash("launch", str(path), "--wait", "--timeout", "120", timeout=300)
    assert crashed.returncode == 4, crashed.stdout + crashed.stderr
    assert "CRASHED" in crashed.stdout and "server failed to start" in crashed.stderr
    assert "fatal:" in crashed.stderr or "last log lines:" in crashed.stderr
    assert "Traceback" in crashed.stderr or "Error" in crashed.stderr
