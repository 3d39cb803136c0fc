"""The history database: where it lives, WAL mode and round trips (a SIGKILL mid-write: tests/integration)."""

from __future__ import annotations

import pytest

from app.core.measure.client import RequestResult
from app.core.measure.store import DATA_DIR_ENV, HistoryStore, StoreError, default_path


def test_location_follows_the_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "d"))
    assert default_path() == tmp_path / "d" / "history.sqlite3"
    with HistoryStore() as store:
        assert store.path.exists()
        assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unwritable_location_names_the_file_and_the_fix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match=DATA_DIR_ENV) as info:
        HistoryStore(blocker / "sub" / "h.sqlite3")
    assert str(blocker) in str(info.value)


def test_round_trip_of_a_run(tmp_path):
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        rid = store.start_run("ab", profile="demo", host="sim", backend="sglang", model="m",
                              params={"trials": 2}, arms=[("A", "x=1", {"x": 1}), ("B", "x=2", {"x": 2})])
        store.add_launch(run_id=rid, arm_idx=0, profile="demo", host="sim", argv=["python", "-m", "s"],
                         flags={"x": 1}, server_flags={"x": 1}, phase_times={"ready": 1.5}, outcome="ready")
        reqs = [RequestResult(ok=True, output_tokens=16, ttft_s=0.1, latency_s=0.5),
                RequestResult(ok=False, error="HTTP 500")]
        store.add_trial(rid, 0, 0, value=50.0, summary={"requests": 2, "errors": 1}, accept_len=2.5,
                        accept_source="log", requests=reqs)
        store.add_trial(rid, 1, 0, value=None, summary={"requests": 2, "errors": 2}, accept_len=None,
                        accept_source="none", requests=[])
        assert store.runs()[0].status == "running" and store.runs()[0].trial_count == 2
        store.finish_run(rid, "done", summary={"k": 1}, verdict="B is 1% faster")
        run = store.run(rid)
        assert run is not None and run.status == "done" and run.verdict == "B is 1% faster"
        assert [a.label for a in run.arms] == ["A", "B"] and run.arms[1].flags == {"x": 2}
        assert run.values(0) == [50.0] and run.values(1) == []
        assert run.launches[0].phase_times == {"ready": 1.5} and run.launches[0].server_flags == {"x": 1}
        rows = store.request_rows(rid)
        assert [r.ok for r in rows] == [True, False] and rows[1].error == "HTTP 500"
        assert rows[0].tpot_s is not None and round(rows[0].tpot_s, 6) == round(0.4 / 15, 6)
        assert (rows[0].arm_idx, rows[0].launch_idx, rows[0].trial_idx, rows[0].idx) == (0, 0, 0, 0)
        assert store.run(rid + 100) is None

