"""The takeover's refusals on real processes: a PID reused between the ask and the signal (in a pid namespace of
its own, so only processes this test started exist there), and another user's server (listed, never signalled,
whatever flag is given). Nothing is signalled in either; the processes are the test's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, tunedash

pytestmark = pytest.mark.slow
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a pid namespace and a second Unix user need root")


def fake_sglang(folder: Path) -> None:
    """A harmless server-like argv: `python -m sglang.launch_server` that only sleeps."""
    package = folder / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text("import time\ntime.sleep(300)\n")


@needs_root
@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is not installed")
def test_a_pid_reused_between_the_ask_and_the_signal_is_refused(tmp_path: Path) -> None:
    fake_sglang(tmp_path)
    done = subprocess.run(["unshare", "-pf", "--mount-proc", sys.executable, "-m",
                           "tests.integration.adopt_pid_reuse", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["second"] == result["first"], result  # the very same pid, another process
    assert result["ticks"][0] != result["ticks"][1]
    assert "another process now (started at another time: the pid was reused)" in result["refused"]
    assert "nothing was signalled" in result["refused"]
    assert result["second_alive"] and result["signalled"] == []




@needs_root
def test_another_users_server_is_never_signalled_even_with_adopted_ok(their_server: int, shared_folder: Path) -> None:
    from tests.integration.sshd import TEST_USER

    pid = their_server
    target = shared_folder / "theirs.toml"
    assert tunedash("adopt", "--pid", str(pid), "--write", str(target)).returncode == 0
    for extra in ([], ["--adopted-ok"]):
        refused = tunedash("kill", str(target), *extra, "--grace", "1")
        assert refused.returncode != 0
        assert f"pid {pid} on local belongs to user {TEST_USER}: tunedash never signals another user's " \
               "process; nothing was signalled" in refused.stderr, refused.stderr
        assert "SIGTERM" not in refused.stdout
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state == "S"  # still sleeping: neither stopped nor killed
