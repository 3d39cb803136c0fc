"""A dashboard's session against the SGLang version in front of it (issue: SGLang as people run it today): the
keys render that version's flags, and a profile written for 0.5.10 opened against 0.5.23 says which of its flags
0.5.23 rejects and what replaces each, never rewriting it; its launch is refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.connect import host_for
from app.core.data import ServerState
from app.core.profiles.loading import load_profile
from app.core.session import Session
from tests.helpers import free_port, kill_launched, until

pytestmark = pytest.mark.slow


def _profile(tmp_path: Path, sim_state: Path, version: str, mamba_flag: str) -> Path:
    path = tmp_path / f"v{version.replace('.', '')}.toml"
    path.write_text(
        f'name = "v"\nhost = "sim"\nsim_version = "{version}"\nbackend = "sglang"\nmodel = "sim/qwen3.6-27b"\n'
        f'port = {free_port()}\ngpus = [0, 1]\nsim_state = "{sim_state}"\n'
        'env = { TUNEDASH_SIM_STARTUP_S = "0.3" }\n[flags]\ntp-size = 2\nspeculative-algorithm = "NEXTN"\n'
        'speculative-num-steps = 1\nspeculative-eagle-topk = 1\nspeculative-num-draft-tokens = 2\n'
        f'{mamba_flag} = "extra_buffer"\n')
    return path


async def test_a_0510_profile_against_0523_is_named_not_rewritten_and_refused(tmp_path: Path,
                                                                              sim_state: Path) -> None:
    profile = load_profile(_profile(tmp_path, sim_state, "0.5.23", "mamba-scheduler-strategy"))
    session = Session(host_for(profile), profile)
    await session.start()
    try:
        await until(lambda: session.server_flags is not None, 30, "discovery")
        texts = "\n".join(e.text for e in session.events)
        assert "SGLang 0.5.23" in texts and "--mamba-scheduler-strategy (use --mamba-radix-cache-strategy" in texts
        assert session.profile.flags["mamba-scheduler-strategy"] == "extra_buffer"  # never rewritten
        g = session.profile.toggle("g")
        assert g is not None and g.flags == ("cuda-graph-backend-prefill",)  # this version's flag
        assert session.run_command("launch", session.launch)
        await until(lambda: session.busy is None, 10, "the launch to end")
        assert session.view().state == ServerState.STOPPED and session.view().record is None
        assert "does not accept --mamba-scheduler-strategy" in "\n".join(e.text for e in session.events)
    finally:
        await session.stop()
        kill_launched(sim_state)


async def test_a_0523_profile_launches_and_g_renders_the_prefill_backend(tmp_path: Path, sim_state: Path) -> None:
    profile = load_profile(_profile(tmp_path, sim_state, "0.5.23", "mamba-radix-cache-strategy"))
    session = Session(host_for(profile), profile)
    await session.start()
    try:
        await until(lambda: session.server_flags is not None, 30, "discovery")
        g = session.profile.toggle("g")
        assert g is not None
        session.press_toggle(g)
        assert session.pending_flags.get("cuda-graph-backend-prefill") == "breakable"
        assert "--cuda-graph-backend-prefill breakable" in " ".join(session.pending_argv())
        session.run_command("launch", session.launch)
        await until(lambda: session.view().state == ServerState.READY and session.busy is None, 30, "READY")
        assert session.server_version == "0.5.23"
    finally:
        await session.lifecycle.kill(confirm_free=False)
        await session.stop()
        kill_launched(sim_state)
