"""Helpers for end-to-end tests: the repository root and the real CLI in a subprocess.

The simulated host and its profiles (`sim_state`, `make_profile`) come from tests/conftest.py.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO


def tunedash(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder under /tmp that the second user can read and write (tmp_path is root's only)."""
    folder = Path(tempfile.mkdtemp(prefix="tunedash-adopt-", dir="/tmp"))
    folder.chmod(0o777)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)
