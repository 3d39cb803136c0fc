"""`tunedash adopt`'s reading of command lines and the profile it writes: found by argv, typed by the catalog,
unknown flags kept verbatim, and the written profile loads and renders the same argv (order aside)."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

import pytest

from app.core.adopt.command import classify, parse_server_args
from app.core.adopt.profile_text import build_profile
from app.core.profiles.loading import load_profile
from app.core.profiles.render import launch_argv
from tests.adopt_helpers import server_for
from tests.helpers import REPO

VENV_PY = "/srv/venv/bin/python"
SEED = REPO / "profiles" / "qwen3.6-27b-2xa6000.toml"


def seed_argv() -> list[str]:
    return [VENV_PY if word == "python3" else word for word in launch_argv(load_profile(SEED))]


def normalised(argv: list[str]) -> Counter[str]:
    """argv items as a multiset, `--a=b` split: the same command line with the flags in any order."""
    out: list[str] = []
    for word in argv:
        out += word.split("=", 1) if word.startswith("--") and "=" in word else [word]
    return Counter(out)


def written(tmp_path: Path, argv: list[str], **kw: object) -> tuple[Path, list[str]]:
    path = tmp_path / "adopted.toml"
    made = build_profile(server_for(argv, **kw), "local", path)  # type: ignore[arg-type]
    path.write_text(made.text)
    return path, launch_argv(load_profile(path))


def test_seed_command_line_round_trips(tmp_path: Path) -> None:
    argv = seed_argv()
    path, rendered = written(tmp_path, argv, environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert normalised(rendered) == normalised(argv)
    data = tomllib.loads(path.read_text())
    assert data["gpus"] == [0, 1]
    assert data["flags"]["speculative-num-steps"] == 3
    assert data["flags"]["mem-fraction-static"] == 0.88
    assert data["flags"]["enforce-piecewise-cuda-graph"] is True
    assert "extra_args" not in data
    assert "pid 4242" in path.read_text() and "user alice" in path.read_text()


@pytest.mark.parametrize(("argv", "backend", "label"), [
    (["python3", "-m", "sglang.launch_server", "--model-path", "m"], "sglang", "SGLang"),
    (["/v/bin/python", "-u", "-m", "sglang.launch_server", "--model", "m"], "sglang", "SGLang"),
    (["/v/bin/python3.11", "/v/bin/sglang", "serve", "--model-path", "m"], "sglang", "SGLang (serve)"),
    (["/v/bin/python", "/v/bin/vllm", "serve", "m", "--port", "8001"], "vllm", "vLLM (serve)"),
    (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm", "vLLM"),
    (["/usr/bin/python3", "-m", "app.sim.sglang", "--model-path", "sim/x"], "sglang", "SGLang (simulated)"),
])
def test_servers_found_by_argv(argv: list[str], backend: str, label: str) -> None:
    command = classify(argv)
    assert command is not None
    assert (command.backend, command.label) == (backend, label)
    assert parse_server_args(command).model == "m" or command.simulated


@pytest.mark.parametrize("argv", [
    ["sglang::scheduler_TP0"],  # SGLang's scheduler child sets its title: not the main process
    ["python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()", "--multiprocessing-fork"],
    ["grep", "-E", "sglang|vllm", "/proc/1/cmdline"],
    ["sh", "-c", "python -m sglang.launch_server --model-path m"],
    ["vim", "sglang/launch_server.py"],
    ["python3", "bench_serving.py", "--backend", "sglang"],
    ["python3", "-m", "sglang.bench_serving", "--port", "30000"],
    ["python3", "-m", "pytest", "-k", "vllm"],
])
def test_not_servers(argv: list[str]) -> None:
    assert classify(argv) is None


def test_unknown_flags_kept_verbatim_and_listed(tmp_path: Path) -> None:
    argv = [VENV_PY, "-m", "sglang.launch_server", "--model-path", "m", "--port=30001", "--max-total-tokens",
            "4096", "--enable-torch-compile", "--some-new-bool", "--cuda-graph-bs", "1", "2", "4",
            "--json-model-override-args", '{"rope_scaling": null}', "--speculative-algorithm", "BRANDNEW"]
    path, rendered = written(tmp_path, argv)
    assert normalised(rendered) == normalised(argv)
    text = path.read_text()
    data = tomllib.loads(text)
    assert data["port"] == 30001
    assert data["flags"]["cuda-graph-bs"] == "1 2 4"
    assert data["flags"]["enable-torch-compile"] is True
    assert data["extra_args"] == ["--max-total-tokens", "4096", "--some-new-bool", "--json-model-override-args",
                                  '{"rope_scaling": null}', "--speculative-algorithm", "BRANDNEW"]
    comment = next(line for line in text.splitlines() if "Not in the flag catalog" in line)
    assert "--max-total-tokens" in comment and "--some-new-bool" in comment
    assert "--speculative-algorithm (value not typed by the catalog: 'BRANDNEW')" in comment


def test_vllm_forms_round_trip(tmp_path: Path) -> None:
    argv = [VENV_PY, "/srv/venv/bin/vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "8011", "--tp", "2",
            "--no-enable-prefix-caching", "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 3}', "--max-num-seqs", "8", "--api-server-count", "1"]
    path, rendered = written(tmp_path, argv)
    data = tomllib.loads(path.read_text())
    assert data["script"] == ["/srv/venv/bin/vllm", "serve"]
    assert data["flags"]["enable-prefix-caching"] is False
    assert data["flags"]["speculative-config"] == {"method": "ngram", "num_speculative_tokens": 3}
    assert rendered[:4] == argv[:4]
    assert dict(load_profile(path).flags)["tensor-parallel-size"] == 2
    module_argv = [VENV_PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--enforce-eager"]
    (tmp_path / "m").mkdir()
    _, rendered = written(tmp_path / "m", module_argv)
    # no --port on the command line: the profile names the default the server took (vLLM's 8000)
    assert normalised(rendered) == normalised([*module_argv, "--port", "8000"])


def test_environment_kept_secrets_left_out_gpus_from_cuda_visible(tmp_path: Path) -> None:
    argv = [VENV_PY, "-m", "sglang.launch_server", "--model-path", "m", "--tp-size", "2"]
    environ = {"CUDA_VISIBLE_DEVICES": "2,3", "HF_TOKEN": "hf_secret", "HF_HOME": "/data/hf", "NCCL_P2P_DISABLE": "1",
               "PATH": "/usr/bin", "TUNEDASH_SIM_STATE": "/x"}
    path, _ = written(tmp_path, argv, environ=environ, gpus={2: 40000, 3: 40000})
    text = path.read_text()
    data = tomllib.loads(text)
    assert data["gpus"] == [2, 3]
    assert data["env"] == {"HF_HOME": "/data/hf", "NCCL_P2P_DISABLE": "1"}
    assert "hf_secret" not in text
    assert "left out (secrets; set them in the environment): HF_TOKEN" in text


def test_unreadable_environ_takes_gpus_from_memory_holders(tmp_path: Path) -> None:
    argv = [VENV_PY, "-m", "sglang.launch_server", "--model-path", "m"]
    server = server_for(argv, gpus={1: 20000})
    server.environ = None
    path = tmp_path / "other.toml"
    made = build_profile(server, "local", path)
    data = tomllib.loads(made.text)
    assert data["gpus"] == [1]
    assert "env" not in data
    assert "environ could not be read" in made.text


def test_no_cuda_visible_devices_keeps_every_gpu_visible(tmp_path: Path) -> None:
    argv = [VENV_PY, "-m", "sglang.launch_server", "--model-path", "m", "--base-gpu-id", "1"]
    path, rendered = written(tmp_path, argv, environ={"SGLANG_X": "1"}, gpus={1: 1000})
    assert tomllib.loads(path.read_text())["gpus"] == []
    assert "CUDA_VISIBLE_DEVICES" not in " ".join(rendered)


def test_custom_profile_command_is_recognised_and_written(tmp_path: Path) -> None:
    from app.core.adopt.profile_text import build_profile as build
    from tests.adopt_helpers import server_for as make

    template = ("{python}", "{profile_dir}/serve.py", "--listen", "{port}")
    argv = ["/usr/bin/python3", "/srv/tgi/serve.py", "--listen", "8080", "--workers", "2"]
    command = classify(argv, [("my-tgi", template)])
    assert command is not None and (command.backend, command.custom_profile) == ("custom", "my-tgi")
    assert classify(["/usr/bin/python3", "/srv/other.py", "--listen", "8080"], [("my-tgi", template)]) is None
    server = make(argv, custom=[("my-tgi", template)])
    path = tmp_path / "tgi.toml"
    made = build(server, "local", path, custom=("listening on", ""))
    path.write_text(made.text)
    profile = load_profile(path)
    assert (profile.backend, profile.ready_regex) == ("custom", "listening on")
    assert launch_argv(profile) == argv
