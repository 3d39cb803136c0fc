"""Kill safety for the weight cache daemon: `kill --all` signals the daemon's group only when its record proves it
ours, by the same rules as the server's (tests/faults/test_kill_safety.py): a reused pid or a process without the
record's tag is refused, named, and left alive. Every process here is one the test started."""

from __future__ import annotations

from pathlib import Path

from app.core.hosts.base import SpawnedProcess
from app.core.profiles.loading import parse_profile
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.events import ActionLogged, LifecycleEvent
from app.core.server.lifecycle import ServerLifecycle
from app.core.server.warm import daemon_profile
from app.core.telemetry.smi import SmiTelemetry
from tests.kill_helpers import CountingHost, alive, proven_record, start_group, wait_gone


def warm_profile(tmp_path: Path) -> Profile:
    text = 'name = "wk"\nhost = "local"\nbackend = "sglang"\nmodel = "m"\ngpus = []\nwarm = true\n'
    path = tmp_path / "wk.toml"
    path.write_text(text)
    return parse_profile(text, path)


async def kill_all_said(host: CountingHost, profile: Profile) -> list[str]:
    lifecycle = ServerLifecycle(host, profile, SmiTelemetry(host, ()), grace_s=2.0)
    seen: list[LifecycleEvent] = []
    lifecycle.subscribe(seen.append)
    await lifecycle.kill_all()
    await lifecycle.close()
    return [event.text for event in seen if isinstance(event, ActionLogged)]


async def test_a_proven_daemon_is_stopped_by_kill_all(host: CountingHost, tmp_path: Path,
                                                       started: list[SpawnedProcess]) -> None:
    profile = warm_profile(tmp_path)
    tag = jobs.new_tag()
    spawned = await start_group(host, tmp_path, started, tag=tag)
    await jobs.save_job(host, await proven_record(host, daemon_profile(profile), spawned, tag))
    said = await kill_all_said(host, profile)
    assert wait_gone(spawned.pid), said
    assert any("SIGTERM to the weight cache daemon's group" in line for line in said), said
    assert host.sent and all(pgid == spawned.pgid for pgid, _ in host.sent)


async def test_a_reused_pid_in_the_daemon_record_is_not_signalled(host: CountingHost, tmp_path: Path,
                                                                   started: list[SpawnedProcess]) -> None:
    profile = warm_profile(tmp_path)
    tag = jobs.new_tag()
    spawned = await start_group(host, tmp_path, started, tag=tag)
    record = await proven_record(host, daemon_profile(profile), spawned, tag,
                                 start_time=str(int(spawned.start_time) + 1))
    await jobs.save_job(host, record)
    said = await kill_all_said(host, profile)
    assert any("weight cache daemon record:" in line and "not ours" in line for line in said), said
    assert host.sent == [] and alive(spawned.pid)


async def test_a_process_without_the_daemons_tag_is_not_signalled(host: CountingHost, tmp_path: Path,
                                                                   started: list[SpawnedProcess]) -> None:
    profile = warm_profile(tmp_path)
    spawned = await start_group(host, tmp_path, started, tag=None)  # right pid and start time, no TUNEDASH_JOB
    await jobs.save_job(host, await proven_record(host, daemon_profile(profile), spawned, jobs.new_tag()))
    said = await kill_all_said(host, profile)
    assert any(f"does not carry {jobs.TAG_ENV}=" in line for line in said), said
    assert host.sent == [] and alive(spawned.pid)
