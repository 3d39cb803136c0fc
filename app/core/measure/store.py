"""SQLite history of launches, benchmark runs and A/B experiments, written as results arrive.

Where: $TUNEDASH_DATA_DIR/history.sqlite3, else platformdirs.user_data_dir("tunedash")/history.sqlite3.
The database is in WAL mode with autocommit: every launch, trial (with its requests) and run status is
its own committed transaction the moment it is known, so a tunedash killed mid-run (even SIGKILL) loses
nothing already measured; a run that never finished keeps status "running" and reads as interrupted.
synchronous=NORMAL is durable against a crash of the process (only an OS crash or power loss could drop
the last transactions, never corrupt the file). Several tunedash processes may write at once
(busy_timeout), e.g. two people in one tmux.

Tables: runs (one bench or ab run), arms (label, overrides, the effective flags), launches (argv, the
profile's flags, the server's own resolved flags, phase times, outcome, launch_idx: the launch's place within
its arm), trials (one value per trial: output tok/s, plus its summary, acceptance length and launch_idx),
requests (every request of every trial), launch_phases (every launch and relaunch that reached READY: its
config and weight-cache state, each phase's begin offset, its total: the ETA of the next one,
app.core.server.progress; created by PHASE_SCHEMA on open, so older files get it without a version change).

Schema versions (PRAGMA user_version): 1 had no launch_idx; 2 adds `launch_idx INTEGER NOT NULL DEFAULT 0` to
trials and launches (an A/B arm runs several launches). Opening a version-1 file adds the columns in place
(ALTER TABLE ... ADD COLUMN, one transaction): old rows read launch_idx 0, which is what they were (one launch
per arm). 3 adds the nullable `slot TEXT` to launches (a tune with `--slots N`: the slot's index, GPUs and port as
JSON; NULL for a launch that ran without slots, as every older row did).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from app.core import jsontext
from app.core.errors import TunedashError
from app.core.server.progress import RunRecord

DATA_DIR_ENV = "TUNEDASH_DATA_DIR"
DB_NAME = "history.sqlite3"
SCHEMA_VERSION = 3
BUSY_TIMEOUT_S = 10.0  # how long a write waits for another writer's lock (two people in one tmux), in a thread
P = ParamSpec("P")
T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,                 -- bench | ab
    profile TEXT NOT NULL, host TEXT NOT NULL, backend TEXT NOT NULL, model TEXT NOT NULL,
    started_at REAL NOT NULL, finished_at REAL,
    status TEXT NOT NULL,               -- running | done | cancelled | failed
    params TEXT NOT NULL,               -- JSON: the request set, trials, order
    summary TEXT,                       -- JSON: statistics at the end
    verdict TEXT,
    note TEXT
);
CREATE TABLE IF NOT EXISTS arms (
    run_id INTEGER NOT NULL REFERENCES runs(id), idx INTEGER NOT NULL,
    label TEXT NOT NULL, overrides TEXT NOT NULL, flags TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE TABLE IF NOT EXISTS launches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER REFERENCES runs(id), arm_idx INTEGER,
    profile TEXT NOT NULL, host TEXT NOT NULL, at REAL NOT NULL,
    argv TEXT NOT NULL, flags TEXT NOT NULL, server_flags TEXT,
    phase_times TEXT NOT NULL, outcome TEXT NOT NULL,
    launch_idx INTEGER NOT NULL DEFAULT 0, slot TEXT
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL REFERENCES runs(id), arm_idx INTEGER NOT NULL, trial_idx INTEGER NOT NULL,
    at REAL NOT NULL, value REAL, summary TEXT NOT NULL,
    accept_len REAL, accept_source TEXT,
    launch_idx INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS requests (
    trial_id INTEGER NOT NULL REFERENCES trials(id), idx INTEGER NOT NULL,
    ok INTEGER NOT NULL, output_tokens INTEGER NOT NULL, ttft_s REAL, latency_s REAL, tpot_s REAL,
    start_s REAL, usage_missing INTEGER NOT NULL, error TEXT
);
CREATE INDEX IF NOT EXISTS trials_run ON trials(run_id);
CREATE INDEX IF NOT EXISTS requests_trial ON requests(trial_id);
"""

PHASE_SCHEMA = """
CREATE TABLE IF NOT EXISTS launch_phases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    config_key TEXT NOT NULL, weights_key TEXT NOT NULL,
    cache TEXT NOT NULL,                -- cold | fill | warm
    profile TEXT NOT NULL, host TEXT NOT NULL, kind TEXT NOT NULL, at REAL NOT NULL,
    offsets TEXT NOT NULL, phase_times TEXT NOT NULL, total_s REAL NOT NULL, weights_s REAL
);
CREATE INDEX IF NOT EXISTS launch_phases_profile ON launch_phases(profile, host, cache, at);
CREATE INDEX IF NOT EXISTS launch_phases_weights ON launch_phases(weights_key, at);
"""

# Columns added after version 1, per table: (column, its declaration). Added to an older file when it opens.
MIGRATIONS = {
    "trials": [("launch_idx", "INTEGER NOT NULL DEFAULT 0")],
    "launches": [("launch_idx", "INTEGER NOT NULL DEFAULT 0"), ("slot", "TEXT")],
}


def data_dir() -> Path:
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("tunedash"))


def default_path() -> Path:
    return data_dir() / DB_NAME


class StoreError(TunedashError):
    """The history cannot be opened or read; the message names the file and what to do."""

    title = "History unreadable"


@dataclass(frozen=True)
class TrialRow:
    arm_idx: int
    trial_idx: int
    at: float
    value: float | None
    summary: dict[str, Any]
    accept_len: float | None
    accept_source: str
    launch_idx: int = 0  # 0-based launch within the arm; 0 for rows written before schema 2


@dataclass(frozen=True)
class ArmRow:
    idx: int
    label: str
    overrides: str
    flags: dict[str, Any]


@dataclass(frozen=True)
class LaunchRow:
    arm_idx: int | None
    at: float
    argv: list[str]
    flags: dict[str, Any]
    server_flags: dict[str, Any] | None
    phase_times: dict[str, float]
    outcome: str
    launch_idx: int = 0
    slot: dict[str, Any] | None = None  # {"index", "gpus", "port"} of a `--slots` launch; None without slots


@dataclass(frozen=True)
class RequestRow:
    """One stored request of a trial, with the trial's arm, launch and trial index (the compare plots' TTFT and
    ITL, audits). Times in seconds; None where the request never got that far."""

    arm_idx: int
    launch_idx: int
    trial_idx: int
    idx: int  # the request's place in its trial
    ok: bool
    output_tokens: int
    ttft_s: float | None
    latency_s: float | None
    tpot_s: float | None
    start_s: float | None
    usage_missing: bool
    error: str | None


@dataclass(frozen=True)
class RunRow:
    """One run as the history lists it; arms/trials/launches are filled by HistoryStore.run()."""

    id: int
    kind: str
    profile: str
    host: str
    backend: str
    model: str
    started_at: float
    finished_at: float | None
    status: str
    params: dict[str, Any]
    summary: dict[str, Any] | None
    verdict: str | None
    note: str | None
    arms: list[ArmRow] = field(default_factory=list)
    trials: list[TrialRow] = field(default_factory=list)
    launches: list[LaunchRow] = field(default_factory=list)
    trial_count: int = 0

    @property
    def shown_status(self) -> str:
        """The status for people: a run whose writer died before finishing it reads "interrupted"."""
        return "interrupted" if self.status == "running" and self.finished_at is None else self.status

    def values(self, arm_idx: int) -> list[float]:
        """The arm's successful trial values, in order."""
        return [t.value for t in self.trials if t.arm_idx == arm_idx and t.value is not None]

    def trials_by_launch(self, arm_idx: int) -> list[list[float]]:
        """The arm's successful trial values grouped by launch (launch_idx order), empty launches left out."""
        by_launch: dict[int, list[float]] = {}
        for t in self.trials:
            if t.arm_idx == arm_idx and t.value is not None:
                by_launch.setdefault(t.launch_idx, []).append(t.value)
        return [by_launch[k] for k in sorted(by_launch)]


EPOCH_MAX = 4102444800.0  # 2100-01-01: a time past it (1e300) is not one a clock wrote


class BadRow(StoreError, ValueError):
    """A history row whose values are not what tunedash writes (a hand edit, another tool, a torn disk)."""

    title = "Unreadable history row"


def _loads(text: object) -> Any:
    """A JSON column: None stays None; text nested past jsontext's cap, or not JSON, is a BadRow."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise BadRow(f"expected JSON text, got {type(text).__name__}")
    try:
        return jsontext.loads(text)
    except ValueError as exc:  # JSONDecodeError and JsonTooDeep
        raise BadRow(f"unreadable JSON ({str(exc)[:80]})") from None


def _json_dict(text: object, *, optional: bool = False) -> dict[str, Any] | None:
    value = _loads(text)
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise BadRow(f"expected a JSON object, got {type(value).__name__}")
    return value


def _epoch(value: object, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= EPOCH_MAX:
        raise BadRow(f"expected seconds since the epoch (1970-2100), got {str(value)[:40]!r}")
    return float(value)


def _number(value: object) -> float | None:
    """None, or a finite number (a trial's tok/s, an acceptance length, seconds)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRow(f"expected a number, got {str(value)[:40]!r}")
    return float(value)


def _int(value: object, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 2**53:
        raise BadRow(f"expected an integer, got {str(value)[:40]!r}")
    return value


def _text(value: object, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise BadRow(f"expected text, got {str(value)[:40]!r}")
    return value


def _phase_dict(text: object) -> dict[str, float]:
    """A launch_phases JSON column: phase -> seconds, every value a finite number."""
    data = _json_dict(text)
    out: dict[str, float] = {}
    for key, value in (data or {}).items():
        number = _number(value)  # raises BadRow for anything but a finite number
        if number is None:
            raise BadRow(f"phase {str(key)[:40]!r}: no seconds")
        out[str(key)] = number
    return out


def _serialised(method: Callable[P, T]) -> Callable[P, T]:
    """One call at a time on the store's one connection (its `_lock`), from the loop or a thread worker."""
    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        with args[0]._lock:  # type: ignore[attr-defined]
            return method(*args, **kwargs)

    return call


class HistoryStore:
    """The history database. Cheap to open; every write commits at once.

    Async code calls it through `in_thread` (a thread worker): SQLite may wait up to BUSY_TIMEOUT_S for another
    writer's lock, longer than the driver lock's 5 s stale limit, so it must never wait on the event loop. One
    connection serves every thread, one call at a time (`_lock`)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_path()
        self._lock = threading.RLock()
        self.skipped = 0  # rows the reads since opening skipped as unreadable (see "reads" below)
        self.skipped_why: list[str] = []
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_S,
                                      check_same_thread=False)  # in_thread's workers; `_lock` keeps one at a time
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(SCHEMA)
            self.db.executescript(PHASE_SCHEMA)
            self._migrate()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot open the history database ({exc}); "
                             f"set {DATA_DIR_ENV} to a writable folder") from None

    def _migrate(self) -> None:
        """Bring an older file up to SCHEMA_VERSION in one transaction (a newer file is left as it is)."""
        version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
        if version >= SCHEMA_VERSION:
            return
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            for table, columns in MIGRATIONS.items():
                have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
                for name, decl in columns:
                    if name not in have:  # another process may have migrated it first
                        self.db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
            self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            self.db.close()

    async def in_thread(self, method: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`method(*args, **kwargs)` (one of this store's methods) in a thread worker, so that SQLite's wait for
        a lock never stalls the event loop; for async callers (an A/B, a recorded bench, the advisor)."""
        def call() -> T:
            with self._lock:
                return method(*args, **kwargs)

        return await asyncio.to_thread(call)

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes ----------------------------------------------------------------------------------
    @_serialised
    def start_run(self, kind: str, *, profile: str, host: str, backend: str, model: str,
                  params: dict[str, Any], arms: Sequence[tuple[str, str, dict[str, Any]]] = ()) -> int:
        """A new run (status "running") with its arms (label, overrides text, effective flags)."""
        with self.db:
            self.db.execute("BEGIN")
            cur = self.db.execute(
                "INSERT INTO runs (kind, profile, host, backend, model, started_at, status, params) "
                "VALUES (?, ?, ?, ?, ?, ?, 'running', ?)",
                (kind, profile, host, backend, model, time.time(), json.dumps(params)),
            )
            run_id = int(cur.lastrowid or 0)
            for idx, (label, overrides, flags) in enumerate(arms):
                self.db.execute("INSERT INTO arms VALUES (?, ?, ?, ?, ?)",
                                (run_id, idx, label, overrides, json.dumps(flags, default=str)))
        return run_id

    @_serialised
    def add_launch(self, *, run_id: int | None, arm_idx: int | None, profile: str, host: str, argv: list[str],
                   flags: dict[str, Any], server_flags: dict[str, Any] | None, phase_times: dict[str, float],
                   outcome: str, launch_idx: int = 0, slot: dict[str, Any] | None = None) -> None:
        self.db.execute(
            "INSERT INTO launches (run_id, arm_idx, profile, host, at, argv, flags, server_flags, phase_times, "
            "outcome, launch_idx, slot) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, arm_idx, profile, host, time.time(), json.dumps(argv), json.dumps(flags, default=str),
             None if server_flags is None else json.dumps(server_flags, default=str), json.dumps(phase_times),
             outcome, launch_idx, None if slot is None else json.dumps(slot)),
        )

    @_serialised
    def add_phase_run(self, run: RunRecord) -> None:
        """One launch or relaunch that reached READY (app.core.server.progress.PhaseTracker)."""
        self.db.execute(
            "INSERT INTO launch_phases (config_key, weights_key, cache, profile, host, kind, at, offsets, "
            "phase_times, total_s, weights_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run.config_key, run.weights_key, run.cache, run.profile, run.host, run.kind, run.at,
             json.dumps(run.offsets), json.dumps(run.phase_times), run.total_s, run.weights_s),
        )

    def _phase_rows(self, where: str, params: tuple[Any, ...], limit: int) -> list[RunRecord]:
        rows = self.db.execute(
            "SELECT config_key, weights_key, cache, profile, host, kind, offsets, phase_times, total_s, weights_s, "
            f"at FROM launch_phases WHERE {where} ORDER BY at DESC LIMIT ?", (*params, limit)).fetchall()
        out = []
        for row in rows:
            try:
                offsets = _phase_dict(row[6])
                times = _phase_dict(row[7])
                total = _number(row[8])
                if total is None:
                    raise BadRow("no total")
                out.append(RunRecord(str(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]), str(row[5]),
                                     offsets, times, total, _number(row[9]), _epoch(row[10]) or 0.0))
            except BadRow as exc:
                self._skip("launch_phases row", exc)
        return out

    @_serialised
    def phase_runs(self, *, profile: str, host: str, cache: str, limit: int = 20) -> list[RunRecord]:
        """The newest runs of `profile` on `host` with the weight cache in state `cache`, newest first."""
        return self._phase_rows("profile = ? AND host = ? AND cache = ?", (profile, host, cache), limit)

    @_serialised
    def weights_runs(self, weights_key: str, limit: int = 20) -> list[RunRecord]:
        """The newest runs that loaded the same weights (progress.weights_key), any cache state, newest first."""
        return self._phase_rows("weights_key = ?", (weights_key,), limit)

    @_serialised
    def add_trial(self, run_id: int, arm_idx: int, trial_idx: int, *, value: float | None, summary: dict[str, Any],
                  accept_len: float | None, accept_source: str, requests: Sequence[Any], launch_idx: int = 0) -> None:
        """One finished trial and its requests (RequestResult-like objects), in one transaction.

        trial_idx counts within the launch; launch_idx is the launch's place within the arm (0-based)."""
        with self.db:
            self.db.execute("BEGIN")
            cur = self.db.execute(
                "INSERT INTO trials (run_id, arm_idx, trial_idx, at, value, summary, accept_len, accept_source, "
                "launch_idx) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, arm_idx, trial_idx, time.time(), value, json.dumps(summary), accept_len, accept_source,
                 launch_idx),
            )
            trial_id = cur.lastrowid
            self.db.executemany(
                "INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(trial_id, i, int(r.ok), r.output_tokens, r.ttft_s, r.latency_s, r.tpot_s, r.start_s,
                  int(r.usage_missing), r.error or None) for i, r in enumerate(requests)],
            )

    @_serialised
    def finish_run(self, run_id: int, status: str, *, summary: dict[str, Any] | None = None,
                   verdict: str | None = None, note: str | None = None) -> None:
        self.db.execute(
            "UPDATE runs SET status = ?, finished_at = ?, summary = ?, verdict = ?, note = ? WHERE id = ?",
            (status, time.time(), None if summary is None else json.dumps(summary), verdict, note, run_id),
        )

    # ---- reads -----------------------------------------------------------------------------------
    # Every row is checked as it is read (types, finite numbers, plausible times, JSON nested at most 32 deep): a
    # row that fails is skipped and counted in `skipped` (with why in `skipped_why`), so one bad row never hides the
    # others nor ends in a traceback; callers say "N unreadable rows skipped" (skipped_note).
    def _skip(self, what: str, exc: Exception) -> None:
        self.skipped += 1
        if len(self.skipped_why) < 20:
            self.skipped_why.append(f"{what}: {exc}")

    def skipped_note(self) -> str:
        """ "1 unreadable row skipped (run #3: ...) in FILE" when reads skipped rows; "" otherwise."""
        if not self.skipped:
            return ""
        why = f" ({self.skipped_why[0]})" if self.skipped_why else ""
        return (f"{self.skipped} unreadable history row{'s' if self.skipped != 1 else ''} skipped{why} in {self.path}")

    def _run_row(self, row: sqlite3.Row | tuple[Any, ...]) -> RunRow:
        (rid, kind, profile, host, backend, model, started, finished, status, params, summary, verdict, note,
         count) = row
        return RunRow(_int(rid) or 0, _text(kind) or "", _text(profile) or "", _text(host) or "", _text(backend) or "",
                      _text(model) or "", _epoch(started) or 0.0, _epoch(finished, optional=True),
                      _text(status) or "", _json_dict(params) or {}, _json_dict(summary, optional=True),
                      _text(verdict, optional=True), _text(note, optional=True), trial_count=int(count or 0))

    def _checked_run_row(self, row: sqlite3.Row | tuple[Any, ...]) -> RunRow | None:
        try:
            return self._run_row(row)
        except BadRow as exc:
            self._skip(f"run #{row[0]}", exc)
            return None

    _RUN_COLUMNS = ("r.id, r.kind, r.profile, r.host, r.backend, r.model, r.started_at, r.finished_at, r.status, "
                    "r.params, r.summary, r.verdict, r.note, (SELECT COUNT(*) FROM trials t WHERE t.run_id = r.id)")

    @_serialised
    def runs(self, limit: int = 200) -> list[RunRow]:
        """The newest runs first, without their trials; unreadable rows skipped (counted in `skipped`)."""
        rows = self.db.execute(f"SELECT {self._RUN_COLUMNS} FROM runs r ORDER BY r.id DESC LIMIT ?", (limit,))
        return [run for run in map(self._checked_run_row, rows.fetchall()) if run is not None]

    @_serialised
    def run(self, run_id: int) -> RunRow | None:
        """One run with its arms, trials and launches (unreadable ones skipped and counted); StoreError when the
        run's own row is unreadable."""
        row = self.db.execute(f"SELECT {self._RUN_COLUMNS} FROM runs r WHERE r.id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        try:
            base = self._run_row(row)
        except BadRow as exc:
            raise StoreError(f"{self.path}: run #{run_id} is unreadable ({exc}); `tunedash history` lists the "
                             "others") from None
        arms = []
        for idx, label, overrides, flags in self.db.execute(
                "SELECT idx, label, overrides, flags FROM arms WHERE run_id = ? ORDER BY idx", (run_id,)):
            try:
                arms.append(ArmRow(_int(idx) or 0, _text(label) or "", _text(overrides) or "", _json_dict(flags) or {}))
            except BadRow as exc:
                self._skip(f"run #{run_id} arm {idx}", exc)
        trials = []
        for a, t, at, v, s, al, src, li in self.db.execute(
                "SELECT arm_idx, trial_idx, at, value, summary, accept_len, accept_source, launch_idx "
                "FROM trials WHERE run_id = ? ORDER BY id", (run_id,)):
            try:
                trials.append(TrialRow(_int(a) or 0, _int(t) or 0, _epoch(at) or 0.0, _number(v),
                                       _json_dict(s) or {}, _number(al), _text(src, optional=True) or "",
                                       _int(li, optional=True) or 0))
            except BadRow as exc:
                self._skip(f"run #{run_id} trial {t}", exc)
        launches = []
        for a, at, argv, fl, sf, pt, out, li, sl in self.db.execute(
                "SELECT arm_idx, at, argv, flags, server_flags, phase_times, outcome, launch_idx, slot FROM launches "
                "WHERE run_id = ? ORDER BY id", (run_id,)):
            try:
                argv_list = _loads(argv) or []
                times = _json_dict(pt) or {}
                if not isinstance(argv_list, list) or not all(isinstance(x, str) for x in argv_list):
                    raise BadRow("argv: expected a list of strings")
                launches.append(LaunchRow(_int(a, optional=True), _epoch(at) or 0.0, argv_list, _json_dict(fl) or {},
                                          _json_dict(sf, optional=True),
                                          {str(k): _number(x) or 0.0 for k, x in times.items()},
                                          _text(out) or "", _int(li, optional=True) or 0,
                                          _json_dict(sl, optional=True)))
            except BadRow as exc:
                self._skip(f"run #{run_id} launch", exc)
        return RunRow(**{**base.__dict__, "arms": arms, "trials": trials, "launches": launches})

    @_serialised
    def request_rows(self, run_id: int) -> list[RequestRow]:
        """Every stored request of a run, with its arm and trial (the compare plots, audits); unreadable rows
        skipped and counted."""
        cur = self.db.execute(
            "SELECT t.arm_idx, t.launch_idx, t.trial_idx, q.idx, q.ok, q.output_tokens, q.ttft_s, q.latency_s, "
            "q.tpot_s, q.start_s, q.usage_missing, q.error FROM requests q JOIN trials t ON q.trial_id = t.id "
            "WHERE t.run_id = ? ORDER BY t.id, q.idx", (run_id,))
        rows = []
        for arm, launch, trial, idx, ok, tokens, ttft, latency, tpot, start, missing, error in cur.fetchall():
            try:
                rows.append(RequestRow(_int(arm) or 0, _int(launch, optional=True) or 0, _int(trial) or 0,
                                       _int(idx) or 0, bool(_int(ok)), _int(tokens) or 0, _number(ttft),
                                       _number(latency), _number(tpot), _number(start), bool(_int(missing)),
                                       _text(error, optional=True)))
            except BadRow as exc:
                self._skip(f"run #{run_id} request {idx}", exc)
        return rows

    @_serialised
    def integrity_ok(self) -> bool:
        return bool(self.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok")
