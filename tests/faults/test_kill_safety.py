"""Kill safety (issue: safe on a shared GPU host): tunedash signals only the group it launched.

Every scenario is real: the processes are ones the test starts itself (never the machine's), the host is the
real LocalHost (a subclass that counts every signal it is asked to send), and the records are real files. The
cases that name groups the test does not own (group 0, group 1, tunedash's own group) run inside a fresh PID
namespace (`unshare -pf --mount-proc`), where even a wrong kill(-1) could reach only the namespace's own
processes. Each scenario failed before the kill-safety change: the old rule (same pgid, started no earlier)
signalled a reused pid, an empty start time matched anything, pgid 1 and 0 went to killpg, records from other
boots and hosts were trusted, untagged leaders were signalled, and a launch cut short after the spawn left an
orphan no command could find.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.data import Holder
from app.core.hosts.base import HostError, LeaderProof, SpawnedProcess
from app.core.hosts.local import LocalHost
from app.core.profiles.loading import parse_profile
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.events import ActionLogged, LifecycleEvent
from app.core.server.lifecycle import ServerLifecycle
from app.core.telemetry.freecheck import FreeVerdict
from app.core.telemetry.smi import SmiTelemetry
from tests.helpers import REPO, kill_launched, tunedash
from tests.kill_helpers import CountingHost, alive, proven_record, start_group, wait_gone

FOREIGN_SIGNALS: list[tuple[int, int]] = []  # every signal any scenario sent to a process it did not start


def _record_bytes(host: CountingHost, profile: Profile) -> bytes:
    return Path(jobs.job_path(host, profile)).read_bytes()


def _write_record(host: CountingHost, profile: Profile, text: str) -> None:
    Path(jobs.job_path(host, profile)).write_text(text)


@pytest.fixture
def profile(tmp_path: Path) -> Profile:
    text = 'name = "kt"\nhost = "local"\nbackend = "custom"\ngpus = []\ncommand = ["sleep", "300"]\n' \
           'ready_regex = "never"\n'
    path = tmp_path / "kt.toml"
    path.write_text(text)
    return parse_profile(text, path)


async def _kill_said(host: CountingHost, profile: Profile) -> list[str]:
    """`tunedash kill` as the lifecycle does it (no confirm-free): what it said."""
    lifecycle = ServerLifecycle(host, profile, SmiTelemetry(host, ()), grace_s=2.0)
    seen: list[LifecycleEvent] = []
    lifecycle.subscribe(seen.append)
    await lifecycle.kill(confirm_free=False)
    await lifecycle.close()
    return [event.text for event in seen if isinstance(event, ActionLogged)]


# ---- the control: a record that is ours is killed -----------------------------------------------------------
async def test_a_proven_record_is_killed_through_its_leader(
    host: CountingHost, profile: Profile, tmp_path: Path, started: list[SpawnedProcess]
) -> None:
    tag = jobs.new_tag()
    spawned = await start_group(host, tmp_path, started, tag=tag)
    await jobs.save_job(host, await proven_record(host, profile, spawned, tag))
    said = await _kill_said(host, profile)
    assert wait_gone(spawned.pid), said
    assert host.sent and all(pgid == spawned.pgid for pgid, _ in host.sent)
    record = await jobs.load_job(host, profile)
    assert record is not None and record.outcome == "killed"


# ---- refusals against processes the test started ------------------------------------------------------------
@pytest.mark.parametrize("shift", [1, -1], ids=["record-newer-than-leader", "pgid-reused-by-a-later-group"])
async def test_a_live_pid_with_another_start_time_is_not_ours(
    host: CountingHost, profile: Profile, tmp_path: Path, started: list[SpawnedProcess], shift: int
) -> None:
    """The record's pid is a live group leader the test started, but the record's start time differs: a reused
    pid (shift -1: the recorded job started earlier and the pid now leads a later group)."""
    tag = jobs.new_tag()
    spawned = await start_group(host, tmp_path, started, tag=tag)
    record = await proven_record(host, profile, spawned, tag, start_time=str(int(spawned.start_time) + shift))
    await jobs.save_job(host, record)
    before = _record_bytes(host, profile)
    said = await _kill_said(host, profile)
    assert any("is now another process" in line and "not ours" in line for line in said), said
    assert host.sent == [] and alive(spawned.pid)
    assert _record_bytes(host, profile) == before  # kept for inspection
    assert await jobs.signal_job(host, record, signal.SIGKILL) == [] and host.sent == []


async def test_a_leader_without_the_job_tag_is_not_ours(
    host: CountingHost, profile: Profile, tmp_path: Path, started: list[SpawnedProcess]
) -> None:
    spawned = await start_group(host, tmp_path, started, tag=None)  # right pid and start time, no TUNEDASH_JOB
    await jobs.save_job(host, await proven_record(host, profile, spawned, jobs.new_tag()))
    said = await _kill_said(host, profile)
    assert any(f"does not carry {jobs.TAG_ENV}=" in line for line in said), said
    assert host.sent == [] and alive(spawned.pid)


async def test_a_leader_with_another_jobs_tag_is_not_ours(
    host: CountingHost, profile: Profile, tmp_path: Path, started: list[SpawnedProcess]
) -> None:
    spawned = await start_group(host, tmp_path, started, tag="someone-elses-launch")
    await jobs.save_job(host, await proven_record(host, profile, spawned, jobs.new_tag()))
    await _kill_said(host, profile)
    assert host.sent == [] and alive(spawned.pid)


@pytest.mark.parametrize("field", ["boot_id", "hostname"])
async def test_a_record_from_another_boot_or_host_is_refused_and_kept(
    host: CountingHost, profile: Profile, tmp_path: Path, started: list[SpawnedProcess], field: str
) -> None:
    """Everything else matches a live, tagged leader: only the boot id (hostname) says the record is not ours."""
    tag = jobs.new_tag()
    spawned = await start_group(host, tmp_path, started, tag=tag)
    other = {"boot_id": "6b1c0f0e-0000-4000-8000-000000000000", "hostname": "another-gpu-box"}[field]
    await jobs.save_job(host, await proven_record(host, profile, spawned, tag, **{field: other}))
    before = _record_bytes(host, profile)
    said = await _kill_said(host, profile)
    expected = "earlier boot" if field == "boot_id" else "was written on host 'another-gpu-box'"
    assert any(expected in line and "the record is kept" in line for line in said), said
    assert host.sent == [] and alive(spawned.pid)
    assert _record_bytes(host, profile) == before


async def test_an_empty_start_time_and_a_non_integer_group_are_refused(
    host: CountingHost, profile: Profile, tmp_path: Path, started: list[SpawnedProcess]
) -> None:
    tag = jobs.new_tag()
    spawned = await start_group(host, tmp_path, started, tag=tag)
    await jobs.save_job(host, await proven_record(host, profile, spawned, tag, start_time=""))
    said = await _kill_said(host, profile)
    assert any("has no start time" in line for line in said), said
    text = json.loads(_record_bytes(host, profile))
    text.update(pgid="abc", start_time=spawned.start_time)
    _write_record(host, profile, json.dumps(text))
    said = await _kill_said(host, profile)
    assert any("unreadable (pgid: expected a process group id 0-4194304 or null, got 'abc')" in line
               for line in said), said
    assert json.loads(_record_bytes(host, profile))["pgid"] == "abc"  # left as it is
    assert host.sent == [] and alive(spawned.pid)


async def test_with_the_leader_gone_only_tagged_members_of_the_group_count(
    host: CountingHost, profile: Profile, tmp_path: Path, started: list[SpawnedProcess]
) -> None:
    """A member that dropped the tag (env -i) is not proven ours once its leader is gone: not signalled; a
    tagged one is, through its group."""
    tag = jobs.new_tag()
    script = "env -i /bin/sleep 300 & sleep 300 & wait"
    spawned = await start_group(host, tmp_path, started, tag=tag, argv=("sh", "-c", script))
    record = await proven_record(host, profile, spawned, tag)
    await asyncio.sleep(0.2)
    group = [p for p in await host.processes() if p.pgid == spawned.pgid and p.pid != spawned.pid]
    assert len(group) == 2
    os.kill(spawned.pid, signal.SIGKILL)  # the leader only
    assert wait_gone(spawned.pid)
    members = await jobs.job_members(host, record)
    tagged = [p.pid for p in group if await host.environ_value(p.pid, jobs.TAG_ENV) == tag]
    assert [p.pid for p in members] == tagged and len(tagged) == 1
    untagged = next(p.pid for p in group if p.pid not in tagged)
    os.kill(tagged[0], signal.SIGKILL)
    assert wait_gone(tagged[0])
    assert await jobs.job_members(host, record) == []  # only the untagged one is left: not ours
    assert await jobs.signal_job(host, record, signal.SIGKILL) == [] and host.sent == []
    assert alive(untagged)


async def test_the_orphan_report_says_whose_each_holder_is(
    host: CountingHost, profile: Profile, tmp_path: Path, started: list[SpawnedProcess]
) -> None:
    tag = jobs.new_tag()
    ours = await start_group(host, tmp_path, started, tag=tag)
    other_launch = await start_group(host, tmp_path, started, tag="0123456789abcdef")
    untagged = await start_group(host, tmp_path, started, tag=None)
    record = await proven_record(host, profile, ours, tag)
    holders = tuple(Holder(0, pid, "python", 1000) for pid in (ours.pid, other_launch.pid, untagged.pid))
    stuck = FreeVerdict(False, False, {0: 3000}, (*holders, Holder(1, None, "", 9)))
    verdict = await jobs.with_owners(host, record, stuck)
    assert [h.owner for h in verdict.holders] == [
        "this job's (tagged)", "another tunedash launch's (tag 0123456789abcdef)", "not tunedash's (no tag)", "",
    ]
    assert verdict.holders[2].describe() == f"GPU0: pid {untagged.pid} python 1000 MiB (not tunedash's (no tag))"
    assert host.sent == []


async def test_the_host_refuses_group_0_1_and_its_own_even_when_asked(host: CountingHost) -> None:
    for pgid in (0, 1, os.getpgrp()):
        with pytest.raises(HostError, match="refusing to signal process group"):
            await LocalHost.signal_group(host, pgid, 0)
        with pytest.raises(HostError, match="refusing to signal process group"):
            await LocalHost.signal_proven_group(host, LeaderProof(pgid, pgid, "1", f"{jobs.TAG_ENV}=x"), 0)


# ---- groups the test does not own: inside a PID namespace ----------------------------------------------------
NAMESPACE_CHECK = r'''
import asyncio, json, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from app.core.hosts.local import LocalHost
from app.core.server import jobs

def start_of(pid):
    text = open(f"/proc/{pid}/stat").read()
    return text[text.rfind(")") + 2:].split()[19]

async def main():
    sent = []
    class Counting(LocalHost):
        async def signal_group(self, pgid, sig):
            sent.append(pgid); return await super().signal_group(pgid, sig)
        async def signal_proven_group(self, proof, sig):
            sent.append(proof.pgid); return await super().signal_proven_group(proof, sig)
    host = Counting("local", state_dir=sys.argv[2])
    tag = os.environ[jobs.TAG_ENV]
    victim = await host.spawn_detached(["sleep", "300"], log_path=sys.argv[2] + "/v.log", env={jobs.TAG_ENV: tag})
    identity = await host.boot_identity()
    me = os.getpid()
    base = dict(profile="ns", host="local", backend="custom", model="", port=0, argv=[], flags={},
                log_path=sys.argv[2] + "/logs/ns.log", launched_by="t", launched_at=0.0, gpus=[], tag=tag,
                boot_id=identity.boot_id, hostname=identity.hostname)
    cases = {
        "pgid 0": dict(pid=0, pgid=0, start_time="0"),
        "pgid 1": dict(pid=1, pgid=1, start_time=start_of(1)),
        "own pgid": dict(pid=me, pgid=os.getpgrp(), start_time=start_of(me)),
        "empty start time": dict(pid=victim.pid, pgid=victim.pgid, start_time=""),
        "control": dict(pid=victim.pid, pgid=victim.pgid, start_time=victim.start_time),
    }
    results = {"own": [me, os.getpgrp()], "group of pid 1": os.getpgid(1)}
    for name, case in cases.items():
        if name == "control":
            results["victim alive before the control"] = os.path.exists(f"/proc/{victim.pid}") and \
                open(f"/proc/{victim.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
            results["sent before the control"] = list(sent)
        record = jobs.JobRecord(**base, **case)
        check = await jobs.check_job(host, record)
        signalled = await jobs.signal_job(host, record, signal.SIGKILL)
        results[name] = {"refusal": check.refusal, "signalled": [p.pid for p in signalled]}
    time.sleep(0.2)
    results["sent"] = sent
    print(json.dumps(results))

asyncio.run(main())
'''


def _unshare_prefix() -> list[str] | None:
    if shutil.which("unshare") is None:
        return None
    prefix = ["unshare", "-pf", "--mount-proc"] if os.geteuid() == 0 else ["unshare", "-Urpf", "--mount-proc"]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if probe.returncode == 0 else None


def test_group_0_group_1_and_tunedash_s_own_group_are_never_signalled(tmp_path: Path) -> None:
    """In a PID namespace: pid 1 is the namespace's `sh` leading group 1, the checker runs as its own group leader
    (setsid), and every other check passes (start times, the tag in each environment): only the group rules
    refuse. Before the change each of these was signalled: group 0 and the own group killed the checker, group 1
    became kill(-1) and killed the victim, an empty start time matched the victim."""
    prefix = _unshare_prefix()
    if prefix is None:
        pytest.skip("no PID namespace here (unshare -pf --mount-proc failed)")
    script = tmp_path / "check.py"
    script.write_text(NAMESPACE_CHECK)
    state = tmp_path / "state"
    state.mkdir()
    inner = 'setsid "$@"; exit $?'  # `exit` keeps sh from exec'ing the checker: sh stays pid 1
    # the first setsid makes pid 1 (sh) lead group 1, so "group 1" is a live group the old rule would signal
    argv = [*prefix, "setsid", "env", f"{jobs.TAG_ENV}=ns-{os.getpid()}", "sh", "-c", inner, "sh",
            sys.executable, str(script), str(REPO), str(state)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    me, own_group = found["own"]
    assert me == own_group > 1  # the checker leads its own group, so "own pgid" is not also "pgid <= 1"
    assert found["group of pid 1"] == 1  # group 1 exists: kill(-1) would have reached the victim
    assert "process group 0" in found["pgid 0"]["refusal"]
    assert "process group 1 " in found["pgid 1"]["refusal"]
    assert "tunedash's own process group" in found["own pgid"]["refusal"]
    assert "has no start time" in found["empty start time"]["refusal"]
    for name in ("pgid 0", "pgid 1", "own pgid", "empty start time"):
        assert found[name]["signalled"] == [], name
    assert found["sent before the control"] == [] and found["victim alive before the control"]
    assert found["control"]["refusal"] == "" and found["control"]["signalled"]  # the checks are not refuse-all
    FOREIGN_SIGNALS.extend((pgid, 9) for pgid in found["sent"] if pgid != found["control"]["signalled"][0])
    assert FOREIGN_SIGNALS == []


# ---- a launch cut short between the spawn and the pid --------------------------------------------------------
def test_an_orphan_of_a_launch_cut_short_is_found_and_killed_by_its_tag(tmp_path: Path, sim_state: Path) -> None:
    """The spawn happens, then the launching tunedash dies (a dropped connection, a kill -9) before it could write
    the pid: the record written before the spawn ("launching", its tag) lets `tunedash kill` find the orphan."""
    ready = "import time; print('up', flush=True); time.sleep(300)"
    path = tmp_path / "orphan.toml"
    path.write_text(f'name = "orphan"\nhost = "sim"\nbackend = "custom"\ngpus = []\nsim_state = "{sim_state}"\n'
                    f'command = {json.dumps([sys.executable, "-c", ready])}\nready_regex = "up"\n')
    launcher = tmp_path / "launch_then_die.py"
    launcher.write_text(
        "import asyncio, os, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from app.connect import host_for\n"
        "from app.core.profiles.loading import load_profile\n"
        "from app.core.server.lifecycle import ServerLifecycle\n"
        "from app.core.telemetry.smi import SmiTelemetry\n"
        "async def main():\n"
        "    profile = load_profile(sys.argv[1])\n"
        "    host = host_for(profile)\n"
        "    spawn = host.spawn_detached\n"
        "    async def spawn_then_die(*args, **kwargs):\n"
        "        await spawn(*args, **kwargs)\n"
        "        os._exit(9)  # tunedash dies right after the spawn, before the pid is recorded\n"
        "    host.spawn_detached = spawn_then_die\n"
        "    await ServerLifecycle(host, profile, SmiTelemetry(host, ())).launch()\n"
        "asyncio.run(main())\n"
    )
    orphans: list[int] = []
    try:
        died = subprocess.run([sys.executable, str(launcher), str(path)], capture_output=True, text=True, timeout=60)
        assert died.returncode == 9, died.stderr
        record_file = next((sim_state / "host" / "jobs").glob("orphan-*.json"))
        record = json.loads(record_file.read_text())
        assert (record["outcome"], record["pid"]) == ("launching", None) and record["tag"]
        orphans = _tagged(f"{jobs.TAG_ENV}={record['tag']}")
        assert orphans, "the spawn ran: its server carries the tag"
        killed = tunedash("kill", str(path))
        assert killed.returncode == 0, killed.stdout + killed.stderr
        assert all(wait_gone(pid) for pid in orphans), killed.stdout
        record = json.loads(record_file.read_text())
        assert record["outcome"] == "killed" and record["pid"] in orphans
    finally:
        for pid in orphans:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        kill_launched(sim_state)


def _tagged(line: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if line.encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
    return [pid for pid in found if alive(pid)]


async def test_no_record_signals_nothing(host: CountingHost, profile: Profile) -> None:
    said = await _kill_said(host, profile)
    assert said == ["no server of this profile is running"] and host.sent == []
