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
requests (every request of every trial).

Schema versions (PRAGMA user_version): 1 had no launch_idx; 2 adds `launch_idx INTEGER NOT NULL DEFAULT 0` to
trials and launches (an A/B arm runs several launches). Opening a version-1 file adds the columns in place
(ALTER TABLE ... ADD COLUMN, one transaction): old rows read launch_idx 0, which is what they were (one launch
per arm).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_DIR_ENV = "TUNEDASH_DATA_DIR"
DB_NAME = "history.sqlite3"
SCHEMA_VERSION = 2

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
    launch_idx INTEGER NOT NULL DEFAULT 0
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

# Columns added after version 1, per table: (column, its declaration). Added to an older file when it opens.
MIGRATIONS = {
    "trials": [("launch_idx", "INTEGER NOT NULL DEFAULT 0")],
    "launches": [("launch_idx", "INTEGER NOT NULL DEFAULT 0")],
}


def data_dir() -> Path:
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("tunedash"))


def default_path() -> Path:
    return data_dir() / DB_NAME


class StoreError(Exception):
    """The history cannot be opened or read; the message names the file and what to do."""


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


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class HistoryStore:
    """The history database. Cheap to open; every write commits at once."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, isolation_level=None, timeout=10.0)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(SCHEMA)
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
        self.db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes ----------------------------------------------------------------------------------
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

    def add_launch(self, *, run_id: int | None, arm_idx: int | None, profile: str, host: str, argv: list[str],
                   flags: dict[str, Any], server_flags: dict[str, Any] | None, phase_times: dict[str, float],
                   outcome: str, launch_idx: int = 0) -> None:
        self.db.execute(
            "INSERT INTO launches (run_id, arm_idx, profile, host, at, argv, flags, server_flags, phase_times, "
            "outcome, launch_idx) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, arm_idx, profile, host, time.time(), json.dumps(argv), json.dumps(flags, default=str),
             None if server_flags is None else json.dumps(server_flags, default=str), json.dumps(phase_times),
             outcome, launch_idx),
        )

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

    def finish_run(self, run_id: int, status: str, *, summary: dict[str, Any] | None = None,
                   verdict: str | None = None, note: str | None = None) -> None:
        self.db.execute(
            "UPDATE runs SET status = ?, finished_at = ?, summary = ?, verdict = ?, note = ? WHERE id = ?",
            (status, time.time(), None if summary is None else json.dumps(summary), verdict, note, run_id),
        )

    # ---- reads -----------------------------------------------------------------------------------
    def _run_row(self, row: sqlite3.Row | tuple[Any, ...]) -> RunRow:
        (rid, kind, profile, host, backend, model, started, finished, status, params, summary, verdict, note,
         count) = row
        return RunRow(rid, kind, profile, host, backend, model, started, finished, status, _loads(params) or {},
                      _loads(summary), verdict, note, trial_count=int(count or 0))

    _RUN_COLUMNS = ("r.id, r.kind, r.profile, r.host, r.backend, r.model, r.started_at, r.finished_at, r.status, "
                    "r.params, r.summary, r.verdict, r.note, (SELECT COUNT(*) FROM trials t WHERE t.run_id = r.id)")

    def runs(self, limit: int = 200) -> list[RunRow]:
        """The newest runs first, without their trials."""
        rows = self.db.execute(f"SELECT {self._RUN_COLUMNS} FROM runs r ORDER BY r.id DESC LIMIT ?", (limit,))
        return [self._run_row(row) for row in rows.fetchall()]

    def run(self, run_id: int) -> RunRow | None:
        """One run with its arms, trials and launches."""
        row = self.db.execute(f"SELECT {self._RUN_COLUMNS} FROM runs r WHERE r.id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        base = self._run_row(row)
        arms = [ArmRow(idx, label, overrides, _loads(flags) or {}) for idx, label, overrides, flags in self.db.execute(
            "SELECT idx, label, overrides, flags FROM arms WHERE run_id = ? ORDER BY idx", (run_id,))]
        trials = [TrialRow(a, t, at, v, _loads(s) or {}, al, src or "", int(li or 0))
                  for a, t, at, v, s, al, src, li in self.db.execute(
                      "SELECT arm_idx, trial_idx, at, value, summary, accept_len, accept_source, launch_idx "
                      "FROM trials WHERE run_id = ? ORDER BY id", (run_id,))]
        launches = [LaunchRow(a, at, _loads(argv) or [], _loads(fl) or {}, _loads(sf), _loads(pt) or {}, out,
                              int(li or 0))
                    for a, at, argv, fl, sf, pt, out, li in self.db.execute(
                        "SELECT arm_idx, at, argv, flags, server_flags, phase_times, outcome, launch_idx FROM launches "
                        "WHERE run_id = ? ORDER BY id", (run_id,))]
        return RunRow(**{**base.__dict__, "arms": arms, "trials": trials, "launches": launches})

    def request_rows(self, run_id: int) -> list[dict[str, Any]]:
        """Every stored request of a run, with its arm and trial (for CSV export and audits)."""
        cur = self.db.execute(
            "SELECT t.arm_idx, t.launch_idx, t.trial_idx, q.idx, q.ok, q.output_tokens, q.ttft_s, q.latency_s, "
            "q.tpot_s, q.start_s, q.usage_missing, q.error FROM requests q JOIN trials t ON q.trial_id = t.id "
            "WHERE t.run_id = ? ORDER BY t.id, q.idx", (run_id,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def integrity_ok(self) -> bool:
        return bool(self.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok")
