"""Helpers for end-to-end tests: the repository root and the real CLI in a subprocess.

The simulated host and its profiles (`sim_state`, `make_profile`) come from tests/conftest.py.
"""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def tunedash(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
