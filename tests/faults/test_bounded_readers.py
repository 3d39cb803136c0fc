"""Every reader of a server's log is bounded (issue 19): `status`, a dashboard's attach, the fleet and the
advisor read the log's window (its first and last MiBs) and follow from its end, never the whole file; a record
whose log is outside the state folder or not a regular file is refused, naming the record.

The big log is a sparse 4 GiB file (truncate): a whole-file read would need 4 GiB of memory and seconds of reads,
so answering at all, with the state right, is the proof; the tests do not time anything."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
from pathlib import Path

import pytest

from app.connect import host_for
from app.core.advisor.evidence import gather_evidence
from app.core.data import ServerState
from app.core.fleet import FleetPoller
from app.core.profiles.loading import resolve_profile
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.smi import SmiTelemetry
from tests.helpers import MakeProfile, tunedash, until
from tests.integration.sshd import Sshd
from tests.integration.test_ssh_cli import cli

BIG = 4 * 2**30


def _record_file(sim_state: Path, name: str = "t") -> Path:
    return next((sim_state / "host" / "jobs").glob(f"{name}-*.json"))


def _launch(make_profile: MakeProfile) -> Path:
    profile = make_profile()
    launched = tunedash("launch", str(profile), "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stderr
    return profile


def _grow(log: Path, size: int = BIG) -> None:
    """The server's log made `size` bytes (a hole: no disk used); the server's appends land after it."""
    os.truncate(log, size)


def test_status_refuses_a_record_whose_log_is_dev_zero(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = _launch(make_profile)
    record_file = _record_file(sim_state)
    record = json.loads(record_file.read_text())
    record_file.write_text(json.dumps({**record, "log_path": "/dev/zero"}))

    status = tunedash("status", str(profile), timeout=60)

    assert status.returncode == 2, status.stdout + status.stderr
    assert "Traceback" not in status.stderr and "MemoryError" not in status.stderr
    assert str(record_file) in status.stderr and "/dev/zero" in status.stderr and "outside" in status.stderr
    assert "remove the file or launch again" in status.stderr


def test_status_refuses_a_log_that_is_not_a_regular_file(make_profile: MakeProfile, sim_state: Path) -> None:
    """Inside the logs folder but a link to a device: read as nothing, said as not a regular file."""
    profile = _launch(make_profile)
    record = json.loads(_record_file(sim_state).read_text())
    log = Path(record["log_path"])
    log.unlink()
    log.symlink_to("/dev/zero")

    status = tunedash("status", str(profile), timeout=60)

    assert status.returncode == 2, status.stdout + status.stderr
    assert "Traceback" not in status.stderr
    assert "not a regular file" in status.stderr and str(log) in status.stderr


def test_status_answers_on_a_4_gib_log(make_profile: MakeProfile, sim_state: Path) -> None:
    profile = _launch(make_profile)
    record = json.loads(_record_file(sim_state).read_text())
    _grow(Path(record["log_path"]))

    status = tunedash("status", str(profile), "--json", timeout=60)

    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["state"] == "READY" and data["pid"] == record["pid"]
    assert data["log_skipped_bytes"] > BIG - 4 * 2**20  # only the window was read
    text = tunedash("status", str(profile), timeout=60)
    assert "MiB between them not read" in text.stdout, text.stdout + text.stderr


async def test_attach_and_the_fleet_on_a_4_gib_log_see_ready_and_follow_new_lines(
        make_profile: MakeProfile, sim_state: Path) -> None:
    profile_file = _launch(make_profile)
    record = json.loads(_record_file(sim_state).read_text())
    log = Path(record["log_path"])
    _grow(log)
    profile = resolve_profile(str(profile_file))
    host = host_for(profile)
    lifecycle = ServerLifecycle(host, profile, SmiTelemetry(host, ()))
    fleet = FleetPoller([(profile, host)], look_period_s=0.2, gpu_period_ms=200)
    try:
        assert await lifecycle.attach()
        await until(lambda: lifecycle.state == ServerState.READY, 20, "READY after attaching to a 4 GiB log",
                    lambda: lifecycle.state.value)
        fleet.start()
        await until(lambda: fleet.rows()[0].state == ServerState.READY, 20, "the fleet's row READY",
                    lambda: repr(fleet.rows()[0]))
        assert fleet.rows()[0].error == ""
        assert lifecycle.record is not None
        evidence = await gather_evidence(host, lifecycle.record)  # the advisor reads the window too
        assert evidence.log_lines and evidence.phases, evidence.problems  # the startup, from the head
        with log.open("a") as handle:  # noqa: ASYNC230 - a line written after the attach is followed
            handle.write("[2026-12-01 10:00:00] WARNING: a notice written after the attach\n")
        await until(lambda: any("after the attach" in line for line in lifecycle.last_lines), 10,
                    "the new line followed", lambda: repr(list(lifecycle.last_lines)[-3:]))
    finally:
        await fleet.stop()
        await lifecycle.close()
        await host.close()
    await asyncio.sleep(0)


@pytest.mark.ssh
@pytest.mark.slow
def test_status_over_ssh_on_a_4_gib_log_cuts_the_window_on_the_host(sshd: Sshd, ssh_tmp: Path,
                                                                     ssh_profile) -> None:
    """Over SSH the window is cut by head/tail on the host: a 4 GiB log would not cross the connection in any time a
    test waits, nor fit in memory."""
    home = sshd.make_home(ssh_tmp / "home")
    profile = str(ssh_profile())
    launched = cli(home, "launch", profile, "--wait", "--timeout", "60")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    log = Path(launched.stdout.rsplit(", log ", 1)[1].split()[0])
    if not log.is_absolute():  # the remote state folder is relative to the SSH user's home
        log = Path(pwd.getpwnam(sshd.user).pw_dir) / log
    _grow(log)

    status = cli(home, "status", profile, "--json", timeout=60)

    assert status.returncode == 0, status.stdout + status.stderr
    data = json.loads(status.stdout)
    assert data["state"] == "READY" and data["log_skipped_bytes"] > BIG - 4 * 2**20
