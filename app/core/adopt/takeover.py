"""Taking over a server started by hand: the dashboard attaches to it, and its one kill is proven first.

find_adoption looks on a profile's host for the running server that profile would launch (the same command line,
order of flags aside: the profile `tunedash adopt --write` wrote from it) and gives an Adoption: the server as
adopt read it (its AdoptProof), an in-memory job record for the lifecycle to watch (never saved: the server is
not tunedash's until it relaunches it), where its log is (its stdout, when that is a file) and, for another
user's server, why it is never signalled.

Adoption.terminate is the only signal tunedash sends to a process it did not launch: right before it the proof
is read again (scan.still_same: the same pid, start tick, command line and owner), then the signal is sent by a
script that checks the start tick, owner and command line once more in the same breath; on this machine through a
pidfd opened before those checks, so the process signalled is the one proven. PID reuse, a changed command line
or another user's process: TakeoverRefused, nothing signalled. SIGTERM to the server's main process (SGLang,
vLLM and the simulator stop their own children), then after the grace SIGKILL to it and to the process tree read
before the SIGTERM (each child proven by its own start tick). After that the lifecycle launches the profile
under its own record, tag and driver lock.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shlex
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.core.adopt.details import descendants, resolve_pythons
from app.core.adopt.profile_text import argv_difference
from app.core.adopt.scan import AdoptableServer, AdoptProof, read_processes, still_same
from app.core.data import EventLevel
from app.core.errors import Reason, TunedashError
from app.core.hosts.base import Host, HostError
from app.core.hosts.local import LocalHost
from app.core.hosts.procfs import ProcessInfo, parse_stat_line, start_ticks
from app.core.profiles.render import launch_argv
from app.core.profiles.types import Profile
from app.core.server import jobs
from app.core.server.lifecycle import ServerLifecycle

SIGKILL_WAIT_S = 10.0
POLL_S = 0.1
ADOPTED_BY = "by hand"  # the record's launched_by says who started it: "alice (by hand)"

# `sh -c SCRIPT sh SIG PID TICK UID CMDLINE_B64`: exit 0 when PID is still the process proven (start tick, owner,
# and when CMDLINE_B64 is not empty, its command line) and, unless SIG is 0, was sent SIG; 45 when it is gone;
# 46 (the reason on stderr) when it is another process now. Nothing else is signalled.
PROVEN_KILL_SCRIPT = r"""
sig=$1; pid=$2; tick=$3; uid=$4; cmd=$5
stat=$(cat "/proc/$pid/stat" 2>/dev/null) || exit 45
rest=${stat##*") "}
state=$(printf '%s\n' "$rest" | cut -d' ' -f1)
now=$(printf '%s\n' "$rest" | cut -d' ' -f20)
[ "$state" = Z ] && exit 45
[ "$now" = "$tick" ] || { echo "started at tick $now, not $tick: the pid was reused" >&2; exit 46; }
owner=$(stat -c %u "/proc/$pid" 2>/dev/null)
[ "$owner" = "$uid" ] || { echo "it belongs to uid $owner now, not $uid" >&2; exit 46; }
if [ -n "$cmd" ]; then
  now_cmd=$(base64 -w0 < "/proc/$pid/cmdline" 2>/dev/null)
  [ "$now_cmd" = "$cmd" ] || { echo "it has another command line" >&2; exit 46; }
fi
[ "$sig" = 0 ] && exit 0
kill "-$sig" "$pid" 2>/dev/null || exit 45
"""


class TakeoverRefused(TunedashError):
    """A signal to an adopted server refused: the message names the pid, the host and what changed; nothing was
    signalled."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Reason.BAD_INPUT)


def stamp(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at is not None else "(unknown)"


@dataclass
class Adoption:
    """A server started by hand that a dashboard watches (module docstring)."""

    host: Host
    server: AdoptableServer
    record: jobs.JobRecord  # in memory only: what the lifecycle watches until the kill
    refusal: str = ""  # why it is never signalled ("" when it may be, once asked)
    log_note: str = ""  # why its log is not followed ("" when it is)
    confirmed: bool = False  # the user said yes to the ask (r, k, or --adopted-ok)
    signalled: list[int] = field(default_factory=list)

    @property
    def proof(self) -> AdoptProof:
        return self.server.proof

    def describe(self) -> str:
        """The ask's text: pid, user, start time and the command line as adopt read it."""
        p = self.proof
        return (f"pid {p.pid} on {p.host}, user {p.user}, started {stamp(self.server.started_at)} (tick "
                f"{p.start_time}), not launched by tunedash. Its command line:\n{shlex.join(p.argv)}")

    def ask(self, what: str) -> str:
        return (f"{what} stops a server tunedash did not launch: {self.describe()}\n"
                "Right before the signal tunedash reads the process again and signals nothing if the pid, start "
                "time, command line or user changed. After the kill it relaunches under tunedash.")

    async def alive(self) -> bool:
        """Whether the adopted process still runs: its pid with its start tick (a reused pid is not it)."""
        text = await self.host.read_text(f"/proc/{self.proof.pid}/stat")
        stat = parse_stat_line(text or "")
        return stat is not None and stat.state != "Z" and stat.start_time == self.proof.start_time

    async def terminate(self, grace_s: float, say: Callable[[str, EventLevel], None]) -> None:
        """SIGTERM the proven server, wait `grace_s`, SIGKILL it and its process tree (module docstring).
        TakeoverRefused when it may not be signalled or is not the process adopt read any more."""
        if self.refusal:
            raise TakeoverRefused(f"pid {self.proof.pid} on {self.host.name} {self.refusal}; nothing was signalled")
        if not self.confirmed:
            raise TakeoverRefused(f"the server of this profile was not launched by tunedash: confirm the kill "
                                  f"first (r or k asks; headless: --adopted-ok); nothing was signalled. It is "
                                  f"{self.describe()}")
        changed = await still_same(self.host, self.proof)
        if changed:
            raise TakeoverRefused(f"{changed}; nothing was signalled")
        tree = await self._tree()
        if not await self._signal(self.proof.pid, self.proof.start_time, signal.SIGTERM, leader=True):
            say(f"pid {self.proof.pid} exited before the SIGTERM", "info")
        else:
            say(f"SIGTERM to pid {self.proof.pid} (adopted; proven again: same start time, command line and user)",
                "info")
        if not await self._gone(grace_s):
            await self._signal(self.proof.pid, self.proof.start_time, signal.SIGKILL, leader=True)
            say(f"SIGKILL to pid {self.proof.pid} after {grace_s:.0f} s grace", "warning")
            await self._gone(SIGKILL_WAIT_S)
        left = await self._left(tree)
        if left:
            await asyncio.sleep(1.0)  # its own shutdown stops its children: a moment for them
            left = await self._left(tree)
        for proc in left:
            if await self._signal(proc.pid, proc.start_time, signal.SIGKILL, leader=False):
                say(f"SIGKILL to pid {proc.pid} ({proc.name}), left behind by pid {self.proof.pid}", "warning")

    async def _tree(self) -> list[ProcessInfo]:
        """The server's children now (before any signal: an orphan is reparented and no longer found so)."""
        try:
            processes = await self.host.processes()
        except HostError:
            return []
        below = descendants(processes, self.proof.pid) - {self.proof.pid}
        leader_tick = start_ticks(self.proof.start_time)
        return [p for p in processes if p.pid in below and start_ticks(p.start_time) >= leader_tick]

    async def _left(self, tree: Sequence[ProcessInfo]) -> list[ProcessInfo]:
        if not tree:
            return []
        with contextlib.suppress(HostError):
            now = {(p.pid, p.start_time) for p in await self.host.processes() if p.state != "Z"}
            return [p for p in tree if (p.pid, p.start_time) in now]
        return []

    async def _gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not await self.alive():
                return True
            await asyncio.sleep(POLL_S)
        return not await self.alive()

    async def _signal(self, pid: int, tick: str, signal_number: int, *, leader: bool) -> bool:
        """Signal `pid` only while it is the process proven (PROVEN_KILL_SCRIPT); False when it is gone.
        Locally the pidfd is opened first and the signal goes through it: the very process proven."""
        uid = self.proof.uid
        if uid is None:
            raise TakeoverRefused(f"pid {pid} on {self.host.name}: its owner was not read; nothing was signalled")
        cmd = base64.b64encode(("\0".join(self.proof.argv) + "\0").encode("utf-8", "surrogateescape")).decode() \
            if leader else ""
        pidfd = None
        if isinstance(self.host, LocalHost) and hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                return False
            except OSError:
                pidfd = None
        try:
            number = 0 if pidfd is not None else int(signal_number)
            result = await self.host.run(["sh", "-c", PROVEN_KILL_SCRIPT, "sh", str(number), str(int(pid)), tick,
                                          str(uid), cmd], timeout=30.0)
            if result.returncode == 45:
                return False
            if result.returncode == 46:
                raise TakeoverRefused(f"pid {pid} on {self.host.name} is not the process adopt read: "
                                      f"{(result.stderr or '').strip()}; nothing was signalled")
            if result.returncode != 0:
                raise TakeoverRefused(f"pid {pid} on {self.host.name} could not be checked before the signal "
                                      f"({(result.stderr or result.stdout).strip()[-200:]}); nothing was signalled")
            if pidfd is not None:
                try:
                    signal.pidfd_send_signal(pidfd, signal_number)
                except ProcessLookupError:
                    return False
            if leader or signal_number == signal.SIGKILL:
                self.signalled.append(pid)
            return True
        finally:
            if pidfd is not None:
                os.close(pidfd)


def log_file(target: str) -> str:
    """The file a process's stdout goes to (`/proc/PID/fd/1`'s target), or "" when it is no plain file."""
    if not target.startswith("/") or target.startswith(("/dev/", "/proc/")) or target.endswith(" (deleted)"):
        return ""
    return target


def adoption_for(host: Host, server: AdoptableServer, profile: Profile) -> Adoption:
    """The Adoption of `server` as `profile`'s server: its in-memory record, log and refusal."""
    log = log_file(server.log_target)
    note = "" if log else (f"the log of pid {server.pid} is not visible (its stdout goes to "
                           f"{server.log_target or 'nothing readable'}); a relaunch under tunedash will show it")
    record = jobs.JobRecord(
        profile=profile.name, host=host.name, backend=profile.backend, model=profile.model, port=profile.port,
        argv=list(server.proof.argv), flags=dict(profile.flags), pid=server.pid, pgid=None,
        start_time=server.proof.start_time, log_path=log, launched_by=f"{server.user} ({ADOPTED_BY})",
        launched_at=server.started_at or time.time(), gpus=list(profile.gpus),
        profile_file=jobs.profile_file_of(profile))
    refusal = ""
    if not server.mine:
        refusal = f"belongs to user {server.user}: tunedash never signals another user's process"
    return Adoption(host, server, record, refusal=refusal, log_note=note)


@dataclass(frozen=True)
class Found:
    """What find_adoption saw: the adoption, or why none (said in the event log)."""

    adoption: Adoption | None
    note: str = ""


async def find_adoption(host: Host, profile: Profile, *, pid: int | None = None) -> Found:
    """The server started by hand that runs `profile`'s command line on its host (or pid `pid`), if any."""
    if profile.backend == "custom":
        return Found(None)
    try:
        servers = await read_processes(host, [pid] if pid is not None else ())
    except HostError as exc:
        return Found(None, f"servers started by hand on {host.name} could not be read: {exc}")
    servers = [s for s in servers if pid is not None or s.port == profile.port]
    if not servers:
        return Found(None, f"pid {pid} on {host.name} is gone or is not a server" if pid is not None else "")
    await resolve_pythons(host, servers)
    rendered = launch_argv(profile)
    notes = []
    for server in servers:
        if server.launched_by_tunedash:
            notes.append(f"pid {server.pid} on port {server.port} was launched by another tunedash (TUNEDASH_JOB="
                         f"{server.tunedash_tag}): not adopted; `tunedash adopt {host.name} --pid {server.pid}` "
                         "names its profile, whose `tunedash ui` attaches to it")
            continue
        difference = argv_difference(server.command.argv, rendered, server)
        if difference:
            notes.append(f"pid {server.pid} on port {server.port} runs another command line than "
                         f"{profile.source} ({difference}): not adopted")
            continue
        return Found(adoption_for(host, server, profile))
    return Found(None, "; ".join(notes))


def watch_adopted(lifecycle: ServerLifecycle, say: Callable[[str, EventLevel], None], *, confirmed: bool = False,
                  pid: int | None = None) -> None:
    """Let `lifecycle` attach to the server started by hand that runs its profile when it has no record of ours
    (ServerLifecycle.find_adopted); what is found (or why nothing is) goes to `say`. `confirmed`: the kill was
    agreed to already (headless --adopted-ok)."""

    async def find() -> Adoption | None:
        found = await find_adoption(lifecycle.host, lifecycle.profile, pid=pid)
        if found.note:
            say(found.note, "warning")
        adoption = found.adoption
        if adoption is not None:
            adoption.confirmed = confirmed
            p = adoption.proof
            if adoption.refusal:
                how = f"never signalled ({adoption.refusal})"
            elif confirmed:
                how = "--adopted-ok: it is stopped only once proven unchanged"
            else:
                how = "the first r or k asks before it is signalled (headless: --adopted-ok)"
            say(f"adopted pid {p.pid} (user {p.user}, started {stamp(adoption.server.started_at)}), started by hand: "
                f"{how}", "warning" if adoption.refusal else "info")
        return adoption

    lifecycle.find_adopted = find
