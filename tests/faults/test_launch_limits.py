"""A launch the host could not start is refused before anything is killed: a flag value over Linux's one-argument
limit (MAX_ARG_STRLEN), a program that is not there. The READY server keeps running (issue 19)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import MakeProfile
from tests.integration.conftest import tunedash


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
