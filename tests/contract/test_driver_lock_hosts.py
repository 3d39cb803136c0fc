"""The driver lock's wedges broken on every Host (issue 19), here and over the real loopback sshd: a stale
unreadable claim is broken, a heartbeat is judged by its mtime on the host, whatever number it holds.

Before the change: an empty or cut claim made every later acquire fail ("took the lock first") forever, and a
heartbeat holding 9999999999 counted as live forever.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from app.core.hosts.base import Host
from app.core.profiles.loading import parse_profile
from app.core.profiles.types import Profile
from app.core.server.driver import STALE_S, DriverLock
from tests.contract.test_state_files import _sh, _touch


def _profile(folder: Path) -> Profile:
    text = 'name = "c"\nhost = "local"\nbackend = "custom"\ngpus = []\ncommand = ["true"]\nready_regex = "x"\n'
    (folder / "c.toml").write_text(text)
    return parse_profile(text, folder / "c.toml")


@pytest.mark.parametrize("content", ["", "{\"tok"])
async def test_the_driver_lock_breaks_a_stale_unreadable_claim(host: Host, tmp_path: Path, content: str) -> None:
    lock = DriverLock(host, _profile(tmp_path), "cli")
    await _sh(host, 'mkdir -p -- "$(dirname -- "$1")" && printf %s "$2" > "$1"', lock.claim_path, content)
    assert (await lock.acquire(take_over=False)).readonly  # young: maybe an older tunedash mid-write
    await _touch(host, lock.claim_path, time.time() - STALE_S - 5)
    verdict = await lock.acquire(take_over=False)
    assert not verdict.readonly and lock.held and verdict.message.startswith("broke an unreadable driver claim")
    assert json.loads(await host.read_text(lock.claim_path) or "")["token"] == lock.token
    await lock.release()


async def test_a_heartbeat_holding_9999999999_goes_stale_by_its_mtime(host: Host, tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    dead = DriverLock(host, profile, "dashboard")
    assert not (await dead.acquire(take_over=False)).readonly
    await host.write_text(dead._beat_path(dead.token), "9999999999\n")
    alive = DriverLock(host, profile, "dashboard")
    assert (await alive.acquire(take_over=False)).readonly  # just written: live
    await _touch(host, dead._beat_path(dead.token), time.time() - 60)
    assert not (await alive.acquire(take_over=False)).readonly
    await alive.release()
