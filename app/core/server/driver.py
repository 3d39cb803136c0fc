"""One driver per server: a per-session token held in a lock file on the host, with a heartbeat.

Two people (or one person in two tmux panes) can open dashboards on one GPU host, and a script can run
`tunedash kill` beside them. Exactly one session drives a profile's server at a time; every other one is
read-only until it takes over. The lock lives on the host, beside the job records:

- `<state_dir>/drivers/<key>.json` is the claim: the session's random token, who (user@machine), what kind of
  session (dashboard or cli), its pid and since when. It is created exclusively (`Host.create_exclusive`: two
  sessions racing for a free lock cannot both win) and replaced only by a take-over.
- `<state_dir>/drivers/<key>.<token>.beat` is the holder's heartbeat, rewritten every HEARTBEAT_S. A claim
  whose heartbeat is older than STALE_S (a crashed dashboard, a dropped connection) counts as free. The holder
  never rewrites the claim itself, so a heartbeat cannot undo someone's take-over.

The lock is taken at launch and at attach alike (a dashboard opened while nothing runs drives the server it
may launch later), and checked right before every signal and launch (ServerLifecycle.before_act); a holder
that finds another token in the claim has been taken over and turns read-only within HEARTBEAT_S.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from app.core.data import EventLevel
from app.core.errors import Reason, TunedashError
from app.core.hosts.base import Host, HostError
from app.core.profiles.types import Profile
from app.core.server import jobs

HEARTBEAT_S = 1.0
STALE_S = 5.0
SETTLE_S = 0.2  # after taking a free lock: longer than a racer's read -> remove -> create
SessionKind = Literal["dashboard", "cli"]


class DrivenElsewhere(TunedashError):
    """Another live session drives this server; the message names it and says how to take over."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Reason.DRIVEN_ELSEWHERE)


@dataclass(frozen=True)
class DriverClaim:
    """Who holds a server's driver lock (read from the host, validated)."""

    token: str
    who: str
    kind: str
    pid: int
    since: float

    def describe(self) -> str:
        """"alice@gpubox (dashboard, pid 4242, since 07:40)"."""
        return f"{self.who} ({self.kind}, pid {self.pid}, since {_clock(self.since)})"

    @classmethod
    def parse(cls, text: str | None) -> DriverClaim | None:
        """The claim in `text`, or None when there is none or it is not one (a broken file counts as free)."""
        try:
            raw = json.loads(text or "")
        except ValueError:
            return None
        if not isinstance(raw, dict):
            return None
        token, who, kind, pid, since = (raw.get(k) for k in ("token", "who", "kind", "pid", "since"))
        if not (isinstance(token, str) and re.fullmatch(r"[0-9a-f]{8,64}", token) and isinstance(who, str)
                and isinstance(kind, str) and isinstance(pid, int) and isinstance(since, (int, float))):
            return None
        return cls(token, who[:200], kind[:20], pid, float(since))


@dataclass(frozen=True)
class DriverVerdict:
    """What a session opening onto a server should do: drive or stay read-only; a line for its event log."""

    readonly: bool
    message: str
    level: EventLevel = "info"


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if at else "?"




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
        folder = f"{host.state_dir}/drivers"
        self.claim_path = f"{folder}/{self._key}.json"
        self._folder = folder

    def _beat_path(self, token: str) -> str:
        return f"{self._folder}/{self._key}.{token}.beat"

    def _claim_text(self) -> str:
        return json.dumps({"token": self.token, "who": self.who, "kind": self.kind, "pid": os.getpid(),
                           "since": self.since}) + "\n"

    async def holder(self) -> DriverClaim | None:
        """The live claim on this server's lock (None: free, or its holder's heartbeat is older than STALE_S)."""
        claim = DriverClaim.parse(await self.host.read_text(self.claim_path))
        if claim is None:
            return None
        return claim if claim.token == self.token or await self._live(claim) else None

    async def _live(self, claim: DriverClaim) -> bool:
        """Whether the claim's holder beat within STALE_S."""
        beat = await self.host.read_text(self._beat_path(claim.token))
        try:
            last = float((beat or "").strip())
        except ValueError:
            return False
        return time.time() - last <= STALE_S

    async def _beat(self) -> None:
        await self.host.write_text(self._beat_path(self.token), f"{time.time():.3f}\n")

    async def acquire(self, *, take_over: bool, command: str = "ui") -> DriverVerdict:
        """Drive when the lock is free (or ours, or `take_over`); else read-only, naming who drives."""
        other = await self.holder()
        if other is not None and other.token != self.token and not take_over:
            return DriverVerdict(True, f"read-only: {other.describe()} drives {self.profile}; "
                                       f"`tunedash {command} {self.profile} --take-over` to drive it", "warning")
        await self._beat()  # the heartbeat first: a claim is never seen without a fresh one
        if other is not None and other.token != self.token:
            await self.host.write_text(self.claim_path, self._claim_text())
            self.held = True
            return DriverVerdict(False, f"took over from {other.describe()}", "warning")
        if other is None:  # free: take it exclusively, then make sure nobody raced us for it
            current = DriverClaim.parse(await self.host.read_text(self.claim_path))
            if current is not None and current.token != self.token:
                if await self._live(current):  # someone took it since we looked
                    return self._beaten(current)
                await self.host.remove(self.claim_path)  # a dead holder's claim
            created = await self.host.create_exclusive(self.claim_path, self._claim_text())
            await asyncio.sleep(SETTLE_S)  # a racer that read the dead claim before us may still remove ours
            winner = DriverClaim.parse(await self.host.read_text(self.claim_path))
            if not created or winner is None or winner.token != self.token:
                return self._beaten(winner)
        self.held = True
        return DriverVerdict(False, f"driving {self.profile} as {self.who} ({self.kind})")

    def _beaten(self, winner: DriverClaim | None) -> DriverVerdict:
        who = winner.describe() if winner is not None else "another session"
        return DriverVerdict(True, f"read-only: {who} took the lock first", "warning")

    async def check(self, what: str = "this") -> None:
        """Raise DrivenElsewhere unless this session still drives; right before a signal or a launch."""
        claim = DriverClaim.parse(await self.host.read_text(self.claim_path))
        if self.held and claim is not None and claim.token == self.token:
            return
        self.held = False
        who = claim.describe() if claim is not None else "nobody (the lock was released)"
        raise DrivenElsewhere(f"{what} refused: {who} drives {self.profile} now; this session is read-only")

    async def heartbeat(self) -> str | None:
        """Keep the lock alive. When ours is gone, returns who took it ("alice@box (cli, ...)", or "another
        session" when the claim was taken over and given back between two beats) and stops holding."""
        if not self.held:
            return None
        claim = DriverClaim.parse(await self.host.read_text(self.claim_path))
        if claim is None or claim.token != self.token:
            self.held = False
            return claim.describe() if claim is not None else "another session (it has let go since)"
        await self._beat()
        return None

    async def release(self) -> None:
        """Give the lock back (quit, end of a CLI command); a take-over since then is left alone."""
        if not self.held:
            return
        self.held = False
        try:
            claim = DriverClaim.parse(await self.host.read_text(self.claim_path))
            if claim is not None and claim.token == self.token:
                await self.host.remove(self.claim_path)
            await self.host.remove(self._beat_path(self.token))
        except (HostError, OSError):
            pass  # a stale claim expires by itself after STALE_S
