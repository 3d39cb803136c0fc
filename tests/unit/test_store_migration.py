"""The history's schema 1 -> 2 migration (launch_idx on trials and launches) on a database file in the old layout."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from app.core.measure.report import export_run, run_json
from app.core.measure.store import SCHEMA_VERSION, HistoryStore

# The tables exactly as schema version 1 wrote them (before launch_idx).
SCHEMA_V1 = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, profile TEXT NOT NULL, host TEXT NOT NULL,
    backend TEXT NOT NULL, model TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL, status TEXT NOT NULL,
    params TEXT NOT NULL, summary TEXT, verdict TEXT, note TEXT
);
CREATE TABLE arms (
    run_id INTEGER NOT NULL REFERENCES runs(id), idx INTEGER NOT NULL,
    label TEXT NOT NULL, overrides TEXT NOT NULL, flags TEXT NOT NULL, PRIMARY KEY (run_id, idx)
);
CREATE TABLE launches (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER REFERENCES runs(id), arm_idx INTEGER,
    profile TEXT NOT NULL, host TEXT NOT NULL, at REAL NOT NULL, argv TEXT NOT NULL, flags TEXT NOT NULL,
    server_flags TEXT, phase_times TEXT NOT NULL, outcome TEXT NOT NULL
);
CREATE TABLE trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL REFERENCES runs(id), arm_idx INTEGER NOT NULL,
    trial_idx INTEGER NOT NULL, at REAL NOT NULL, value REAL, summary TEXT NOT NULL, accept_len REAL,
    accept_source TEXT
);
CREATE TABLE requests (
    trial_id INTEGER NOT NULL REFERENCES trials(id), idx INTEGER NOT NULL, ok INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL, ttft_s REAL, latency_s REAL, tpot_s REAL, start_s REAL,
    usage_missing INTEGER NOT NULL, error TEXT
);
PRAGMA user_version=1;
"""


def _old_database(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_V1)
    params = json.dumps({"trials": 3, "interleave": False, "bench": {"requests": 4, "concurrency": 2}})
    db.execute("INSERT INTO runs VALUES (1, 'ab', 'demo', 'sim', 'sglang', 'm', 1.0, 2.0, 'done', ?, NULL, 'v', NULL)",
               (params,))
    for idx, label in enumerate(("A", "B")):
        db.execute("INSERT INTO arms VALUES (1, ?, ?, '', '{}')", (idx, label))
        db.execute("INSERT INTO launches (run_id, arm_idx, profile, host, at, argv, flags, server_flags, phase_times,"
                   " outcome) VALUES (1, ?, 'demo', 'sim', 1.0, '[]', '{}', NULL, '{}', 'ready')", (idx,))
        for t, value in enumerate((40.0, 41.0, 39.0) if idx == 0 else (52.0, 53.0, 54.0)):
            db.execute("INSERT INTO trials (run_id, arm_idx, trial_idx, at, value, summary, accept_len, "
                       "accept_source) VALUES (1, ?, ?, 1.0, ?, ?, NULL, '')",
                       (idx, t, value, json.dumps({"requests": 4, "errors": 0, "output_tokens": 64})))
    db.commit()
    db.close()


def test_an_old_database_opens_reads_launch_zero_and_takes_new_rows(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite3"
    _old_database(path)
    with HistoryStore(path) as store:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
        run = store.run(1)
        assert run is not None and len(run.trials) == 6
        assert {t.launch_idx for t in run.trials} == {0} and {ln.launch_idx for ln in run.launches} == {0}
        assert {ln.slot for ln in run.launches} == {None}  # version 3's slot column: old launches ran without slots
        assert run.trials_by_launch(0) == [[40.0, 41.0, 39.0]]
        data = run_json(run)  # one launch per arm: a ratio, no launch-level interval, and it says so
        assert data["arms"][0]["launch_values"] == [40.0] and data["ratio_ci"] is None
        assert "one launch per arm" in data["verdict"]
        assert "one launch per arm: no launch-level interval" in export_run(run, "md")
        assert export_run(run, "csv").splitlines()[1].split(",")[4:6] == ["1", "1"]
        rid = store.start_run("ab", profile="demo", host="sim", backend="sglang", model="m", params={},
                              arms=[("A", "", {}), ("B", "", {})])
        store.add_launch(run_id=rid, arm_idx=1, profile="demo", host="sim", argv=[], flags={}, server_flags=None,
                         phase_times={}, outcome="ready", launch_idx=1, slot={"index": 2, "gpus": [4, 5], "port": 9})
        store.add_trial(rid, 1, 0, value=50.0, summary={}, accept_len=None, accept_source="", requests=[],
                        launch_idx=1)
        new = store.run(rid)
        assert new is not None and new.trials[0].launch_idx == 1 and new.launches[0].launch_idx == 1
        assert new.launches[0].slot == {"index": 2, "gpus": [4, 5], "port": 9}
        assert store.integrity_ok()
    with HistoryStore(path) as again:  # a second open of a migrated file changes nothing
        assert again.run(1) is not None and again.db.execute("PRAGMA user_version").fetchone()[0] == 3


def test_a_fresh_database_has_the_columns_and_the_version(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        columns = {row[1] for row in store.db.execute("PRAGMA table_info(trials)")}
        assert "launch_idx" in columns
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
