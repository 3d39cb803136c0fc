"""Fixtures for the simulated host's own tests: its environment and process-group cleanup (`sim_state` is in
tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.sim.host_env import sim_environment
from tests.helpers import GroupReaper


@pytest.fixture
def sim_env(sim_state: Path) -> dict[str, str]:
    """os.environ plus the simulated host's variables."""
    env = dict(os.environ)
    env.update(sim_environment(sim_state))
    env.pop("TUNEDASH_SIM_FAULT", None)
    env["TUNEDASH_SIM_STARTUP_S"] = "0.4"
    return env


@pytest.fixture
def reaper() -> Iterator[GroupReaper]:
    r = GroupReaper()
    yield r
    r.kill_all()
