"""A launch the host could not start is refused before anything is killed: a flag value over Linux's one-argument
limit (MAX_ARG_STRLEN), a program that is not there. The READY server keeps running (issue 19)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from app.core.data import ServerState
from app.core.errors import Reason
from app.core.hosts.base import HostError, SpawnedProcess
from app.core.profiles.loading import parse_profile
from app.core.server.jobs import job_path
from app.core.server.lifecycle import ServerLifecycle
from app.core.server.preflight import LaunchRefused
from tests.fakes import InMemoryHost, ScriptedTelemetry, gpu_reading
from tests.helpers import MakeProfile, free_port, tunedash


def _record(sim_state: Path, name: str = "t") -> dict:
    return json.loads(next((sim_state / "host" / "jobs").glob(f"{name}-*.json")).read_text())


def test_a_200_kb_value_is_refused_and_the_ready_server_keeps_running(make_profile: MakeProfile,
                                                                       sim_state: Path) -> None:
    profile = make_profile()
    launched = tunedash("launch", str(profile), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stderr
    before = _record(sim_state)
    with profile.open("a") as handle:  # the profile edited: one value of 200 KB (from a file, a palette paste)
        handle.write(f'served-model-name = "{"m" * 200_000}"\n')

    relaunched = tunedash("relaunch", str(profile))

    assert relaunched.returncode == 2, relaunched.stdout + relaunched.stderr
    assert "Traceback" not in relaunched.stderr
    assert "--served-model-name" in relaunched.stderr and "200000 bytes" in relaunched.stderr
    assert "nothing was stopped" in relaunched.stderr
    status = json.loads(tunedash("status", str(profile), "--json").stdout)
    assert status["state"] == "READY" and status["pid"] == before["pid"]
    assert _record(sim_state)["outcome"] != "killed"


def test_a_missing_program_is_refused_and_the_ready_server_keeps_running(make_profile: MakeProfile,
                                                                         sim_state: Path) -> None:
    profile = make_profile()
    assert tunedash("launch", str(profile), "--wait", "--timeout", "60").returncode == 0
    before = _record(sim_state)
    text = profile.read_text().replace('backend = "sglang"\n', 'backend = "sglang"\npython = "/nonexistent/python3"\n')
    profile.write_text(text)

    relaunched = tunedash("relaunch", str(profile))

    assert relaunched.returncode == 2, relaunched.stdout + relaunched.stderr
    assert "Traceback" not in relaunched.stderr
    assert "/nonexistent/python3" in relaunched.stderr and "nothing was stopped" in relaunched.stderr
    status = json.loads(tunedash("status", str(profile), "--json").stdout)
    assert status["state"] == "READY" and status["pid"] == before["pid"]


class SpawnFails(InMemoryHost):
    """A host whose spawn fails as an exec does (E2BIG past the checks, a binary that will not run)."""

    async def spawn_detached(self, argv: Sequence[str], *, log_path: str, env: Mapping[str, str] | None = None,
                             cwd: str | None = None) -> SpawnedProcess:
        raise HostError(f"{self.name}: could not start `{argv[0]}` detached: Argument list too long")


async def test_a_spawn_error_is_a_clean_refusal_and_the_state_says_stopped(tmp_path: Path) -> None:
    text = f'name = "lc"\nhost = "local"\nbackend = "sglang"\nmodel = "m"\nport = {free_port()}\ngpus = [0, 1]\n'
    profile = parse_profile(text, tmp_path / "lc.toml")
    host = SpawnFails()
    lifecycle = ServerLifecycle(host, profile, ScriptedTelemetry(gpu_reading({0: 0, 1: 0})))
    with pytest.raises(LaunchRefused) as caught:
        await lifecycle.launch()
    assert caught.value.reason == Reason.START_FAILED
    assert "did not start" in str(caught.value) and "Argument list too long" in str(caught.value)
    assert lifecycle.state == ServerState.STOPPED
    assert json.loads(host.files[job_path(host, profile)])["outcome"] == "killed"  # not a launch left "launching"
    await lifecycle.close()
