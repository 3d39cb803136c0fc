"""A launch leaves private state files, and a link planted in the state folder is never followed (issue 19):
the real CLI on the simulated host (tests/contract/test_state_files.py holds the same rules per Host, over
sshd too).

Before the change: the state folder and its folders were 0755 and records, logs, claims and beats 0644 (another
user of the host could read every launch's argv, log and who drives); a link at `<record>.lock` was followed,
so a launch created (or opened) whatever the link named.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from app.connect import host_for
from app.core.profiles.loading import load_profile
from app.core.server import jobs
from app.core.server.driver import DriverLock
from tests.helpers import MakeProfile, tunedash

pytestmark = pytest.mark.slow


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


async def test_a_launch_leaves_private_state_files_and_tightens_old_folders(make_profile: MakeProfile) -> None:
    path = make_profile(startup_s=0.2)
    profile = load_profile(path)
    assert profile.sim_state is not None
    state = profile.sim_state / "host"
    (state / "jobs").mkdir(parents=True)
    state.chmod(0o755)  # as an older tunedash left them
    (state / "jobs").chmod(0o755)
    done = tunedash("launch", str(path), "--wait")
    assert done.returncode == 0, done.stderr
    record = Path(jobs.job_path(host_for(profile), profile))
    folders = [state, *(p for p in state.iterdir() if p.is_dir())]
    assert {p.name for p in folders} >= {"host", "jobs", "logs", "drivers"}
    assert {p.name: _mode(p) for p in folders} == {p.name: 0o700 for p in folders}
    files = [record, Path(f"{record}.lock"), *(state / "logs").iterdir()]
    assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
    lock = DriverLock(host_for(profile), profile, "dashboard")
    assert not (await lock.acquire(take_over=False)).readonly
    held = [Path(lock.claim_path), Path(lock._beat_path(lock.token))]
    assert {p.name: _mode(p) for p in held} == {p.name: 0o600 for p in held}
    await lock.release()


def test_a_link_planted_at_a_records_lock_is_not_followed(make_profile: MakeProfile, tmp_path: Path) -> None:
    path = make_profile(startup_s=0.2)
    profile = load_profile(path)
    record = Path(jobs.job_path(host_for(profile), profile))
    record.parent.mkdir(parents=True)
    target = tmp_path / "opened-through-the-link"
    Path(f"{record}.lock").symlink_to(target)
    done = tunedash("launch", str(path), "--wait")
    assert done.returncode == 2, done.stdout
    assert f"{record}.lock is a symbolic link" in done.stderr and "remove it" in done.stderr
    assert "Traceback" not in done.stderr
    assert not target.exists() and not record.exists()  # nothing launched, nothing created through the link


async def test_a_link_planted_at_a_heartbeat_is_replaced_and_its_target_untouched(
        make_profile: MakeProfile, tmp_path: Path) -> None:
    profile = load_profile(make_profile())
    lock = DriverLock(host_for(profile), profile, "dashboard")
    beat = Path(lock._beat_path(lock.token))
    beat.parent.mkdir(parents=True)
    target = tmp_path / "precious.txt"
    target.write_text("precious\n")
    os.symlink(target, beat)
    assert not (await lock.acquire(take_over=False)).readonly
    assert await lock.heartbeat() is None
    assert target.read_text() == "precious\n"
    assert stat.S_ISREG(os.lstat(beat).st_mode)  # a plain file now, in the link's place
    await lock.release()
