"""One driver per server: a per-session token held in a lock file on the host, with a heartbeat.

Two people (or one person in two tmux panes) can open dashboards on one GPU host, and a script can run
`tunedash kill` beside them. Exactly one session drives a profile's server at a time; every other one is
read-only until it takes over. The lock lives on the host, beside the job records:

- `<state_dir>/drivers/<key>.json` is the claim: the session's random token, who (user@machine), what kind of
  session (dashboard or cli), its pid and since when. It is created exclusively (`Host.create_exclusive`: a
  temporary file hard-linked to the claim's name, so two sessions racing for a free lock cannot both win and a
  crash or a full disk never leaves a half claim) and replaced only by a take-over.
- `<state_dir>/drivers/<key>.<token>.beat` is the holder's heartbeat, rewritten every HEARTBEAT_S. Whether it
  is fresh is judged on the host's clock alone (`Host.path_age`: the file's mtime against the host's time, both
  read on the host), never by a client's clock nor by a number inside the file: a heartbeat older than STALE_S
  (a crashed dashboard, a dropped connection), or dated more than CLOCK_SLACK_S into the host's future, is
  stale, and its claim counts as free. The holder never rewrites the claim itself, so a heartbeat cannot undo
  someone's take-over.
- A claim that cannot be read (empty, not JSON, a value out of range, not a plain file) counts as held by an
  unknown session while it is younger than STALE_S by its own mtime, and is broken (removed, and the session
  that broke it says so) once older; `--take-over` replaces it at once. Its `who` and `kind` are shown with
  control characters escaped.

The lock is taken at launch and at attach alike (a dashboard opened while nothing runs drives the server it
may launch later), and checked right before every signal and launch (ServerLifecycle.before_act); a holder
that finds another token in the claim has been taken over and turns read-only within HEARTBEAT_S. A session
that loses (refused, beaten in a race, taken over) removes its own heartbeat file.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from app.core.data import EventLevel, printable
from app.core.errors import Reason, TunedashError
from app.core.hosts.base import Host, HostError, PathAge
from app.core.profiles.types import Profile
from app.core.server import jobs

HEARTBEAT_S = 1.0
STALE_S = 5.0
CLOCK_SLACK_S = 1.0  # a file dated further than this into the host's future is stale (timestamps are coarse)
SETTLE_S = 0.2  # after taking a free lock: longer than a racer's read -> remove -> create
CLAIM_MAX = 4096  # bytes of a claim file read (a claim is ~200)
SINCE_RANGE = (946684800.0, 4102444800.0)  # a claim's `since`: 2000-01-01 to 2100-01-01 UTC
PID_MAX = 4194304  # Linux's PID_MAX_LIMIT
SessionKind = Literal["dashboard", "cli"]


class DrivenElsewhere(TunedashError):
    """Another live session drives this server; the message names it and says how to take over."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Reason.DRIVEN_ELSEWHERE)


def shown(text: str, limit: int) -> str:
    """`text` cut to `limit` characters as a claim's `who`/`kind` is shown: control characters written out by
    app.core.data.printable ("\\x1b"), and, stricter for a name, every other character that is not printable
    (bidi overrides such as U+202E, line separators) as its escape too, so it cannot reorder the line either."""
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in printable(text[:limit]))


def fresh(age: PathAge | None) -> bool:
    """Whether a file of this age (Host.path_age) was written within STALE_S by the host's clock: a plain file,
    neither older than STALE_S nor more than CLOCK_SLACK_S in the host's future."""
    return age is not None and age.plain and -CLOCK_SLACK_S <= age.age_s <= STALE_S


@dataclass(frozen=True)
class DriverClaim:
    """Who holds a server's driver lock (read from the host, validated). An unreadable claim file is a claim too,
    with `problem` saying why (its token is "" and who/kind "unknown"); `age_s` is the file's age on the host."""

    token: str
    who: str
    kind: str
    pid: int
    since: float
    problem: str = ""
    age_s: float = 0.0

    def describe(self) -> str:
        """"alice@gpubox (dashboard, pid 4242, since 07:40)", or what is wrong with an unreadable claim."""
        if self.problem:
            return f"an unreadable driver claim ({self.problem}; written {self.age_s:.0f} s ago)"
        return f"{self.who} ({self.kind}, pid {self.pid}, since {_clock(self.since)})"

    @property
    def broken(self) -> bool:
        """An unreadable claim no longer young (older than STALE_S, or from the host's future): free to break."""
        return bool(self.problem) and not -CLOCK_SLACK_S <= self.age_s <= STALE_S

    @classmethod
    def unreadable(cls, problem: str, age_s: float) -> DriverClaim:
        return cls("", "unknown", "unreadable", 0, 0.0, problem, age_s)

    @classmethod
    def parse(cls, text: str) -> DriverClaim | str:
        """The claim in `text`, or why it is not one ("since: expected a time between 2000 and 2100, got
        1e+308"): every value is checked here, where it enters."""
        if not text.strip():
            return "an empty file"
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            return "not JSON"
        if not isinstance(raw, dict):
            return "not a JSON object"
        token, who, kind, pid, since = (raw.get(k) for k in ("token", "who", "kind", "pid", "since"))
        if not (isinstance(token, str) and re.fullmatch(r"[0-9a-f]{8,64}", token)):
            return f"token: expected 8 to 64 hex digits, got {_short(token)}"
        for name, value in (("who", who), ("kind", kind)):
            if not isinstance(value, str):
                return f"{name}: expected a string, got {_short(value)}"
        if not (isinstance(pid, int) and not isinstance(pid, bool) and 1 <= pid <= PID_MAX):
            return f"pid: expected a process id (1 to {PID_MAX}), got {_short(pid)}"
        if not (isinstance(since, int | float) and not isinstance(since, bool)
                and SINCE_RANGE[0] <= since <= SINCE_RANGE[1]):  # NaN and inf fail the comparison
            return f"since: expected a time between 2000 and 2100, got {_short(since)}"
        assert isinstance(who, str) and isinstance(kind, str)
        return cls(token, shown(who, 200), shown(kind, 20), pid, float(since))


@dataclass(frozen=True)
class DriverVerdict:
    """What a session opening onto a server should do: drive or stay read-only; a line for its event log."""

    readonly: bool
    message: str
    level: EventLevel = "info"


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if at else "?"


def _short(value: object) -> str:
    text = shown(repr(value), 40)
    return text if len(text) < 40 else text[:37] + "..."


class DriverLock:
    """One session's hold on one profile's driver lock (module docstring)."""

    def __init__(self, host: Host, profile: Profile, kind: SessionKind) -> None:
        self.host = host
        self.profile = profile.name
        # the job record's name (slug + the profile file's identity): two files named "demo" get two locks
        self._key = jobs.record_name(profile.name, jobs.profile_file_of(profile))
        self.kind: SessionKind = kind
        self.token = secrets.token_hex(16)
        self.who = jobs.who_am_i()
        self.since = time.time()
        self.held = False  # this session believes it drives (checked against the host by `check`)
        self._taking = False  # acquire is between its heartbeat and `held` (the claim may be on disk already)
        self._let_go = False  # release came while taking: acquire gives back what it took
        self._writing: asyncio.Future[None] | None = None  # the heartbeat write in flight (_beat)
        folder = f"{host.state_dir}/drivers"
        self.claim_path = f"{folder}/{self._key}.json"
        self._folder = folder

    def _beat_path(self, token: str) -> str:
        return f"{self._folder}/{self._key}.{token}.beat"

    def _claim_text(self) -> str:
        return json.dumps({"token": self.token, "who": self.who, "kind": self.kind, "pid": os.getpid(),
                           "since": self.since}) + "\n"

    async def _read_claim(self) -> DriverClaim | None:
        """The claim file as it is now (None: there is none); an unreadable one as DriverClaim.unreadable."""
        found = await self.host.path_age(self.claim_path, read=CLAIM_MAX)
        if found is None:
            return None
        if not found.plain or found.text is None:
            return DriverClaim.unreadable(f"{self.claim_path} is not a plain file (a symbolic link?)", found.age_s)
        parsed = DriverClaim.parse(found.text) if not found.cut else f"over {CLAIM_MAX} bytes"
        if isinstance(parsed, str):
            return DriverClaim.unreadable(f"{self.claim_path}: {parsed}", found.age_s)
        return dataclasses.replace(parsed, age_s=found.age_s)

    async def _holds(self, claim: DriverClaim) -> bool:
        """Whether `claim` (not ours) still holds the lock: its holder beat within STALE_S by the host's clock;
        an unreadable claim holds until it is broken."""
        if claim.problem:
            return not claim.broken
        return fresh(await self.host.path_age(self._beat_path(claim.token)))

    async def holder(self) -> DriverClaim | None:
        """The live claim on this server's lock (None: free, its holder's heartbeat is stale, or it is a broken
        unreadable claim)."""
        claim = await self._read_claim()
        if claim is None:
            return None
        return claim if claim.token == self.token or await self._holds(claim) else None

    async def _beat(self) -> None:
        """Write the heartbeat. The content is only for people and for older tunedash versions (which read it):
        the mtime is the beat. Shielded: a cancelled beat still finishes, and `_drop_beat` waits for it, so a
        write still in flight never puts the file back after it was removed."""
        self._writing = asyncio.ensure_future(self.host.write_text(self._beat_path(self.token),
                                                                   f"{time.time():.3f}\n"))
        await asyncio.shield(self._writing)

    async def _drop_beat(self) -> None:
        """Remove this session's heartbeat file (it does not hold the lock)."""
        if self._writing is not None and not self._writing.done():
            # Only waiting for the write to end: its failure was already raised to the `_beat` that started it.
            with contextlib.suppress(Exception):
                await self._writing
        try:
            await self.host.remove(self._beat_path(self.token))
        except (HostError, OSError):
            pass  # a stale beat names a token nobody holds: harmless

    async def acquire(self, *, take_over: bool, command: str = "ui") -> DriverVerdict:
        """Drive when the lock is free (or ours, or `take_over`); else read-only, naming who drives."""
        current = await self._read_claim()
        other = current if current is not None and current.token != self.token and await self._holds(current) \
            else None
        if other is not None and not take_over:
            later = f" (it counts as free once it is {STALE_S:.0f} s old)" if other.problem else ""
            return DriverVerdict(True, f"read-only: {other.describe()} drives {self.profile}{later}; "
                                       f"`tunedash {command} {self.profile} --take-over` to drive it", "warning")
        self._taking, self._let_go = True, False
        try:
            verdict = await self._take(current, other)
        except BaseException:  # cancelled half way (SIGTERM, Ctrl-C, a closing dashboard): leave nothing behind
            self.held = True
            await self.release()
            raise
        finally:
            self._taking = False
        if self._let_go:  # released while taking (a dashboard stopped in its first second): give back what it took
            self.held = True
            await self.release()
            return DriverVerdict(True, f"read-only: this session stopped while taking the lock of {self.profile}",
                                 "warning")
        return verdict

    async def _take(self, current: DriverClaim | None, other: DriverClaim | None) -> DriverVerdict:
        """acquire, once it is decided to drive: take over `other`, or take the lock `current` leaves free."""
        await self._beat()  # the heartbeat first: a claim is never seen without a fresh one
        if other is not None:
            await self.host.write_text(self.claim_path, self._claim_text())
            self.held = True
            return DriverVerdict(False, f"took over from {other.describe()}", "warning")
        broke = ""
        if current is None or current.token != self.token:  # free: take it exclusively, then check for racers
            if current is not None:
                again = await self._read_claim()  # someone may have taken it since we looked
                if again is not None and again.token not in ("", current.token, self.token) \
                        and await self._holds(again):
                    return await self._beaten(again)
                await self.host.remove(self.claim_path)  # a dead holder's claim, or a broken one
                if current.problem:
                    broke = f"broke {current.describe()}; "
            created = await self.host.create_exclusive(self.claim_path, self._claim_text())
            await asyncio.sleep(SETTLE_S)  # a racer that read the dead claim before us may still remove ours
            winner = await self._read_claim()
            if not created or winner is None or winner.token != self.token:
                return await self._beaten(winner)
        self.held = True
        return DriverVerdict(False, f"{broke}driving {self.profile} as {self.who} ({self.kind})",
                             "warning" if broke else "info")

    async def _beaten(self, winner: DriverClaim | None) -> DriverVerdict:
        await self._drop_beat()
        who = winner.describe() if winner is not None else "another session"
        return DriverVerdict(True, f"read-only: {who} took the lock first", "warning")

    async def check(self, what: str = "this") -> None:
        """Raise DrivenElsewhere unless this session still drives; right before a signal or a launch."""
        claim = await self._read_claim()
        if self.held and claim is not None and claim.token == self.token:
            return
        if self.held:
            self.held = False
            await self._drop_beat()
        who = claim.describe() if claim is not None else "nobody (the lock was released)"
        raise DrivenElsewhere(f"{what} refused: {who} drives {self.profile} now; this session is read-only")

    async def heartbeat(self) -> str | None:
        """Keep the lock alive. When ours is gone, returns who took it ("alice@box (cli, ...)", or "another
        session" when the claim was taken over and given back between two beats) and stops holding."""
        if not self.held:
            return None
        claim = await self._read_claim()
        if claim is None or claim.token != self.token:
            self.held = False
            await self._drop_beat()
            return claim.describe() if claim is not None else "another session (it has let go since)"
        await self._beat()
        return None

    async def release(self) -> None:
        """Give the lock back (quit, end of a CLI command, SIGTERM); a take-over since then is left alone. While
        `acquire` is taking it (its claim on disk, `held` not yet set), what is on disk now is given back, and
        acquire gives back what it takes after (a stop in a dashboard's first second left a heartbeat behind)."""
        if self._taking:
            self._let_go = True
        elif not self.held:
            return
        self.held = False
        try:
            claim = await self._read_claim()
            if claim is not None and claim.token == self.token:
                await self.host.remove(self.claim_path)
        except (HostError, OSError):
            pass  # a stale claim expires by itself after STALE_S
        await self._drop_beat()


async def keep_alive(lock: DriverLock) -> None:
    """A command's lock kept alive: its heartbeat every HEARTBEAT_S until cancelled (a CLI command's, a dashboard
    tune's other slots'); a take-over is found by `check` right before the next signal or launch. A host that does
    not answer one beat is tried again at the next."""
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        with contextlib.suppress(HostError, OSError):
            await lock.heartbeat()
