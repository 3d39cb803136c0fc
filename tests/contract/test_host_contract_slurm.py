"""The Host contract (tests/contract/test_host_contract.py) against SlurmHost on the one-node Slurm of
scripts/slurm-local: every command a real job step (`srun --overlap` into a real allocation), kills through
`scancel J.STEP`. Skipped, saying why, when that Slurm is not up.

One contract test does not apply: test_group_alive_follows_the_group_not_just_its_leader kills a group's leader
and expects its children to keep the group alive. In Slurm the step ends with its task and slurmstepd kills what
is left, so there is no orphaned group to follow; tests/integration/test_slurm_host.py asserts that instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.core.hosts.base import Host
from app.core.hosts.local import LocalHost
from app.core.hosts.slurm import SlurmHost
from app.core.hosts.slurm_request import SlurmRequest
from tests.contract.test_host_contract import (  # noqa: F401 - collected here once more, against SlurmHost
    test_an_empty_text_is_written_at_once,
    test_closing_a_stream_stops_the_command,
    test_detached_job_leads_its_own_group_and_gets_verbatim_args,
    test_files_and_follow,
    test_missing_command_reads_like_a_shell,
    test_no_login_shell_reads_a_value,
    test_port_in_use,
    test_run_captures_output_and_code,
    test_signal_to_a_missing_group_says_so,
    test_stream_yields_lines_stderr_and_exit,
    test_values_are_never_run_by_a_shell,
)


@pytest.fixture
async def host(slurm_conf: Path, tmp_path: Path) -> AsyncIterator[Host]:
    """A SlurmHost on this machine's login node, in an allocation of its own (given back at the end)."""
    login = LocalHost("local", state_dir=str(tmp_path / "state"))
    made = SlurmHost("slurm:local", SlurmRequest(time="10"), login=login)
    yield made
    await made.release()
    await made.close()


async def test_a_log_path_is_never_a_slurm_pattern(host: Host, tmp_path: Path) -> None:
    """srun expands %j, %t, %N ... in --output: a log path holding them must still name exactly that file."""
    log = tmp_path / "logs" / "job-%j-%t-%%.log"
    spawned = await host.spawn_detached(["sh", "-c", "echo hello"], log_path=str(log))
    for _ in range(100):
        if log.exists() and log.read_text() == "hello\n":
            break
        await asyncio.sleep(0.05)
    assert log.read_text() == "hello\n"
    assert sorted(path.name for path in log.parent.iterdir()) == [log.name]
    assert spawned.pid == spawned.pgid


async def test_the_kill_text_names_the_step_recorded_at_launch(host: Host, tmp_path: Path) -> None:
    """The kill confirmation and the event log say what a kill does here: `scancel J.S` of the step recorded at
    launch, the allocation kept; another session (a dashboard started later) says so once it has read the record
    (its first liveness check), never a SIGTERM to a process group it cannot see."""
    assert isinstance(host, SlurmHost)
    spawned = await host.spawn_detached(["sleep", "120"], log_path=str(tmp_path / "sleep.log"))
    record = await host.step_record(spawned.pgid)
    assert record is not None
    job = record.step.split(".")[0]
    said = (f"scancel --signal=TERM {record.step} (the server's step on {record.node}, recorded at launch), then "
            f"--signal=KILL after the grace period. The allocation (job {job}) is kept.")
    assert host.kill_text(spawned.pgid) == said
    assert await host.signal_text(spawned.pgid, "SIGKILL") == (
        f"scancel --signal=KILL {record.step} (the server's step on {record.node}, recorded at launch)")
    later = SlurmHost("slurm:local", host.request, login=host.login)
    assert "SIGTERM to process group" not in later.kill_text(spawned.pgid)
    assert await later.group_alive(spawned.pgid, spawned.start_time)
    assert later.kill_text(spawned.pgid) == said
    assert host.login.kill_text(spawned.pgid) == (f"SIGTERM to process group {spawned.pgid}, then SIGKILL after "
                                                  "the grace period.")  # what the same launch reads as elsewhere
    await later.close()
    assert await host.signal_group(spawned.pgid, 9)
