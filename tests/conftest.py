"""Fixtures shared by every test folder: a fresh simulated host and a demo-like profile on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.sim.host_env import reset_state
from tests.helpers import MakeProfile, free_port, kill_launched, sim_profile_text


@pytest.fixture
def sim_state(tmp_path: Path) -> Path:
    """A fresh simulated host in tmp_path/sim: 2 GPUs, 0.3 s release delay, a 0.4 s server startup unless
    the server's environment (TUNEDASH_SIM_STARTUP_S, which every profile here sets) says otherwise."""
    return reset_state(tmp_path / "sim", startup_s=0.4)


@pytest.fixture
def make_profile(tmp_path: Path, sim_state: Path) -> Iterator[MakeProfile]:
    """Write tmp_path/NAME.toml, a demo-like profile on `sim_state` with a free port (keyword arguments of
    tests.helpers.sim_profile_text); kill whatever it launched afterwards."""

    def make(*, name: str = "t", **options: Any) -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(sim_profile_text(name=name, port=free_port(), sim_state=sim_state, **options))
        return path

    yield make
    kill_launched(sim_state)
