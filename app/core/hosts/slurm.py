"""SlurmHost: the host interface inside a Slurm allocation, every command a job step.

The design: docs/architecture.md#a-host-kind-for-a-cluster-scheduler.

Two hosts in one: the *login* host (LocalHost on the login node, or SshHost to it) where `srun`, `squeue`,
`scancel` and `salloc` run and where the state folder lives (job records, logs, locks: a home folder the node
shares), and the *node* of the allocation where the processes are, reached only through steps:

- run / stream_lines: `srun --jobid J --overlap -N1 -n1 -w NODE -Q -- sh -c 'exec "$@"' sh ARGV...` (argv as a
  list; the `sh` makes a missing program read "not found", exit 127, as on any host). A stream is that srun kept
  open; closing it ends srun, which ends the step (telemetry: one kept-open `nvidia-smi -lms` step).
- spawn_detached: the server is a step of its own, `srun ... -J tunedash-TAG --output LOG --open-mode=append`,
  its srun client detached on the login host (setsid nohup, hosts/detach.py). The step's task writes
  "J.S PID" to a marker file first and then execs the server: the step id and the task's pid and start time on
  the node become a StepRecord under `<state_dir>/slurm/steps/PID`.
- signals: `scancel --signal=SIG J.S`, never a pid. A signal needs the StepRecord of that group, squeue showing
  that step alive under the recorded name, and the task's pid on the node still that process with the job's
  tag in its environment (read through a step); otherwise LeaderMismatch and nothing is signalled.
  group_alive asks squeue whether the recorded step still runs.
- files, follow, locks: the login host's (the node's output file is on the shared folder).
- processes, ports, /proc reads, boot identity: the node's, through steps.
- the scheduler's facts: a watch task reads `squeue -h -j J -o %T|%L|%N|%r` every `poll_s` (SlurmFacts:
  state, time left); slurmctld unreachable is ConnectionChanged "lost" and "connected" when it answers again;
  the allocation ending (time limit, scancel, node failure, preemption) is "failed" with the final state from
  scontrol, and every call after it raises HostError saying so.

Over 400 lines: one implementation of the whole Host interface (as local.py and ssh.py); the parsing of the
scheduler's output is in slurm_facts.py, the profile's request in slurm_request.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import signal
import socket
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence

from app.core.data import ConnectionState, EventLevel
from app.core.hosts.base import (
    CommandResult,
    ConnectionChanged,
    Host,
    HostError,
    HostIdentity,
    LeaderMismatch,
    LeaderProof,
    PathAge,
    SchedulerStep,
    SpawnedProcess,
)
from app.core.hosts.procfs import ProcessInfo, is_recorded_leader, listening_ports, parse_stat_line, parse_stat_text
from app.core.hosts.slurm_facts import (
    SlurmFacts,
    StepRecord,
    format_left,
    granted_job,
    gres_gpu_indices,
    parse_job_line,
    parse_scontrol_job,
    parse_step_rows,
    trouble,
)
from app.core.hosts.slurm_request import STEP_NAME, SlurmRequest
from app.core.hosts.ssh import SshHost
from app.core.hosts.window import HEAD_BYTES, TAIL_BYTES, LogWindow
from app.core.tasks import Listeners, TaskOwner, Unsubscribe

TAG_NAME = "TUNEDASH_JOB"  # the launch tag's variable (app.core.server.jobs.TAG_ENV; hosts sit below server)
EXEC = 'exec "$@"'
# The step's task: the marker ("J.S PID", written then renamed so it is never read half done), then the server.
MARK = 'printf "%s %s\\n" "$SLURM_JOB_ID.$SLURM_STEP_ID" "$$" > "$0.tmp" && mv -f "$0.tmp" "$0" && exec "$@"'
SIGNAL_NAMES = {signal.SIGTERM: "TERM", signal.SIGKILL: "KILL", signal.SIGINT: "INT", signal.SIGHUP: "HUP",
                signal.SIGUSR1: "USR1", signal.SIGUSR2: "USR2", signal.SIGCONT: "CONT", signal.SIGSTOP: "STOP"}
POLL_S = 5.0
STREAM_STEP = "tunedash-stream"  # the name of every kept-open stream's step (telemetry)
BUSY_RETRY_S = 20.0  # how long run() asks again for a step the controller cannot grant yet
WARN_AT_S = (900.0, 300.0, 60.0)  # the event log hears when the allocation's time left passes each of these
SALLOC_TIMEOUT_S = 300.0
# srun's own word on how the task ended ("srun: error: NODE: task 0: Exited with exit code 3"): not the command's.
TASK_EXIT = re.compile(r"^srun: error: \S+: tasks? [0-9,-]+: (Exited with exit code \d+|Terminated|Killed)")


class AllocationEnded(HostError):
    """The allocation is over (time limit, scancel, node failure, preemption): nothing runs there any more."""

    title = "Allocation ended"


class SlurmHost(Host):
    """A node of a Slurm allocation (module docstring). `login` runs the Slurm commands and holds the files;
    `extra_env` reaches every step (srun exports the environment: the simulated host's PATH goes this way)."""

    is_local = False

    def __init__(
        self,
        name: str,
        request: SlurmRequest,
        *,
        login: Host,
        extra_env: Mapping[str, str] | None = None,
        poll_s: float = POLL_S,
        slot: int = 0,
        owns_login: bool = True,
    ) -> None:
        self.name = name
        self.slot = slot  # a `tune --slots` slot's own allocation (0: the profile's)
        self._owns_login = owns_login  # False: a slot's host sharing slot 0's login host (slot 0 closes it)
        self.request = request
        self.login = login
        self._extra_env = dict(extra_env or {})
        self.poll_s = poll_s  # seconds between two reads of the allocation's facts
        self._job: int | None = None
        self._node = request.node
        self._where_lock = asyncio.Lock()
        self._listeners: Listeners[ConnectionChanged] = Listeners(f"slurm {name}")
        self._tasks = TaskOwner(f"slurm {name}")
        self._closing = False
        self.facts = SlurmFacts()
        self._lost_at: float | None = None
        self._notices: Listeners[tuple[str, EventLevel]] = Listeners(f"slurm {name} notices")
        self.allocate = True  # where() may ask for an allocation (False: attach to a recorded one only)
        self._warned: set[float] = set()
        self._steps_read: dict[int, StepRecord] = {}  # pgid -> the StepRecord last read or written (kill_text)

    # ---- where: the allocation and its node ---------------------------------------------------------
    @property
    def state_dir(self) -> str:
        return self.login.state_dir

    @property
    def job(self) -> int | None:
        """The allocation's job id once where() found or asked for it (None before)."""
        return self._job

    async def gpu_indices(self) -> tuple[int, ...]:
        """The node GPU indices Slurm gave the allocation (`scontrol show job -d J`, GRES ...(IDX:...)); ()
        when it names none."""
        job, _ = await self.where()
        result = await self._slurm(["scontrol", "show", "job", "-d", str(job)])
        return gres_gpu_indices(result.stdout) if result.returncode == 0 else ()

    @property
    def allocation_file(self) -> str:
        return f"{self.state_dir}/slurm/allocation" + (f"@slot{self.slot}" if self.slot else "")

    def for_slot(self, index: int, immediate_s: int, gpus: int) -> SlurmHost:
        """Slot `index`'s own host (`tune --slots N` over several allocations): the same request, its own
        allocation (`<state>/slurm/allocation@slotINDEX`, `salloc -J tunedash@slotINDEX --immediate=S`), sharing
        this host's login host and files. docs/architecture.md#tune---slots-n-over-several-allocations-built."""
        return SlurmHost(f"{self.name}@slot{index}", self.request.for_slot(index, immediate_s, gpus), login=self.login,
                         extra_env=self._extra_env, poll_s=self.poll_s, slot=index, owns_login=False)

    async def where(self) -> tuple[int, str]:
        """The job id and node, allocating (salloc --no-shell) or attaching on first use; the watch starts then.
        With `allocate` False (the fleet: it only looks) a host with no recorded allocation raises HostError."""
        if self.facts.ended:
            raise AllocationEnded(self._ended_message())
        if self._job is not None and self._node:
            return self._job, self._node
        async with self._where_lock:
            if self._job is None:
                self._job = await self._find_job()
            if not self._node:
                self._node = await self._first_node(self._job)
            if not self._tasks.tasks:
                self._tasks.spawn(self._watch(), "watch")
            return self._job, self._node

    async def _find_job(self) -> int:
        if self.request.job is not None:
            await self._check_running(self.request.job, given=True)
            return self.request.job
        recorded = await self.login.read_text(self.allocation_file)
        if recorded is not None:
            lines = recorded.split("\n")
            if lines[0].strip().isdigit() and lines[1:2] == [self.request.describe()]:
                job = int(lines[0])
                with contextlib.suppress(AllocationEnded):
                    await self._check_running(job, given=False)
                    return job
        if not self.allocate:
            raise HostError(f"{self.name}: no allocation of tunedash's is running ({self.request.describe()}); "
                            "nothing runs there yet")
        result = await self.login.run(self.request.salloc_argv(), timeout=SALLOC_TIMEOUT_S, env=self._extra_env)
        granted = granted_job(result.stderr)
        if result.returncode != 0 or granted is None:
            raise HostError(f"{self.name}: `{' '.join(self.request.salloc_argv())}` was refused: "
                            f"{result.stderr.strip() or result.returncode}; fix the profile's [slurm] table")
        await self.login.write_text(self.allocation_file, f"{granted}\n{self.request.describe()}\n")
        return granted

    async def _check_running(self, job: int, *, given: bool) -> None:
        result = await self._slurm(["squeue", "-h", "-j", str(job), "-o", "%T|%L|%N|%r"])
        row = parse_job_line(result.stdout) if result.returncode == 0 else None
        if row is None or row[0] not in ("RUNNING",):
            state = row[0] if row else "not in the queue"
            raise AllocationEnded(f"{self.name}: job {job} is {state}; tunedash launches into a running "
                                  "allocation" + ("; fix slurm.job in the profile" if given else ""))

    async def _first_node(self, job: int) -> str:
        result = await self._slurm(["squeue", "-h", "-j", str(job), "-o", "%N"])
        nodes = result.stdout.strip()
        if not nodes:
            raise AllocationEnded(f"{self.name}: job {job} has no node (it ended?)")
        if "[" in nodes or "," in nodes:
            names = await self._slurm(["scontrol", "show", "hostnames", nodes])
            nodes = names.stdout.split()[0] if names.stdout.split() else nodes
        return nodes

    async def _slurm(self, argv: Sequence[str], timeout: float = 30.0) -> CommandResult:
        """A Slurm client command on the login host; HostError ("connection lost") when slurmctld does not answer."""
        result = await self.login.run(argv, timeout=timeout, env=self._extra_env or None)
        if result.returncode != 0 and trouble(result.stderr) == "unreachable":
            self._set_reachable(False, result.stderr.strip().splitlines()[-1])
            raise HostError(f"{self.name}: slurmctld unreachable ({result.stderr.strip().splitlines()[-1]}); "
                            "tunedash retries")
        return result

    # ---- the watch: the scheduler's facts ------------------------------------------------------------
    def subscribe_connection(self, listener: Callable[[ConnectionChanged], None]) -> Unsubscribe:
        return self._listeners.subscribe(listener)

    @property
    def connection_listeners(self) -> int:
        return len(self._listeners)

    def subscribe_notices(self, listener: Callable[[str, EventLevel], None]) -> Unsubscribe:
        return self._notices.subscribe(lambda notice: listener(*notice))

    def scheduler_line(self) -> str | None:
        """SlurmFacts.header with the time left counted down from when it was read."""
        facts = self.facts
        if facts.time_left_s is not None and facts.read_at and not facts.ended:
            left = max(0.0, facts.time_left_s - (time.time() - facts.read_at))
            facts = SlurmFacts(facts.job, facts.node, facts.state, facts.reason, left, facts.read_at,
                               facts.reachable, facts.detail)
        return facts.header()

    def _warn_time_left(self) -> None:
        left = self.facts.time_left_s
        if left is None:
            return
        passed = [mark for mark in WARN_AT_S if left <= mark and mark not in self._warned]
        if passed:
            self._warned.update(mark for mark in WARN_AT_S if left <= mark)
            level: EventLevel = "error" if left <= WARN_AT_S[-1] else "warning"
            self._notices.emit((f"{self.name}: the allocation (job {self.facts.job}) ends in {format_left(left)}; "
                                "its steps end with it (a launch that cannot finish by then is refused)", level))

    def _emit(self, state: ConnectionState, detail: str, since: float | None = None) -> None:
        self._listeners.emit(ConnectionChanged(self.name, state, detail, time.time(), since))

    def _set_reachable(self, reachable: bool, detail: str) -> None:
        was = self.facts.reachable
        self.facts = SlurmFacts(self.facts.job, self.facts.node, self.facts.state, self.facts.reason,
                                self.facts.time_left_s, time.time(), reachable, detail)
        if was and not reachable:
            self._lost_at = time.time()
            self._emit("lost", f"slurmctld unreachable ({detail}); the server keeps running, tunedash retries",
                       self._lost_at)
        elif reachable and not was:
            self._emit("connected", f"slurmctld answers again ({self.facts.header()})", self._lost_at)
            self._lost_at = None
            self._tasks.spawn(self._end_streams(), "end recovered streams")

    async def _end_streams(self) -> None:
        """After slurmctld came back, end tunedash's kept-open stream steps (their readers start them again).
        Slurm 22.05 recovers running overlapping steps and then refuses every new step of the job while two of
        them live ("Memory required by task is not available"); the server's step stays, the telemetry step
        goes, and new steps are granted again (docs/decisions.md#slurm-steps-after-a-slurmctld-restart)."""
        if self._job is None:
            return
        with contextlib.suppress(HostError):
            result = await self._slurm(["squeue", "-h", "-s", "-j", str(self._job), "-o", "%i|%j|%N"])
            for step, (name, _node) in parse_step_rows(result.stdout).items():
                if name == STREAM_STEP:
                    await self._slurm(["scancel", step])

    async def refresh(self) -> SlurmFacts:
        """Read the allocation's facts now (the watch does this every poll_s)."""
        job = self._job
        if job is None:
            return self.facts
        try:
            result = await self._slurm(["squeue", "-h", "-j", str(job), "-o", "%T|%L|%N|%r"])
        except HostError:
            return self.facts
        row = parse_job_line(result.stdout) if result.returncode == 0 else None
        if row is not None and row[0] in ("RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"):
            state, left, _nodes, reason = row
            self.facts = SlurmFacts(job, self._node, state, reason, left, time.time(), self.facts.reachable, "")
            self._set_reachable(True, "")
            self._warn_time_left()
            return self.facts
        try:
            final = await self._slurm(["scontrol", "-o", "show", "job", str(job)])
        except HostError:
            return self.facts
        fields = parse_scontrol_job(final.stdout) if final.returncode == 0 else {}
        state = fields.get("JobState") or (row[0] if row else "ENDED")
        reason = fields.get("Reason", row[3] if row else "")
        was_ended = self.facts.ended
        self.facts = SlurmFacts(job, self._node, state, reason, 0.0, time.time(), self.facts.reachable, "")
        self._set_reachable(True, "")
        if self.facts.ended and not was_ended:
            self._emit("failed", self._ended_message())
        return self.facts

    def _ended_message(self) -> str:
        why = {"TIMEOUT": "its time limit was reached", "CANCELLED": "it was cancelled (scancel)",
               "NODE_FAIL": "its node failed", "PREEMPTED": "it was preempted", "COMPLETED": "it completed",
               "FAILED": "it failed", "BOOT_FAIL": "its node failed to boot", "DEADLINE": "its deadline passed",
               "OUT_OF_MEMORY": "it ran out of memory"}.get(self.facts.state, f"it is {self.facts.state}")
        return (f"{self.name}: the allocation (job {self.facts.job}) ended: {why}; every step in it ended with it. "
                "Start tunedash again to ask for a new allocation")

    async def _watch(self) -> None:
        while not self._closing and not self.facts.ended:
            with contextlib.suppress(HostError):  # unreachable: already said by _set_reachable; the next poll retries
                await self.refresh()
            await asyncio.sleep(self.poll_s)

    async def time_left_s(self) -> float | None:
        """Seconds until the allocation ends (None: no limit, or not known yet)."""
        await self.where()
        return (await self.refresh()).time_left_s

    # ---- commands through steps ---------------------------------------------------------------------
    def _step_argv(self, job: int, node: str, argv: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
        return [*step_head(job, node), *extra, "--", "sh", "-c", EXEC, "sh", *argv]

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        return {**self._extra_env, **(env or {})}

    def _srun_failed(self, result: CommandResult) -> None:
        """A failure of srun itself (not of the command) becomes a HostError that says which."""
        said = own_srun_errors(result.stderr).splitlines()
        if result.returncode == 0 or not said:
            return
        kind = trouble("\n".join(said))
        last = said[-1]
        if kind == "unreachable":
            self._set_reachable(False, last)
            raise HostError(f"{self.name}: slurmctld unreachable ({last}); tunedash retries")
        if kind == "gone":
            raise AllocationEnded(f"{self.name}: the allocation (job {self._job}) is gone ({last})")
        raise HostError(f"{self.name}: the step did not run ({last})")  # srun's own failure: nothing ran

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = 30.0, env: Mapping[str, str] | None = None
    ) -> CommandResult:
        job, node = await self.where()
        deadline = time.monotonic() + BUSY_RETRY_S
        while True:
            result = await self.login.run(self._step_argv(job, node, argv), timeout=timeout, env=self._env(env))
            if time.monotonic() > deadline or trouble(own_srun_errors(result.stderr)) != "busy":
                break
            await asyncio.sleep(0.5)  # the step was not granted yet: ask again
        self._srun_failed(result)
        return CommandResult(tuple(argv), result.returncode, result.stdout, own_stderr(result.stderr))

    async def stream_lines(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> AsyncGenerator[str, None]:
        job, node = await self.where()
        lines = self.login.stream_lines(self._step_argv(job, node, argv, ["-J", STREAM_STEP]), env=self._env(env))
        async with contextlib.aclosing(lines):
            async for line in lines:
                if not (line.startswith("\x00stderr:") and TASK_EXIT.search(line[len("\x00stderr:"):])):
                    yield line

    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> SpawnedProcess:
        job, node = await self.where()
        launch = self._env(env)
        tag = launch.get(TAG_NAME, "")
        name = f"{STEP_NAME}-{tag}" if tag else STEP_NAME
        marker = f"{self.state_dir}/slurm/launch-{secrets.token_hex(6)}"
        await self.login.make_folder(f"{self.state_dir}/slurm/steps")
        await self.login.make_folder(log_path.rsplit("/", 1)[0] if "/" in log_path else ".")
        # srun expands %j, %t, ... in --output ("%%t" came out "%0" on 22.05); a leading backslash turns every
        # substitution off and is itself dropped, so the path is the file's name as written
        if "\\" in log_path:
            raise HostError(f"{self.name}: the log path {log_path!r} holds a backslash, which srun's --output would "
                            "drop; use a state folder without one")
        extra = ["-J", name, f"--output=\\{log_path}", "--open-mode=append"] + ([f"--chdir={cwd}"] if cwd else [])
        inner = ["env", *(f"{key}={value}" for key, value in launch.items()), *argv] if launch else list(argv)
        srun = [*step_head(job, node), *extra, "--", "sh", "-c", MARK, marker, *inner]
        client = await self.login.spawn_detached(srun, log_path=log_path, env=launch)
        mark = await self._wait_marker(marker, client, log_path)
        step, _, pid_text = mark.partition(" ")
        pid = int(pid_text)
        info = await self._node_stat(pid)
        record = StepRecord(step, node, pid, info.start_time if info else "", name)
        await self.login.write_text(self._step_file(pid), record.to_json())
        self._steps_read[info.pgid if info else pid] = record
        await self.login.remove(marker)
        return SpawnedProcess(pid=pid, pgid=info.pgid if info else pid, start_time=record.start_time)

    async def _wait_marker(self, marker: str, client: SpawnedProcess, log_path: str) -> str:
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            text = await self.login.read_text(marker)
            if text and text.endswith("\n"):
                words = text.split()
                if len(words) == 2 and words[1].isdigit():
                    return text.strip()
            if not await self.login.group_alive(client.pgid, client.start_time):
                tail = await self.login.read_window(log_path)
                said = [line for line in tail.lines if "srun" in line or "error" in line] if tail else []
                raise HostError(f"{self.name}: the step did not start: {said[-1] if said else 'srun exited'}")
            await asyncio.sleep(0.05)
        raise HostError(f"{self.name}: the step did not start within 60 s (is the allocation's node busy?)")

    def _step_file(self, pid: int) -> str:
        return f"{self.state_dir}/slurm/steps/{int(pid)}"

    async def step_record(self, pgid: int) -> StepRecord | None:
        """The StepRecord of the launch whose group is `pgid`, if tunedash recorded one."""
        text = await self.login.read_text(self._step_file(pgid))
        record = StepRecord.from_json(text) if text else None
        if record is None:
            self._steps_read.pop(pgid, None)
        else:
            self._steps_read[pgid] = record
        return record

    async def step_rows(self, steps: Sequence[str]) -> dict[str, tuple[str, str]]:
        """squeue's live rows of these steps (id -> (name, node)); HostError when slurmctld does not answer."""
        result = await self._slurm(["squeue", "-h", f"--steps={','.join(steps)}", "-o", "%i|%j|%N"])
        return parse_step_rows(result.stdout) if result.returncode == 0 else {}

    async def _live_step(self, pgid: int, start_time: str | None) -> StepRecord | None:
        """The recorded step of group `pgid` when squeue shows it alive under its recorded name (and, given a
        start time, the record is of that start); else None."""
        record = await self.step_record(pgid)
        if record is None or (start_time is not None and record.start_time != start_time):
            return None
        row = (await self.step_rows([record.step])).get(record.step)
        if row is None or row[0] != record.name:
            return None
        return record

    async def scheduler_steps(self) -> list[SchedulerStep]:
        """This user's steps named tunedash-TAG in every allocation (`squeue --me -s`), streams left out."""
        result = await self._slurm(["squeue", "-h", "-s", "--me", "-o", "%i|%j|%N|%M"])
        steps = []
        for line in result.stdout.splitlines() if result.returncode == 0 else []:
            parts = line.strip().split("|")
            if len(parts) == 4 and parts[1].startswith(STEP_NAME + "-") and parts[1] != STREAM_STEP:
                steps.append(SchedulerStep(*parts))
        return steps

    async def _node_stat(self, pid: int) -> ProcessInfo | None:
        result = await self.run(["cat", f"/proc/{int(pid)}/stat"], timeout=30.0)
        return parse_stat_line(result.stdout) if result.returncode == 0 else None

    # ---- signals: scancel of the recorded step, never a pid -------------------------------------------
    async def _scancel(self, step: str, signal_number: int) -> None:
        name = SIGNAL_NAMES.get(signal.Signals(signal_number), str(int(signal_number)))
        result = await self._slurm(["scancel", f"--signal={name}", step])
        if result.returncode != 0:
            raise HostError(f"{self.name}: scancel of step {step} failed: {result.stderr.strip()}")

    async def signal_text(self, pgid: int, signal_name: str) -> str:
        """`scancel --signal=TERM J.S` of the step recorded at launch: what a signal to that launch really does."""
        try:
            record = await self.step_record(pgid)
        except HostError as exc:
            return f"scancel --signal={signal_name.removeprefix('SIG')} of group {pgid}'s recorded step ({exc})"
        if record is None:
            return f"no step of tunedash is recorded for group {pgid} on {self.name}: nothing is signalled"
        return (f"scancel --signal={signal_name.removeprefix('SIG')} {record.step} (the server's step on "
                f"{record.node}, recorded at launch)")

    def kill_text(self, pgid: int) -> str:
        """The recorded step's scancel, from the StepRecord last read (no I/O: the dashboard asks in its handler)."""
        record = self._steps_read.get(pgid)
        if record is None:
            return (f"scancel --signal=TERM of the step recorded at launch for group {pgid}, then --signal=KILL after "
                    "the grace period; the allocation is kept.")
        job = record.step.partition(".")[0]
        return (f"scancel --signal=TERM {record.step} (the server's step on {record.node}, recorded at launch), "
                f"then --signal=KILL after the grace period. The allocation (job {job}) is kept.")

    async def signal_proven_group(self, proof: LeaderProof, signal_number: int) -> bool:
        record = await self.step_record(proof.pgid)
        if record is None or record.pid != proof.pid or record.start_time != proof.start_time:
            raise LeaderMismatch(f"{self.name}: no step of tunedash is recorded for pid {proof.pid} (started "
                                 f"{proof.start_time}); nothing was signalled")
        row = (await self.step_rows([record.step])).get(record.step)
        if row is None:
            return False  # the step ended: its processes went with it
        if row[0] != record.name:
            raise LeaderMismatch(f"{self.name}: step {record.step} is now {row[0]!r}, not tunedash's {record.name!r}; "
                                 "nothing was signalled")
        leader = await self._node_stat(proof.pid)
        if leader is None or leader.state == "Z":
            return False
        if not is_recorded_leader(leader, proof.pid, proof.pgid, proof.start_time):
            raise LeaderMismatch(f"{self.name}: pid {proof.pid} on {record.node} is no longer step {record.step}'s "
                                 "task; nothing was signalled")
        key, _, value = proof.env_line.partition("=")
        if await self.environ_value(proof.pid, key) != value:
            raise LeaderMismatch(f"{self.name}: pid {proof.pid} does not carry {proof.env_line}; nothing was signalled")
        await self._scancel(record.step, signal_number)
        return True

    async def signal_group(self, pgid: int, signal_number: int) -> bool:
        """The group's recorded step, while squeue shows it under its name; False for any other group."""
        if pgid <= 1:
            raise HostError(f"{self.name}: refusing to signal process group {pgid}")
        record = await self._live_step(pgid, None)
        if record is None:
            return False
        await self._scancel(record.step, signal_number)
        return True

    async def group_alive(self, pgid: int, start_time: str) -> bool:
        """The recorded step of that launch is still in squeue under its name (the scheduler's word, not a pid)."""
        return await self._live_step(pgid, start_time) is not None

    async def boot_identity(self) -> HostIdentity:
        """The node's boot id and hostname; HostError when the step could not read them (an empty answer would
        read as another host, and a job record's checks would refuse it)."""
        identity = await super().boot_identity()
        if not identity.hostname:
            raise HostError(f"{self.name}: could not read the boot id and hostname of {self._node or 'the node'}")
        return identity

    async def processes(self) -> list[ProcessInfo]:
        result = await self.run(["sh", "-c", "cat /proc/[0-9]*/stat 2>/dev/null; exit 0"])
        return parse_stat_text(result.stdout)

    async def port_in_use(self, port: int) -> bool:
        result = await self.run(["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; exit 0"])
        return port in listening_ports(result.stdout)

    # ---- files: the login host's (a folder the node shares) ---------------------------------------
    async def read_text(self, path: str) -> str | None:
        return await self.login.read_text(path)

    async def read_window(
        self, path: str, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES
    ) -> LogWindow | None:
        return await self.login.read_window(path, head_bytes, tail_bytes)

    async def write_text(self, path: str, text: str) -> None:
        await self.login.write_text(path, text)

    async def swap_text(self, path: str, text: str, *, expect: str | None) -> bool:
        return await self.login.swap_text(path, text, expect=expect)

    async def remove(self, path: str) -> None:
        await self.login.remove(path)

    async def create_exclusive(self, path: str, text: str) -> bool:
        return await self.login.create_exclusive(path, text)

    async def path_age(self, path: str, *, read: int = 0) -> PathAge | None:
        return await self.login.path_age(path, read=read)

    async def make_folder(self, folder: str) -> None:
        await self.login.make_folder(folder)

    def follow(self, path: str, *, from_start: bool = True, offset: int | None = None) -> AsyncGenerator[str, None]:
        return self.login.follow(path, from_start=from_start, offset=offset)

    # ---- HTTP and lifetime ----------------------------------------------------------------------------
    async def http_base(self, port: int) -> str:
        """On one node that is this machine: 127.0.0.1; a node the login host reaches by name: NODE:PORT; over
        SSH, a forward through the login node: to its own 127.0.0.1 when the step runs on the login node, else to
        NODE:PORT as the login node reaches it (the server must listen on the node's address, not 127.0.0.1)."""
        _, node = await self.where()
        if getattr(self.login, "is_local", False):
            here = socket.gethostname().split(".")[0]
            return f"http://127.0.0.1:{port}" if node.split(".")[0] == here else f"http://{node}:{port}"
        identity = await self.login.boot_identity()
        if identity.hostname.split(".")[0] == node.split(".")[0]:
            return await self.login.http_base(port)
        if not isinstance(self.login, SshHost):
            raise HostError(f"{self.name}: the server runs on {node}, not on the login node, and the login host "
                            "cannot forward a port; run tunedash on the login node (slurm:local)")
        return await self.login.forward_to(node, port)

    async def release(self) -> None:
        """Give the allocation back (`scancel J`) when tunedash asked for it; a job given by the profile stays."""
        if self._job is not None and self.request.job is None:
            await self._slurm(["scancel", str(self._job)])
            await self.login.remove(self.allocation_file)

    async def close(self) -> None:
        self._closing = True
        await self._tasks.close()
        if self._owns_login:
            await self.login.close()


def own_stderr(stderr: str) -> str:
    """The command's stderr without srun's own lines about how the task ended."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not TASK_EXIT.search(line))


def step_head(job: int, node: str) -> list[str]:
    """The start of every srun tunedash runs: a step of `job` on `node`, one task, sharing the allocation's CPUs
    and GPUs with the other steps (--overlap) and reserving none of its memory (--mem=0: after a slurmctld restart
    the recovered steps' memory otherwise refused every new step, "Memory required by task is not available")."""
    return ["srun", "--jobid", str(job), "--overlap", "--mem=0", "-N1", "-n1", "-w", node, "-Q"]


def own_srun_errors(stderr: str) -> str:
    """srun's own error lines (the step could not be made or reached), without how the task ended."""
    return "\n".join(line for line in stderr.splitlines() if line.startswith("srun: error:")
                     and not TASK_EXIT.search(line))
