"""Job records that never lie (issue: safe on a shared GPU host): atomic, locked, compare-and-swap writes.

Real scenarios on the real LocalHost (and the remote write through the real loopback sshd): 300 concurrent
saves in one process, several processes saving one record, a remote write whose stdin closes early, a
dashboard-like holder with a stale record after a CLI-like relaunch, two launches racing for one profile,
record names that collide or try to leave the state folder, and records with wrong types. Before the change
two saves in one process shared one temporary name (corrupt records), the remote write installed whatever
arrived, a stale holder overwrote the newer record, and two profile files named alike shared one record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from app.core.data import ServerState
from app.core.errors import Reason
from app.core.hosts.base import Host, HostError
from app.core.hosts.local import LocalHost
from app.core.profiles.loading import parse_profile
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.events import ActionLogged, LifecycleEvent
from app.core.server.lifecycle import ServerLifecycle
from app.core.server.preflight import LaunchRefused
from app.core.telemetry.smi import SmiTelemetry
from tests.helpers import REPO
from tests.integration.sshd import Sshd

SERVER = "import time; print('up', flush=True); time.sleep(300)"  # a custom server: ready at once, runs 5 min


def _profile(folder: Path, name: str = "rec") -> Profile:
    text = (f'name = "{name}"\nhost = "local"\nbackend = "custom"\ngpus = []\n'
            f'command = {json.dumps([sys.executable, "-c", SERVER])}\nready_regex = "up"\n')
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return parse_profile(text, path)


def _record(host: Host, profile: Profile, **changes: object) -> jobs.JobRecord:
    record = jobs.JobRecord(
        profile=profile.name, host="local", backend="custom", model="", port=0, argv=["x"], flags={}, pid=None,
        pgid=None, start_time="", log_path=jobs.log_path_for(host, profile), launched_by="test@here",
        launched_at=time.time(), gpus=[],
        profile_file=jobs.profile_file_of(profile), outcome="killed",
    )
    return dataclasses.replace(record, **changes)  # type: ignore[arg-type]


class CorruptReads:
    """Reads a file over and over in a thread while writers work: how many reads found a corrupt record."""

    def __init__(self, path: Path) -> None:
        self.path, self.reads, self.corrupt = path, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                continue
            self.reads += 1
            time.sleep(0.001)
            try:
                jobs.JobRecord.from_json(text)
            except (ValueError, TypeError):
                self.corrupt += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[LocalHost]:
    made = LocalHost("local", state_dir=str(tmp_path / "state"))
    yield made
    await made.close()


# ---- concurrent saves ----------------------------------------------------------------------------------------
async def test_300_concurrent_saves_in_one_process_never_corrupt_and_never_lose_an_update(
    host: LocalHost, tmp_path: Path
) -> None:
    profile = _profile(tmp_path)
    await jobs.save_job(host, _record(host, profile))
    path = Path(jobs.job_path(host, profile))
    reader = CorruptReads(path)

    # 300 holders of the same generation: exactly one wins, 299 are refused (the compare-and-swap)
    holders = [await jobs.load_job(host, profile) for _ in range(300)]
    outcomes = await asyncio.gather(*(jobs.save_job(host, h) for h in holders if h), return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, jobs.StaleRecord)]
    assert len(refused) == 299 and outcomes.count(None) == 1
    assert refused[0].reason == Reason.ALREADY_RUNNING

    # 300 read-modify-write updates by 10 concurrent holders that reload when refused: every one lands
    retries = 0

    async def holder(n: int) -> None:
        nonlocal retries
        for i in range(n, 300, 10):
            while True:
                record = await jobs.load_job(host, profile)
                assert record is not None
                record.phase_times[f"u{i}"] = float(i)
                try:
                    await jobs.save_job(host, record)
                    break
                except jobs.StaleRecord:
                    retries += 1
                    await asyncio.sleep(random.uniform(0, 0.005))

    await asyncio.gather(*(holder(n) for n in range(10)))
    reader.stop()
    final = await jobs.load_job(host, profile)
    assert final is not None and final.generation == 302
    assert sorted(final.phase_times) == sorted(f"u{i}" for i in range(300))  # records lost: 0
    assert reader.reads > 0 and reader.corrupt == 0  # records corrupted: 0
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".lock"]  # no temp files left
    print(f"one process: 299 refusals of one generation, {retries} refusals over 300 updates, "
          f"{reader.reads} reads, 0 corrupt")


WORKER = r'''
import asyncio, random, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from app.core.hosts.local import LocalHost
from app.core.profiles.loading import parse_profile
from app.core.server import jobs

async def main():
    host = LocalHost("local", state_dir=sys.argv[2])
    path = Path(sys.argv[3])
    profile = parse_profile(path.read_text(), path)
    refused = 0
    for i in range(int(sys.argv[5])):
        while True:
            record = await jobs.load_job(host, profile)
            record.phase_times[f"{sys.argv[4]}-{i}"] = float(i)
            try:
                await jobs.save_job(host, record)
                break
            except jobs.StaleRecord:
                refused += 1
                await asyncio.sleep(random.uniform(0, 0.02))
    print(refused)

asyncio.run(main())
'''


def test_several_processes_saving_one_record_never_corrupt_and_never_lose_an_update(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    state = tmp_path / "state"
    host = LocalHost("local", state_dir=str(state))
    asyncio.run(jobs.save_job(host, _record(host, profile)))
    path = Path(jobs.job_path(host, profile))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    reader = CorruptReads(path)
    workers, rounds = 4, 40
    procs = [subprocess.Popen([sys.executable, str(script), str(REPO), str(state), str(profile.source), f"w{n}",
                               str(rounds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(workers)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    reader.stop()
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in outputs]
    refusals = sum(int(out.strip()) for out, _ in outputs)
    final = asyncio.run(jobs.load_job(host, profile))
    assert final is not None and final.generation == 1 + workers * rounds
    assert len(final.phase_times) == workers * rounds  # records lost: 0
    assert reader.corrupt == 0  # records corrupted: 0
    print(f"{workers} processes x {rounds} updates: {refusals} refusals, {reader.reads} reads, 0 corrupt")


# ---- a remote write cut short --------------------------------------------------------------------------------
def test_a_remote_write_whose_stdin_closes_early_leaves_the_old_record(tmp_path: Path) -> None:
    """The host-side script of SshHost, as sshd runs it: the text arrives on stdin and stops half way."""
    from app.core.hosts.shell_scripts import WRITE_SCRIPT

    target = tmp_path / "jobs" / "r.json"
    target.parent.mkdir()
    target.write_text('{"old": true}')
    new = json.dumps({"new": "x" * 4000})
    for expect in ("any", "absent"):
        cut = subprocess.run(["sh", "-c", WRITE_SCRIPT, "sh", str(target), str(len(new)), expect],
                             input=new[: len(new) // 2], capture_output=True, text=True, timeout=30)
        assert cut.returncode == 48, cut.stderr
        assert f"received {len(new) // 2} of {len(new)} bytes" in cut.stderr
        assert target.read_text() == '{"old": true}'
    whole = subprocess.run(["sh", "-c", WRITE_SCRIPT, "sh", str(target), str(len(new)), "any"],
                           input=new, capture_output=True, text=True, timeout=30)
    assert whole.returncode == 0 and target.read_text() == new
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]  # no temp file left


@pytest.fixture
def ssh_state() -> Iterator[Path]:
    """A state folder the SSH test user can write to."""
    folder = Path(tempfile.mkdtemp(prefix="tunedash-records-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.ssh
async def test_a_partial_write_through_sshd_keeps_the_record(sshd: Sshd, ssh_state: Path, tmp_path: Path) -> None:
    from app.core.hosts.ssh import SshHost

    class ClosesEarly(SshHost):
        """The connection delivers only half of what is written to the command's stdin, then EOF."""

        cut = False

        async def run(self, argv, *, timeout=30.0, env=None, input_text=None):  # type: ignore[no-untyped-def]
            if self.cut and input_text:
                input_text = input_text[: len(input_text) // 2]
            return await super().run(argv, timeout=timeout, env=env, input_text=input_text)

    host = ClosesEarly(sshd.spec, state_dir=str(ssh_state / "state"), options=sshd.options())
    try:
        profile = _profile(tmp_path)
        await jobs.save_job(host, _record(host, profile, launched_by="first"))
        record = await jobs.load_job(host, profile)
        assert record is not None and record.generation == 1
        host.cut = True
        record.launched_by = "second"
        with pytest.raises(HostError, match=r"received \d+ of \d+ bytes"):
            await jobs.save_job(host, record)
        host.cut = False
        kept = await jobs.load_job(host, profile)
        assert kept is not None and (kept.launched_by, kept.generation) == ("first", 1)
        record.generation = 1
        await jobs.save_job(host, record)  # the same save, whole: it lands, and the swap still checks
        assert (await jobs.load_job(host, profile)).launched_by == "second"  # type: ignore[union-attr]
        stale = _record(host, profile, launched_by="stale")
        with pytest.raises(jobs.StaleRecord):
            await jobs.save_job(host, stale)
    finally:
        await host.close()


# ---- stale holders, racing launches --------------------------------------------------------------------------
async def test_a_dashboard_with_a_stale_record_cannot_overwrite_a_cli_relaunch_and_follows_it(
    host: LocalHost, tmp_path: Path
) -> None:
    """A (a dashboard) watches server X; B (a CLI) relaunches, so the record names Y. When A sees X die it would
    mark the record crashed: refused (its generation is old), and A follows Y."""
    profile = _profile(tmp_path)
    dashboard = ServerLifecycle(host, profile, SmiTelemetry(host, ()), liveness_period_s=0.05)
    seen: list[LifecycleEvent] = []
    dashboard.subscribe(seen.append)
    cli = ServerLifecycle(host, profile, SmiTelemetry(host, ()), grace_s=2.0)
    try:
        x = await dashboard.launch()
        assert await dashboard.wait_ready(20) == ServerState.READY
        assert await cli.attach()
        assert await cli.relaunch(profile, ready_timeout_s=20) == ServerState.READY
        y = cli.record
        assert y is not None and y.pid != x.pid
        for _ in range(200):
            if dashboard.record is not None and dashboard.record.pid == y.pid:
                break
            await asyncio.sleep(0.05)
        on_disk = await jobs.load_job(host, profile)
        assert on_disk is not None and on_disk.pid == y.pid and on_disk.outcome != "crashed"
        assert dashboard.record is not None and dashboard.record.pid == y.pid  # the dashboard follows Y
        texts = [e.text for e in seen if isinstance(e, ActionLogged)]
        # it either saw the new record first and followed it, or its stale write was refused: never both lost
        assert any(f"following pid {y.pid}" in t or ("changed since this tunedash read it" in t and "not overwritten"
                                                     in t) for t in texts), texts
    finally:
        await dashboard.close()
        await cli.kill(confirm_free=False)
        await cli.close()


async def test_two_launches_racing_for_one_profile_start_one_server(host: LocalHost, tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    first = ServerLifecycle(host, profile, SmiTelemetry(host, ()))
    second = ServerLifecycle(host, profile, SmiTelemetry(host, ()))
    try:
        outcomes = await asyncio.gather(first.launch(), second.launch(), return_exceptions=True)
        launched = [o for o in outcomes if isinstance(o, jobs.JobRecord)]
        refused = [o for o in outcomes if isinstance(o, LaunchRefused)]
        assert len(launched) == 1 and len(refused) == 1, outcomes
        assert refused[0].reason == Reason.ALREADY_RUNNING
        assert len([p for p in await host.processes() if p.pgid == launched[0].pgid]) >= 1
        assert len(await host.find_env(f"{jobs.TAG_ENV}={launched[0].tag}")) >= 1
    finally:
        for lifecycle in (first, second):
            if lifecycle.record is not None and lifecycle.record.pid is not None:
                await lifecycle.kill(confirm_free=False)
            await lifecycle.close()


async def test_a_launch_writes_its_record_before_the_spawn(host: LocalHost, tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    seen_at_spawn: list[jobs.JobRecord | None] = []
    spawn = host.spawn_detached

    async def spawn_and_look(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen_at_spawn.append(await jobs.load_job(host, profile))
        assert kwargs["env"][jobs.TAG_ENV]
        return await spawn(*args, **kwargs)

    host.spawn_detached = spawn_and_look  # type: ignore[method-assign]
    lifecycle = ServerLifecycle(host, profile, SmiTelemetry(host, ()))
    try:
        record = await lifecycle.launch()
        before = seen_at_spawn[0]
        assert before is not None and before.outcome == "launching" and before.pid is None
        assert before.tag == record.tag and before.boot_id and before.hostname
        assert (await host.environ_value(record.pid or 0, jobs.TAG_ENV)) == record.tag
    finally:
        await lifecycle.kill(confirm_free=False)
        await lifecycle.close()


# ---- names and validation ------------------------------------------------------------------------------------
async def test_two_files_named_alike_do_not_share_a_record_and_no_name_leaves_the_folder(
    host: LocalHost, tmp_path: Path
) -> None:
    one, two = _profile(tmp_path / "a", "demo"), _profile(tmp_path / "b", "demo")
    assert jobs.job_path(host, one) != jobs.job_path(host, two)
    await jobs.save_job(host, _record(host, one, launched_by="one"))
    await jobs.save_job(host, _record(host, two, launched_by="two"))
    assert [(await jobs.load_job(host, p)).launched_by for p in (one, two)] == ["one", "two"]  # type: ignore[union-attr]
    jobs_dir = Path(host.state_dir) / "jobs"
    for name in ("../../x", "..", "/etc/passwd", "a/../../b", "\x00"):
        sneaky = dataclasses.replace(one, name=name)
        path = Path(jobs.job_path(host, sneaky))
        assert path.parent == jobs_dir and path.name not in (".json", "..json"), name
        assert Path(jobs.log_path_for(host, sneaky)).parent == Path(host.state_dir) / "logs", name


@pytest.mark.parametrize(("key", "value", "why"), [
    ("pgid", "123", "pgid: expected a process group id"),
    ("pid", True, "pid: expected a process id"),
    ("argv", "python -m x", "argv: expected a list of strings"),
    ("gpus", [0, -1], "gpus: expected a list of GPU indexes"),
    ("launched_at", "yesterday", "launched_at: expected seconds since the epoch"),
    ("generation", -1, "generation: expected a non-negative integer"),
    ("start_time", 5000, "start_time: expected a string"),
    ("profile", None, "profile: expected a string"),
])
async def test_a_record_with_a_wrong_type_is_unreadable_and_said_once(
    host: LocalHost, tmp_path: Path, key: str, value: object, why: str
) -> None:
    profile = _profile(tmp_path)
    await jobs.save_job(host, _record(host, profile))
    path = Path(jobs.job_path(host, profile))
    raw = json.loads(path.read_text())  # noqa: ASYNC240
    raw[key] = value
    path.write_text(json.dumps(raw))  # noqa: ASYNC240
    said: list[str] = []
    for _ in range(3):
        assert await jobs.load_job(host, profile, report=said.append) is None
    assert len(said) == 1 and why in said[0] and str(path) in said[0]
    del raw[key]
    path.write_text(json.dumps(raw))  # noqa: ASYNC240
    if key in ("pgid", "pid", "argv", "gpus", "launched_at", "start_time", "profile"):  # required keys
        assert await jobs.load_job(host, profile) is None
        assert await host.read_text(str(path)) == json.dumps(raw)  # left as it is
