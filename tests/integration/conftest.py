"""Helpers for end-to-end tests: the repository root and the real CLI in a subprocess.

The simulated host and its profiles (`sim_state`, `make_profile`) come from tests/conftest.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder under /tmp that the second user can read and write (tmp_path is root's only)."""
    folder = Path(tempfile.mkdtemp(prefix="tunedash-adopt-", dir="/tmp"))
    folder.chmod(0o777)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)


@pytest.fixture
def their_server(shared_folder: Path) -> Iterator[int]:
    """A harmless server-like process (`python -m sglang.launch_server` that only sleeps) run by the second Unix
    user; yields its pid and SIGKILLs it (the process this fixture started, by its pid) at the end."""
    from tests.integration.sshd import TEST_USER, _prepare_user

    _prepare_user()
    package = shared_folder / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text("import time\ntime.sleep(300)\n")
    runner = subprocess.Popen(["runuser", "-u", TEST_USER, "--", "env", f"PYTHONPATH={shared_folder}",
                               sys.executable, "-m", "sglang.launch_server", "--model-path", "m",
                               "--port", str(free_port())], cwd="/", start_new_session=True)
    pid = None
    try:
        deadline = time.monotonic() + 20
        while pid is None:
            found = subprocess.run(["pgrep", "-P", str(runner.pid)], capture_output=True, text=True).stdout.split()
            pid = int(found[0]) if found else None
            assert time.monotonic() < deadline, "the second user's process did not start"
            time.sleep(0.1)
        yield pid
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        runner.wait(timeout=10)
