"""The `host` fixture both Host suites run against: this machine, and the same over a real loopback sshd (as a
user whose login shell is /bin/sh, fish, and tcsh).

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
from tests.integration.sshd import Sshd


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A scratch folder the SSH test user can write too (pytest's own is private to this user)."""
    folder = Path(tempfile.mkdtemp(prefix="tunedash-contract-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# SshHost once more under users whose login shells are fish and tcsh: every command must mean the same there.
SSH_FIXTURES = {"ssh": "sshd", "ssh-fish": "sshd_fish", "ssh-tcsh": "sshd_tcsh"}


@pytest.fixture(params=["local", *(pytest.param(name, marks=pytest.mark.ssh) for name in SSH_FIXTURES)])
async def host(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Host]:
    made: Host
    if request.param in SSH_FIXTURES:
        from app.core.hosts.ssh import SshHost

        server: Sshd = request.getfixturevalue(SSH_FIXTURES[request.param])
        made = SshHost(server.spec, state_dir=str(tmp_path / "state"), options=server.options())
    else:
        made = LocalHost("local", state_dir=str(tmp_path / "state"))
    yield made
    await made.close()
