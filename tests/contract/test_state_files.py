"""The state folder's files on every Host (issue 19), here and over the real loopback sshd: folders 0700 (and
tightened when found wider), files 0600, no symbolic link followed, and ages read on the host's own clock.

Before the change: state folders were 0755 and files 0644; over SSH a link at a heartbeat's path to a folder
made `mv -f` write into that folder; a link at `<record>.lock` (or at a launch's log) was followed and its target
created; staleness was a number inside the heartbeat file, compared with the client's clock.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.core.hosts.base import Host, HostError


async def _sh(host: Host, script: str, *args: str) -> str:
    """A small command on the host, as the host's own user (the SSH test user over sshd)."""
    result = await host.run(["sh", "-c", script, "sh", *args])
    assert result.returncode == 0, result.stderr
    return result.stdout


async def _mode(host: Host, path: str) -> str:
    return (await _sh(host, 'stat -c %a -- "$1"', path)).strip()


async def _touch(host: Host, path: str, at: float) -> None:
    """Set the path's mtime on the host (what waiting, or a clock running ahead, would leave)."""
    await _sh(host, 'touch -h -d "@$2" -- "$1"', path, str(int(at)))


async def test_files_under_the_state_folder_are_private(host: Host) -> None:
    state = host.state_dir
    await host.write_text(f"{state}/jobs/r.json", "{}\n")
    assert await host.swap_text(f"{state}/jobs/s.json", "{}\n", expect=None)
    assert await host.create_exclusive(f"{state}/drivers/c.json", "{}\n")
    spawned = await host.spawn_detached(["true"], log_path=f"{state}/logs/j.log")
    assert spawned.pid > 1
    for folder in ("", "/jobs", "/drivers", "/logs"):
        assert await _mode(host, state + folder) == "700", folder
    for file in ("jobs/r.json", "jobs/s.json", "jobs/s.json.lock", "drivers/c.json", "logs/j.log"):
        assert await _mode(host, f"{state}/{file}") == "600", file


async def test_a_state_folder_found_wider_is_tightened(host: Host) -> None:
    state = host.state_dir
    await _sh(host, 'mkdir -p -- "$1/jobs" && chmod 755 -- "$1" "$1/jobs"', state)  # what an older tunedash left
    await host.write_text(f"{state}/jobs/r.json", "{}\n")
    assert (await _mode(host, state), await _mode(host, f"{state}/jobs")) == ("700", "700")


async def test_a_link_at_a_written_path_is_replaced_never_followed(host: Host, tmp_path: Path) -> None:
    state = host.state_dir
    folder, file = str(tmp_path / "victim-folder"), str(tmp_path / "victim.txt")
    await _sh(host, 'mkdir -p -- "$1/drivers" "$2" && printf precious > "$3" && '
                    'ln -s -- "$2" "$1/drivers/a.beat" && ln -s -- "$3" "$1/drivers/b.beat"', state, folder, file)
    await host.write_text(f"{state}/drivers/a.beat", "1\n")
    await host.write_text(f"{state}/drivers/b.beat", "2\n")
    assert (await _sh(host, 'ls -A -- "$1"', folder)) == ""  # nothing was written into the linked folder
    assert await _sh(host, 'cat -- "$1"', file) == "precious"
    assert await host.read_text(f"{state}/drivers/a.beat") == "1\n"
    assert (await _sh(host, '[ -L "$1" ] && echo link || echo file', f"{state}/drivers/b.beat")) == "file\n"


async def test_a_link_at_a_records_lock_is_refused_never_followed(host: Host, tmp_path: Path) -> None:
    state = host.state_dir
    target = tmp_path / "made-through-the-link"
    await _sh(host, 'mkdir -p -- "$1/jobs" && ln -s -- "$2" "$1/jobs/r.json.lock"', state, str(target))
    with pytest.raises(HostError, match=r"r\.json\.lock is a symbolic link.*remove it"):
        await host.swap_text(f"{state}/jobs/r.json", "{}\n", expect=None)
    assert not target.exists()
    assert await host.read_text(f"{state}/jobs/r.json") is None


async def test_a_link_at_a_launch_log_is_refused_never_followed(host: Host, tmp_path: Path) -> None:
    state = host.state_dir
    target = tmp_path / "log-through-the-link"
    await _sh(host, 'mkdir -p -- "$1/logs" && ln -s -- "$2" "$1/logs/j.log"', state, str(target))
    with pytest.raises(HostError, match="symbolic link"):
        await host.spawn_detached(["true"], log_path=f"{state}/logs/j.log")
    assert not target.exists()


async def test_a_link_as_a_folder_inside_the_state_folder_is_refused(host: Host, tmp_path: Path) -> None:
    state = host.state_dir
    elsewhere = str(tmp_path / "elsewhere")
    await _sh(host, 'mkdir -p -- "$1" "$2" && ln -s -- "$2" "$1/jobs"', state, elsewhere)
    with pytest.raises(HostError, match=r"jobs is a symbolic link"):
        await host.write_text(f"{state}/jobs/r.json", "{}\n")
    assert (await _sh(host, 'ls -A -- "$1"', elsewhere)) == ""


async def test_create_exclusive_never_follows_or_replaces_a_link(host: Host, tmp_path: Path) -> None:
    state = host.state_dir
    target = tmp_path / "claim-through-the-link"
    await _sh(host, 'mkdir -p -- "$1/drivers" && ln -s -- "$2" "$1/drivers/c.json"', state, str(target))
    assert not await host.create_exclusive(f"{state}/drivers/c.json", "{}\n")
    assert not target.exists()
    assert (await _sh(host, 'ls -A -- "$1"', f"{state}/drivers")) == "c.json\n"  # no temporary file left


async def test_path_age_is_read_on_the_hosts_own_clock(host: Host, tmp_path: Path) -> None:
    path = f"{host.state_dir}/drivers/x.beat"
    assert await host.path_age(path) is None
    await host.write_text(path, "hello world\n")
    fresh = await host.path_age(path, read=5)
    assert fresh is not None and fresh.plain and -1.0 <= fresh.age_s <= 5.0
    assert (fresh.text, fresh.cut) == ("hello", True)
    await _touch(host, path, time.time() - 60)
    old = await host.path_age(path)
    assert old is not None and 58 <= old.age_s <= 65 and old.text is None
    await _touch(host, path, time.time() + 3600)
    ahead = await host.path_age(path)
    assert ahead is not None and -3605 <= ahead.age_s <= -3595
    link = f"{host.state_dir}/drivers/l.beat"
    await _sh(host, 'ln -s -- "$2" "$1"', link, path)
    linked = await host.path_age(link, read=100)
    assert linked is not None and not linked.plain and linked.text is None  # never read through the link
