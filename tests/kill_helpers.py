"""The kill-safety tests' helpers (tests/faults/test_kill_safety.py, test_weight_cache_kill_safety.py): a LocalHost
that counts the signals it is asked to send, groups the test starts, and records that prove them ours. Their fixtures
(`host`, `started`) are in tests/faults/conftest.py."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from app.core.hosts.base import LeaderProof, SpawnedProcess
from app.core.hosts.local import LocalHost
from app.core.profiles.types import Profile
from app.core.server import jobs
from tests.helpers import wait_until


class CountingHost(LocalHost):
    """The real LocalHost, counting each signal it is asked to send (group, signal)."""

    def __init__(self, state_dir: str) -> None:
        super().__init__("local", state_dir=state_dir)
        self.sent: list[tuple[int, int]] = []

    async def signal_group(self, pgid: int, signal_number: int) -> bool:
        self.sent.append((pgid, signal_number))
        return await super().signal_group(pgid, signal_number)

    async def signal_proven_group(self, proof: LeaderProof, signal_number: int) -> bool:
        self.sent.append((proof.pgid, signal_number))
        return await super().signal_proven_group(proof, signal_number)


def stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


async def start_group(host: CountingHost, tmp_path: Path, started: list[SpawnedProcess], *, tag: str | None,
                 argv: tuple[str, ...] = ("sleep", "300")) -> SpawnedProcess:
    env = {jobs.TAG_ENV: tag} if tag is not None else None
    spawned = await host.spawn_detached(list(argv), log_path=str(tmp_path / "job.log"), env=env)
    started.append(spawned)
    return spawned


async def proven_record(host: CountingHost, profile: Profile, spawned: SpawnedProcess, tag: str, **changes: object
                  ) -> jobs.JobRecord:
    identity = await host.boot_identity()
    record = jobs.JobRecord(
        profile=profile.name, host=host.name, backend="custom", model="", port=0, argv=["sleep", "300"], flags={},
        pid=spawned.pid, pgid=spawned.pgid, start_time=spawned.start_time, log_path=jobs.log_path_for(host, profile),
        launched_by="test@here", launched_at=time.time(), gpus=[], profile_file=jobs.profile_file_of(profile),
        tag=tag, boot_id=identity.boot_id, hostname=identity.hostname,
    )
    return replace(record, **changes)  # type: ignore[arg-type]


def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    """Whether process `pid` is gone (or a zombie) within `timeout_s`."""
    try:
        wait_until(lambda: not alive(pid), timeout=timeout_s, what=f"process {pid} to end")
    except AssertionError:
        return False
    return True
