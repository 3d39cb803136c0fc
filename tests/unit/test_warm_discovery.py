"""Discovery says whether the installed server offers warm mode: SGLang's --weight-cache-mode, vLLM's ipc_cache load
format (its `--help` text, as 0.32 prints it); elsewhere the launch says why."""

from __future__ import annotations

from pathlib import Path

from app.core.flags.discovery import ServerFlags, parse_help_flags
from app.core.profiles.loading import parse_profile
from app.core.profiles.types import Profile
from app.core.server.warm import warm_refusal
from app.sim.versions import flag_table

VLLM_032_HELP = '''options:
  --load-format LOAD_FORMAT
                        The format of the model weights to load.
                        - "auto" will try to load the weights in the
                        - "ipc_cache" will map post-quantized weights from a
                        local weight cache daemon via CUDA IPC for fast engine
                        restarts. Launch the daemon with `vllm preload` first.
'''
VLLM_OLD_HELP = VLLM_032_HELP.replace('"ipc_cache"', '"npcache"')


def profile(tmp_path: Path, backend: str, flags: str = "") -> Profile:
    text = f'backend = "{backend}"\nmodel = "m"\nwarm = true\n[flags]\n{flags}'
    return parse_profile(text, tmp_path / "w.toml")


def sglang(version: str) -> ServerFlags:
    help_text = flag_table(version).help_text
    return ServerFlags("sglang", "python3", "sglang.launch_server", version, parse_help_flags(help_text))


def test_sglang_0523_offers_it_and_0510_says_why(tmp_path: Path) -> None:
    warm = profile(tmp_path, "sglang")
    assert warm_refusal(warm, sglang("0.5.23")) == ""
    why = warm_refusal(warm, sglang("0.5.10"))
    assert "SGLang 0.5.10" in why and "--weight-cache-mode arrived in SGLang 0.5.23" in why


def test_sglang_with_speculation_says_the_servers_reason(tmp_path: Path) -> None:
    warm = profile(tmp_path, "sglang", 'speculative-algorithm = "NEXTN"\n')
    why = warm_refusal(warm, sglang("0.5.23"))
    assert "refuses --weight-cache-mode with --speculative-algorithm" in why


def test_vllm_offers_it_when_its_help_names_ipc_cache(tmp_path: Path) -> None:
    warm = profile(tmp_path, "vllm")
    new = ServerFlags("vllm", "python3", "vllm.entrypoints.openai.api_server", "0.32.0",
                      parse_help_flags(VLLM_032_HELP))
    old = ServerFlags("vllm", "python3", "vllm.entrypoints.openai.api_server", "0.11.0",
                      parse_help_flags(VLLM_OLD_HELP))
    assert warm_refusal(warm, new) == ""
    assert "has no ipc_cache load format" in warm_refusal(warm, old)
