"""The `host` fixture both Host suites run against: this machine, and the same over a real loopback sshd.

`tmp_path` is replaced by a scratch folder the SSH test user can write to too (pytest's own is private to root).
Every test module in tests/contract gets them (the Host contract, and proven kills on both hosts).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from app.core.hosts.base import Host
from app.core.hosts.local import LocalHost
from tests.integration.sshd import Sshd, sshd  # noqa: F401 - the fixture


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A scratch folder the SSH test user can write too (pytest's own is private to this user)."""
    folder = Path(tempfile.mkdtemp(prefix="tunedash-contract-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
async def host(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Host]:
    made: Host
    if request.param == "ssh":
        from app.core.hosts.ssh import SshHost

        server: Sshd = request.getfixturevalue("sshd")
        made = SshHost(server.spec, state_dir=str(tmp_path / "state"), options=server.options())
    else:
        made = LocalHost("local", state_dir=str(tmp_path / "state"))
    yield made
    await made.close()
