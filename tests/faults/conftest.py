"""Fixtures of the fault tests shared by more than one module (test modules never import fixtures from each other):
the counting host and the groups a kill-safety test starts (tests/kill_helpers.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.core.hosts.base import SpawnedProcess
from tests.kill_helpers import CountingHost


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[CountingHost]:
    made = CountingHost(str(tmp_path / "state"))
    yield made
    await made.close()


@pytest.fixture
async def started(host: CountingHost, tmp_path: Path) -> AsyncIterator[list[SpawnedProcess]]:
    """The groups a test starts (`sleep 300` leaders); SIGKILLed afterwards."""
    groups: list[SpawnedProcess] = []
    yield groups
    for group in groups:
        try:
            os.killpg(group.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
